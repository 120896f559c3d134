/*
 * va_shmw_expose.c - shmw setup and the mapping side: a region gets its
 * window bound over its arena slice (IBV_WR_BIND_MW) and its descriptor,
 * rkey included, is sent to the peer.
 *
 * Correct: every mapping takes the next key of the window with
 * ibv_inc_rkey(); a failed bind recycles the region at once, a failed
 * descriptor send goes through shmw_unmap(), which waits for its LOCAL_INV.
 * Wrong: a RESIZE re-binds the window under the key it already had, and
 * setup forgets the receive MR when a window cannot be allocated.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not the subject of this program
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "va_shmw.h"

uint64_t shmw_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int shmw_post_rx(struct shmw_ctx *ctx, struct shmw_rx *rx)
{
	struct ibv_sge sge;
	struct ibv_recv_wr wr, *bad;

	sge.addr = (uintptr_t)&rx->msg;
	sge.length = sizeof(rx->msg);
	sge.lkey = ctx->rx_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)rx;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(ctx->qp, &wr, &bad);
}

int shmw_ctx_init(struct shmw_ctx *ctx)
{
	size_t arena_len = (size_t)SHMW_NR_REGIONS * SHMW_REGION_SIZE;
	int i;

	ctx->arena = aligned_alloc(4096, arena_len);
	if (!ctx->arena)
		return -ENOMEM;
	ctx->arena_mr = ibv_reg_mr(ctx->pd, ctx->arena, arena_len,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!ctx->arena_mr)
		goto err_arena;

	ctx->rx = calloc(SHMW_RX_DEPTH, sizeof(*ctx->rx));
	if (!ctx->rx)
		goto err_arena_mr;
	ctx->rx_mr = ibv_reg_mr(ctx->pd, ctx->rx, SHMW_RX_DEPTH * sizeof(*ctx->rx),
				IBV_ACCESS_LOCAL_WRITE);
	if (!ctx->rx_mr)
		goto err_rx;

	ctx->free = NULL;
	for (i = 0; i < SHMW_NR_REGIONS; i++) {
		struct shmw_region *r = &ctx->regions[i];

		r->mw = ibv_alloc_mw(ctx->pd, IBV_MW_TYPE_2);
		if (!r->mw)
			goto err_mw;
		r->idx = i;
		r->rkey = r->mw->rkey;
		r->buf = ctx->arena + (size_t)i * SHMW_REGION_SIZE;
		// OK: rdma-invalidation-leak -- a window fresh from ibv_alloc_mw() is bound to nothing
		r->next = ctx->free;
		ctx->free = r;
	}

	for (i = 0; i < SHMW_RX_DEPTH; i++)
		if (shmw_post_rx(ctx, &ctx->rx[i]))
			goto err_mw_all;
	return 0;

err_mw_all:
	i = SHMW_NR_REGIONS;
err_mw:
	while (--i >= 0)
		ibv_dealloc_mw(ctx->regions[i].mw);	// OK: rdma-mr-leak -- every window allocated so far is deallocated
	ctx->free = NULL;
err_rx:
	// OK: rdma-invalidation-leak -- the receive ring is registered for local access only
	free(ctx->rx);	// BUG: rdma-mr-leak -- the window failure paths fall through here without ibv_dereg_mr(ctx->rx_mr)
	ctx->rx = NULL;
err_arena_mr:
	ibv_dereg_mr(ctx->arena_mr);
err_arena:
	free(ctx->arena);
	ctx->arena = NULL;
	return -ENOMEM;
}

static struct shmw_region *shmw_region_get(struct shmw_ctx *ctx)
{
	struct shmw_region *r = ctx->free;

	if (r) {
		ctx->free = r->next;
		r->next = NULL;
		r->mapped = 1;
	}
	return r;
}

static int shmw_post_bind(struct shmw_ctx *ctx, struct shmw_region *r,
			  uint32_t key)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)r;
	wr.opcode = IBV_WR_BIND_MW;
	wr.bind_mw.mw = r->mw;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info.mr = ctx->arena_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)r->buf;
	wr.bind_mw.bind_info.length = r->length;
	wr.bind_mw.bind_info.mw_access_flags = r->access;
	if (ibv_post_send(ctx->qp, &wr, &bad))
		return -1;
	r->rkey = key;
	return 0;
}

static int shmw_post_desc(struct shmw_ctx *ctx, struct shmw_region *r,
			  uint32_t type)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	r->desc.type = type;
	r->desc.region = r->idx;
	r->desc.addr = (uintptr_t)r->buf;
	r->desc.length = r->length;
	r->desc.rkey = r->rkey;
	r->desc.access = r->access;

	sge.addr = (uintptr_t)&r->desc;
	sge.length = sizeof(r->desc);
	sge.lkey = 0;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 0;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	return ibv_post_send(ctx->qp, &wr, &bad);
}

struct shmw_region *shmw_map(struct shmw_ctx *ctx, size_t length,
			     unsigned int access)
{
	struct shmw_region *r;

	if (length == 0 || length > SHMW_REGION_SIZE)
		return NULL;
	r = shmw_region_get(ctx);
	if (!r)
		return NULL;

	r->length = length;
	r->access = access;
	r->lease_end = shmw_now_ns() + ctx->lease_ns;
	if (shmw_post_bind(ctx, r, ibv_inc_rkey(r->rkey))) {	// OK: rdma-rkey-reuse -- each mapping binds under the next key
		shmw_region_put(ctx, r);	// OK: rdma-invalidation-leak -- the bind was not posted
		return NULL;
	}
	if (shmw_post_desc(ctx, r, SHMW_MSG_MAP)) {
		shmw_unmap(ctx, r);	// OK: rdma-invalidation-leak -- shmw_unmap() posts a signaled LOCAL_INV and waits for it
		return NULL;
	}
	return r;
}

/* RESIZE from the peer: grow the binding in place, the peer keeps its key */
int shmw_resize(struct shmw_ctx *ctx, struct shmw_region *r, size_t length)
{
	struct ibv_send_wr inv, *bad;

	if (!r->mapped || length > SHMW_REGION_SIZE)
		return -EINVAL;
	if (length <= r->length)
		return 0;

	memset(&inv, 0, sizeof(inv));
	inv.wr_id = (uintptr_t)r;
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = r->rkey;
	if (ibv_post_send(ctx->qp, &inv, &bad))	// OK: rdma-unmap-before-invalidate -- nothing is released after this LOCAL_INV; the slice is bound again
		return -EIO;

	r->length = length;
	if (shmw_post_bind(ctx, r, r->rkey))	// BUG(file): rdma-rkey-reuse -- the window is bound again under the key it had before the LOCAL_INV
		return -EIO;
	r->lease_end = shmw_now_ns() + ctx->lease_ns;
	return shmw_post_desc(ctx, r, SHMW_MSG_MAP);
}
