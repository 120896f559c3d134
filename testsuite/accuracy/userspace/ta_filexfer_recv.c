/*
 * ta_filexfer_recv.c - receiving side of an RDMA file copy tool
 *
 * perftest-style single-connection tool.  The receiver offers chunk slots to
 * the sender with CREDIT messages; the sender RDMA-WRITEs a chunk into the
 * slot and reports it with CHUNK_DONE, and the receiver appends the chunk to
 * the output file and offers the slot again.
 *
 * Two ways to expose a slot:
 *   --mw  (default) a type 2 window per slot, bound with ibv_wr_bind_mw()
 *         over the pre-registered ring (LOCAL_WRITE | MW_BIND); the sender
 *         sends CHUNK_DONE as SEND_WITH_INV of the slot's rkey.
 *   --reg for devices without windows: every offer registers the slot's own
 *         buffer with REMOTE_WRITE and deregisters it when the chunk is in.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not part of this review
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SUCCESS		0
#define FAILURE		1
#define NUM_SLOTS	8
#define CHUNK_SIZE	(4 * 1024 * 1024)

enum { MSG_CREDIT = 1, MSG_CHUNK_DONE, MSG_EOF, MSG_RETRY, MSG_SLOT_ABORT };
enum { WRID_RECV = 0x100, WRID_SEND = 0x200, WRID_BIND = 0x300, WRID_INV = 0x400 };

struct xfer_msg {
	uint32_t	type;
	uint32_t	slot;
	uint32_t	rkey;
	uint32_t	len;
	uint64_t	addr;
	uint64_t	offset;
	uint32_t	csum;
};

struct xfer_slot {
	int		busy;
	struct ibv_mw	*mw;
	uint32_t	rkey;
	char		*buf;
	struct ibv_mr	*mr;		/* --reg only */
	struct xfer_msg	credit;
};

struct xfer_context {
	struct rdma_cm_id	*cm_id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	int			use_mw;
	int			out_fd;
	int			eof;
	char			*ring;
	struct ibv_mr		*ring_mr;
	struct xfer_slot	slots[NUM_SLOTS];
	struct xfer_msg		rx[NUM_SLOTS];
	struct ibv_mr		*msg_mr;	/* covers rx[] */
};

static uint32_t chunk_csum(const char *p, uint32_t len)
{
	uint32_t a = 1, b = 0;

	while (len--) {
		a = (a + (uint8_t)*p++) % 65521;
		b = (b + a) % 65521;
	}
	return (b << 16) | a;
}

static struct xfer_slot *ctx_get_slot(struct xfer_context *ctx)
{
	int i;

	for (i = 0; i < NUM_SLOTS; i++) {
		if (!ctx->slots[i].busy) {
			ctx->slots[i].busy = 1;
			return &ctx->slots[i];
		}
	}
	return NULL;
}

static void ctx_fill_credit(struct xfer_slot *s, int idx, uint32_t rkey, uint32_t type)
{
	s->credit.type = type;
	s->credit.slot = idx;
	s->credit.rkey = rkey;
	s->credit.addr = (uintptr_t)s->buf;
	s->credit.len = CHUNK_SIZE;
}

static int ctx_offer_slot(struct xfer_context *ctx, struct xfer_slot *s)
{
	int idx = s - ctx->slots;
	struct ibv_mw_bind_info bi = {
		.mr = ctx->ring_mr, .addr = (uintptr_t)s->buf, .length = CHUNK_SIZE,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	if (!ctx->use_mw) {
		s->mr = ibv_reg_mr(ctx->pd, s->buf, CHUNK_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!s->mr)
			return FAILURE;
		ctx_fill_credit(s, idx, s->mr->rkey, MSG_CREDIT);
		ibv_wr_start(ctx->qpx);
	} else {
		s->rkey = ibv_inc_rkey(s->rkey);
		ctx_fill_credit(s, idx, s->rkey, MSG_CREDIT);
		ibv_wr_start(ctx->qpx);
		ctx->qpx->wr_id = WRID_BIND | idx;
		ctx->qpx->wr_flags = 0;
		ibv_wr_bind_mw(ctx->qpx, s->mw, s->rkey, &bi); /* OK: rdma-rkey-reuse -- s->rkey was rotated before the bind */
	}
	ctx->qpx->wr_id = WRID_SEND | idx;
	ctx->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ctx->qpx);
	ibv_wr_set_inline_data(ctx->qpx, &s->credit, sizeof(s->credit));
	return ibv_wr_complete(ctx->qpx) ? FAILURE : SUCCESS;
}

/* bad checksum: let the sender write the same chunk again */
static int ctx_offer_next(struct xfer_context *ctx)
{
	struct xfer_slot *s = ctx_get_slot(ctx);

	return s ? ctx_offer_slot(ctx, s) : SUCCESS;
}

