/*
 * A user-space NFS-over-RDMA client transport (xprtrdma style).  Each RPC
 * slot owns a type-2 memory window used to expose the reply chunk (the
 * server RDMA-WRITEs large replies into it).  A call posts BIND_MW chained
 * to the call SEND; the reply arrives on a receive, its completion flags
 * and invalidated key are saved in the receive buffer descriptor (rep),
 * and the reply handler decides later whether the window still needs a
 * LOCAL_INV.
 *
 * Not correct:
 *  - the window key is computed once, when the slot is created, and every
 *    call binds with that same value: a server that kept an old reply
 *    chunk key can write into the next call's reply buffer;
 *  - the reply handler treats IBV_WC_WITH_INV (copied into rep->rr_wc_flags)
 *    as "our window is invalidated" without comparing rep->rr_inv_rkey.
 * Queue sizing (3 WRs per slot) is right; the factor is hand-made.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RPCRDMA_WRS_PER_CALL	3

struct rpcrdma_rep {
	struct ibv_sge  rr_sge;
	uint32_t        rr_xid;
	unsigned int    rr_wc_flags;
	uint32_t        rr_inv_rkey;
	char            rr_buf[1024];
};

struct rpcrdma_req {
	uint32_t            rl_slot;
	struct ibv_mw      *rl_mw;
	uint32_t            rl_key;	/* key for the next bind */
	bool                rl_mw_live;
	void               *rl_reply_chunk;
	uint32_t            rl_reply_len;
	struct ibv_sge      rl_send_sge;
	struct ibv_send_wr  rl_bind_wr;
	struct ibv_send_wr  rl_send_wr;
	struct ibv_send_wr  rl_inv_wr;
	char                rl_call[1024];
};

struct rpcrdma_ep {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	struct ibv_mr       *chunk_mr;	/* reply chunks, LOCAL_WRITE | MW_BIND */
	struct ibv_mr       *call_mr;
	unsigned int         max_requests;
	struct rpcrdma_req  *reqs;
};

int rpcrdma_ep_create(struct rpcrdma_ep *ep)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- BIND + SEND + LOCAL_INV per request */
	attr.cap.max_send_wr = RPCRDMA_WRS_PER_CALL * ep->max_requests; // BUG: rdma-send-queue-manual-factor -- depth times a hand-made factor for BIND/LOCAL_INV
	attr.cap.max_recv_wr = ep->max_requests;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	ep->qp = ibv_create_qp(ep->pd, &attr);
	return ep->qp ? 0 : -errno;
}

int rpcrdma_reqs_create(struct rpcrdma_ep *ep)
{
	unsigned int i;

	ep->reqs = calloc(ep->max_requests, sizeof(*ep->reqs));
	if (!ep->reqs)
		return -ENOMEM;
	for (i = 0; i < ep->max_requests; i++) {
		struct rpcrdma_req *req = &ep->reqs[i];

		req->rl_slot = i;
		req->rl_mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- windows allocated by the ULP
		if (!req->rl_mw)
			goto out_unwind;
		req->rl_key = ibv_inc_rkey(req->rl_mw->rkey);
	}
	return 0;

out_unwind:
	while (i--)
		ibv_dealloc_mw(ep->reqs[i].rl_mw);
	free(ep->reqs);
	ep->reqs = NULL;
	return -ENOMEM;
}

int rpcrdma_send_call(struct rpcrdma_ep *ep, struct rpcrdma_req *req, uint32_t call_len)
{
	struct ibv_send_wr *bad;

	memset(&req->rl_bind_wr, 0, sizeof(req->rl_bind_wr));
	req->rl_bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	req->rl_bind_wr.bind_mw.mw = req->rl_mw;
	// BUG: rdma-rkey-reuse -- rl_key was computed once at slot creation; every bind reuses it
	req->rl_bind_wr.bind_mw.rkey = req->rl_key;
	req->rl_bind_wr.bind_mw.bind_info.mr = ep->chunk_mr;
	req->rl_bind_wr.bind_mw.bind_info.addr = (uintptr_t)req->rl_reply_chunk;
	req->rl_bind_wr.bind_mw.bind_info.length = req->rl_reply_len;
	req->rl_bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	req->rl_bind_wr.next = &req->rl_send_wr;

	/* the reply chunk (address, key) is encoded in rl_call by the XDR layer */
	req->rl_send_sge.addr = (uintptr_t)req->rl_call;
	req->rl_send_sge.length = call_len;
	req->rl_send_sge.lkey = ep->call_mr->lkey;
	memset(&req->rl_send_wr, 0, sizeof(req->rl_send_wr));
	req->rl_send_wr.wr_id = (uintptr_t)req;
	req->rl_send_wr.opcode = IBV_WR_SEND;
	req->rl_send_wr.sg_list = &req->rl_send_sge;
	req->rl_send_wr.num_sge = 1;
	req->rl_send_wr.send_flags = IBV_SEND_SIGNALED;
	req->rl_mw_live = true;
	return ibv_post_send(ep->qp, &req->rl_bind_wr, &bad);
}

/* receive completion: stash what the reply handler needs */
void rpcrdma_wc_receive(struct rpcrdma_rep *rep, const struct ibv_wc *wc)
{
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->invalidated_rkey;
	rep->rr_xid = *(uint32_t *)rep->rr_buf;
}

static int rpcrdma_local_inv(struct rpcrdma_ep *ep, struct rpcrdma_req *req)
{
	struct ibv_send_wr *bad;

	memset(&req->rl_inv_wr, 0, sizeof(req->rl_inv_wr));
	req->rl_inv_wr.wr_id = (uintptr_t)req | 1;
	req->rl_inv_wr.opcode = IBV_WR_LOCAL_INV;
	req->rl_inv_wr.invalidate_rkey = req->rl_key;
	req->rl_inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(ep->qp, &req->rl_inv_wr, &bad);
}

void rpcrdma_complete_rqst(struct rpcrdma_req *req);

void rpcrdma_reply_handler(struct rpcrdma_ep *ep, struct rpcrdma_rep *rep)
{
	uint32_t slot = be32toh(rep->rr_xid) % ep->max_requests;
	struct rpcrdma_req *req = &ep->reqs[slot];

	// BUG: rdma-remote-invalidate-unchecked -- rr_inv_rkey is never compared with req->rl_key
	if (rep->rr_wc_flags & IBV_WC_WITH_INV) {
		req->rl_mw_live = false;
		rpcrdma_complete_rqst(req);
		return;
	}
	if (rpcrdma_local_inv(ep, req) == 0)
		return;		/* completes from the LOCAL_INV completion */
	req->rl_mw_live = true;	/* left for connection teardown */
}
