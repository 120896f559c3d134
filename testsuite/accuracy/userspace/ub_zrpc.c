/*
 * ub_zrpc.c - zero-copy RPC transport in the style of eRPC/MICA's RDMA
 * transport: one RC QP per session, wr_id dispatch, free lists.
 *
 * Small messages travel in buffers carved out of one pre-registered pool.
 * Large requests are zero-copy: the caller's buffer is registered for the
 * message and its address/rkey ride in the header; the server pulls the
 * payload with RDMA READ into a pool buffer and pushes the result back in
 * place with an RDMA WRITE chained in front of the response SEND.  Each
 * server also exposes a MICA-style value arena that clients read (and, with
 * allow_put, write) one-sided; its rkey is announced in HELLO.  Sends are
 * unsignaled except every cfg.sig_every-th; the SQ depth comes from config.
 *
 * Not right: per-message (de)registration on the request/response path, an
 * MR leak when slots run out, the timeout path dropping the slot's MR and
 * recycling the slot while its key is live, the arena freed before
 * deregistration, put rights without local write, READ into a pool without
 * remote write, 8 SGEs unchecked, and an SQ sized one WR per credit
 * although a large response posts two.
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define ZRPC_MAX_SGE		8
#define ZRPC_LARGE_THRESH	(16 * 1024)
#define ZRPC_MAX_SSLOTS		64
#define ZRPC_HDR_MAGIC		0x5a52
#define ZRPC_POLL_BATCH		16
#define ZRPC_TXQ		256	/* power of two */

enum zrpc_wr_kind { ZWR_SEND = 1, ZWR_READ, ZWR_RESP, ZWR_RECV };
#define ZRPC_WRID(kind, idx)	(((uint64_t)(kind) << 32) | (uint32_t)(idx))
#define ZRPC_WRID_KIND(id)	((uint32_t)((id) >> 32))
#define ZRPC_WRID_IDX(id)	((uint32_t)(id))

enum { ZT_REQ = 1, ZT_RESP, ZT_LARGE_REQ, ZT_HELLO };

struct zrpc_cfg {
	uint32_t credits;	/* requests in flight per session */
	uint32_t sig_every;	/* signal one send in this many */
	uint32_t inline_max, nmsgbufs;
	size_t   msgbuf_size, arena_size;
	int      allow_put;	/* clients may RDMA WRITE into the arena */
	uint64_t timeout_ns;
};

struct zrpc_hdr {
	uint16_t magic;
	uint8_t  type, flags;
	uint32_t slot, len, rkey;
	uint64_t addr;
} __attribute__((packed));

struct zrpc_msgbuf { struct zrpc_msgbuf *next; uint8_t *buf; uint32_t idx; };

typedef void (*zrpc_cont_fn)(void *tag, int status, void *buf, size_t len);
typedef size_t (*zrpc_handler_fn)(void *req, size_t len, void *resp, size_t max);

struct zrpc_sslot {
	struct zrpc_sslot *next;
	uint32_t idx;
	int in_use;
	uint64_t deadline;
	struct ibv_mr *large_mr;	/* caller's buffer, exposed to the server */
	void *large_buf;
	size_t large_len;
	zrpc_cont_fn cont;
	void *tag;
};

/* server side: in-place response of a large request, WRITE then SEND */
struct zrpc_resp_ctx {
	struct ibv_send_wr write_wr, send_wr;
	struct ibv_sge write_sge, send_sge;
	struct zrpc_msgbuf *data_mb, *hdr_mb;
	uint64_t raddr;
	uint32_t rkey, client_slot;
};

struct zrpc {
	struct zrpc_cfg cfg;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;

	uint8_t *pool_mem;
	struct ibv_mr *pool_mr;
	struct zrpc_msgbuf *mbufs, *mb_free;

	void *arena;
	struct ibv_mr *arena_mr;

	struct zrpc_sslot sslots[ZRPC_MAX_SSLOTS], *ss_free;
	struct zrpc_resp_ctx resp[ZRPC_MAX_SSLOTS];
	zrpc_handler_fn handler;

	/* sent buffers, reclaimed in order when a signaled send completes */
	struct zrpc_msgbuf *txq[ZRPC_TXQ];
	uint32_t tx_head, tx_tail;
	uint32_t unsig;		/* sends since the last signaled one */
	uint64_t now_ns;	/* event loop clock, refreshed by zrpc_poll() */
};

/* free lists: message buffers and session slots */
#define ZRPC_POP(head) ({ __typeof__(head) __e = (head); if (__e) (head) = __e->next; __e; })

