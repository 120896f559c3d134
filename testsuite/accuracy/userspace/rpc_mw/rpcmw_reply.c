/*
 * rpcmw_reply.c: reply handling.  A reply that carried a remote
 * invalidation completes at once; otherwise a signaled LOCAL_INV is posted
 * and the call completes from its completion (rpcmw_inv_done), so the
 * reply buffer is never handed back while the window is live.
 *
 * Not correct: the saved completion flags are trusted -- IBV_WC_WITH_INV
 * means "some key was invalidated", and s->inv_rkey is never compared
 * with the slot's window key.
 */
#include "rpcmw.h"

#include <string.h>

void rpcmw_reply(struct rpcmw_xprt *x, struct rpcmw_slot *s)
{
	struct ibv_send_wr *bad;

	// BUG: rdma-remote-invalidate-unchecked -- s->inv_rkey is never compared with s->mw->rkey
	if (s->wc_flags & IBV_WC_WITH_INV) {
		s->bound = 0;
		s->done(s, 0);
		return;
	}
	memset(&s->inv_wr, 0, sizeof(s->inv_wr));
	s->inv_wr.wr_id = (uintptr_t)s;
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->mw->rkey;
	s->inv_wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(x->qp, &s->inv_wr, &bad))
		s->done(s, -1);		/* slot stays bound: torn down with the QP */
}

void rpcmw_inv_done(struct rpcmw_xprt *x, struct rpcmw_slot *s, int ok)
{
	(void)x;
	if (!ok)
		return;
	s->bound = 0;
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- completed from the LOCAL_INV completion */
	s->done(s, 0);
}
