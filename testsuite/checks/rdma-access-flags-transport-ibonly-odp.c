// RUN: %check_ulplint %s rdma-access-flags-transport %t

// Near miss: a server that refuses devices without implicit on-demand
// paging. No iWARP device has ODP, so its READ sink needs no REMOTE_WRITE.
// Nothing is reported.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

struct shm_srv {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_mr *odp_mr;
};

static int shm_check_odp(struct shm_srv *s)
{
	struct ibv_device_attr_ex attr;

	if (ibv_query_device_ex(s->ctx, NULL, &attr))
		return -errno;
	if (!(attr.odp_caps.general_caps & IBV_ODP_SUPPORT) ||
	    !(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT))
		return -EOPNOTSUPP;
	return 0;
}

int shm_init(struct shm_srv *s)
{
	int ret = shm_check_odp(s);

	if (ret)
		return ret;
	s->odp_mr = ibv_reg_mr(s->pd, NULL, SIZE_MAX,
			       IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	return s->odp_mr ? 0 : -errno;
}

int shm_pull(struct shm_srv *s, void *dst, uint32_t len, uint64_t raddr,
	     uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)dst, len, s->odp_mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	return ibv_post_send(s->qp, &wr, &bad);
}