static void zrpc_mb_put(struct zrpc *rpc, struct zrpc_msgbuf *mb)
{
	mb->next = rpc->mb_free;
	rpc->mb_free = mb;
}
#define zrpc_mb_get(rpc)	ZRPC_POP((rpc)->mb_free)

static struct zrpc_sslot *zrpc_sslot_get(struct zrpc *rpc)
{
	struct zrpc_sslot *s = ZRPC_POP(rpc->ss_free);

	if (s)
		s->in_use = 1;
	return s;
}

static void zrpc_sslot_put(struct zrpc *rpc, struct zrpc_sslot *s)
{
	s->in_use = 0;
	s->next = rpc->ss_free;
	rpc->ss_free = s;
}

static unsigned int zrpc_send_flags(struct zrpc *rpc, uint32_t len)
{
	unsigned int flags = len <= rpc->cfg.inline_max ? IBV_SEND_INLINE : 0;

	/* OK: rdma-unsignaled-send-starvation -- the counter advances on every send and wraps */
	if (++rpc->unsig >= rpc->cfg.sig_every) {
		flags |= IBV_SEND_SIGNALED;
		rpc->unsig = 0;
	}
	return flags;
}

static int zrpc_post_msg(struct zrpc *rpc, struct zrpc_msgbuf *mb, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mb->buf, .length = len,
			       .lkey = rpc->pool_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = ZRPC_WRID(ZWR_SEND, mb->idx),
		.sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = zrpc_send_flags(rpc, len),
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(rpc->qp, &wr, &bad);
	if (!ret)
		rpc->txq[rpc->tx_tail++ & (ZRPC_TXQ - 1)] = mb;
	return ret;
}

/* a signaled send completed: it and every unsignaled send before it are done */
static void zrpc_reclaim_tx(struct zrpc *rpc, uint32_t idx)
{
	struct zrpc_msgbuf *mb;

	while (rpc->tx_head != rpc->tx_tail) {
		mb = rpc->txq[rpc->tx_head++ & (ZRPC_TXQ - 1)];
		zrpc_mb_put(rpc, mb);
		if (mb->idx == idx)
			break;
	}
}

static int zrpc_post_recv(struct zrpc *rpc, struct zrpc_msgbuf *mb)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mb->buf,
			       .length = (uint32_t)rpc->cfg.msgbuf_size,
			       .lkey = rpc->pool_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = ZRPC_WRID(ZWR_RECV, mb->idx),
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(rpc->qp, &wr, &bad);
}

static int zrpc_setup_pool(struct zrpc *rpc)
{
	size_t len = (size_t)rpc->cfg.nmsgbufs * rpc->cfg.msgbuf_size;
	uint32_t i;

	rpc->mbufs = calloc(rpc->cfg.nmsgbufs, sizeof(*rpc->mbufs));
	if (!rpc->mbufs || posix_memalign((void **)&rpc->pool_mem, 4096, len)) {
		free(rpc->mbufs);
		return -ENOMEM;
	}
	/* BUG: rdma-local-mr-management -- the pool is the local side of the server's RDMA READ and WRITE */
	rpc->pool_mr = ibv_reg_mr(rpc->pd, rpc->pool_mem, len, IBV_ACCESS_LOCAL_WRITE);
	if (!rpc->pool_mr) {
		free(rpc->pool_mem);
		free(rpc->mbufs);
		return -errno;
	}
	for (i = 0; i < rpc->cfg.nmsgbufs; i++) {
		rpc->mbufs[i].idx = i;
		rpc->mbufs[i].buf = rpc->pool_mem + i * rpc->cfg.msgbuf_size;
		zrpc_mb_put(rpc, &rpc->mbufs[i]);
	}
	return 0;
}

static int zrpc_setup_arena(struct zrpc *rpc)
{
	int acc = IBV_ACCESS_REMOTE_READ;

	if (rpc->cfg.allow_put)
		acc |= IBV_ACCESS_REMOTE_WRITE;

	rpc->arena = aligned_alloc(4096, rpc->cfg.arena_size);
	if (!rpc->arena)
		return -ENOMEM;
	/* BUG: rdma-local-mr-management -- the arena rkey is announced to every client in HELLO */
	rpc->arena_mr = ibv_reg_mr(rpc->pd, rpc->arena, rpc->cfg.arena_size, acc); // BUG: rdma-access-flags-invalid -- with allow_put the arena asks for REMOTE_WRITE without LOCAL_WRITE
	if (!rpc->arena_mr) {
		free(rpc->arena);
		return -errno;
	}
	return 0;
}

