/*
 * shmsrv: a "remote shared memory" service.  Clients attach and RDMA-READ
 * or -WRITE objects the server publishes.  To avoid registering every
 * object, the server registers its whole address space with implicit ODP
 * and hands that single rkey to every client -- so a client can reach any
 * byte of the server process (stack, heap, credentials in memory).
 *
 * The server also runs a local copy engine (loopback RDMA for memmove of
 * large objects); it uses a second implicit-ODP MR with LOCAL_WRITE only,
 * which is fine: nothing remote can use it.
 *
 * Correct: ODP support (and implicit ODP) are checked before use; the
 * local implicit MR grants no remote rights; failures unwind.
 * Not correct: the client-facing implicit ODP MR carries remote rights.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shm_attach_reply {
	uint64_t base;
	uint32_t rkey;
	uint32_t flags;
};

struct shmsrv {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_mr      *client_mr;	/* handed to clients */
	struct ibv_mr      *copy_mr;	/* loopback copy engine */
	int                 rc_odp_read_write;
};

static int shmsrv_check_odp(struct shmsrv *s)
{
	struct ibv_device_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	if (ibv_query_device_ex(s->ctx, NULL, &attr))
		return -errno;
	if (!(attr.odp_caps.general_caps & IBV_ODP_SUPPORT) ||
	    !(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT))
		return -EOPNOTSUPP;
	s->rc_odp_read_write =
		(attr.odp_caps.per_transport_caps.rc_odp_caps &
		 (IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE)) ==
		(IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_WRITE);
	return 0;
}

int shmsrv_init(struct shmsrv *s, struct ibv_context *ctx)
{
	int ret;

	memset(s, 0, sizeof(*s));
	s->ctx = ctx;
	ret = shmsrv_check_odp(s);
	if (ret)
		return ret;
	if (!s->rc_odp_read_write)
		return -EOPNOTSUPP;
	s->pd = ibv_alloc_pd(ctx);
	if (!s->pd)
		return -errno;

	// BUG: rdma-remote-access-overbroad -- implicit ODP (NULL, SIZE_MAX) with remote read/write exposes the whole address space
	s->client_mr = ibv_reg_mr(s->pd, NULL, SIZE_MAX, // BUG: rdma-local-mr-management -- rkey handed to every client
				  IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE |
				  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!s->client_mr) {
		ret = -errno;
		goto err_pd;
	}

	/* OK: rdma-remote-access-overbroad -- implicit ODP without remote rights */
	s->copy_mr = ibv_reg_mr(s->pd, NULL, SIZE_MAX, // BUG: rdma-local-mr-management -- lkey addresses the copy engine's own RDMA READ/WRITE
				IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
	if (!s->copy_mr) {
		ret = -errno;
		goto err_client_mr;
	}
	return 0;

err_client_mr:
	/* OK: rdma-mr-leak -- the first MR is released when the second fails */
	ibv_dereg_mr(s->client_mr);
err_pd:
	ibv_dealloc_pd(s->pd);
	return ret;
}

void shmsrv_attach_reply(const struct shmsrv *s, struct shm_attach_reply *r)
{
	r->base = htobe64(0);
	r->rkey = htobe32(s->client_mr->rkey);
	r->flags = 0;
}

/*
 * Loopback copy: an RDMA READ on the loopback QP from src (through the
 * client MR's key) into dst (the copy MR's lkey).  The sink has no
 * REMOTE_WRITE; shmsrv_init() refused devices without implicit ODP, and
 * no iWARP device offers it.
 */
int shmsrv_copy(struct shmsrv *s, struct ibv_qp *lo_qp, void *dst, const void *src,
		uint32_t len)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)dst, .length = len, .lkey = s->copy_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)src, .rkey = s->client_mr->rkey },
	}, *bad;
	struct ibv_sge prefetch = sge;

	ibv_advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &prefetch, 1);
	/* OK: rdma-access-flags-transport -- implicit ODP is required, so this never runs on iWARP */
	return ibv_post_send(lo_qp, &wr, &bad);
}

void shmsrv_fini(struct shmsrv *s)
{
	ibv_dereg_mr(s->copy_mr);
	ibv_dereg_mr(s->client_mr);
	ibv_dealloc_pd(s->pd);
}
