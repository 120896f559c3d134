/*
 * bulkv3: the third version of a bulk-data RPC client.  Bulk replies land
 * in a per-slot buffer exposed through the slot's type-2 window.  The
 * reply handler derives "need a local invalidation" from the completion
 * flags with a ternary and a local, and the window is re-bound for the
 * next call with the key the slot remembers.
 *
 * Not correct:
 *  - need_inv is cleared by any remote invalidation, whichever key it
 *    named (invalidated_rkey is never looked at);
 *  - the slot's remembered key is only advanced on the error path of the
 *    bind (to skip a possibly half-bound key), so successful calls reuse
 *    it;
 *  - the queue is sized with a hand-made factor of 3 (BIND, SEND,
 *    LOCAL_INV per call) -- enough, but the ULP's own registration
 *    arithmetic (migration note).
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define BV3_WRS_PER_CALL	3

struct bv3_slot {
	struct ibv_mw     *mw;
	uint32_t           key;
	void              *reply;
	uint32_t           reply_len;
	struct ibv_send_wr bind, call, inv;
	struct ibv_sge     call_sge;
	char               hdr[128];
};

struct bv3 {
	struct ibv_pd   *pd;
	struct ibv_cq   *cq;
	struct ibv_qp   *qp;
	struct ibv_mr   *reply_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr   *hdr_mr;
	unsigned int     nslots;
	struct bv3_slot *slots;
};

int bv3_create_qp(struct bv3 *b)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = b->cq;
	attr.recv_cq = b->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- BIND + SEND + LOCAL_INV per slot */
	attr.cap.max_send_wr = BV3_WRS_PER_CALL * b->nslots; // BUG: rdma-send-queue-manual-factor -- nslots times a hand-made factor for BIND/LOCAL_INV
	attr.cap.max_recv_wr = b->nslots;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	b->qp = ibv_create_qp(b->pd, &attr);
	return b->qp ? 0 : -errno;
}

int bv3_call(struct bv3 *b, struct bv3_slot *s, uint32_t hdr_len)
{
	struct ibv_send_wr *bad;

	memset(&s->bind, 0, sizeof(s->bind));
	s->bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	s->bind.bind_mw.mw = s->mw;
	// BUG: rdma-rkey-reuse -- s->key only changes when a bind fails; successful calls re-bind with the same key
	s->bind.bind_mw.rkey = s->key;
	s->bind.bind_mw.bind_info.mr = b->reply_mr;
	s->bind.bind_mw.bind_info.addr = (uintptr_t)s->reply;
	s->bind.bind_mw.bind_info.length = s->reply_len;
	s->bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	s->bind.next = &s->call;
	s->call_sge = (struct ibv_sge){ (uintptr_t)s->hdr, hdr_len, b->hdr_mr->lkey };
	memset(&s->call, 0, sizeof(s->call));
	s->call.wr_id = (uintptr_t)s;
	s->call.opcode = IBV_WR_SEND;
	s->call.sg_list = &s->call_sge;
	s->call.num_sge = 1;
	s->call.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(b->qp, &s->bind, &bad)) {
		s->key = ibv_inc_rkey(s->key);
		return -EIO;
	}
	return 0;
}

int bv3_reply(struct bv3 *b, struct bv3_slot *s, const struct ibv_wc *wc)
{
	struct ibv_send_wr *bad;
	bool need_inv = (wc->wc_flags & IBV_WC_WITH_INV) ? false : true;

	// BUG: rdma-remote-invalidate-unchecked -- any remote invalidation clears need_inv; invalidated_rkey is never compared with s->key
	if (!need_inv)
		return 0;
	memset(&s->inv, 0, sizeof(s->inv));
	s->inv.wr_id = (uintptr_t)s | 1;
	s->inv.opcode = IBV_WR_LOCAL_INV;
	s->inv.invalidate_rkey = s->key;
	s->inv.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(b->qp, &s->inv, &bad) ? -EIO : 1;
}
