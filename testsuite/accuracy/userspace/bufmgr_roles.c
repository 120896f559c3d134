/*
 * bufmgr: buffer manager of a streaming library.  Buffers are registered
 * by role, and one helper maps the role to access flags so the rules live
 * in one place:
 *   SEND source   -> no rights (local read is implicit)
 *   RECV target   -> LOCAL_WRITE
 *   RDMA target   -> remote read/write for the peer's one-sided ops
 * The RDMA-target case forgot LOCAL_WRITE when the helper was introduced,
 * so every registration of the exposed landing zone fails with EINVAL and
 * the library falls back to two-sided transfers.  The send and receive
 * registrations go through the same helper and are fine.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum bm_role { BM_ROLE_SEND, BM_ROLE_RECV, BM_ROLE_RDMA_TARGET };

struct bm {
	struct ibv_pd *pd;
	void          *send_area, *recv_area, *landing;
	size_t         send_len, recv_len, landing_len;
	struct ibv_mr *send_mr, *recv_mr, *landing_mr;
};

struct bm_landing_desc {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

static unsigned int bm_role_access(enum bm_role role)
{
	switch (role) {
	case BM_ROLE_SEND:
		return 0;
	case BM_ROLE_RECV:
		return IBV_ACCESS_LOCAL_WRITE;
	case BM_ROLE_RDMA_TARGET:
		return IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	}
	return 0;
}

int bm_init(struct bm *b, struct bm_landing_desc *desc)
{
	/* OK: rdma-access-flags-invalid -- SEND sources need no rights */
	/* OK: rdma-local-mr-management -- send area registered once, SEND source */
	b->send_mr = ibv_reg_mr(b->pd, b->send_area, b->send_len, bm_role_access(BM_ROLE_SEND));
	if (!b->send_mr)
		return -errno;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE for receives */
	/* OK: rdma-local-mr-management -- receive area registered once */
	b->recv_mr = ibv_reg_mr(b->pd, b->recv_area, b->recv_len, bm_role_access(BM_ROLE_RECV));
	if (!b->recv_mr)
		goto err_send;
	// BUG: rdma-access-flags-invalid -- bm_role_access(BM_ROLE_RDMA_TARGET) has remote write without LOCAL_WRITE
	b->landing_mr = ibv_reg_mr(b->pd, b->landing, b->landing_len, // BUG: rdma-local-mr-management -- rkey handed to the peer
				   bm_role_access(BM_ROLE_RDMA_TARGET));
	if (!b->landing_mr)
		goto err_recv;
	desc->addr = (uintptr_t)b->landing;
	desc->rkey = b->landing_mr->rkey;
	desc->len = (uint32_t)b->landing_len;
	return 0;

err_recv:
	ibv_dereg_mr(b->recv_mr);
err_send:
	/* OK: rdma-mr-leak -- each earlier registration is released */
	ibv_dereg_mr(b->send_mr);
	return -EIO;
}

void bm_fini(struct bm *b)
{
	ibv_dereg_mr(b->landing_mr);
	ibv_dereg_mr(b->recv_mr);
	ibv_dereg_mr(b->send_mr);
}
