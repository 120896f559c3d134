/*
 * va_shmw_release.c - shmw unmapping side: regions come back from the peer
 * (UNMAP, normally sent with SEND_WITH_INV on the region's key), from lease
 * expiry, from a local unmap, and at teardown.
 *
 * Correct: shmw_unmap() posts a signaled LOCAL_INV and polls for its
 * completion before the region returns to the free list; teardown
 * deallocates every window (which invalidates it) before the arena is
 * freed.
 * Wrong: an UNMAP with IBV_WC_WITH_INV is accepted without comparing the
 * invalidated rkey (it is copied into the rx descriptor and never looked
 * at), lease expiry recycles regions whose window is still bound, and
 * shmw_unmap_async() recycles the region right after an unsignaled
 * LOCAL_INV.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not the subject of this program
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "va_shmw.h"

void shmw_region_put(struct shmw_ctx *ctx, struct shmw_region *r)
{
	r->mapped = 0;
	r->length = 0;
	r->next = ctx->free;
	ctx->free = r;
}

static int shmw_post_inv(struct shmw_ctx *ctx, struct shmw_region *r,
			 unsigned int send_flags)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = r->rkey;
	wr.send_flags = send_flags;
	return ibv_post_send(ctx->qp, &wr, &bad);
}

/* poll until the completion of the work request posted for @r */
static int shmw_wait(struct shmw_ctx *ctx, struct shmw_region *r)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(ctx->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 1 && wc.wr_id == (uintptr_t)r)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
		if (n == 1 && wc.opcode == IBV_WC_RECV)
			shmw_handle_recv(ctx, &wc);
	} while (!ctx->broken);
	return -EIO;
}

int shmw_unmap(struct shmw_ctx *ctx, struct shmw_region *r)
{
	int ret;

	ret = shmw_post_inv(ctx, r, IBV_SEND_SIGNALED);
	if (ret)
		return ret;
	ret = shmw_wait(ctx, r);
	if (ret) {
		ctx->broken = 1;
		return ret;
	}
	shmw_region_put(ctx, r);	// OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV completed successfully
	return 0;
}

void shmw_unmap_async(struct shmw_ctx *ctx, struct shmw_region *r)
{
	if (shmw_post_inv(ctx, r, 0)) {
		ctx->broken = 1;
		return;
	}
	shmw_region_put(ctx, r);	// BUG: rdma-unmap-before-invalidate -- nobody waits for the unsignaled LOCAL_INV; the next shmw_map() hands the slice to another user while the peer's key may still work
}

static void shmw_process(struct shmw_ctx *ctx, struct shmw_rx *rx)
{
	struct shmw_region *r;

	if (rx->msg.region >= SHMW_NR_REGIONS)
		return;
	r = &ctx->regions[rx->msg.region];
	if (!r->mapped)
		return;

	switch (rx->msg.type) {
	case SHMW_MSG_RESIZE:
		if (shmw_resize(ctx, r, rx->msg.length))
			ctx->broken = 1;
		break;
	case SHMW_MSG_UNMAP:
		if (rx->wc_flags & IBV_WC_WITH_INV) {	// BUG: rdma-remote-invalidate-unchecked -- rx->inv_rkey is never compared with r->rkey; any key the peer invalidated frees this region
			shmw_region_put(ctx, r);
			break;
		}
		if (shmw_unmap(ctx, r))
			fprintf(stderr, "shmw: region %u: LOCAL_INV failed\n", r->idx);
		break;
	default:
		fprintf(stderr, "shmw: unexpected message %u\n", rx->msg.type);
		break;
	}
}

void shmw_handle_recv(struct shmw_ctx *ctx, const struct ibv_wc *wc)
{
	struct shmw_rx *rx = (struct shmw_rx *)(uintptr_t)wc->wr_id;

	if (wc->status != IBV_WC_SUCCESS) {
		ctx->broken = 1;
		return;
	}
	rx->wc_flags = wc->wc_flags;
	rx->inv_rkey = wc->invalidated_rkey;
	rx->byte_len = wc->byte_len;
	if (rx->byte_len >= sizeof(rx->msg))
		shmw_process(ctx, rx);
	if (shmw_post_rx(ctx, rx))
		ctx->broken = 1;
}

void shmw_expire(struct shmw_ctx *ctx)
{
	uint64_t now = shmw_now_ns();
	int i;

	for (i = 0; i < SHMW_NR_REGIONS; i++) {
		struct shmw_region *r = &ctx->regions[i];

		if (!r->mapped || r->lease_end > now)
			continue;
		fprintf(stderr, "shmw: lease on region %d expired\n", i);
		shmw_region_put(ctx, r);	// BUG: rdma-invalidation-leak -- the window is still bound over the slice and the peer still has its key
	}
}

void shmw_ctx_fini(struct shmw_ctx *ctx)
{
	int i;

	for (i = 0; i < SHMW_NR_REGIONS; i++)
		ibv_dealloc_mw(ctx->regions[i].mw);	// OK: rdma-mr-leak -- every window is deallocated
	ctx->free = NULL;
	ibv_dereg_mr(ctx->arena_mr);
	free(ctx->arena);	// OK: rdma-invalidation-leak -- deallocating the windows invalidated them before the arena goes
	ctx->arena = NULL;
	ibv_dereg_mr(ctx->rx_mr);
	free(ctx->rx);
	ctx->rx = NULL;
}
