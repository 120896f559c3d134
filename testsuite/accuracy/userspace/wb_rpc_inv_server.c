/*
 * wb_rpc_inv_server.c - key/value RPC server with memory-window grants.
 *
 * Small values travel inline in the request and reply SENDs.  For a large
 * PUT or APPEND the server binds a type-2 window over a staging slot and
 * sends the client a GRANT carrying the window's rkey; the client RDMA
 * WRITEs the value and sends the COMMIT with SEND_WITH_INV for that rkey.
 * A large GET gets a read-only window over the value cache and the client
 * RELEASEs it the same way.  Whenever the commit does not invalidate the
 * window we do it ourselves with LOCAL_INV before touching the slot.
 *
 * The commit handlers were written at different times: PUT commits and
 * releases check which rkey the peer invalidated, APPEND commits and the
 * deferred abort path do not.  Oversized PUTs register the store's value buffer per
 * request.  Clients get max_inflight request credits in the HELLO reply.
 * Replies are inline and the QP asks for 128 bytes of inline data blindly.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-rkey-reuse, rdma-unmap-before-invalidate, rdma-local-mr-management, rdma-send-queue-manual-factor -- not reviewed here
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdbool.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define KV_SLOT_SIZE	(256 * 1024)
#define KV_INLINE_VAL	96
#define KV_CACHE_SIZE	(64UL << 20)

enum rpc_op {
	RPC_HELLO = 1, RPC_GET, RPC_PUT, RPC_APPEND,
	RPC_PUT_COMMIT, RPC_APPEND_COMMIT, RPC_RELEASE, RPC_ABORT,
	RPC_GRANT, RPC_REPLY,
};

enum { WR_GRANT = 1, WR_INV = 2, WR_REPLY = 3 };
#define WRID(p, t)	((uint64_t)(uintptr_t)(p) | (t))
#define WRID_PTR(id)	((void *)(uintptr_t)((id) & ~7ULL))
#define WRID_TYPE(id)	((int)((id) & 7))

struct rpc_msg {
	uint8_t		op;
	uint8_t		status;
	uint16_t	slot;
	uint32_t	rkey;
	uint64_t	req_id;
	uint64_t	addr;
	uint32_t	len;
	uint32_t	key_hash;
	char		val[KV_INLINE_VAL];
};

struct kv_conn;

struct kv_slot {
	struct kv_conn		*conn;
	uint16_t		 idx;
	struct ibv_mw		*mw;
	uint32_t		 rkey;		/* key the window is bound under */
	bool			 bound;
	uint8_t			 op;
	uint64_t		 req_id;
	uint32_t		 key_hash;
	char			*buf;
	size_t			 len;
	void			*big_buf;
	struct ibv_mr		*big_mr;
	struct ibv_send_wr	 bind_wr;
	struct ibv_send_wr	 grant_wr;
	struct ibv_send_wr	 inv_wr;
	struct ibv_sge		 grant_sge;
	struct rpc_msg		 grant;
	struct kv_slot		*next_free;
};

struct kv_cfg {
	unsigned	max_inflight;	/* slots per connection */
	unsigned	rx_depth;
};

struct kv_server {
	struct kv_cfg	 cfg;
	struct ibv_pd	*pd;
	struct ibv_cq	*cq;
	char		*stage;
	struct ibv_mr	*stage_mr;
	char		*cache;
	struct ibv_mr	*cache_mr;
};

struct kv_conn {
	struct kv_server	*srv;
	struct rdma_cm_id	*id;
	struct ibv_qp		*qp;
	struct rpc_msg		*rx;
	struct ibv_mr		*rx_mr;
	struct kv_slot		*slots;
	struct kv_slot		*free_slots;
	struct rpc_msg		 reply;
};

struct kv_abort_work {
	struct kv_slot	*slot;
	unsigned	 wc_flags;
};

/* the value store and the worker queue live elsewhere */
char *kv_lookup(uint32_t key_hash, size_t *len);
char *kv_cache_base(void);
void *kv_value_alloc(size_t len);
void kv_value_free(void *val);
int kv_apply(uint8_t op, uint32_t key_hash, const void *val, size_t len);
void kv_defer(void (*fn)(struct kv_abort_work *), struct kv_abort_work *w);

static void conn_error(struct kv_conn *c)
{
	fprintf(stderr, "conn %p: protocol error, disconnecting\n", (void *)c);
	rdma_disconnect(c->id);
}

