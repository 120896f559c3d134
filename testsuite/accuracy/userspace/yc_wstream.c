/*
 * wstream.c - push a staged log to a remote target with pipelined RDMA WRITEs.
 *
 * The target accepts the rdma_cm connection and hands out (in the accept's
 * private data) the address and rkey of its landing region.  The source log
 * is staged in a registered arena in WS_BLOCK_SIZE blocks that are not
 * contiguous (blk_map[] gives the arena block of each log block), so one
 * chunk is one RDMA WRITE with one SGE per block.  Up to WS_WINDOW chunks are
 * kept in flight; every WS_SIGNAL_BATCH-th WRITE (and the last one) is
 * signaled, and its completion retires all chunks up to it.  The target
 * sends a progress message whenever it has made data durable; a FIN SEND
 * ends the stream.
 *
 * The window (WS_WINDOW WRITEs outstanding) is twice the send queue the QP
 * is created with, so a full window overruns the queue and the stream aborts
 * on the failed post.  The SGE count is clamped to the device, inline data is
 * retried without inline when refused, but the receive depth is never
 * compared with max_qp_wr.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-registration-in-datapath,
 *   rdma-local-mr-management, rdma-invalidation-leak,
 *   rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked,
 *   rdma-send-queue-manual-factor -- not covered by this file's annotations
 */
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define WS_SQ_DEPTH		128
#define WS_WINDOW		256
#define WS_BLOCK_SIZE		(16 * 1024)
#define WS_SIGNAL_BATCH		16
#define WS_MAX_SGE		8
#define WS_INLINE_WANT		128
#define WS_RECV_DEPTH		2048
#define WS_TIMEOUT_MS		2000
#define WS_FIN_MAGIC		0x57534649u
#define WS_WRID_FIN		((uint64_t)-1)

#define WS_ERRLOG(fmt, ...)	fprintf(stderr, "wstream: " fmt, ##__VA_ARGS__)

struct ws_target_info {
	uint64_t	addr;
	uint32_t	rkey;
	uint32_t	len;
};

struct ws_progress {
	uint64_t	durable_off;
	uint32_t	flags;
	uint32_t	pad;
};

struct ws_fin {
	uint64_t	total;
	uint32_t	magic;
	uint32_t	pad;
};

struct ws_chunk {
	uint32_t		idx;
	uint32_t		len;
	uint64_t		off;
	int			signaled;
	struct ibv_sge		sge[WS_MAX_SGE];
	struct ibv_send_wr	wr;
};

struct ws_qpair {
	struct rdma_event_channel	*ec;
	struct rdma_cm_id		*cm_id;
	struct ibv_pd			*pd;
	struct ibv_cq			*cq;
	struct ibv_qp			*qp;
	struct ibv_mr			*arena_mr;
	char				*arena;
	const uint32_t			*blk_map;
	uint64_t			total;
	struct ibv_mr			*rx_mr;
	struct ws_progress		*rx;
	struct ws_fin			fin;
	struct ws_target_info		tgt;
	uint32_t			max_sge;
	uint32_t			max_inline;
	uint32_t			head;
	uint32_t			tail;
	uint32_t			inflight;
	uint32_t			sig_countdown;
	uint64_t			next_off;
	uint64_t			durable_off;
	int				fin_done;
	struct ws_chunk			chunks[WS_WINDOW];
};

static int ws_qpair_create_qp(struct ws_qpair *q)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr attr;
	int rc;

	if (ibv_query_device(q->cm_id->verbs, &dattr))
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = WS_SQ_DEPTH; /* BUG(file): rdma-send-queue-undersized -- ws_pump() keeps up to WS_WINDOW (256) chunk WRITEs in flight, one entry each, on a 128-entry queue */
	attr.cap.max_recv_wr = WS_RECV_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 2048 receives; only max_sge is compared with the device, max_qp_wr never is */
	attr.cap.max_send_sge = WS_MAX_SGE < dattr.max_sge ? WS_MAX_SGE : dattr.max_sge; /* OK: rdma-queue-cap-unchecked -- clamped to max_sge */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = WS_INLINE_WANT; /* OK: rdma-queue-cap-unchecked -- retried without inline if refused; the granted size is read back */

	rc = rdma_create_qp(q->cm_id, q->pd, &attr);
	if (rc && errno == EINVAL) {
		attr.cap.max_inline_data = 0;
		rc = rdma_create_qp(q->cm_id, q->pd, &attr);
	}
	if (rc) {
		WS_ERRLOG("rdma_create_qp: %s\n", strerror(errno));
		return -errno;
	}
	q->qp = q->cm_id->qp;
	q->max_sge = attr.cap.max_send_sge;
	q->max_inline = attr.cap.max_inline_data;
	return 0;
}

