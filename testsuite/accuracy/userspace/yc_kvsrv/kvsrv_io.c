/*
 * kvsrv_io.c - request handling and send-side posting of kvsrv (see kvsrv.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "kvsrv.h"

#define kv_log(fmt, ...)	fprintf(stderr, "kvsrv: " fmt "\n", ##__VA_ARGS__)

#define KV_WRID_RECV		(1ull << 63)
#define KV_WRID_NONE		0ull	/* unsignaled notice, op already recycled */

int kv_srq_post(struct kv_server *srv, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&srv->rx[slot], .length = sizeof(struct kv_msg),
		.lkey = srv->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = KV_WRID_RECV | slot, .sg_list = &sge, .num_sge = 1,
	};
	struct ibv_recv_wr *bad;

	return ibv_post_srq_recv(srv->srq, &wr, &bad);
}

void kv_conn_init_ops(struct kv_conn *c)
{
	int i;

	c->free_ops = NULL;
	for (i = KV_OPS_PER_CONN - 1; i >= 0; i--) {
		c->ops[i].conn = c;
		c->ops[i].next_free = c->free_ops;
		c->free_ops = &c->ops[i];
	}
}

static struct kv_op *kv_op_get(struct kv_conn *c)
{
	struct kv_op *op = c->free_ops;

	if (op) {
		c->free_ops = op->next_free;
		op->win = NULL;
		op->release_win = 0;
	}
	return op;
}

static void kv_op_put(struct kv_conn *c, struct kv_op *op)
{
	op->next_free = c->free_ops;
	c->free_ops = op;
}

/* Take n send queue entries; the op's signaled completion gives them back. */
static int kv_sq_reserve(struct kv_conn *c, struct kv_op *op, uint32_t n)
{
	if (c->sq_credits < n)
		return -EAGAIN;
	c->sq_credits -= n;
	op->sq_cost = n;
	return 0;
}

static uint32_t kv_slot_of(uint64_t key)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (uint32_t)(key % KV_NR_SLOTS);
}

static void kv_prep_resp(struct kv_op *op, struct ibv_send_wr *wr,
			 const struct kv_msg *req, int32_t status)
{
	op->rsp = *req;
	op->rsp.op = KV_OP_RESP;
	op->rsp.status = status;
	op->sge[KV_MAX_SGE - 1].addr = (uintptr_t)&op->rsp;
	op->sge[KV_MAX_SGE - 1].length = sizeof(op->rsp);
	op->sge[KV_MAX_SGE - 1].lkey = 0;

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)op;
	wr->opcode = IBV_WR_SEND;
	wr->sg_list = &op->sge[KV_MAX_SGE - 1];
	wr->num_sge = 1;
	wr->send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
}

static int kv_do_get(struct kv_conn *c, const struct kv_msg *m)
{
	struct kv_server *srv = c->srv;
	struct kv_op *op = kv_op_get(c);
	struct ibv_send_wr *bad;
	uint32_t slot = kv_slot_of(m->key), n, i;

	if (!op)
		return -EAGAIN;
	if (kv_sq_reserve(c, op, 2)) {
		kv_op_put(c, op);
		return -EAGAIN;
	}
	n = m->len >= 1 && m->len < KV_MAX_SGE ? m->len : 1;	/* consecutive slots */
	for (i = 0; i < n; i++) {
		uint32_t s = (slot + i) % KV_NR_SLOTS;

		op->sge[i].addr = (uintptr_t)srv->store + (uint64_t)s * KV_SLOT_SIZE;
		op->sge[i].length = srv->slot_len[s];
		op->sge[i].lkey = srv->store_mr->lkey;
	}

	memset(&op->wr[0], 0, sizeof(op->wr[0]));
	op->wr[0].wr_id = (uintptr_t)op;
	op->wr[0].opcode = IBV_WR_RDMA_WRITE;
	op->wr[0].sg_list = op->sge;
	op->wr[0].num_sge = n;
	op->wr[0].wr.rdma.remote_addr = m->addr;
	op->wr[0].wr.rdma.rkey = m->rkey;
	op->wr[0].send_flags = 0; /* OK: rdma-unsignaled-send-starvation -- the WRITE is retired by the signaled response SEND chained behind it */
	op->wr[0].next = &op->wr[1];
	kv_prep_resp(op, &op->wr[1], m, 0);
	return ibv_post_send(c->qp, &op->wr[0], &bad) ? -EIO : 0;
}