static int ctx_retry_slot(struct xfer_context *ctx, struct xfer_slot *s)
{
	int idx = s - ctx->slots;
	struct ibv_mw_bind_info bi = {
		.mr = ctx->ring_mr, .addr = (uintptr_t)s->buf, .length = CHUNK_SIZE,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	ctx_fill_credit(s, idx, ctx->use_mw ? s->rkey : s->mr->rkey, MSG_RETRY);
	ibv_wr_start(ctx->qpx);
	if (ctx->use_mw) {
		/* CHUNK_DONE killed the window; restore it under the key the sender has */
		ctx->qpx->wr_id = WRID_BIND | idx;
		ctx->qpx->wr_flags = 0;
		ibv_wr_bind_mw(ctx->qpx, s->mw, s->rkey, &bi); /* BUG: rdma-rkey-reuse -- rebinds the window under the rkey that was just invalidated */
	}
	ctx->qpx->wr_id = WRID_SEND | idx;
	ctx->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ctx->qpx);
	ibv_wr_set_inline_data(ctx->qpx, &s->credit, sizeof(s->credit));
	return ibv_wr_complete(ctx->qpx) ? FAILURE : SUCCESS;
}

static int ctx_local_inv(struct xfer_context *ctx, struct xfer_slot *s, unsigned int flags)
{
	ibv_wr_start(ctx->qpx);
	ctx->qpx->wr_id = WRID_INV | (s - ctx->slots);
	ctx->qpx->wr_flags = flags;
	ibv_wr_local_inv(ctx->qpx, s->rkey);
	return ibv_wr_complete(ctx->qpx);
}

static int ctx_handle_chunk_done(struct xfer_context *ctx, struct ibv_wc *wc, struct xfer_msg *msg)
{
	struct xfer_slot *s = &ctx->slots[msg->slot];

	if (ctx->use_mw && !((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == s->rkey)) {
		/* protocol violation: kill the window ourselves and stop */
		fprintf(stderr, " Slot %u: sender did not invalidate rkey 0x%x\n", msg->slot, s->rkey);
		ctx_local_inv(ctx, s, IBV_SEND_SIGNALED);
		return FAILURE;
	}

	if (chunk_csum(s->buf, msg->len) != msg->csum)
		return ctx_retry_slot(ctx, s);

	if (pwrite(ctx->out_fd, s->buf, msg->len, msg->offset) != (ssize_t)msg->len) {
		perror(" pwrite");
		return FAILURE;
	}
	if (!ctx->use_mw) {
		ibv_dereg_mr(s->mr);
		s->mr = NULL;
	}
	s->busy = 0; /* OK: rdma-invalidation-leak, rdma-remote-invalidate-unchecked -- window killed by a SEND_WITH_INV of its own rkey, or the slot's MR deregistered */
	return ctx_offer_next(ctx);
}

static int ctx_handle_eof(struct xfer_context *ctx, struct ibv_wc *wc, struct xfer_msg *msg)
{
	struct xfer_slot *s = &ctx->slots[msg->slot];

	ctx->eof = 1;
	if (!ctx->use_mw)
		return SUCCESS;
	/* EOF hands back the credit the sender did not use, invalidating its window */
	if (wc->wc_flags & IBV_WC_WITH_INV)
		s->busy = 0; /* BUG: rdma-remote-invalidate-unchecked -- does not check which rkey the sender invalidated */
	return SUCCESS;
}

static void ctx_handle_inv_done(struct xfer_context *ctx, struct ibv_wc *wc)
{
	struct xfer_slot *s = &ctx->slots[wc->wr_id & 0xff];

	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, " LOCAL_INV failed on slot %lu: %s\n",
			(unsigned long)(wc->wr_id & 0xff), ibv_wc_status_str(wc->status));
		return;
	}
	s->busy = 0; /* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
	if (!ctx->eof)
		ctx_offer_next(ctx);
}

/* sender gave up on one slot */
static int ctx_abort_slot(struct xfer_context *ctx, struct xfer_slot *s)
{
	struct ibv_wc wc;
	int ne;

	if (!ctx->use_mw) {
		ibv_dereg_mr(s->mr);
		s->mr = NULL;
		s->busy = 0; /* OK: rdma-invalidation-leak -- the slot's MR was deregistered */
		return SUCCESS;
	}
	if (ctx_local_inv(ctx, s, IBV_SEND_SIGNALED))
		return FAILURE;
	do {
		ne = ibv_poll_cq(ctx->cq, 1, &wc);
	} while (ne == 0 || (ne == 1 && (wc.wr_id & 0xf00) != WRID_INV));
	if (ne < 0 || wc.status != IBV_WC_SUCCESS)
		return FAILURE;
	s->busy = 0; /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- waited for the LOCAL_INV completion */
	return SUCCESS;
}