int kv_server_init(struct kv_server *srv, struct ibv_context *verbs)
{
	size_t stage_len = (size_t)srv->cfg.max_inflight * KV_SLOT_SIZE;

	srv->pd = ibv_alloc_pd(verbs);
	srv->cq = ibv_create_cq(verbs, 4096, NULL, NULL, 0);
	if (!srv->pd || !srv->cq)
		return -1;
	srv->stage = aligned_alloc(4096, stage_len);
	if (!srv->stage)
		return -ENOMEM;
	/* BUG: rdma-remote-access-overbroad -- clients only ever get window rkeys; stage_mr->rkey itself never leaves */
	srv->stage_mr = ibv_reg_mr(srv->pd, srv->stage, stage_len,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND |
				   IBV_ACCESS_REMOTE_WRITE);
	return srv->stage_mr ? 0 : -1;
}

/* The cache is mapped by the store on first use; register it then. */
static struct ibv_mr *srv_cache_mr(struct kv_server *srv)
{
	if (!srv->cache_mr) {
		srv->cache = kv_cache_base();
		/* OK: rdma-registration-in-datapath -- registered on the first large GET and kept */
		srv->cache_mr = ibv_reg_mr(srv->pd, srv->cache, KV_CACHE_SIZE, IBV_ACCESS_MW_BIND);
	}
	return srv->cache_mr;
}

static struct kv_slot *slot_get(struct kv_conn *c)
{
	struct kv_slot *s = c->free_slots;

	if (s)
		c->free_slots = s->next_free;
	return s;
}

static void slot_put(struct kv_slot *s)
{
	if (s->big_mr) {
		ibv_dereg_mr(s->big_mr); /* BUG: rdma-registration-in-datapath -- the per-request MR of an oversized PUT is deregistered on the completion path */
		kv_value_free(s->big_buf);
		s->big_mr = NULL;
		s->big_buf = NULL;
	}
	s->next_free = s->conn->free_slots;
	s->conn->free_slots = s;
}

static int send_reply(struct kv_conn *c, uint64_t req_id, int status)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->reply, .length = sizeof(c->reply), .lkey = 0,
	};
	struct ibv_send_wr wr = {
		.wr_id = WRID(c, WR_REPLY), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
	}, *bad;

	c->reply.op = RPC_REPLY;
	c->reply.req_id = req_id;
	c->reply.status = status;
	return ibv_post_send(c->qp, &wr, &bad);
}

/* BIND_MW followed by the GRANT that carries the new rkey. */
static int post_grant(struct kv_conn *c, struct kv_slot *s)
{
	struct ibv_send_wr *bad;

	s->grant.op = RPC_GRANT;
	s->grant.req_id = s->req_id;
	s->grant.slot = s->idx;
	s->grant.rkey = s->rkey;
	s->grant_sge.addr = (uintptr_t)&s->grant;
	s->grant_sge.length = sizeof(s->grant);
	s->grant_sge.lkey = 0;

	s->bind_wr.next = &s->grant_wr;
	s->grant_wr.wr_id = WRID(s, WR_GRANT);
	s->grant_wr.next = NULL;
	s->grant_wr.opcode = IBV_WR_SEND;
	s->grant_wr.sg_list = &s->grant_sge;
	s->grant_wr.num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- bind and grant stay unsignaled; every reply and LOCAL_INV is signaled and retires them */
	s->grant_wr.send_flags = IBV_SEND_INLINE;
	if (ibv_post_send(c->qp, &s->bind_wr, &bad))
		return -1;
	s->bound = true;
	return 0;
}

static int grant_put_window(struct kv_conn *c, struct kv_slot *s, size_t len)
{
	struct ibv_mr *mr = c->srv->stage_mr;
	char *dst = s->buf;

	if (len > KV_SLOT_SIZE) {
		/* oversized: let the client write straight into the store's value */
		s->big_buf = kv_value_alloc(len);
		if (!s->big_buf)
			return -ENOMEM;
		/* BUG: rdma-registration-in-datapath -- the store's buffer is registered for every oversized PUT */
		s->big_mr = ibv_reg_mr(c->srv->pd, s->big_buf, len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		if (!s->big_mr)
			return -1;
		mr = s->big_mr;
		dst = s->big_buf;
	}
	s->len = len;
	s->rkey = ibv_inc_rkey(s->rkey);
	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->rkey;
	s->bind_wr.bind_mw.bind_info.mr = mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)dst;
	s->bind_wr.bind_mw.bind_info.length = len;
	/* OK: rdma-access-flags-invalid -- stage_mr and big_mr both have LOCAL_WRITE and MW_BIND */
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	s->grant.addr = (uintptr_t)dst;
	return post_grant(c, s);
}

