/*
 * rpcmw: an RPC transport whose calls expose a reply buffer through a
 * type-2 window.  rpcmw_xprt.c: QP and completion polling; rpcmw_bind.c:
 * window allocation and the per-call bind + call SEND; rpcmw_reply.c:
 * reply handling and invalidation.
 */
#ifndef RPCMW_H
#define RPCMW_H

#include <infiniband/verbs.h>
#include <stdint.h>

struct rpcmw_slot {
	uint32_t           xid;
	struct ibv_mw     *mw;
	int                bound;
	void              *reply;
	uint32_t           reply_len;
	char               call[512];
	struct ibv_sge     call_sge;
	struct ibv_send_wr bind_wr, call_wr, inv_wr;
	unsigned int       wc_flags;	/* saved from the reply's receive completion */
	uint32_t           inv_rkey;
	void             (*done)(struct rpcmw_slot *, int);
};

struct rpcmw_xprt {
	struct ibv_pd     *pd;
	struct ibv_cq     *cq;
	struct ibv_qp     *qp;
	struct ibv_mr     *reply_mr;	/* LOCAL_WRITE | MW_BIND */
	struct ibv_mr     *call_mr;
	unsigned int       slots;
	struct rpcmw_slot *slot;
};

int rpcmw_alloc_windows(struct rpcmw_xprt *x);
int rpcmw_call(struct rpcmw_xprt *x, struct rpcmw_slot *s, uint32_t call_len);
void rpcmw_reply(struct rpcmw_xprt *x, struct rpcmw_slot *s);
void rpcmw_inv_done(struct rpcmw_xprt *x, struct rpcmw_slot *s, int ok);

#endif