int ctx_poll(struct xfer_context *ctx)
{
	struct ibv_wc wc[NUM_SLOTS];
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad;
	int ne, i, rc = SUCCESS;

	ne = ibv_poll_cq(ctx->cq, NUM_SLOTS, wc);
	if (ne < 0)
		return FAILURE;
	for (i = 0; i < ne && rc == SUCCESS; i++) {
		uint64_t kind = wc[i].wr_id & 0xf00;
		struct xfer_msg *msg;

		if (kind == WRID_INV) {
			ctx_handle_inv_done(ctx, &wc[i]);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, " Completion with error: %s\n", ibv_wc_status_str(wc[i].status));
			return FAILURE;
		}
		if (kind != WRID_RECV)
			continue;

		msg = &ctx->rx[wc[i].wr_id & 0xff];
		if (msg->slot >= NUM_SLOTS)
			return FAILURE;
		if (msg->type == MSG_CHUNK_DONE)
			rc = ctx_handle_chunk_done(ctx, &wc[i], msg);
		else if (msg->type == MSG_EOF)
			rc = ctx_handle_eof(ctx, &wc[i], msg);
		else if (msg->type == MSG_SLOT_ABORT)
			rc = ctx_abort_slot(ctx, &ctx->slots[msg->slot]);

		sge.addr = (uintptr_t)msg;
		sge.length = sizeof(*msg);
		sge.lkey = ctx->msg_mr->lkey;
		rwr.wr_id = wc[i].wr_id;
		rwr.next = NULL;
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		if (ibv_post_recv(ctx->qp, &rwr, &bad))
			return FAILURE;
	}
	return rc;
}

/* transfer finished: withdraw whatever the sender can still reach */
void ctx_finish(struct xfer_context *ctx)
{
	int i;

	for (i = 0; i < NUM_SLOTS; i++) {
		if (!ctx->slots[i].busy || !ctx->use_mw)
			continue;
		ctx_local_inv(ctx, &ctx->slots[i], 0);
	}
	if (ctx->use_mw) {
		/* OK: rdma-invalidation-leak -- idle slots' windows are already dead and busy ones got a LOCAL_INV */
		free(ctx->ring); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INVs above may not have executed yet */
		ctx->ring = NULL;
	}
}

int ctx_destroy(struct xfer_context *ctx)
{
	int i, rc = SUCCESS;

	if (ctx->use_mw) {
		for (i = 0; i < NUM_SLOTS; i++)
			if (ctx->slots[i].mw && ibv_dealloc_mw(ctx->slots[i].mw))
				rc = FAILURE;
		if (ctx->ring_mr)
			ibv_dereg_mr(ctx->ring_mr);
		free(ctx->ring); /* OK: rdma-invalidation-leak -- all windows deallocated first */
	} else {
		for (i = 0; i < NUM_SLOTS; i++)
			free(ctx->slots[i].buf); /* BUG: rdma-invalidation-leak -- slot buffers are freed while their REMOTE_WRITE MRs are still registered */
		for (i = 0; i < NUM_SLOTS; i++)
			if (ctx->slots[i].mr)
				ibv_dereg_mr(ctx->slots[i].mr);
	}
	ibv_dereg_mr(ctx->msg_mr);
	rdma_destroy_qp(ctx->cm_id);
	return rc;
}

/* rdma_cm listen/accept, QP with SEND | BIND_MW | LOCAL_INV send ops, ring
 * and message registration, window allocation: xfer_common.c */
int xfer_setup(struct xfer_context *ctx, const char *port);

int main(int argc, char *argv[])
{
	struct xfer_context ctx = { .use_mw = 1, .out_fd = -1 };
	const char *port = "18515";
	int op;

	while ((op = getopt(argc, argv, "rp:o:")) != -1) {
		switch (op) {
		case 'r':
			ctx.use_mw = 0;
			break;
		case 'p':
			port = optarg;
			break;
		case 'o':
			ctx.out_fd = open(optarg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			break;
		default:
			fprintf(stderr, "usage: %s [-r] [-p port] -o <file>\n", argv[0]);
			return FAILURE;
		}
	}
	if (ctx.out_fd < 0) {
		fprintf(stderr, " Couldn't open output file\n");
		return FAILURE;
	}
	if (xfer_setup(&ctx, port) != SUCCESS) {
		fprintf(stderr, " Couldn't set up the connection\n");
		return FAILURE;
	}
	while (!ctx.eof)
		if (ctx_poll(&ctx) != SUCCESS)
			break;
	ctx_finish(&ctx);
	ctx_destroy(&ctx);
	close(ctx.out_fd);
	return SUCCESS;
}
