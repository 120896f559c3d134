// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// A collective library's registration helper returns a status and the MR
// through an out-parameter, deciding the status by the MR itself
// (`return *out ? OK : ERR`). When the caller sees the error status the
// registration failed and there is nothing to release; after success the
// caller owns the MR on every path.

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { CL_OK = 0, CL_ERR_NO_MEMORY = -2, CL_ERR_IO = -3 } cl_status_t;

struct cl_comm {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
};

static cl_status_t cl_ring_step(struct cl_comm *c, struct ibv_mr *mr, float *buf,
				size_t count)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf,
			       .length = (uint32_t)(count * sizeof(float)),
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	return ibv_post_send(c->qp, &wr, &bad) ? CL_ERR_IO : CL_OK;
}

static cl_status_t cl_reg_user(struct cl_comm *c, void *buf, size_t len,
			       struct ibv_mr **out)
{
	*out = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	return *out ? CL_OK : CL_ERR_NO_MEMORY;
}

cl_status_t cl_allreduce(struct cl_comm *c, float *buf, size_t count)
{
	struct ibv_mr *umr;
	cl_status_t st;

	/* Near miss: the error status means nothing was registered. */
	st = cl_reg_user(c, buf, count * sizeof(float), &umr);
	if (st != CL_OK)
		return st;

	st = cl_ring_step(c, umr, buf, count);
	if (st != CL_OK)
		return st;
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ibv_reg_mr'; it leaks [rdma-mr-leak]
	// CHECK-MESSAGES: :37:9: note: memory region obtained here
	// CHECK-MESSAGES: :[[@LINE-4]]:2: note: error path taken here

	ibv_dereg_mr(umr);
	return CL_OK;
}
