// RUN: %check_ulplint --kernel %s rdma-access-flags-invalid %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-access-flags-invalid %t.plugin

// Fast registration (IB_WR_REG_MR) in kernel ULP style: request structs,
// an alias pointer to the embedded work request, error-path gotos.

#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <linux/slab.h>

struct demo_queue {
	struct ib_qp *qp;
	struct ib_pd *pd;
	int remote_write;
};

struct demo_request {
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_cqe reg_cqe;
	struct ib_sge sge;
	struct scatterlist *sgl;
	int nents;
};

static void demo_memreg_done(struct ib_cq *cq, struct ib_wc *wc) {}

/* nvme-rdma's registration with LOCAL_WRITE dropped. */
static int demo_map_sg_fr(struct demo_queue *queue, struct demo_request *req)
{
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	nr = ib_map_mr_sg(req->mr, req->sgl, req->nents, NULL, SZ_4K);
	if (nr < req->nents)
		goto out_put;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_cqe.done = demo_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;
	// CHECK-MESSAGES: :[[@LINE-1]]:2: warning: 'IB_WR_REG_MR' requests IB_ACCESS_REMOTE_WRITE without IB_ACCESS_LOCAL_WRITE; the registration work request completes with an error [rdma-access-flags-invalid]
	// CHECK-FIXES: req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;
	return 0;

out_put:
	ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
	req->mr = NULL;
	return -EINVAL;
}

/* Built in two steps through an alias of the embedded work request. */
static void demo_prep_reg(struct demo_queue *queue, struct demo_request *req)
{
	struct ib_reg_wr *reg = &req->reg_wr;

	reg->wr.opcode = IB_WR_REG_MR;
	reg->mr = req->mr;
	reg->key = req->mr->rkey;
	reg->access = IB_ACCESS_REMOTE_READ;
	if (queue->remote_write)
		reg->access |= IB_ACCESS_REMOTE_ATOMIC;
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'IB_WR_REG_MR' requests IB_ACCESS_REMOTE_ATOMIC without IB_ACCESS_LOCAL_WRITE; the registration work request completes with an error [rdma-access-flags-invalid]
	// CHECK-FIXES: reg->access |= IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_ATOMIC;
}

/* A compound literal with designated initializers. */
static void demo_prep_literal(struct demo_request *req, int write)
{
	req->reg_wr = (struct ib_reg_wr){
		.wr = { .opcode = IB_WR_REG_MR, .num_sge = 0 },
		.mr = req->mr,
		.key = req->mr->rkey,
		.access = write ? IB_ACCESS_REMOTE_WRITE : IB_ACCESS_REMOTE_READ,
		// CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'IB_WR_REG_MR' requests IB_ACCESS_REMOTE_WRITE without IB_ACCESS_LOCAL_WRITE; the registration work request completes with an error on some paths [rdma-access-flags-invalid]
		// CHECK-FIXES: .access = IB_ACCESS_LOCAL_WRITE | (write ? IB_ACCESS_REMOTE_WRITE : IB_ACCESS_REMOTE_READ),
	};
}

/* Near misses. */

/* nvme-rdma as shipped. */
static void ok_nvme_style(struct demo_request *req)
{
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;
}

/* The first store is incomplete, the final one carries LOCAL_WRITE. */
static void ok_completed_later(struct demo_request *req)
{
	req->reg_wr.access = IB_ACCESS_REMOTE_WRITE;
	req->reg_wr.access |= IB_ACCESS_LOCAL_WRITE;
}

/* Access from the caller: not judged. */
static void ok_caller_access(struct demo_request *req, int access)
{
	req->reg_wr.access = access | IB_ACCESS_REMOTE_READ;
}

/* Read-only remote access is valid without local write. */
static void ok_read_only(struct demo_request *req)
{
	req->reg_wr.access = IB_ACCESS_REMOTE_READ;
}