static int grant_get_window(struct kv_conn *c, struct kv_slot *s, char *val,
			    size_t len, bool for_update)
{
	struct ibv_mr *mr = srv_cache_mr(c->srv);

	if (!mr)
		return -1;
	s->len = len;
	s->rkey = ibv_inc_rkey(s->rkey);
	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->rkey;
	s->bind_wr.bind_mw.bind_info.mr = c->srv->cache_mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)val;
	s->bind_wr.bind_mw.bind_info.length = len;
	/* BUG: rdma-access-flags-invalid -- for_update adds REMOTE_ATOMIC (CAS on the version word), but cache_mr has no LOCAL_WRITE */
	s->bind_wr.bind_mw.bind_info.mw_access_flags = for_update ?
		IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : IBV_ACCESS_REMOTE_READ;
	s->grant.addr = (uintptr_t)val;
	return post_grant(c, s);
}

static int post_local_inv(struct kv_conn *c, struct kv_slot *s)
{
	struct ibv_send_wr *bad;

	memset(&s->inv_wr, 0, sizeof(s->inv_wr));
	s->inv_wr.wr_id = WRID(s, WR_INV);
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->rkey;
	s->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &s->inv_wr, &bad);
}

/* Window is dead: store the value and answer. */
static void slot_finish(struct kv_slot *s)
{
	struct kv_conn *c = s->conn;
	void *val = s->big_buf ? s->big_buf : s->buf;
	int ret = 0;

	if (s->op != RPC_GET)
		ret = kv_apply(s->op, s->key_hash, val, s->len);
	send_reply(c, s->req_id, ret ? 1 : 0);
	slot_put(s);
}

static int view_check_inv(const struct kv_slot *s, const struct ibv_wc *wc)
{
	if (wc->invalidated_rkey != s->rkey) {
		fprintf(stderr, "slot %u: peer invalidated %#x, window is %#x\n",
			s->idx, wc->invalidated_rkey, s->rkey);
		return -EINVAL;
	}
	return 0;
}

static void handle_put_commit(struct kv_conn *c, struct kv_slot *s, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the slot's */
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey != s->rkey) {
			conn_error(c);
			return;
		}
		s->bound = false;
	}
	if (s->bound)
		post_local_inv(c, s);		/* finish from the LOCAL_INV completion */
	else
		slot_finish(s);
}

static void handle_append_commit(struct kv_conn *c, struct kv_slot *s, const struct ibv_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey is taken as this slot's; the window may stay writable while the value is appended */
	if (wc->wc_flags & IBV_WC_WITH_INV)
		s->bound = false;
	if (s->bound)
		post_local_inv(c, s);
	else
		slot_finish(s);
}

static void handle_release(struct kv_conn *c, struct kv_slot *s, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- view_check_inv() compares wc->invalidated_rkey */
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (view_check_inv(s, wc)) {
			conn_error(c);
			return;
		}
		s->bound = false;
	}
	if (s->bound)
		post_local_inv(c, s);
	else
		slot_finish(s);
}

static void abort_worker(struct kv_abort_work *w)
{
	struct kv_slot *s = w->slot;

	/* BUG: rdma-remote-invalidate-unchecked -- the copied completion flags are trusted; the invalidated rkey was never looked at */
	if (w->wc_flags & IBV_WC_WITH_INV) {
		s->bound = false;
		send_reply(s->conn, s->req_id, 1);
		slot_put(s);
	} else {
		post_local_inv(s->conn, s);
	}
	free(w);
}

