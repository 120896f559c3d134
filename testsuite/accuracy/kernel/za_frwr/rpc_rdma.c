// SPDX-License-Identifier: GPL-2.0
/*
 * rpc_rdma.c - chunk marshaling and reply handling for the zf client.
 *
 * Correct: the general reply path (a remote invalidation releases only
 * the MR whose handle matches, the rest are invalidated before the RPC
 * completes), releasing a slot through the synchronous invalidation,
 * resetting MRs after a marshaling failure.
 * Not correct: the single-chunk fast path takes any remote invalidation
 * as the invalidation of its MR; cancelling an RPC puts its registered
 * MRs back on the free list while the server may still use them.
 */
#include "zf.h"
#include <asm/byteorder.h>

struct zf_chunk_seg {
	__be32	handle;
	__be32	length;
	__be64	offset;
};

static int zf_marshal_chunk(struct zf_xprt *xprt, struct zf_req *req,
			    struct zf_seg *seg, int nsegs, bool writing,
			    struct zf_chunk_seg *out, int max_out)
{
	struct zf_mr *mr;
	int nchunks = 0;

	do {
		if (nchunks == max_out)
			return -EMSGSIZE;
		mr = zf_mr_get(xprt);
		if (!mr)
			return -EAGAIN;
		mr->mr_req = req;
		list_add_tail(&mr->mr_list, &req->rl_registered);

		seg = zf_map(xprt, seg, nsegs, writing, req->rl_xid, mr);
		if (IS_ERR(seg))
			return PTR_ERR(seg);

		out[nchunks].handle = cpu_to_be32(mr->mr_handle);
		out[nchunks].length = cpu_to_be32(mr->mr_length);
		out[nchunks].offset = cpu_to_be64(mr->mr_offset);
		nchunks++;
		nsegs -= mr->mr_nents;
	} while (nsegs);

	return nchunks;
}

int zf_send_request(struct zf_xprt *xprt, struct zf_req *req,
		    struct zf_seg *segs, int nsegs, bool writing,
		    struct zf_chunk_seg *hdr, int max_chunks)
{
	int rc;

	rc = zf_marshal_chunk(xprt, req, segs, nsegs, writing, hdr,
			      max_chunks);
	if (rc < 0) {
		zf_reset(req);
		return rc;
	}

	req->rl_busy = true;
	rc = zf_send(xprt, req);
	if (rc) {
		/* MRs stay with the request until the reconnect */
		zf_force_disconnect(xprt);
		return -ENOTCONN;
	}
	return 0;
}

void zf_complete_rqst(struct zf_req *req, int status)
{
	req->rl_busy = false;
	req->rl_complete(req, status);
}

/*
 * Common case for small READs: a single Write chunk, which the server
 * invalidated with its Send.
 */
static bool zf_reply_fastpath(struct zf_req *req, struct zf_rep *rep)
{
	struct zf_mr *mr;

	if (list_empty(&req->rl_registered))
		return false;
	mr = list_first_entry(&req->rl_registered, struct zf_mr, mr_list);
	if (mr->mr_list.next != &req->rl_registered)
		return false;

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE) {	/* BUG: rdma-remote-invalidate-unchecked -- rr_inv_rkey is never compared with mr->mr_handle */
		/* only one MR: the invalidation was for it */
		list_del_init(&mr->mr_list);
		zf_mr_put(mr);
		zf_complete_rqst(req, 0);
		return true;
	}
	return false;
}

void zf_reply_handler(struct zf_rep *rep)
{
	struct zf_xprt *xprt = rep->rr_xprt;
	struct zf_req *req;

	req = zf_xid_lookup(xprt, rep->rr_xid);
	if (!req || !req->rl_busy) {
		pr_warn("zf: reply for unknown xid %#x dropped\n", rep->rr_xid);
		return;
	}
	req->rl_reply = rep;

	if (zf_reply_fastpath(req, rep))
		return;

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)	/* OK: rdma-remote-invalidate-unchecked -- zf_reminv() releases only the MR whose handle matches */
		zf_reminv(xprt, rep->rr_inv_rkey, &req->rl_registered);

	if (!list_empty(&req->rl_registered)) {
		zf_unmap_async(xprt, req);
		/* the LocalInv completion will complete the RPC */
		return;
	}
	zf_complete_rqst(req, 0);
}

/*
 * The RPC was interrupted by a signal before its reply arrived: give the
 * slot back.
 */
void zf_req_cancel(struct zf_xprt *xprt, struct zf_req *req)
{
	struct zf_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		zf_mr_put(mr);	/* BUG: rdma-invalidation-leak -- the server still holds these handles from the call */
	}
	req->rl_busy = false;
	list_add(&req->rl_free, &xprt->rx_free_reqs);
}

/* Slot freed after the RPC finished or was abandoned by its caller. */
void zf_req_release(struct zf_xprt *xprt, struct zf_req *req)
{
	/* OK: rdma-invalidation-leak -- zf_unmap_sync() waits for the LOCAL_INVs before the MRs go back */
	if (!list_empty(&req->rl_registered) && zf_unmap_sync(xprt, req))
		return;		/* the disconnect worker frees the slot */
	req->rl_busy = false;
	list_add(&req->rl_free, &xprt->rx_free_reqs);
}

struct zf_req *zf_req_get(struct zf_xprt *xprt)
{
	struct zf_req *req;

	req = list_first_entry_or_null(&xprt->rx_free_reqs, struct zf_req,
				       rl_free);
	if (req)
		list_del_init(&req->rl_free);
	return req;
}
