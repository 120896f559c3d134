/*
 * ts_ingest.c - streaming client of a time-series ingest service.
 *
 * Samples are RDMA-written into the server's ring (rkey from the
 * out-of-band exchange) over a data QP driven with the extended post API.
 * Small batches are copied into a staging buffer registered at start-up;
 * large batches are written zero-copy from the caller's memory.  The
 * client RDMA-READs the server's head index, its series catalog and the
 * ack bitmap.  A second RC QP carries heartbeats.  Any device is accepted
 * (IB, RoCE or iWARP).
 *
 * Problems: the head index is read into memory without remote write, the
 * ack bitmap's rights are chosen by a transport test, zero-copy batches
 * are registered per batch (and leak when the post fails), the heartbeat
 * QP never asks for a completion, the commit marker's signaling counter
 * never moves, and the heartbeat QP's inline size is not checked.
 *
 * NOT-ANNOTATED: rdma-local-mr-management -- migration notes not annotated in this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define TS_SQ_DEPTH		4096
#define TS_CQ_DEPTH		(TS_SQ_DEPTH + 256)
#define TS_CTRL_DEPTH		64
#define TS_CTRL_INLINE		256
#define TS_SIG_EVERY		32
#define TS_FLUSH_BATCH		16
#define TS_STAGING		(4u << 20)
#define TS_ZCOPY_MIN		(256 * 1024)
#define TS_ACK_WORDS		64

#define TS_WRID_HEAD		(1ull << 62)
#define TS_WRID_CATALOG		(1ull << 61)
#define TS_WRID_ACKS		(1ull << 60)

struct ts_sample {
	uint64_t ts;
	uint32_t series;
	float value;
};

struct ts_batch {
	struct ts_batch *next;
	struct ts_sample *samples;
	size_t n;
	uint64_t seq;
	struct ibv_mr *mr;
	void (*release)(struct ts_batch *b);
};

struct ts_remote {
	uint32_t qpn, ctrl_qpn;
	union ibv_gid gid;
	uint64_t ring_addr, ring_size, head_addr, cat_addr, ack_addr;
	uint32_t ring_rkey, head_rkey, cat_rkey, ack_rkey;
	uint32_t cat_len;
};

struct ts_ctx {
	struct ibv_context *verbs;
	struct ibv_device_attr dev_attr;
	uint8_t port;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_qp *ctrl_qp;

	void *staging;
	struct ibv_mr *staging_mr;
	size_t staging_off;
	uint64_t remote_head;
	struct ibv_mr *head_mr;
	void *catalog;
	size_t catalog_len;
	struct ibv_mr *cat_mr;
	uint64_t ack_bits[TS_ACK_WORDS];
	struct ibv_mr *ack_mr;

	struct ts_remote remote;
	uint64_t ring_off;
	uint64_t seq;
	unsigned int since_signal;
	unsigned int unsig;
	uint32_t max_inline;
	struct ts_batch *pending;
	struct ts_batch **pending_tail;
};

/* Provided by the out-of-band bootstrap and the sample source. */
int ts_oob_connect(struct ts_ctx *ctx, struct ts_remote *remote);
struct ts_batch *ts_source_next(void);

static int ts_create_data_qp(struct ts_ctx *ctx)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = ctx->cq;
	attr.recv_cq = ctx->cq;
	attr.pd = ctx->pd;
	attr.sq_sig_all = 0;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE |
			      IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			      IBV_QP_EX_WITH_RDMA_READ;
	attr.cap.max_send_wr = TS_SQ_DEPTH;	// OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr just below
	if (attr.cap.max_send_wr > (uint32_t)ctx->dev_attr.max_qp_wr)
		attr.cap.max_send_wr = ctx->dev_attr.max_qp_wr;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 128;	// OK: rdma-queue-cap-unchecked -- the granted size is read back after creation

	ctx->qp = ibv_create_qp_ex(ctx->verbs, &attr);
	if (!ctx->qp)
		return -errno;
	ctx->max_inline = attr.cap.max_inline_data;
	ctx->qpx = ibv_qp_to_qp_ex(ctx->qp);
	return 0;
}

static int ts_create_ctrl_qp(struct ts_ctx *ctx)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = ctx->cq,
		.recv_cq = ctx->cq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,	// BUG(file): rdma-unsignaled-send-starvation -- heartbeats are never signaled, the control send queue fills after 64 beats
		.cap = {
			.max_send_wr = TS_CTRL_DEPTH,
			.max_recv_wr = 16,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = TS_CTRL_INLINE,	// BUG: rdma-queue-cap-unchecked -- 256 bytes of inline data, never checked nor read back
		},
	};

	ctx->ctrl_qp = ibv_create_qp(ctx->pd, &attr);
	return ctx->ctrl_qp ? 0 : -errno;
}