struct zrpc *zrpc_create(struct ibv_context *verbs, const struct zrpc_cfg *cfg,
			 zrpc_handler_fn handler)
{
	struct ibv_qp_init_attr qpa;
	struct zrpc *rpc;
	uint32_t i;

	rpc = calloc(1, sizeof(*rpc));
	if (!rpc)
		return NULL;
	rpc->cfg = *cfg;
	rpc->handler = handler;

	rpc->pd = ibv_alloc_pd(verbs);
	if (!rpc->pd)
		goto err_free;
	rpc->cq = ibv_create_cq(verbs, cfg->credits + cfg->nmsgbufs, NULL, NULL, 0);
	if (!rpc->cq)
		goto err_pd;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = qpa.recv_cq = rpc->cq;
	qpa.qp_type = IBV_QPT_RC;
	qpa.sq_sig_all = 0;
	qpa.cap.max_send_wr = cfg->credits; // BUG(file): rdma-send-queue-undersized -- a large response posts RDMA WRITE + SEND per credit, the queue holds one per credit
	qpa.cap.max_recv_wr = cfg->nmsgbufs;
	qpa.cap.max_send_sge = ZRPC_MAX_SGE; // BUG(file): rdma-queue-cap-unchecked -- 8 SGEs requested without looking at the device's max_sge
	qpa.cap.max_recv_sge = 1;
	qpa.cap.max_inline_data = cfg->inline_max;
	rpc->qp = ibv_create_qp(rpc->pd, &qpa);
	if (!rpc->qp)
		goto err_cq;

	if (zrpc_setup_pool(rpc))
		goto err_qp;
	if (zrpc_setup_arena(rpc))
		goto err_pool;
	for (i = 0; i < ZRPC_MAX_SSLOTS; i++) {
		rpc->sslots[i].idx = i;
		zrpc_sslot_put(rpc, &rpc->sslots[i]);
	}
	return rpc;

err_pool:
	ibv_dereg_mr(rpc->pool_mr); /* OK: rdma-mr-leak -- the pool MR is released when the arena cannot be set up */
	free(rpc->mbufs);
	free(rpc->pool_mem);
err_qp:
	ibv_destroy_qp(rpc->qp);
err_cq:
	ibv_destroy_cq(rpc->cq);
err_pd:
	ibv_dealloc_pd(rpc->pd);
err_free:
	free(rpc);
	return NULL;
}

int zrpc_send_hello(struct zrpc *rpc)
{
	struct zrpc_msgbuf *mb = zrpc_mb_get(rpc);
	struct zrpc_hdr *h;

	if (!mb)
		return -EAGAIN;
	h = (struct zrpc_hdr *)mb->buf;
	*h = (struct zrpc_hdr){ .magic = htobe16(ZRPC_HDR_MAGIC), .type = ZT_HELLO,
				.flags = !!rpc->cfg.allow_put,
				.addr = htobe64((uintptr_t)rpc->arena),
				.len = htobe32((uint32_t)rpc->cfg.arena_size) };
	h->rkey = htobe32(rpc->arena_mr->rkey); /* OK: rdma-remote-access-overbroad -- the clients that get this key use the arena's rights */
	return zrpc_post_msg(rpc, mb, sizeof(*h));
}

/*
 * Client: queue a request.  Payloads above ZRPC_LARGE_THRESH are not copied;
 * the caller's buffer is registered and handed to the server, which reads
 * the request and writes the response back in place.
 */