/* [LOCAL_INV] -> BIND_MW -> SEND(grant) for window w under w->key. */
static int kv_post_grant(struct kv_conn *c, struct kv_op *op, struct kv_win *w,
			 int with_inv, const struct kv_msg *m)
{
	struct kv_server *srv = c->srv;
	struct ibv_send_wr *bind, *bad;
	int n = 0;

	if (with_inv) {
		memset(&op->wr[0], 0, sizeof(op->wr[0]));
		op->wr[0].wr_id = (uintptr_t)op;
		op->wr[0].opcode = IBV_WR_LOCAL_INV;
		op->wr[0].invalidate_rkey = w->key;
		op->wr[0].next = &op->wr[1];
		n = 1;
	}
	bind = &op->wr[n];
	memset(bind, 0, sizeof(*bind));
	bind->wr_id = (uintptr_t)op;
	bind->opcode = IBV_WR_BIND_MW;
	bind->bind_mw.mw = w->mw;
	bind->bind_mw.rkey = w->key;
	bind->bind_mw.bind_info.mr = srv->store_mr;
	bind->bind_mw.bind_info.addr = (uintptr_t)srv->store +
		(uint64_t)w->slot * KV_SLOT_SIZE + (uint64_t)w->slice * KV_SLICE_SIZE;
	bind->bind_mw.bind_info.length = KV_SLICE_SIZE;
	bind->bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	bind->next = &op->wr[n + 1];

	kv_prep_resp(op, &op->wr[n + 1], m, 0);
	op->rsp.addr = bind->bind_mw.bind_info.addr;
	op->rsp.rkey = w->key;
	op->rsp.len = KV_SLICE_SIZE;
	op->rsp.win = (uint32_t)(w - c->wins);
	op->win = w;
	return ibv_post_send(c->qp, &op->wr[0], &bad) ? -EIO : 0;
}

static int kv_do_put(struct kv_conn *c, const struct kv_msg *m)
{
	struct kv_win *w = NULL;
	struct kv_op *op;
	int i;

	for (i = 0; i < KV_NR_WINDOWS && !w; i++)
		if (!c->wins[i].busy)
			w = &c->wins[i];
	if (!w || !(op = kv_op_get(c)))
		return -EAGAIN;
	if (kv_sq_reserve(c, op, 2)) {
		kv_op_put(c, op);
		return -EAGAIN;
	}
	w->busy = 1;
	w->slot = kv_slot_of(m->key);
	w->slice = 0;
	w->kv_key = m->key;
	c->srv->slot_len[w->slot] = 0;
	w->key = ibv_inc_rkey(w->key); /* OK: rdma-rkey-reuse -- a fresh key for every new grant */
	return kv_post_grant(c, op, w, 0, m);
}

static int kv_do_put_more(struct kv_conn *c, const struct kv_msg *m, int remote_inv)
{
	struct kv_win *w;
	struct kv_op *op;

	if (m->win >= KV_NR_WINDOWS || !c->wins[m->win].busy)
		return -EINVAL;
	w = &c->wins[m->win];
	if ((w->slice + 2) * KV_SLICE_SIZE > KV_SLOT_SIZE)
		return -ENOSPC;
	if (!(op = kv_op_get(c)))
		return -EAGAIN;
	if (kv_sq_reserve(c, op, remote_inv ? 2 : 3)) {
		kv_op_put(c, op);
		return -EAGAIN;
	}
	c->srv->slot_len[w->slot] += KV_SLICE_SIZE;
	w->slice++;
	return kv_post_grant(c, op, w, !remote_inv, m); /* BUG(file): rdma-rkey-reuse -- the window is rebound over the next slice under the key the client used for the previous one */
}

static int kv_do_put_done(struct kv_conn *c, const struct kv_msg *m, int remote_inv)
{
	struct kv_server *srv = c->srv;
	struct ibv_send_wr *bad;
	struct kv_win *w;
	struct kv_op *op;

	if (m->win >= KV_NR_WINDOWS || !c->wins[m->win].busy)
		return -EINVAL;
	w = &c->wins[m->win];
	if (!(op = kv_op_get(c)))
		return -EAGAIN;
	if (kv_sq_reserve(c, op, remote_inv ? 1 : 2)) {
		kv_op_put(c, op);
		return -EAGAIN;
	}
	srv->slot_key[w->slot] = w->kv_key;
	srv->slot_len[w->slot] += m->len < KV_SLICE_SIZE ? m->len : KV_SLICE_SIZE;
	op->win = w;
	op->release_win = 1;
	if (remote_inv) {
		kv_prep_resp(op, &op->wr[0], m, 0);
	} else {
		memset(&op->wr[0], 0, sizeof(op->wr[0]));
		op->wr[0].wr_id = (uintptr_t)op;
		op->wr[0].opcode = IBV_WR_LOCAL_INV;
		op->wr[0].invalidate_rkey = w->key;
		op->wr[0].send_flags = 0; /* OK: rdma-unsignaled-send-starvation -- completes before the signaled ack behind it */
		op->wr[0].next = &op->wr[1];
		kv_prep_resp(op, &op->wr[1], m, 0);
	}
	return ibv_post_send(c->qp, &op->wr[0], &bad) ? -EIO : 0;
}

