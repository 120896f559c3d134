/*
 * ya_rpc_bulk_srv.c - bulk PUT server of a small RPC object store on rdma_cm.
 *
 * Per connection the server carves a slab into bulk slots; the slab is
 * registered LOCAL_WRITE | MW_BIND and every slot has its own type-2 memory
 * window.  PUT_BEGIN takes a free slot, binds its window with REMOTE_WRITE
 * under a new key and answers with a GRANT {slot, addr, rkey}.  The client
 * RDMA-writes the object and sends PUT_COMMIT as a SEND_WITH_INV of the
 * granted key (or a plain SEND if its device cannot, in which case the server
 * fences the window itself with a signaled LOCAL_INV and waits).  Receive
 * completions are copied into an rx context (flags and invalidated key) and
 * dispatched by opcode.  A lease reaper fences grants that were never
 * committed and parks the slot for a grace period in which the client may
 * PUT_RESUME.
 *
 * Right: COMMIT compares the invalidated key with the grant; the reaper
 * fences with a waited LOCAL_INV; teardown deallocates the windows before the
 * slab goes away.  Wrong: COMMIT logs a key mismatch and recycles the slot
 * anyway; ABORT trusts the with-invalidate flag, and otherwise recycles the
 * slot right after an unsignaled LOCAL_INV; RESUME re-binds under the old key.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-mr-leak, rdma-queue-cap-unchecked, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define RPC_SLOTS        16
#define RPC_SLOT_SIZE    (1u << 20)
#define RPC_RX_DEPTH     32
#define RPC_LEASE_SEC    10
#define RPC_GRACE_SEC    30
#define FENCE_WRID(_s)   (0xfe00000000000000ull | (_s))
#define BIND_WRID(_s)    (0xfd00000000000000ull | (_s))

enum rpc_op { RPC_PUT_BEGIN = 1, RPC_PUT_COMMIT, RPC_PUT_ABORT, RPC_PUT_RESUME, RPC_GRANT, RPC_STATUS };

enum slot_state { SLOT_FREE, SLOT_GRANTED, SLOT_EXPIRED };

struct rpc_msg {
	uint16_t op;
	uint16_t slot;
	int32_t  status;
	uint64_t obj_id;
	uint64_t addr;
	uint32_t len;
	uint32_t rkey;
};

struct rpc_slot {
	unsigned         idx;
	bool             busy;
	enum slot_state  state;
	struct ibv_mw   *mw;
	uint32_t         rkey;
	char            *buf;
	uint32_t         len;
	uint64_t         obj_id;
	time_t           stamp;
};

struct rpc_rx_ctx {
	const struct rpc_msg *msg;
	unsigned              wc_flags;
	uint32_t              inv_rkey;
};

struct rpc_conn {
	struct rdma_cm_id *id;
	struct ibv_pd     *pd;
	struct ibv_cq     *scq, *rcq;
	char              *slab;
	struct ibv_mr     *slab_mr;
	struct rpc_slot    slots[RPC_SLOTS];
	struct rpc_msg     rx[RPC_RX_DEPTH];
	struct ibv_mr     *rx_mr;
	struct rpc_msg     tx;
	struct ibv_mr     *tx_mr;
};

extern int obj_store_put(uint64_t obj_id, const void *data, uint32_t len);

static struct rpc_slot *rpc_slot_get(struct rpc_conn *c)
{
	int i;

	for (i = 0; i < RPC_SLOTS; i++) {
		if (!c->slots[i].busy) {
			c->slots[i].busy = true;
			return &c->slots[i];
		}
	}
	return NULL;
}

static void rpc_slot_put(struct rpc_conn *c, struct rpc_slot *s)
{
	(void)c;
	s->state = SLOT_FREE;
	s->len = 0;
	s->busy = false;
}

static struct rpc_slot *rpc_slot_lookup(struct rpc_conn *c, unsigned idx, enum slot_state st)
{
	if (idx >= RPC_SLOTS || !c->slots[idx].busy || c->slots[idx].state != st)
		return NULL;
	return &c->slots[idx];
}

static int rpc_send(struct rpc_conn *c, uint16_t op, const struct rpc_slot *s,
		    uint64_t obj_id, int status)
{
	struct ibv_send_wr wr = {}, *bad;
	struct ibv_sge sge;

	memset(&c->tx, 0, sizeof(c->tx));
	c->tx.op = op;
	c->tx.obj_id = obj_id;
	c->tx.status = status;
	if (s) {
		c->tx.slot = s->idx;
		c->tx.addr = (uintptr_t)s->buf;
		c->tx.len  = s->len;
		c->tx.rkey = s->rkey;
	}
	sge.addr = (uintptr_t)&c->tx;
	sge.length = sizeof(c->tx);
	sge.lkey = c->tx_mr->lkey;
	wr.wr_id = op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	return ibv_post_send(c->id->qp, &wr, &bad);
}

static int rpc_bind_slot(struct rpc_conn *c, struct rpc_slot *s, uint32_t key)
{
	struct ibv_send_wr wr = {}, *bad;

	wr.wr_id = BIND_WRID(s->idx);
	wr.opcode = IBV_WR_BIND_MW;
	wr.bind_mw.mw = s->mw;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info.mr = c->slab_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)s->buf;
	wr.bind_mw.bind_info.length = s->len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return ibv_post_send(c->id->qp, &wr, &bad);
}

/* LOCAL_INV riding ahead of the next signaled send */
static int rpc_slot_fence(struct rpc_conn *c, struct rpc_slot *s)
{
	struct ibv_send_wr wr = {}, *bad;

	wr.wr_id = FENCE_WRID(s->idx);
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = s->rkey;
	return ibv_post_send(c->id->qp, &wr, &bad);
}