static int ts_register(struct ts_ctx *ctx)
{
	int ack_access = IBV_ACCESS_LOCAL_WRITE;

	ctx->staging = malloc(TS_STAGING);
	if (!ctx->staging)
		return -ENOMEM;
	ctx->staging_mr = ibv_reg_mr(ctx->pd, ctx->staging, TS_STAGING,
				     IBV_ACCESS_LOCAL_WRITE);	// OK: rdma-registration-in-datapath -- set up once before the streaming loop
	if (!ctx->staging_mr)
		goto err_staging;

	ctx->head_mr = ibv_reg_mr(ctx->pd, &ctx->remote_head, sizeof(ctx->remote_head),
				  IBV_ACCESS_LOCAL_WRITE);
	if (!ctx->head_mr)
		goto err_staging_mr;

	ctx->catalog_len = ctx->remote.cat_len;
	ctx->catalog = malloc(ctx->catalog_len);
	if (!ctx->catalog)
		goto err_head_mr;
	/* READ sink: on iWARP the responder places the data with this key */
	ctx->cat_mr = ibv_reg_mr(ctx->pd, ctx->catalog, ctx->catalog_len,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);	// OK: rdma-remote-access-overbroad -- REMOTE_WRITE on a READ sink is what iWARP needs
	if (!ctx->cat_mr)
		goto err_catalog;

	if (ctx->verbs->device->transport_type == IBV_TRANSPORT_IWARP)
		ack_access |= IBV_ACCESS_REMOTE_WRITE;
	// OK: rdma-remote-access-overbroad -- READ sink of ts_read_acks()
	ctx->ack_mr = ibv_reg_mr(ctx->pd, ctx->ack_bits, sizeof(ctx->ack_bits),
				 ack_access);	// BUG: rdma-access-flags-transport -- rights chosen by an inline iWARP test
	if (!ctx->ack_mr)
		goto err_catalog;	// BUG: rdma-mr-leak -- cat_mr is not deregistered on this path
	return 0;

err_catalog:
	free(ctx->catalog);	// BUG: rdma-invalidation-leak -- on the ack failure path the catalog is freed while cat_mr (remote write) stays registered
err_head_mr:
	ibv_dereg_mr(ctx->head_mr);	// OK: rdma-mr-leak -- the unwinding releases head_mr and staging_mr
err_staging_mr:
	ibv_dereg_mr(ctx->staging_mr);
err_staging:
	free(ctx->staging);
	return -ENOMEM;
}

/* The catalog only grows; the server announces its size with each head. */
static int ts_catalog_reserve(struct ts_ctx *ctx, size_t want)
{
	void *buf;

	if (want <= ctx->catalog_len)
		return 0;
	buf = malloc(want);
	if (!buf)
		return -ENOMEM;
	ibv_dereg_mr(ctx->cat_mr);
	free(ctx->catalog);	// OK: rdma-invalidation-leak -- the old registration is gone first
	ctx->catalog = buf;
	// OK: rdma-remote-access-overbroad -- READ sink
	ctx->cat_mr = ibv_reg_mr(ctx->pd, buf, want,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);	// OK: rdma-registration-in-datapath -- the catalog buffer only grows and is kept
	if (!ctx->cat_mr)
		return -ENOMEM;
	ctx->catalog_len = want;
	return 0;
}

static int ts_post_read(struct ts_ctx *ctx, uint64_t wr_id, uint32_t rkey,
			uint64_t raddr, uint32_t lkey, void *dst, uint32_t len)
{
	ibv_wr_start(ctx->qpx);
	ctx->qpx->wr_id = wr_id;
	ctx->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(ctx->qpx, rkey, raddr);
	ibv_wr_set_sge(ctx->qpx, lkey, (uintptr_t)dst, len);
	return ibv_wr_complete(ctx->qpx);
}

static void ts_handle_wc(struct ts_ctx *ctx, const struct ibv_wc *wc)
{
	struct ts_batch *b;

	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "ts: wr %#llx: %s\n", (unsigned long long)wc->wr_id,
			ibv_wc_status_str(wc->status));
		return;
	}
	if (wc->wr_id & (TS_WRID_HEAD | TS_WRID_CATALOG | TS_WRID_ACKS))
		return;
	/* One signaled WRITE retires every batch posted before it. */
	while ((b = ctx->pending) && b->seq <= wc->wr_id) {
		ctx->pending = b->next;
		if (!ctx->pending)
			ctx->pending_tail = &ctx->pending;
		if (b->mr)
			ibv_dereg_mr(b->mr);	// BUG: rdma-registration-in-datapath -- zero-copy batch deregistered on the completion path
		b->release(b);
	}
}