static int ws_post_rx(struct ws_qpair *q, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&q->rx[slot], .length = sizeof(q->rx[slot]),
		.lkey = q->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

static void ws_chunk_prep(struct ws_qpair *q, struct ws_chunk *c)
{
	uint64_t blk = q->next_off / WS_BLOCK_SIZE;
	uint32_t n = 0;

	c->off = q->next_off;
	c->len = 0;
	while (n < q->max_sge && c->off + c->len < q->total) {
		uint64_t left = q->total - (c->off + c->len);
		uint32_t len = left < WS_BLOCK_SIZE ? (uint32_t)left : WS_BLOCK_SIZE;

		c->sge[n].addr = (uintptr_t)q->arena + (uint64_t)q->blk_map[blk + n] * WS_BLOCK_SIZE;
		c->sge[n].length = len;
		c->sge[n].lkey = q->arena_mr->lkey;
		c->len += len;
		n++;
	}

	memset(&c->wr, 0, sizeof(c->wr));
	c->wr.wr_id = c->idx;
	c->wr.sg_list = c->sge;
	c->wr.num_sge = n;
	c->wr.wr.rdma.remote_addr = q->tgt.addr + c->off;
	c->wr.wr.rdma.rkey = q->tgt.rkey;
}

static int ws_post_chunk(struct ws_qpair *q, struct ws_chunk *c, int last)
{
	struct ibv_send_wr *bad;

	c->wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	c->wr.imm_data = last ? htonl(WS_FIN_MAGIC) : 0;
	c->wr.send_flags = 0;
	c->signaled = 0;
	if (--q->sig_countdown == 0 || last) { /* OK: rdma-unsignaled-send-starvation -- the countdown drops on every WRITE and is reloaded when it signals */
		c->wr.send_flags |= IBV_SEND_SIGNALED;
		q->sig_countdown = WS_SIGNAL_BATCH;
		c->signaled = 1;
	}
	return ibv_post_send(q->qp, &c->wr, &bad);
}

static int ws_pump(struct ws_qpair *q)
{
	int rc;

	while (q->inflight < WS_WINDOW && q->next_off < q->total) {
		struct ws_chunk *c = &q->chunks[q->head];

		ws_chunk_prep(q, c);
		rc = ws_post_chunk(q, c, q->next_off + c->len == q->total);
		if (rc) {
			WS_ERRLOG("post chunk at %llu: %s\n",
				  (unsigned long long)c->off, strerror(rc));
			return -rc;
		}
		q->next_off += c->len;
		q->head = (q->head + 1) % WS_WINDOW;
		q->inflight++;
	}
	return 0;
}

/* A signaled WRITE completed: every chunk posted before it is done too. */
static void ws_retire(struct ws_qpair *q, uint32_t idx)
{
	for (;;) {
		uint32_t t = q->tail;

		q->tail = (q->tail + 1) % WS_WINDOW;
		q->inflight--;
		if (t == idx)
			break;
	}
}

static int ws_send_fin(struct ws_qpair *q)
{
	struct ibv_sge sge = { .addr = (uintptr_t)&q->fin, .length = sizeof(q->fin) };
	struct ibv_send_wr wr, *bad;

	q->fin.total = q->total;
	q->fin.magic = WS_FIN_MAGIC;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = WS_WRID_FIN;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE; /* OK: rdma-unsignaled-send-starvation -- FIN is signaled and waited for */
	if (q->max_inline < sizeof(q->fin))
		return -ENOTSUP;
	return ibv_post_send(q->qp, &wr, &bad);
}

static int ws_poll(struct ws_qpair *q)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(q->cq, 32, wc);
	if (n < 0)
		return -EIO;
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			WS_ERRLOG("completion error %s (wr_id %llu)\n",
				  ibv_wc_status_str(wc[i].status),
				  (unsigned long long)wc[i].wr_id);
			return -EIO;
		}
		if (wc[i].opcode == IBV_WC_RECV) {
			struct ws_progress *pr = &q->rx[wc[i].wr_id];

			if (pr->durable_off > q->durable_off)
				q->durable_off = pr->durable_off;
			if (ws_post_rx(q, (uint32_t)wc[i].wr_id))
				return -EIO;
		} else if (wc[i].wr_id == WS_WRID_FIN) {
			q->fin_done = 1;
		} else {
			ws_retire(q, (uint32_t)wc[i].wr_id);
		}
	}
	return 0;
}