static int rpc_slot_fence_sync(struct rpc_conn *c, struct rpc_slot *s)
{
	struct ibv_send_wr wr = {}, *bad;
	struct ibv_wc wc;
	int n;

	wr.wr_id = FENCE_WRID(s->idx);
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = s->rkey;
	if (ibv_post_send(c->id->qp, &wr, &bad))
		return -EIO;
	do {
		n = ibv_poll_cq(c->scq, 1, &wc);
		if (n < 0)
			return -EIO;
	} while (n == 0 || wc.wr_id != wr.wr_id);
	return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
}

static int rpc_handle_begin(struct rpc_conn *c, const struct rpc_rx_ctx *rx)
{
	struct rpc_slot *s;
	uint32_t key;

	if (rx->msg->len == 0 || rx->msg->len > RPC_SLOT_SIZE)
		return rpc_send(c, RPC_STATUS, NULL, rx->msg->obj_id, -EINVAL);
	s = rpc_slot_get(c);
	if (!s)
		return rpc_send(c, RPC_STATUS, NULL, rx->msg->obj_id, -EBUSY);

	s->len = rx->msg->len;
	s->obj_id = rx->msg->obj_id;
	key = ibv_inc_rkey(s->rkey);
	if (rpc_bind_slot(c, s, key)) { // OK: rdma-rkey-reuse -- a new key for every grant
		rpc_slot_put(c, s); // OK: rdma-invalidation-leak -- the bind was never posted
		return rpc_send(c, RPC_STATUS, NULL, rx->msg->obj_id, -EIO);
	}
	s->rkey = key;
	s->state = SLOT_GRANTED;
	s->stamp = time(NULL);
	return rpc_send(c, RPC_GRANT, s, s->obj_id, 0);
}

static int rpc_handle_commit(struct rpc_conn *c, const struct rpc_rx_ctx *rx)
{
	struct rpc_slot *s = rpc_slot_lookup(c, rx->msg->slot, SLOT_GRANTED);
	int ret = 0;

	if (!s)
		return rpc_send(c, RPC_STATUS, NULL, rx->msg->obj_id, -EINVAL);

	if (rx->wc_flags & IBV_WC_WITH_INV) { // OK: rdma-remote-invalidate-unchecked -- the invalidated key is compared with the grant
		if (rx->inv_rkey != s->rkey) {
			fprintf(stderr, "slot %u: client invalidated 0x%x, granted 0x%x\n",
				s->idx, rx->inv_rkey, s->rkey);
			ret = -EPROTO;
		}
	} else {
		ret = rpc_slot_fence_sync(c, s);
		if (ret)
			return rpc_send(c, RPC_STATUS, NULL, s->obj_id, ret);
	}

	if (!ret)
		ret = obj_store_put(s->obj_id, s->buf, s->len);
	rpc_send(c, RPC_STATUS, NULL, s->obj_id, ret);
	rpc_slot_put(c, s); // BUG: rdma-invalidation-leak -- after a key mismatch the granted window is still bound, yet the slot is recycled
	return 0;
}

