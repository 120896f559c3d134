// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * tb_rpc_rdma.c - RPC-over-RDMA marshaling, transmit and Reply handling.
 *
 * Payload pages are registered chunk by chunk (frwr_map()), the handles
 * are encoded into the transport header, and the Call goes out behind its
 * REG_MRs (frwr_send()). A Reply that arrives with Send With Invalidate
 * releases the one MR whose handle matches; the rest are invalidated by
 * frwr_unmap_async(), whose last completion finishes the RPC.
 */
#include "tb_xprt.h"

/* provided by the RPC client glue */
struct xpr_req *xpr_lookup_rqst(struct xpr_xprt *r_xprt, __be32 xid);
void xpr_post_recv(struct xpr_rep *rep);
bool xpr_is_retransmit(struct xpr_req *req);

static __be32 *xpr_encode_segment(__be32 *p, struct xpr_mr *mr)
{
	*p++ = cpu_to_be32(mr->mr_handle);
	*p++ = cpu_to_be32(mr->mr_length);
	*p++ = cpu_to_be32((u32)(mr->mr_offset >> 32));
	*p++ = cpu_to_be32((u32)mr->mr_offset);
	return p;
}

static int xpr_register_chunks(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	struct xpr_mr_seg *seg = req->rl_segments;
	int nsegs = req->rl_nsegs;
	__be32 *p = req->rl_chunks;
	struct xpr_mr_seg *next;
	struct xpr_mr *mr;

	while (nsegs > 0) {
		mr = xpr_mr_get(r_xprt);
		if (!mr)
			return -EAGAIN;

		next = frwr_map(r_xprt, seg, nsegs, req->rl_writing,
				req->rl_xid, mr);
		/* on failure frwr_reset() unmaps it with the others */
		xpr_mr_push(mr, &req->rl_registered); /* OK: rdma-invalidation-leak -- the request's own list of registrations; the REG_MR is posted later by frwr_send() */
		if (IS_ERR(next))
			return PTR_ERR(next);

		p = xpr_encode_segment(p, mr);
		nsegs -= next - seg;
		seg = next;
	}
	return 0;
}

static void xpr_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("xprtrdma: Call SEND: %s\n", ib_wc_status_msg(wc->status));
}

int xpr_send_request(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	int rc;

	if (xpr_is_retransmit(req))
		frwr_unmap_stale(r_xprt, req);

	rc = xpr_register_chunks(r_xprt, req);
	if (rc) {
		frwr_reset(req); /* OK: rdma-invalidation-leak -- nothing registered for this transmission was posted */
		return rc;
	}

	req->rl_cqe.done = xpr_send_done;
	req->rl_wr.next = NULL;
	req->rl_wr.wr_cqe = &req->rl_cqe;
	req->rl_wr.sg_list = req->rl_sge;
	req->rl_wr.num_sge = 2;
	req->rl_wr.opcode = IB_WR_SEND;
	req->rl_wr.send_flags = IB_SEND_SIGNALED;

	rc = frwr_send(r_xprt, req);
	if (rc)
		xpr_force_disconnect(r_xprt->rx_ep);
	return rc;
}

void xpr_reply_handler(struct xpr_rep *rep)
{
	struct xpr_xprt *r_xprt = rep->rr_rxprt;
	struct xpr_req *req;

	req = xpr_lookup_rqst(r_xprt, rep->rr_xid);
	if (!req) {
		xpr_post_recv(rep);
		return;
	}
	req->rl_reply = rep;

	/* OK: rdma-remote-invalidate-unchecked -- frwr_reminv() releases only the MR whose handle equals rr_inv_rkey */
	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		frwr_reminv(rep, &req->rl_registered);

	if (!list_empty(&req->rl_registered))
		frwr_unmap_async(r_xprt, req);	/* LOCAL_INV completion finishes the RPC */
	else
		xpr_complete_rqst(rep);
}

void xpr_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xpr_rep *rep = container_of(wc->wr_cqe, struct xpr_rep, rr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		goto out_flushed;

	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	rep->rr_len = wc->byte_len;
	if (rep->rr_len < 4)
		goto out_flushed;
	rep->rr_xid = *(__be32 *)rep->rr_buf;

	xpr_reply_handler(rep);
	return;

out_flushed:
	xpr_post_recv(rep);
}

/* the RPC is done or was interrupted: make sure nothing stays registered */
void xpr_free_request(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	if (!list_empty(&req->rl_registered))
		frwr_unmap_sync(r_xprt, req);
}
