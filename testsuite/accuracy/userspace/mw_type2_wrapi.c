/*
 * rpcx: an RPC client on the extended QP API (ibv_wr_*).  Each call slot
 * owns a type-2 memory window; a call binds the slot's window over the
 * caller's reply buffer (the server RDMA-WRITEs bulk results through it),
 * then sends the request, all in one ibv_wr_start()/ibv_wr_complete()
 * batch.  The server may answer with SEND_WITH_INV; otherwise the client
 * invalidates the window itself before reusing the slot.
 *
 * Correct: the remote invalidation is compared with the slot's key; the
 * send queue holds BIND + SEND + LOCAL_INV per slot.
 * Not correct: every bind reuses the window's current key (mw->rkey), so a
 * server that kept the key of an earlier call reaches the next caller's
 * buffer; the LOCAL_INV is posted unsignaled and the slot goes straight
 * back to the free list, before the invalidation executed.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RPCX_SLOTS	64

struct rpcx_req_hdr {
	uint32_t xid;
	uint32_t proc;
	uint64_t reply_addr;
	uint32_t reply_rkey;
	uint32_t reply_len;
};

struct rpcx_slot {
	struct rpcx_slot    *next_free;
	uint32_t             xid;
	struct ibv_mw       *mw;
	uint32_t             rkey;
	void                *reply_buf;
	size_t               reply_len;
	struct rpcx_req_hdr  hdr;
	void               (*done)(struct rpcx_slot *, int);
};

struct rpcx_clnt {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	struct ibv_mr      *reply_mr;	/* reply buffers, MW_BIND */
	struct ibv_mr      *hdr_mr;
	struct rpcx_slot    slots[RPCX_SLOTS];
	struct rpcx_slot   *free_slots;
};

int rpcx_create_qp(struct rpcx_clnt *c)
{
	struct ibv_qp_init_attr_ex attr;
	unsigned int wrs_per_call = 3;	/* BIND_MW, SEND, LOCAL_INV */

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.pd = c->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			      IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-undersized -- three WRs per call slot */
	attr.cap.max_send_wr = wrs_per_call * RPCX_SLOTS; // BUG: rdma-send-queue-manual-factor -- hand-made factor for the BIND/INV work requests (depth is a macro here, same bug class)
	attr.cap.max_recv_wr = RPCX_SLOTS;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	c->qp = ibv_create_qp_ex(c->ctx, &attr);
	if (!c->qp)
		return -errno;
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	return 0;
}

static void rpcx_put_slot(struct rpcx_clnt *c, struct rpcx_slot *s)
{
	s->next_free = c->free_slots;
	c->free_slots = s;
}

int rpcx_call(struct rpcx_clnt *c, uint32_t proc, void *reply, size_t reply_len,
	      void (*done)(struct rpcx_slot *, int))
{
	struct ibv_mw_bind_info info;
	struct rpcx_slot *s = c->free_slots;

	if (!s)
		return -EAGAIN;
	c->free_slots = s->next_free;
	s->reply_buf = reply;
	s->reply_len = reply_len;
	s->done = done;
	s->rkey = s->mw->rkey;

	memset(&info, 0, sizeof(info));
	info.mr = c->reply_mr;
	info.addr = (uintptr_t)reply;
	info.length = reply_len;
	info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	s->hdr.xid = htobe32(s->xid);
	s->hdr.proc = htobe32(proc);
	s->hdr.reply_addr = htobe64((uintptr_t)reply);
	s->hdr.reply_rkey = htobe32(s->rkey);
	s->hdr.reply_len = htobe32((uint32_t)reply_len);

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = (uintptr_t)s;
	c->qpx->wr_flags = 0;
	// BUG: rdma-rkey-reuse -- the window is bound again with its current key instead of ibv_inc_rkey()
	ibv_wr_bind_mw(c->qpx, s->mw, s->rkey, &info); // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	c->qpx->wr_id = (uintptr_t)s;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(c->qpx);
	ibv_wr_set_sge(c->qpx, c->hdr_mr->lkey, (uintptr_t)&s->hdr, sizeof(s->hdr));
	if (ibv_wr_complete(c->qpx)) {
		rpcx_put_slot(c, s);
		return -EIO;
	}
	return 0;
}

void rpcx_reply(struct rpcx_clnt *c, struct ibv_wc *wc, uint32_t xid, int status)
{
	struct rpcx_slot *s;

	if (xid >= RPCX_SLOTS)
		return;
	s = &c->slots[xid];

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		/* OK: rdma-remote-invalidate-unchecked -- only this slot's key counts as invalidated */
		if (wc->invalidated_rkey == s->rkey) {
			s->done(s, status);
			rpcx_put_slot(c, s);
			return;
		}
	}

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = 0;
	c->qpx->wr_flags = 0;
	ibv_wr_local_inv(c->qpx, s->rkey);
	if (ibv_wr_complete(c->qpx))
		return;
	s->done(s, status);
	// BUG: rdma-unmap-before-invalidate -- the slot (and its reply buffer) is reused before the unsignaled LOCAL_INV executed
	rpcx_put_slot(c, s);
}

int rpcx_init_slots(struct rpcx_clnt *c)
{
	int i;

	for (i = 0; i < RPCX_SLOTS; i++) {
		c->slots[i].xid = i;
		c->slots[i].mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP to expose reply buffers
		if (!c->slots[i].mw)
			goto unwind;
		rpcx_put_slot(c, &c->slots[i]);
	}
	return 0;

unwind:
	/* OK: rdma-mr-leak -- the windows allocated so far are freed */
	while (--i >= 0)
		ibv_dealloc_mw(c->slots[i].mw);
	c->free_slots = NULL;
	return -ENOMEM;
}