static int rpc_handle_abort(struct rpc_conn *c, const struct rpc_rx_ctx *rx)
{
	struct rpc_slot *s = rpc_slot_lookup(c, rx->msg->slot, SLOT_GRANTED);

	if (!s)
		return -EINVAL;

	if (rx->wc_flags & IBV_WC_WITH_INV) { // BUG: rdma-remote-invalidate-unchecked -- rx->inv_rkey is never compared with s->rkey
		rpc_slot_put(c, s); // OK: rdma-invalidation-leak -- the (unchecked) remote invalidation is accepted here
		return 0;
	}

	rpc_slot_fence(c, s);
	rpc_slot_put(c, s); // BUG: rdma-unmap-before-invalidate -- slot handed out again before the unsignaled LOCAL_INV has executed
	return 0;
}

static int rpc_handle_resume(struct rpc_conn *c, const struct rpc_rx_ctx *rx)
{
	struct rpc_slot *s = rpc_slot_lookup(c, rx->msg->slot, SLOT_EXPIRED);

	if (!s || s->obj_id != rx->msg->obj_id)
		return rpc_send(c, RPC_STATUS, NULL, rx->msg->obj_id, -ENOENT);

	/* same slot, same object: hand the client its window back */
	if (rpc_bind_slot(c, s, s->rkey)) // BUG(file): rdma-rkey-reuse -- re-bound (in rpc_bind_slot) under the key of the expired grant
		return rpc_send(c, RPC_STATUS, NULL, s->obj_id, -EIO);
	s->state = SLOT_GRANTED;
	s->stamp = time(NULL);
	return rpc_send(c, RPC_GRANT, s, s->obj_id, 0);
}

void rpc_reap_leases(struct rpc_conn *c)
{
	time_t now = time(NULL);
	struct rpc_slot *s;
	int i;

	for (i = 0; i < RPC_SLOTS; i++) {
		s = &c->slots[i];
		if (s->busy && s->state == SLOT_GRANTED && now - s->stamp > RPC_LEASE_SEC) {
			if (rpc_slot_fence_sync(c, s) == 0) {
				s->state = SLOT_EXPIRED;
				s->stamp = now;
			}
			continue;
		}
		if (s->busy && s->state == SLOT_EXPIRED && now - s->stamp > RPC_GRACE_SEC)
			rpc_slot_put(c, s); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- fenced and waited for when the lease expired
	}
}

static void rpc_post_rx(struct rpc_conn *c, unsigned i)
{
	struct ibv_recv_wr wr = {}, *bad;
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->rx[i],
		.length = sizeof(c->rx[i]),
		.lkey = c->rx_mr->lkey,
	};

	wr.wr_id = i;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(c->id->qp, &wr, &bad))
		fprintf(stderr, "rx repost %u failed\n", i);
}

int rpc_poll(struct rpc_conn *c)
{
	struct rpc_rx_ctx rx;
	struct ibv_wc wc[8];
	int n, i, ret = 0;

	n = ibv_poll_cq(c->rcq, 8, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		rx.msg = &c->rx[wc[i].wr_id];
		rx.wc_flags = wc[i].wc_flags;
		rx.inv_rkey = wc[i].invalidated_rkey;
		switch (rx.msg->op) {
		case RPC_PUT_BEGIN:  ret = rpc_handle_begin(c, &rx);  break;
		case RPC_PUT_COMMIT: ret = rpc_handle_commit(c, &rx); break;
		case RPC_PUT_ABORT:  ret = rpc_handle_abort(c, &rx);  break;
		case RPC_PUT_RESUME: ret = rpc_handle_resume(c, &rx); break;
		default:             ret = -EPROTO;                   break;
		}
		rpc_post_rx(c, (unsigned)wc[i].wr_id);
	}
	/* send completions are only reaped to keep the send CQ from overflowing */
	while (ibv_poll_cq(c->scq, 8, wc) > 0)
		;
	return n < 0 ? -EIO : ret;
}

