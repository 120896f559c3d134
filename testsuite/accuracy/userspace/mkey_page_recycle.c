/*
 * pgx: page-list exposure for a remote-swap client on mlx5 (mlx5dv only).
 * A swap-out request gathers up to 64 scattered pages behind one indirect
 * mkey (mlx5dv_wr_mr_list, REMOTE_READ) so the swap server can pull them
 * with a single RDMA READ.  After the server's ack the mkey is invalidated
 * and the pages go back to the kernel-managed page cache of the runtime.
 *
 * The invalidation is posted in the same batch as nothing else, without a
 * completion request ("the UMR for the next request orders behind it"),
 * and the pages are released immediately.  The ordering argument only
 * holds for work on this QP; the server can still READ the pages through
 * the mkey until the LOCAL_INV executes, and by then they may hold another
 * process's data.
 *
 * Correct: the UMR's access flags (REMOTE_READ needs no LOCAL_WRITE); the
 * mkeys are created and destroyed in pairs.
 */
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PGX_PAGES	64

struct pgx_req {
	struct mlx5dv_mkey *mkey;
	struct ibv_sge      sg[PGX_PAGES];
	uint16_t            nr;
	void               *pages[PGX_PAGES];
};

struct pgx {
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	struct ibv_pd       *pd;
	void               (*page_release)(void *page);
};

int pgx_req_init(struct pgx *x, struct pgx_req *r)
{
	struct mlx5dv_mkey_init_attr a = {
		.pd = x->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = PGX_PAGES,
	};

	r->mkey = mlx5dv_create_mkey(&a); // BUG: rdma-local-mr-management -- mkeys created by the ULP to expose pages
	return r->mkey ? 0 : -errno;
}

int pgx_expose(struct pgx *x, struct pgx_req *r, uint32_t *rkey)
{
	ibv_wr_start(x->qpx);
	x->qpx->wr_id = (uintptr_t)r;
	x->qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	/* OK: rdma-access-flags-invalid -- REMOTE_READ alone needs no LOCAL_WRITE */
	mlx5dv_wr_mr_list(x->mqpx, r->mkey, IBV_ACCESS_REMOTE_READ, r->nr, r->sg); // BUG: rdma-local-mr-management -- per-request mkey configuration done by the ULP
	if (ibv_wr_complete(x->qpx))
		return -EIO;
	*rkey = r->mkey->rkey;
	return 0;
}

void pgx_ack(struct pgx *x, struct pgx_req *r)
{
	uint16_t i;

	ibv_wr_start(x->qpx);
	x->qpx->wr_id = 0;
	x->qpx->wr_flags = 0;
	ibv_wr_local_inv(x->qpx, r->mkey->rkey);
	if (ibv_wr_complete(x->qpx))
		return;
	// BUG: rdma-unmap-before-invalidate -- pages released right after an unsignaled LOCAL_INV
	for (i = 0; i < r->nr; i++)
		x->page_release(r->pages[i]);
	r->nr = 0;
}

void pgx_req_fini(struct pgx_req *r)
{
	mlx5dv_destroy_mkey(r->mkey);
}
