/*
 * bulkrpc: an RPC transport with separate argument and reply chunks.  A
 * call binds two type-2 windows -- the argument chunk (server READs it)
 * and the reply chunk (server WRITEs it) -- and sends the call header; the
 * three work requests live in a wr[] array indexed by an enum and are
 * linked through a tail pointer, so calls without one of the chunks skip
 * its bind.  The server invalidates the reply window with SEND_WITH_INV;
 * the argument window (and the reply window when the server did not) is
 * invalidated locally after the reply.
 *
 * Correct: keys rotated with ibv_inc_rkey() for each bind.
 * Not correct:
 *  - the send queue is sized for 4 WRs per call ("two binds, the send, an
 *    invalidate"), but a call can post 2 binds + SEND + 2 LOCAL_INVs;
 *    the factor itself is hand-made (migration note);
 *  - the reply path accepts the remote invalidation in the else branch of
 *    a negated test without comparing the invalidated key.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { BR_WR_BIND_ARG, BR_WR_BIND_REPLY, BR_WR_SEND, BR_WR_NR };
enum { BR_CHUNK_ARG, BR_CHUNK_REPLY, BR_CHUNK_NR };

struct br_chunk {
	struct ibv_mw *mw;
	uint32_t       key;
	void          *addr;
	uint32_t       len;
	int            live;
};

struct br_call {
	uint32_t           xid;
	struct br_chunk    chunk[BR_CHUNK_NR];
	struct ibv_send_wr wr[BR_WR_NR];
	struct ibv_send_wr inv[BR_CHUNK_NR];
	struct ibv_sge     hdr_sge;
	char               hdr[256];
	int                pending_inv;
};

struct br_xprt {
	struct ibv_pd  *pd;
	struct ibv_cq  *cq;
	struct ibv_qp  *qp;
	struct ibv_mr  *bulk_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr  *hdr_mr;
	unsigned int    slots;
	struct br_call *calls;
};

int br_create_qp(struct br_xprt *x)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = x->cq;
	attr.recv_cq = x->cq;
	attr.qp_type = IBV_QPT_RC;
	// BUG(file): rdma-send-queue-undersized -- up to 5 WRs per call (2 BIND_MW, SEND, 2 LOCAL_INV), room for 4
	attr.cap.max_send_wr = 4 * x->slots; // BUG: rdma-send-queue-manual-factor -- depth times a hand-made factor for binds and invalidations
	attr.cap.max_recv_wr = x->slots;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	x->qp = ibv_create_qp(x->pd, &attr);
	return x->qp ? 0 : -errno;
}

static struct ibv_send_wr **br_add_bind(struct br_xprt *x, struct br_call *c, int ci,
				       int wi, unsigned int access,
				       struct ibv_send_wr **tail)
{
	struct br_chunk *ch = &c->chunk[ci];
	struct ibv_send_wr *wr = &c->wr[wi];

	if (!ch->len)
		return tail;
	/* OK: rdma-rkey-reuse -- each bind gets ibv_inc_rkey() of the previous key */
	ch->key = ibv_inc_rkey(ch->key);
	memset(wr, 0, sizeof(*wr));
	wr->opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window binds done by the ULP
	wr->bind_mw.mw = ch->mw;
	wr->bind_mw.rkey = ch->key;
	wr->bind_mw.bind_info.mr = x->bulk_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)ch->addr;
	wr->bind_mw.bind_info.length = ch->len;
	wr->bind_mw.bind_info.mw_access_flags = access;
	ch->live = 1;
	*tail = wr;
	return &wr->next;
}

int br_call_start(struct br_xprt *x, struct br_call *c, uint32_t hdr_len)
{
	struct ibv_send_wr *head = NULL, **tail = &head, *bad;

	tail = br_add_bind(x, c, BR_CHUNK_ARG, BR_WR_BIND_ARG, IBV_ACCESS_REMOTE_READ, tail);
	tail = br_add_bind(x, c, BR_CHUNK_REPLY, BR_WR_BIND_REPLY, IBV_ACCESS_REMOTE_WRITE, tail);

	c->hdr_sge.addr = (uintptr_t)c->hdr;
	c->hdr_sge.length = hdr_len;
	c->hdr_sge.lkey = x->hdr_mr->lkey;
	memset(&c->wr[BR_WR_SEND], 0, sizeof(c->wr[BR_WR_SEND]));
	c->wr[BR_WR_SEND].wr_id = (uintptr_t)c;
	c->wr[BR_WR_SEND].opcode = IBV_WR_SEND;
	c->wr[BR_WR_SEND].sg_list = &c->hdr_sge;
	c->wr[BR_WR_SEND].num_sge = 1;
	c->wr[BR_WR_SEND].send_flags = IBV_SEND_SIGNALED;
	*tail = &c->wr[BR_WR_SEND];
	return ibv_post_send(x->qp, head, &bad);
}

static int br_post_inv(struct br_xprt *x, struct br_call *c, int ci)
{
	struct ibv_send_wr *wr = &c->inv[ci], *bad;

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)c | 1;
	wr->opcode = IBV_WR_LOCAL_INV;
	wr->invalidate_rkey = c->chunk[ci].key;
	wr->send_flags = IBV_SEND_SIGNALED;
	c->pending_inv++;
	return ibv_post_send(x->qp, wr, &bad);
}

void br_reply(struct br_xprt *x, struct br_call *c, const struct ibv_wc *wc)
{
	if (c->chunk[BR_CHUNK_ARG].live && br_post_inv(x, c, BR_CHUNK_ARG) == 0)
		c->chunk[BR_CHUNK_ARG].live = 0;	/* completion counted in pending_inv */

	if (!c->chunk[BR_CHUNK_REPLY].live)
		return;
	if (!(wc->wc_flags & IBV_WC_WITH_INV)) {
		if (br_post_inv(x, c, BR_CHUNK_REPLY) == 0)
			c->chunk[BR_CHUNK_REPLY].live = 0;
	} else {
		// BUG: rdma-remote-invalidate-unchecked -- whichever key the server invalidated, the reply window is taken as dead
		c->chunk[BR_CHUNK_REPLY].live = 0;
	}
}

int br_alloc_calls(struct br_xprt *x)
{
	unsigned int i;
	int ci;

	x->calls = calloc(x->slots, sizeof(*x->calls));
	if (!x->calls)
		return -ENOMEM;
	for (i = 0; i < x->slots; i++) {
		x->calls[i].xid = i;
		for (ci = 0; ci < BR_CHUNK_NR; ci++) {
			struct ibv_mw *mw = ibv_alloc_mw(x->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP

			/* OK: rdma-mr-leak -- the windows allocated so far are in x->calls; the caller runs br_free_calls() */
			if (!mw)
				return -ENOMEM;
			x->calls[i].chunk[ci].mw = mw;
			x->calls[i].chunk[ci].key = mw->rkey;
		}
	}
	return 0;
}

void br_free_calls(struct br_xprt *x)
{
	unsigned int i;
	int ci;

	for (i = 0; i < x->slots && x->calls; i++)
		for (ci = 0; ci < BR_CHUNK_NR; ci++)
			if (x->calls[i].chunk[ci].mw)
				ibv_dealloc_mw(x->calls[i].chunk[ci].mw);
	free(x->calls);
	x->calls = NULL;
}
