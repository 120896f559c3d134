/*
 * umr_post.c: the benchmark loop.  Each iteration configures an mkey over
 * UMR_SEGS segments (list or interleaved layout), sends its key to the
 * peer (which READs through it), and invalidates it with a signaled
 * LOCAL_INV whose completion is polled before the mkey is reused.
 *
 * Not correct:
 *  - atomic mode configures the mkey with REMOTE_ATOMIC but without
 *    LOCAL_WRITE; the UMR completes in error;
 *  - the early-exit path (the peer went away) posts an unsignaled LOCAL_INV
 *    for the last mkey and frees the data buffer right away.
 */
#include "umr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int umr_wait(struct umr_bench *b)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(b->cq, 1, &wc);
	while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

static int umr_send_key(struct umr_bench *b, uint32_t key)
{
	ibv_wr_start(b->qpx);
	b->qpx->wr_id = key;
	b->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(b->qpx);
	ibv_wr_set_inline_data(b->qpx, &key, sizeof(key));
	if (ibv_wr_complete(b->qpx))
		return -EIO;
	return umr_wait(b);
}

static int umr_configure(struct umr_bench *b, struct mlx5dv_mkey *mk, char *base)
{
	struct ibv_sge sge[UMR_SEGS];
	struct mlx5dv_mr_interleaved il[2];
	int i;

	ibv_wr_start(b->qpx);
	b->qpx->wr_id = 0;
	b->qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	switch (b->mode) {
	case UMR_MODE_LIST:
		for (i = 0; i < UMR_SEGS; i++) {
			sge[i].addr = (uintptr_t)(base + i * UMR_SEG_SIZE);
			sge[i].length = UMR_SEG_SIZE;
			sge[i].lkey = b->data_mr->lkey;
		}
		/* OK: rdma-access-flags-invalid -- remote read only */
		mlx5dv_wr_mr_list(b->mqpx, mk, IBV_ACCESS_REMOTE_READ, UMR_SEGS, sge); // BUG: rdma-local-mr-management -- per-iteration mkey configuration done by the ULP
		break;
	case UMR_MODE_INTERLEAVED:
	case UMR_MODE_ATOMIC:
		il[0] = (struct mlx5dv_mr_interleaved){ (uintptr_t)base, 512, 0, b->data_mr->lkey };
		il[1] = (struct mlx5dv_mr_interleaved){ (uintptr_t)(base + UMR_SEG_SIZE * 4), 8, 0,
							b->data_mr->lkey };
		// BUG: rdma-access-flags-invalid -- atomic mode grants REMOTE_ATOMIC without LOCAL_WRITE
		mlx5dv_wr_mr_interleaved(b->mqpx, mk, // BUG: rdma-local-mr-management -- per-iteration mkey configuration done by the ULP
					 b->mode == UMR_MODE_ATOMIC ?
					 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC :
					 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
					 UMR_SEGS, 2, il);
		break;
	}
	if (ibv_wr_complete(b->qpx))
		return -EIO;
	return umr_wait(b);
}

static int umr_invalidate(struct umr_bench *b, struct mlx5dv_mkey *mk, unsigned int flags)
{
	ibv_wr_start(b->qpx);
	b->qpx->wr_id = 1;
	b->qpx->wr_flags = flags;
	ibv_wr_local_inv(b->qpx, mk->rkey);
	return ibv_wr_complete(b->qpx);
}

int umr_run(struct umr_bench *b, unsigned int iters)
{
	unsigned int it;

	for (it = 0; it < iters; it++) {
		struct mlx5dv_mkey *mk = b->mkey[it % UMR_NKEYS];
		char *base = b->data + (size_t)(it % UMR_NKEYS) * UMR_SEGS * UMR_SEG_SIZE;

		if (umr_configure(b, mk, base))
			return -EIO;
		if (umr_send_key(b, mk->rkey)) {
			umr_invalidate(b, mk, 0);
			// BUG: rdma-unmap-before-invalidate -- the data buffer is freed right after an unsignaled LOCAL_INV
			free(b->data);
			b->data = NULL;
			return -ECONNRESET;
		}
		if (umr_invalidate(b, mk, IBV_SEND_SIGNALED) || umr_wait(b))
			return -EIO;
		/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completion was polled; the mkey is reused next */
	}
	return 0;
}