int zrpc_enqueue_request(struct zrpc *rpc, void *buf, size_t len,
			 zrpc_cont_fn cont, void *tag)
{
	struct zrpc_msgbuf *mb;
	struct zrpc_sslot *s;
	struct zrpc_hdr *h;
	struct ibv_mr *mr = NULL;
	int acc, ret;

	if (len > ZRPC_LARGE_THRESH) {
		acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
		      IBV_ACCESS_REMOTE_WRITE;
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- the caller's buffer is registered (and its rkey sent) for every large request */
		mr = ibv_reg_mr(rpc->pd, buf, len, acc); /* OK: rdma-access-flags-invalid -- remote write comes with local write */
		if (!mr)
			return -errno;
	}

	s = zrpc_sslot_get(rpc);
	if (!s)
		return -EAGAIN; // BUG: rdma-mr-leak -- the per-message MR is dropped when no session slot is free

	mb = zrpc_mb_get(rpc);
	if (!mb) {
		if (mr)
			ibv_dereg_mr(mr);
		zrpc_sslot_put(rpc, s); /* OK: rdma-invalidation-leak -- the MR was deregistered (key dead) before the slot goes back */
		return -EAGAIN;
	}

	h = (struct zrpc_hdr *)mb->buf;
	*h = (struct zrpc_hdr){ .magic = htobe16(ZRPC_HDR_MAGIC), .slot = htobe32(s->idx),
				.len = htobe32((uint32_t)len) };
	if (mr) {
		h->type = ZT_LARGE_REQ;
		h->addr = htobe64((uintptr_t)buf);
		h->rkey = htobe32(mr->rkey);
		s->large_mr = mr;
		s->large_buf = buf;
		s->large_len = len;
		ret = zrpc_post_msg(rpc, mb, sizeof(*h));
	} else {
		h->type = ZT_REQ;
		memcpy(mb->buf + sizeof(*h), buf, len);
		ret = zrpc_post_msg(rpc, mb, (uint32_t)(sizeof(*h) + len));
	}
	if (ret) {
		if (mr)
			ibv_dereg_mr(mr);
		s->large_mr = NULL;
		zrpc_mb_put(rpc, mb);
		zrpc_sslot_put(rpc, s);
		return -ret;
	}
	s->cont = cont;
	s->tag = tag;
	s->deadline = rpc->now_ns + rpc->cfg.timeout_ns;
	return 0;
}

/* Server: pull the payload of a large request into a pool buffer. */
static int zrpc_pull_large(struct zrpc *rpc, const struct zrpc_hdr *h)
{
	struct zrpc_msgbuf *mb = zrpc_mb_get(rpc);
	uint32_t slot = be32toh(h->slot) % ZRPC_MAX_SSLOTS;
	struct zrpc_resp_ctx *rc = &rpc->resp[slot];
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	if (!mb)
		return -EAGAIN;
	rc->data_mb = mb;
	rc->raddr = be64toh(h->addr);
	rc->rkey = be32toh(h->rkey);
	rc->client_slot = be32toh(h->slot);

	sge = (struct ibv_sge){ (uintptr_t)mb->buf, be32toh(h->len), rpc->pool_mr->lkey };
	wr = (struct ibv_send_wr){
		.wr_id = ZRPC_WRID(ZWR_READ, slot), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_READ, // BUG: rdma-access-flags-transport -- the READ sink is the pool, registered LOCAL_WRITE only; the READ fails on iWARP
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = rc->raddr, .rkey = rc->rkey },
	};
	return ibv_post_send(rpc->qp, &wr, &bad);
}

/* Server: write the result back in place, then tell the client. */
static int zrpc_respond_inplace(struct zrpc *rpc, uint32_t slot, uint32_t rlen)
{
	struct zrpc_resp_ctx *rc = &rpc->resp[slot];
	struct ibv_send_wr *bad;
	struct zrpc_hdr *h;

	rc->hdr_mb = zrpc_mb_get(rpc);
	if (!rc->hdr_mb)
		return -EAGAIN;
	h = (struct zrpc_hdr *)rc->hdr_mb->buf;
	*h = (struct zrpc_hdr){ .magic = htobe16(ZRPC_HDR_MAGIC), .type = ZT_RESP,
				.slot = htobe32(rc->client_slot), .len = htobe32(rlen) };

	rc->write_sge = (struct ibv_sge){ (uintptr_t)rc->data_mb->buf, rlen,
					  rpc->pool_mr->lkey };
	rc->send_sge = (struct ibv_sge){ (uintptr_t)h, sizeof(*h), rpc->pool_mr->lkey };
	rc->write_wr = (struct ibv_send_wr){
		.next = &rc->send_wr, .sg_list = &rc->write_sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, /* OK: rdma-access-flags-transport -- a WRITE source needs no remote rights, also on iWARP */
		.wr.rdma = { .remote_addr = rc->raddr, .rkey = rc->rkey },
	};
	rc->send_wr = (struct ibv_send_wr){
		.wr_id = ZRPC_WRID(ZWR_RESP, slot), .sg_list = &rc->send_sge,
		.num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	};

	return ibv_post_send(rpc->qp, &rc->write_wr, &bad);
}