static int ws_wait_event(struct ws_qpair *q, enum rdma_cm_event_type want,
			 struct ws_target_info *info)
{
	struct rdma_cm_event *ev;
	int rc = 0;

	if (rdma_get_cm_event(q->ec, &ev))
		return -errno;
	if (ev->event != want) {
		WS_ERRLOG("unexpected cm event %s\n", rdma_event_str(ev->event));
		rc = -ECONNREFUSED;
	} else if (info) {
		if (ev->param.conn.private_data_len < sizeof(*info))
			rc = -EPROTO;
		else
			memcpy(info, ev->param.conn.private_data, sizeof(*info));
	}
	rdma_ack_cm_event(ev);
	return rc;
}

int ws_connect(struct ws_qpair *q, const char *host, const char *port)
{
	struct rdma_conn_param param = { .responder_resources = 1,
					 .initiator_depth = 1, .retry_count = 7,
					 .rnr_retry_count = 7 };
	struct addrinfo *ai;
	uint32_t i;
	int rc;

	q->ec = rdma_create_event_channel();
	if (!q->ec || rdma_create_id(q->ec, &q->cm_id, q, RDMA_PS_TCP))
		return -errno;
	if (getaddrinfo(host, port, NULL, &ai))
		return -EHOSTUNREACH;
	rc = rdma_resolve_addr(q->cm_id, NULL, ai->ai_addr, WS_TIMEOUT_MS);
	freeaddrinfo(ai);
	if (rc || (rc = ws_wait_event(q, RDMA_CM_EVENT_ADDR_RESOLVED, NULL)))
		return rc ? rc : -errno;

	q->pd = ibv_alloc_pd(q->cm_id->verbs);
	q->cq = ibv_create_cq(q->cm_id->verbs, WS_SQ_DEPTH + WS_RECV_DEPTH, NULL, NULL, 0);
	if (!q->pd || !q->cq)
		return -ENOMEM;
	rc = ws_qpair_create_qp(q);
	if (rc)
		return rc;

	q->rx = calloc(WS_RECV_DEPTH, sizeof(*q->rx));
	if (!q->rx)
		return -ENOMEM;
	q->rx_mr = ibv_reg_mr(q->pd, q->rx, WS_RECV_DEPTH * sizeof(*q->rx),
			      IBV_ACCESS_LOCAL_WRITE);
	if (!q->rx_mr)
		return -errno;
	for (i = 0; i < WS_RECV_DEPTH; i++)
		if (ws_post_rx(q, i))
			return -EIO;

	if (rdma_resolve_route(q->cm_id, WS_TIMEOUT_MS) ||
	    (rc = ws_wait_event(q, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL)))
		return rc ? rc : -errno;
	if (rdma_connect(q->cm_id, &param))
		return -errno;
	return ws_wait_event(q, RDMA_CM_EVENT_ESTABLISHED, &q->tgt);
}

int ws_stream(struct ws_qpair *q, char *arena, size_t arena_len,
	      const uint32_t *blk_map, uint64_t total)
{
	uint32_t i;
	int rc;

	if (total > q->tgt.len)
		return -ENOSPC;
	q->arena_mr = ibv_reg_mr(q->pd, arena, arena_len, IBV_ACCESS_LOCAL_WRITE);
	if (!q->arena_mr)
		return -errno;
	q->arena = arena;
	q->blk_map = blk_map;
	q->total = total;
	q->sig_countdown = WS_SIGNAL_BATCH;
	for (i = 0; i < WS_WINDOW; i++)
		q->chunks[i].idx = i;

	while (q->next_off < q->total || q->inflight) {
		rc = ws_pump(q);
		if (rc == 0)
			rc = ws_poll(q);
		if (rc)
			goto out;
	}
	rc = ws_send_fin(q);
	while (rc == 0 && !q->fin_done)
		rc = ws_poll(q);
out:
	ibv_dereg_mr(q->arena_mr);
	q->arena_mr = NULL;
	return rc;
}