static int ts_wait(struct ts_ctx *ctx, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(ctx->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (!n)
			continue;
		ts_handle_wc(ctx, &wc);
		if (wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

static int ts_read_head(struct ts_ctx *ctx)
{
	int ret;

	ret = ts_post_read(ctx, TS_WRID_HEAD, ctx->remote.head_rkey,
			   ctx->remote.head_addr, ctx->head_mr->lkey,
			   &ctx->remote_head, sizeof(ctx->remote_head));	// BUG: rdma-access-flags-transport -- READ into head_mr, registered without REMOTE_WRITE; fails on iWARP
	return ret ? -EIO : ts_wait(ctx, TS_WRID_HEAD);
}

static int ts_read_catalog(struct ts_ctx *ctx, size_t len)
{
	int ret = ts_catalog_reserve(ctx, len);

	if (ret)
		return ret;
	ret = ts_post_read(ctx, TS_WRID_CATALOG, ctx->remote.cat_rkey,
			   ctx->remote.cat_addr, ctx->cat_mr->lkey,
			   ctx->catalog, (uint32_t)len);	// OK: rdma-access-flags-transport -- the catalog sink has REMOTE_WRITE
	return ret ? -EIO : ts_wait(ctx, TS_WRID_CATALOG);
}

static int ts_read_acks(struct ts_ctx *ctx)
{
	int ret;

	ret = ts_post_read(ctx, TS_WRID_ACKS, ctx->remote.ack_rkey,
			   ctx->remote.ack_addr, ctx->ack_mr->lkey,
			   ctx->ack_bits, sizeof(ctx->ack_bits));	// OK: rdma-access-flags-transport -- the sink gets REMOTE_WRITE on iWARP (the test itself is reported at the registration)
	return ret ? -EIO : ts_wait(ctx, TS_WRID_ACKS);
}

static int ts_push_small(struct ts_ctx *ctx, const struct ts_batch *b)
{
	size_t bytes = b->n * sizeof(*b->samples);
	char *dst;

	if (ctx->staging_off + bytes > TS_STAGING)
		ctx->staging_off = 0;
	dst = (char *)ctx->staging + ctx->staging_off;
	memcpy(dst, b->samples, bytes);

	ibv_wr_start(ctx->qpx);
	ctx->qpx->wr_id = ctx->seq++;
	ctx->qpx->wr_flags = (++ctx->since_signal % TS_SIG_EVERY) ? 0 : IBV_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- every 32nd write is signaled; the counter advances on each post
	ibv_wr_rdma_write(ctx->qpx, ctx->remote.ring_rkey,
			  ctx->remote.ring_addr + ctx->ring_off % ctx->remote.ring_size);
	ibv_wr_set_sge(ctx->qpx, ctx->staging_mr->lkey, (uintptr_t)dst, (uint32_t)bytes);
	if (ibv_wr_complete(ctx->qpx))
		return -EIO;
	ctx->staging_off += bytes;
	ctx->ring_off += bytes;
	return 0;
}

static int ts_push_batch(struct ts_ctx *ctx, struct ts_batch *b)
{
	size_t bytes = b->n * sizeof(*b->samples);

	b->mr = ibv_reg_mr(ctx->pd, b->samples, bytes, 0);	// BUG: rdma-registration-in-datapath -- every large batch is registered on the submit path
	if (!b->mr)
		return -errno;

	b->seq = ctx->seq++;
	ibv_wr_start(ctx->qpx);
	ctx->qpx->wr_id = b->seq;
	ctx->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(ctx->qpx, ctx->remote.ring_rkey,
			  ctx->remote.ring_addr + ctx->ring_off % ctx->remote.ring_size);
	ibv_wr_set_sge(ctx->qpx, b->mr->lkey, (uintptr_t)b->samples, (uint32_t)bytes);
	if (ibv_wr_complete(ctx->qpx))
		return -EIO;	// BUG: rdma-mr-leak -- the batch's MR stays registered when the post fails

	ctx->ring_off += bytes;
	b->next = NULL;
	*ctx->pending_tail = b;
	ctx->pending_tail = &b->next;
	return 0;
}

/* Tell the server how far the ring is filled. */
static int ts_commit(struct ts_ctx *ctx)
{
	unsigned int flags = 0;

	if (ctx->unsig >= TS_FLUSH_BATCH) {	// BUG: rdma-unsignaled-send-starvation -- ctx->unsig is only ever reset, the commit is never signaled
		flags = IBV_SEND_SIGNALED;
		ctx->unsig = 0;
	}
	ibv_wr_start(ctx->qpx);
	ctx->qpx->wr_id = ctx->seq++;
	ctx->qpx->wr_flags = flags;
	ibv_wr_rdma_write_imm(ctx->qpx, ctx->remote.ring_rkey, ctx->remote.ring_addr,
			      htobe32((uint32_t)(ctx->ring_off % ctx->remote.ring_size)));
	ibv_wr_set_sge(ctx->qpx, ctx->staging_mr->lkey, (uintptr_t)ctx->staging, 0);
	return ibv_wr_complete(ctx->qpx) ? -EIO : 0;
}

static int ts_heartbeat(struct ts_ctx *ctx, uint64_t now)
{
	struct ibv_sge sge = { .addr = (uintptr_t)&now, .length = sizeof(now) };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_INLINE;
	return ibv_post_send(ctx->ctrl_qp, &wr, &bad);
}

static void ts_reap(struct ts_ctx *ctx)
{
	struct ibv_wc wc[32];
	int n, i;

	while ((n = ibv_poll_cq(ctx->cq, 32, wc)) > 0)
		for (i = 0; i < n; i++)
			ts_handle_wc(ctx, &wc[i]);
}

static int ts_run(struct ts_ctx *ctx)
{
	struct ts_batch *b;
	uint64_t tick = 0;
	int ret;

	ctx->pending_tail = &ctx->pending;
	ret = ts_read_catalog(ctx, ctx->remote.cat_len);

	while (!ret && (b = ts_source_next()) != NULL) {
		if (b->n * sizeof(*b->samples) < TS_ZCOPY_MIN) {
			ret = ts_push_small(ctx, b);
			b->release(b);
		} else {
			ret = ts_push_batch(ctx, b);
		}
		if (++tick % 64 == 0) {
			ret = ret ?: ts_commit(ctx);
			ret = ret ?: ts_heartbeat(ctx, tick);
			ret = ret ?: ts_read_head(ctx);
			ret = ret ?: ts_read_acks(ctx);
		}
		ts_reap(ctx);
	}
	return ret;
}

static void ts_close(struct ts_ctx *ctx)
{
	struct ts_batch *b;

	ibv_destroy_qp(ctx->ctrl_qp);
	ibv_destroy_qp(ctx->qp);
	while ((b = ctx->pending) != NULL) {
		ctx->pending = b->next;
		ibv_dereg_mr(b->mr);
		b->release(b);
	}
	ibv_dereg_mr(ctx->ack_mr);
	ibv_dereg_mr(ctx->cat_mr);
	free(ctx->catalog);	// OK: rdma-invalidation-leak -- deregistered on the line above
	ibv_dereg_mr(ctx->head_mr);
	ibv_dereg_mr(ctx->staging_mr);
	free(ctx->staging);
	ibv_destroy_cq(ctx->cq);
	ibv_dealloc_pd(ctx->pd);
	ibv_close_device(ctx->verbs);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ts_ctx ctx;
	int i, num, ret;

	memset(&ctx, 0, sizeof(ctx));
	list = ibv_get_device_list(&num);
	if (!list)
		return 1;
	for (i = 0; i < num; i++) {
		if (argc > 1 && strcmp(ibv_get_device_name(list[i]), argv[1]))
			continue;
		ctx.verbs = ibv_open_device(list[i]);
		break;
	}
	ibv_free_device_list(list);
	if (!ctx.verbs || ibv_query_device(ctx.verbs, &ctx.dev_attr))
		return 1;
	ctx.port = 1;
	ctx.pd = ibv_alloc_pd(ctx.verbs);
	ctx.cq = ibv_create_cq(ctx.verbs, TS_CQ_DEPTH, NULL, NULL, 0);
	if (!ctx.pd || !ctx.cq)
		return 1;
	if (ts_create_data_qp(&ctx) || ts_create_ctrl_qp(&ctx))
		return 1;
	if (ts_oob_connect(&ctx, &ctx.remote))
		return 1;
	if (ts_register(&ctx))
		return 1;
	ret = ts_run(&ctx);
	ts_close(&ctx);
	return ret ? 1 : 0;
}
