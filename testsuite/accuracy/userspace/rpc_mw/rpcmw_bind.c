/*
 * rpcmw_bind.c: windows and the call path.
 *
 * Not correct: each call re-binds its slot's window with the window's
 * current rkey; a server that kept the key of a previous call can write
 * into this call's reply buffer.
 */
#include "rpcmw.h"

#include <errno.h>
#include <string.h>

int rpcmw_alloc_windows(struct rpcmw_xprt *x)
{
	unsigned int i;

	for (i = 0; i < x->slots; i++) {
		x->slot[i].xid = i;
		x->slot[i].mw = ibv_alloc_mw(x->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!x->slot[i].mw)
			goto undo;
	}
	return 0;
undo:
	/* OK: rdma-mr-leak -- forward unwind of the windows allocated so far */
	for (unsigned int j = 0; j < i; j++)
		ibv_dealloc_mw(x->slot[j].mw);
	return -ENOMEM;
}

int rpcmw_call(struct rpcmw_xprt *x, struct rpcmw_slot *s, uint32_t call_len)
{
	struct ibv_send_wr *bad;

	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->mw->rkey; // BUG: rdma-rkey-reuse -- re-bound with the window's current key instead of ibv_inc_rkey()
	s->bind_wr.bind_mw.bind_info.mr = x->reply_mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)s->reply;
	s->bind_wr.bind_mw.bind_info.length = s->reply_len;
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	s->bind_wr.next = &s->call_wr;

	s->call_sge.addr = (uintptr_t)s->call;
	s->call_sge.length = call_len;
	s->call_sge.lkey = x->call_mr->lkey;
	memset(&s->call_wr, 0, sizeof(s->call_wr));
	s->call_wr.wr_id = (uintptr_t)s;
	s->call_wr.opcode = IBV_WR_SEND;
	s->call_wr.sg_list = &s->call_sge;
	s->call_wr.num_sge = 1;
	s->call_wr.send_flags = IBV_SEND_SIGNALED;
	s->bound = 1;
	return ibv_post_send(x->qp, &s->bind_wr, &bad) ? -EIO : 0;
}