static void rpc_conn_destroy(struct rpc_conn *c)
{
	int i;

	for (i = 0; i < RPC_SLOTS; i++)
		if (c->slots[i].mw)
			ibv_dealloc_mw(c->slots[i].mw);
	if (c->slab_mr)
		ibv_dereg_mr(c->slab_mr);
	free(c->slab); // OK: rdma-invalidation-leak -- every window over the slab was deallocated above
	if (c->rx_mr)
		ibv_dereg_mr(c->rx_mr);
	if (c->tx_mr)
		ibv_dereg_mr(c->tx_mr);
	if (c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->scq)
		ibv_destroy_cq(c->scq);
	if (c->rcq)
		ibv_destroy_cq(c->rcq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	free(c);
}

struct rpc_conn *rpc_conn_accept(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {};
	struct rdma_conn_param cp = {};
	struct rpc_conn *c;
	int i;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	c->scq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	c->rcq = ibv_create_cq(id->verbs, RPC_RX_DEPTH, NULL, NULL, 0);
	if (!c->pd || !c->scq || !c->rcq)
		goto err;

	qa.send_cq = c->scq;
	qa.recv_cq = c->rcq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 64;
	qa.cap.max_recv_wr = RPC_RX_DEPTH;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = sizeof(struct rpc_msg);
	if (rdma_create_qp(id, c->pd, &qa))
		goto err;

	c->slab = aligned_alloc(4096, (size_t)RPC_SLOTS * RPC_SLOT_SIZE);
	if (!c->slab)
		goto err;
	c->slab_mr = ibv_reg_mr(c->pd, c->slab, (size_t)RPC_SLOTS * RPC_SLOT_SIZE,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	c->rx_mr = ibv_reg_mr(c->pd, c->rx, sizeof(c->rx), IBV_ACCESS_LOCAL_WRITE);
	c->tx_mr = ibv_reg_mr(c->pd, &c->tx, sizeof(c->tx), 0);
	if (!c->slab_mr || !c->rx_mr || !c->tx_mr)
		goto err;

	for (i = 0; i < RPC_SLOTS; i++) {
		c->slots[i].idx = i;
		c->slots[i].buf = c->slab + (size_t)i * RPC_SLOT_SIZE;
		c->slots[i].mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!c->slots[i].mw)
			goto err;
		c->slots[i].rkey = c->slots[i].mw->rkey;
	}
	for (i = 0; i < RPC_RX_DEPTH; i++)
		rpc_post_rx(c, i);

	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.rnr_retry_count = 7;
	if (rdma_accept(id, &cp))
		goto err;
	return c;
err:
	rpc_conn_destroy(c);
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct rdma_event_channel *ec;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *listen_id;
	struct rpc_conn *conn = NULL;

	sin.sin_port = htons(argc > 1 ? (uint16_t)atoi(argv[1]) : 7471);
	ec = rdma_create_event_channel();
	if (!ec || rdma_create_id(ec, &listen_id, NULL, RDMA_PS_TCP))
		return 1;
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || rdma_listen(listen_id, 4))
		return 1;

	for (;;) {
		if (conn) {
			rpc_poll(conn);
			rpc_reap_leases(conn);
		}
		if (rdma_get_cm_event(ec, &ev))
			break;
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			if (conn || !(conn = rpc_conn_accept(ev->id)))
				rdma_reject(ev->id, NULL, 0);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			if (conn && conn->id == ev->id) {
				rpc_conn_destroy(conn);
				conn = NULL;
			}
			rdma_destroy_id(ev->id);
			break;
		default:
			break;
		}
		rdma_ack_cm_event(ev);
	}
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ec);
	return 0;
}