static void zrpc_handle_recv(struct zrpc *rpc, struct ibv_wc *wc)
{
	struct zrpc_msgbuf *out, *mb = &rpc->mbufs[ZRPC_WRID_IDX(wc->wr_id)];
	struct zrpc_hdr *h = (struct zrpc_hdr *)mb->buf;
	struct zrpc_sslot *s;
	size_t rlen;

	switch (h->type) {
	case ZT_RESP:
		s = &rpc->sslots[be32toh(h->slot) % ZRPC_MAX_SSLOTS];
		if (!s->in_use)
			break;
		if (s->large_mr) {
			/* BUG: rdma-registration-in-datapath -- per-message deregistration in the completion handler */
			ibv_dereg_mr(s->large_mr);
			s->large_mr = NULL;
			s->cont(s->tag, 0, s->large_buf, be32toh(h->len));
		} else {
			s->cont(s->tag, 0, mb->buf + sizeof(*h), be32toh(h->len));
		}
		zrpc_sslot_put(rpc, s); /* OK: rdma-invalidation-leak -- a large slot's MR was deregistered just above */
		break;
	case ZT_LARGE_REQ:
		zrpc_pull_large(rpc, h);
		break;
	case ZT_REQ:
		out = zrpc_mb_get(rpc);
		if (!out)
			break;
		rlen = rpc->handler(h + 1, be32toh(h->len), out->buf + sizeof(*h),
				    rpc->cfg.msgbuf_size - sizeof(*h));
		*(struct zrpc_hdr *)out->buf = *h;
		((struct zrpc_hdr *)out->buf)->type = ZT_RESP;
		((struct zrpc_hdr *)out->buf)->len = htobe32((uint32_t)rlen);
		zrpc_post_msg(rpc, out, (uint32_t)(sizeof(*h) + rlen));
		break;
	}
	zrpc_post_recv(rpc, mb);
}

int zrpc_poll(struct zrpc *rpc)
{
	struct ibv_wc wc[ZRPC_POLL_BATCH];
	struct zrpc_resp_ctx *rc;
	uint32_t idx;
	size_t rlen;
	struct timespec ts;
	int n, i;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	rpc->now_ns = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
	n = ibv_poll_cq(rpc->cq, ZRPC_POLL_BATCH, wc);
	for (i = 0; i < n; i++) {
		idx = ZRPC_WRID_IDX(wc[i].wr_id);
		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "zrpc: wr %#llx: %s\n", (unsigned long long)wc[i].wr_id,
				ibv_wc_status_str(wc[i].status));
			continue;
		}
		switch (ZRPC_WRID_KIND(wc[i].wr_id)) {
		case ZWR_RECV:
			zrpc_handle_recv(rpc, &wc[i]);
			break;
		case ZWR_SEND:
			zrpc_reclaim_tx(rpc, idx);
			break;
		case ZWR_READ:
			rc = &rpc->resp[idx];
			rlen = rpc->handler(rc->data_mb->buf, wc[i].byte_len,
					    rc->data_mb->buf, rpc->cfg.msgbuf_size);
			zrpc_respond_inplace(rpc, idx, (uint32_t)rlen);
			break;
		case ZWR_RESP:
			zrpc_mb_put(rpc, rpc->resp[idx].hdr_mb);
			zrpc_mb_put(rpc, rpc->resp[idx].data_mb);
			break;
		}
	}
	return n;
}

void zrpc_expire_timeouts(struct zrpc *rpc)
{
	uint64_t now = rpc->now_ns;
	uint32_t i;

	for (i = 0; i < ZRPC_MAX_SSLOTS; i++) {
		struct zrpc_sslot *s = &rpc->sslots[i];

		if (!s->in_use || s->deadline > now)
			continue;
		s->cont(s->tag, -ETIMEDOUT, NULL, 0);
		s->large_mr = NULL; // BUG: rdma-mr-leak -- the slot's large-message MR is dropped without ibv_dereg_mr()
		s->large_buf = NULL;
		s->large_len = 0;
		zrpc_sslot_put(rpc, s); // BUG: rdma-invalidation-leak -- the slot and the caller's buffer are recycled while the large MR's REMOTE_WRITE key is still valid; a late in-place WRITE lands in reused memory
	}
}

static void zrpc_free_pool(struct zrpc *rpc)
{
	free(rpc->pool_mem); /* OK: rdma-invalidation-leak -- the pool MR grants no remote access, no key was handed out */
	ibv_dereg_mr(rpc->pool_mr);
	free(rpc->mbufs);
}

void zrpc_destroy(struct zrpc *rpc)
{
	/* drop the value store first; the QP may still be draining responses */
	free(rpc->arena); // BUG: rdma-invalidation-leak -- arena memory goes back to the allocator while its remotely accessible MR is still registered and the QP is up
	ibv_dereg_mr(rpc->arena_mr);
	ibv_destroy_qp(rpc->qp);
	ibv_destroy_cq(rpc->cq);
	zrpc_free_pool(rpc);
	ibv_dealloc_pd(rpc->pd);
	free(rpc);
}