static int handle_recv(struct kv_conn *c, const struct ibv_wc *wc)
{
	struct rpc_msg *m = &c->rx[wc->wr_id];
	struct kv_abort_work *w;
	struct kv_slot *s = NULL;
	size_t len;
	char *val;

	if (m->op >= RPC_PUT_COMMIT && m->op <= RPC_ABORT) {
		if (m->slot >= c->srv->cfg.max_inflight)
			return -EPROTO;
		s = &c->slots[m->slot];
	}
	switch (m->op) {
	case RPC_HELLO:
		/* OK: rdma-remote-invalidate-unchecked -- nothing is granted before HELLO; an invalidating HELLO is rejected, not accepted */
		if (wc->wc_flags & IBV_WC_WITH_INV)
			return -EPROTO;
		return send_reply(c, m->req_id, 0);
	case RPC_GET:
		val = kv_lookup(m->key_hash, &len);
		if (!val)
			return send_reply(c, m->req_id, 2);
		if (len <= KV_INLINE_VAL) {
			memcpy(c->reply.val, val, len);
			return send_reply(c, m->req_id, 0);
		}
		s = slot_get(c);
		if (!s)
			return send_reply(c, m->req_id, 3);
		s->op = RPC_GET;
		s->req_id = m->req_id;
		return grant_get_window(c, s, val, len, m->status & 1);
	case RPC_PUT:
	case RPC_APPEND:
		if (m->len <= KV_INLINE_VAL)
			return send_reply(c, m->req_id,
					  kv_apply(m->op, m->key_hash, m->val, m->len) ? 1 : 0);
		s = slot_get(c);
		if (!s)
			return send_reply(c, m->req_id, 3);
		s->op = m->op;
		s->req_id = m->req_id;
		s->key_hash = m->key_hash;
		return grant_put_window(c, s, m->len);
	case RPC_PUT_COMMIT:
		handle_put_commit(c, s, wc);
		return 0;
	case RPC_APPEND_COMMIT:
		handle_append_commit(c, s, wc);
		return 0;
	case RPC_RELEASE:
		handle_release(c, s, wc);
		return 0;
	case RPC_ABORT:
		w = malloc(sizeof(*w));
		if (!w)
			return -ENOMEM;
		w->slot = s;
		w->wc_flags = wc->wc_flags;
		kv_defer(abort_worker, w);
		return 0;
	}
	return -EPROTO;
}

static int post_rx(struct kv_conn *c, unsigned i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->rx[i], .length = sizeof(c->rx[i]), .lkey = c->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

void kv_poll(struct kv_conn *c)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(c->srv->cq, 32, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			conn_error(c);
			continue;
		}
		if (wc[i].opcode & IBV_WC_RECV) {
			if (handle_recv(c, &wc[i]))
				conn_error(c);
			post_rx(c, wc[i].wr_id);
		} else if (WRID_TYPE(wc[i].wr_id) == WR_INV) {
			struct kv_slot *s = WRID_PTR(wc[i].wr_id);

			s->bound = false;
			slot_finish(s);
		}
	}
}

int kv_conn_setup(struct kv_server *srv, struct kv_conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr init = { 0 };
	unsigned i;

	c->srv = srv;
	c->id = id;
	init.send_cq = srv->cq;
	init.recv_cq = srv->cq;
	init.qp_type = IBV_QPT_RC;
	init.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- per request at most BIND_MW, GRANT, LOCAL_INV and the reply; credits keep max_inflight requests outstanding */
	init.cap.max_send_wr = 4 * srv->cfg.max_inflight + 1;
	init.cap.max_recv_wr = srv->cfg.rx_depth;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = sizeof(struct rpc_msg); /* BUG(file): rdma-queue-cap-unchecked -- 128 bytes of inline data, never compared with what the QP was granted */
	if (rdma_create_qp(id, srv->pd, &init))
		return -1;
	c->qp = id->qp;

	c->rx = calloc(srv->cfg.rx_depth, sizeof(*c->rx));
	c->slots = calloc(srv->cfg.max_inflight, sizeof(*c->slots));
	if (!c->rx || !c->slots)
		goto err_qp;
	/* OK: rdma-registration-in-datapath -- receive ring registered once per connection */
	c->rx_mr = ibv_reg_mr(srv->pd, c->rx, srv->cfg.rx_depth * sizeof(*c->rx),
			      IBV_ACCESS_LOCAL_WRITE);
	if (!c->rx_mr)
		goto err_qp;
	for (i = 0; i < srv->cfg.max_inflight; i++) {
		struct kv_slot *s = &c->slots[i];

		s->conn = c;
		s->idx = i;
		s->buf = srv->stage + (size_t)i * KV_SLOT_SIZE;
		s->mw = ibv_alloc_mw(srv->pd, IBV_MW_TYPE_2);
		if (!s->mw)
			goto err_mw;
		s->rkey = s->mw->rkey;
		s->next_free = c->free_slots;
		c->free_slots = s;
	}
	for (i = 0; i < srv->cfg.rx_depth; i++)
		if (post_rx(c, i))
			goto err_mw;
	return rdma_accept(id, NULL);

err_mw:
	while (i--)
		ibv_dealloc_mw(c->slots[i].mw);
	ibv_dereg_mr(c->rx_mr);
err_qp:
	free(c->rx);
	free(c->slots);
	rdma_destroy_qp(id);
	return -1;
}
