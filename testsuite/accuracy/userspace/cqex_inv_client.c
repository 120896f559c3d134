/*
 * objc: object-store client.  A PUT or GET exposes the caller's buffer
 * through a type-2 window bound per request (BIND_MW chained to the
 * request SEND); the server moves the data with one-sided operations and
 * completes the request with SEND_WITH_INV on the window's key.  Completions
 * come from an extended CQ (ibv_start_poll/ibv_next_poll).
 *
 * Correct: keys rotate through objc_next_key(); the invalidated rkey read
 * from the extended CQ is compared with the request's before the window is
 * considered dead, and a mismatch falls back to LOCAL_INV.
 * Not correct: the send queue was sized when the client still relied on
 * the server's invalidation only: 2 WRs per request, but a request can
 * post BIND + SEND + LOCAL_INV, so with a full window of requests posts
 * fail with ENOMEM.  The factor is also hand-made (migration note).
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct objc_msg {
	uint8_t  op;
	uint8_t  pad[3];
	uint32_t id;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	char     name[64];
};

struct objc_req {
	uint32_t            id;
	int                 in_use;
	struct ibv_mw      *mw;
	uint32_t            rkey;
	struct objc_msg     msg;
	struct ibv_sge      sge;
	struct ibv_send_wr  bind;
	struct ibv_send_wr  send;
	struct ibv_send_wr  inv;
	void              (*cb)(struct objc_req *, int);
};

struct objc {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq_ex   *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *buf_mr;	/* application buffers, MW_BIND */
	struct ibv_mr      *msg_mr;
	unsigned int        depth;
	struct objc_req    *reqs;
};

static uint32_t objc_next_key(const struct objc_req *r)
{
	return ibv_inc_rkey(r->rkey);
}

int objc_create_qp(struct objc *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ibv_cq_ex_to_cq(c->cq);
	attr.recv_cq = ibv_cq_ex_to_cq(c->cq);
	attr.qp_type = IBV_QPT_RC;
	// BUG(file): rdma-send-queue-undersized -- BIND + SEND + LOCAL_INV per request, room for 2
	attr.cap.max_send_wr = 2 * c->depth; // BUG: rdma-send-queue-manual-factor -- hand-made factor for the BIND work request
	attr.cap.max_recv_wr = c->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

int objc_submit(struct objc *c, struct objc_req *r, uint8_t op, const char *name,
		void *buf, uint32_t len)
{
	struct ibv_send_wr *bad;

	r->rkey = objc_next_key(r);
	memset(&r->bind, 0, sizeof(r->bind));
	r->bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-request window bind by the ULP
	r->bind.bind_mw.mw = r->mw;
	r->bind.bind_mw.rkey = r->rkey; /* OK: rdma-rkey-reuse -- computed by objc_next_key() with ibv_inc_rkey() */
	r->bind.bind_mw.bind_info.mr = c->buf_mr;
	r->bind.bind_mw.bind_info.addr = (uintptr_t)buf;
	r->bind.bind_mw.bind_info.length = len;
	r->bind.bind_mw.bind_info.mw_access_flags =
		IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	r->bind.next = &r->send;

	r->msg.op = op;
	r->msg.id = htobe32(r->id);
	r->msg.addr = htobe64((uintptr_t)buf);
	r->msg.rkey = htobe32(r->rkey);
	r->msg.len = htobe32(len);
	strncpy(r->msg.name, name, sizeof(r->msg.name) - 1);
	r->sge.addr = (uintptr_t)&r->msg;
	r->sge.length = sizeof(r->msg);
	r->sge.lkey = c->msg_mr->lkey;

	memset(&r->send, 0, sizeof(r->send));
	r->send.wr_id = (uintptr_t)r;
	r->send.opcode = IBV_WR_SEND;
	r->send.sg_list = &r->sge;
	r->send.num_sge = 1;
	r->send.send_flags = IBV_SEND_SIGNALED;
	r->in_use = 1;
	return ibv_post_send(c->qp, &r->bind, &bad);
}

static int objc_post_inv(struct objc *c, struct objc_req *r)
{
	struct ibv_send_wr *bad;

	memset(&r->inv, 0, sizeof(r->inv));
	r->inv.wr_id = (uintptr_t)r | 1;
	r->inv.opcode = IBV_WR_LOCAL_INV;
	r->inv.invalidate_rkey = r->rkey;
	r->inv.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &r->inv, &bad);
}

static void objc_done(struct objc_req *r, int status)
{
	r->in_use = 0;
	r->cb(r, status);
}

void objc_poll(struct objc *c, const struct objc_msg *rx_ring)
{
	struct ibv_poll_cq_attr attr = { 0 };
	struct objc_req *r;

	if (ibv_start_poll(c->cq, &attr))
		return;
	do {
		enum ibv_wc_opcode op = ibv_wc_read_opcode(c->cq);
		uint64_t wr_id = c->cq->wr_id;

		if (c->cq->status != IBV_WC_SUCCESS)
			continue;
		if (op == IBV_WC_LOCAL_INV) {
			objc_done((struct objc_req *)(uintptr_t)(wr_id & ~1ull), 0);
		} else if (op == IBV_WC_RECV) {
			uint32_t id = be32toh(rx_ring[wr_id].id);

			if (id >= c->depth || !c->reqs[id].in_use)
				continue;
			r = &c->reqs[id];
			/* OK: rdma-remote-invalidate-unchecked -- the invalidated key is compared with the request's */
			if ((ibv_wc_read_wc_flags(c->cq) & IBV_WC_WITH_INV) &&
			    ibv_wc_read_invalidated_rkey(c->cq) == r->rkey)
				objc_done(r, 0);
			else if (objc_post_inv(c, r))
				r->cb(r, -EIO);	/* stays in_use: the window dies with the QP at teardown */
		}
	} while (ibv_next_poll(c->cq) == 0);
	ibv_end_poll(c->cq);
}

int objc_alloc_reqs(struct objc *c)
{
	unsigned int n;

	c->reqs = calloc(c->depth, sizeof(*c->reqs));
	if (!c->reqs)
		return -ENOMEM;
	for (n = 0; n < c->depth; n++) {
		c->reqs[n].id = n;
		if (!(c->reqs[n].mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2))) // BUG: rdma-local-mr-management -- windows allocated by the ULP
			goto undo;
		c->reqs[n].rkey = c->reqs[n].mw->rkey;
	}
	return 0;
undo:
	/* OK: rdma-mr-leak -- unwinds every window allocated before the failure */
	while (n--)
		ibv_dealloc_mw(c->reqs[n].mw);
	free(c->reqs);
	return -ENOMEM;
}
