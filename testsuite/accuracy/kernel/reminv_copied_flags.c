// SPDX-License-Identifier: GPL-2.0
/*
 * rpx: the reply path of an invented RPC-over-RDMA client transport
 * ("rpx"), split like xprtrdma: the receive completion only copies what it
 * needs from the work completion into the reply buffer (rr_wc_flags,
 * rr_inv_rkey), and the reply handler, later and in process context, decides
 * whether the server's SEND_WITH_INV already invalidated the RPC's MRs.
 *
 * The forward channel is right: rpx_reminv() walks the RPC's MRs and only
 * treats the one whose handle equals rr_inv_rkey as invalidated. The bulk
 * channel copies only the flag (its receive handler never saved the rkey)
 * and treats all of the RPC's MRs as invalidated when it is set.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <rdma/ib_verbs.h>

struct rpx_mr {
	struct list_head	mr_list;
	struct ib_mr		*ibmr;
	u32			mr_handle;
	bool			need_linv;
};

struct rpx_rep {
	struct ib_cqe		rr_cqe;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	u32			rr_xid;
	void			*rr_buf;
};

struct rpx_req {
	struct list_head	rl_registered;
};

struct rpx_xprt;

struct rpx_req *rpx_lookup_rqst(struct rpx_xprt *x, u32 xid);
void rpx_unmap_async(struct rpx_xprt *x, struct rpx_req *req);
void rpx_complete_rqst(struct rpx_xprt *x, struct rpx_req *req);
struct rpx_xprt *rpx_cq_to_xprt(struct ib_cq *cq);
void rpx_queue_reply(struct rpx_xprt *x, struct rpx_rep *rep);

void rpx_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rpx_rep *rep = container_of(wc->wr_cqe, struct rpx_rep, rr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	rpx_queue_reply(rpx_cq_to_xprt(cq), rep);
}

static void rpx_reminv(struct rpx_rep *rep, struct list_head *mrs)
{
	struct rpx_mr *mr;

	list_for_each_entry(mr, mrs, mr_list)
		if (mr->mr_handle == rep->rr_inv_rkey) {
			mr->need_linv = false;
			break;	/* only one invalidated MR per RPC */
		}
}

void rpx_reply_handler(struct rpx_xprt *x, struct rpx_rep *rep)
{
	struct rpx_req *req = rpx_lookup_rqst(x, rep->rr_xid);

	if (!req)
		return;
	/* OK: rdma-remote-invalidate-unchecked -- rpx_reminv() accepts only the MR whose handle matches the copied rr_inv_rkey */
	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		rpx_reminv(rep, &req->rl_registered);
	if (!list_empty(&req->rl_registered))
		rpx_unmap_async(x, req);	/* LOCAL_INV for the rest */
	else
		rpx_complete_rqst(x, req);
}

struct rpx_bulk_rep {
	struct ib_cqe		br_cqe;
	int			br_wc_flags;
	u32			br_xid;
};

void rpx_bulk_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rpx_bulk_rep *rep =
		container_of(wc->wr_cqe, struct rpx_bulk_rep, br_cqe);

	if (wc->status == IB_WC_SUCCESS)
		rep->br_wc_flags = wc->wc_flags;
}

void rpx_bulk_reply_handler(struct rpx_xprt *x, struct rpx_bulk_rep *rep)
{
	struct rpx_req *req = rpx_lookup_rqst(x, rep->br_xid);
	struct rpx_mr *mr;

	if (!req)
		return;
	/* BUG: rdma-remote-invalidate-unchecked -- the copied flag alone marks every MR of the RPC invalidated; the invalidated rkey was never saved, let alone compared */
	if (rep->br_wc_flags & IB_WC_WITH_INVALIDATE) {
		list_for_each_entry(mr, &req->rl_registered, mr_list)
			mr->need_linv = false;
	}
	rpx_unmap_async(x, req);
}