void kv_notify_evict(struct kv_server *srv, uint64_t kv_key)
{
	struct ibv_send_wr *bad;
	int i;

	for (i = 0; i < KV_MAX_CONNS; i++) {
		struct kv_conn *c = &srv->conns[i];
		struct kv_msg note = { .op = KV_OP_NOTIFY, .key = kv_key };
		struct kv_op *op;
		int signaled = 0;

		if (!c->in_use || !(op = kv_op_get(c)))
			continue;
		if (kv_sq_reserve(c, op, 1)) {
			kv_op_put(c, op);
			continue;		/* the client re-validates on its next GET */
		}
		kv_prep_resp(op, &op->wr[0], &note, 0);
		op->rsp.op = KV_OP_NOTIFY;
		op->wr[0].send_flags = IBV_SEND_INLINE;
		if (c->notify_budget == 0) { /* BUG(program): rdma-unsignaled-send-starvation -- notify_budget is loaded at accept and reloaded here but nothing counts it down, so no notice is ever signaled */
			op->wr[0].send_flags |= IBV_SEND_SIGNALED;
			op->sq_cost = c->notify_unsig + 1;
			c->notify_unsig = 0;
			c->notify_budget = KV_NOTIFY_SIGNAL_EVERY;
			signaled = 1;
		} else {
			op->wr[0].wr_id = KV_WRID_NONE;
			c->notify_unsig++;
		}
		if (ibv_post_send(c->qp, &op->wr[0], &bad)) {
			c->sq_credits += 1;
			kv_op_put(c, op);
			continue;
		}
		if (!signaled)
			kv_op_put(c, op);
		srv->notices++;
	}
}

static int kv_dispatch(struct kv_conn *c, const struct kv_msg *m, int remote_inv)
{
	switch (m->op) {
	case KV_OP_GET:		return kv_do_get(c, m);
	case KV_OP_PUT:		return kv_do_put(c, m);
	case KV_OP_PUT_MORE:	return kv_do_put_more(c, m, remote_inv);
	case KV_OP_PUT_DONE:	return kv_do_put_done(c, m, remote_inv);
	default:		return -EINVAL;
	}
}

static void kv_handle_recv(struct kv_server *srv, struct ibv_wc *wc)
{
	struct kv_conn *c = kv_conn_by_qpn(srv, wc->qp_num);
	uint32_t slot = (uint32_t)(wc->wr_id & ~KV_WRID_RECV);
	struct kv_msg m = srv->rx[slot];
	int remote_inv = 0, rc;

	kv_srq_post(srv, slot);
	if (!c)
		return;
	if ((wc->wc_flags & IBV_WC_WITH_INV) && m.win < KV_NR_WINDOWS &&
	    c->wins[m.win].busy && wc->invalidated_rkey == c->wins[m.win].key)
		remote_inv = 1;

	rc = kv_dispatch(c, &m, remote_inv);
	if (rc == -EAGAIN && c->npending < KV_PENDING_MAX) {
		c->pending[c->npending] = m;
		c->pending_inv[c->npending] = (uint8_t)remote_inv;
		c->npending++;
	} else if (rc) {
		kv_log("op %u from qp %u failed: %d", m.op, wc->qp_num, rc);
	}
}

static void kv_send_done(struct kv_op *op)
{
	struct kv_conn *c = op->conn;
	unsigned i, kept = 0;

	c->sq_credits += op->sq_cost;
	if (op->release_win && op->win)
		op->win->busy = 0;
	kv_op_put(c, op);

	for (i = 0; i < c->npending; i++) {
		if (kv_dispatch(c, &c->pending[i], c->pending_inv[i]) == -EAGAIN) {
			c->pending[kept] = c->pending[i];
			c->pending_inv[kept] = c->pending_inv[i];
			kept++;
		}
	}
	c->npending = kept;
}

int kv_process_cq(struct kv_server *srv)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(srv->cq, 32, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].wr_id & KV_WRID_RECV) {
			if (wc[i].status == IBV_WC_SUCCESS)
				kv_handle_recv(srv, &wc[i]);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS)
			kv_log("send wc %s on qp %u", ibv_wc_status_str(wc[i].status),
			       wc[i].qp_num);
		if (wc[i].wr_id == KV_WRID_NONE)
			continue;
		kv_send_done((struct kv_op *)(uintptr_t)wc[i].wr_id);
	}
	return n < 0 ? -EIO : n;
}
