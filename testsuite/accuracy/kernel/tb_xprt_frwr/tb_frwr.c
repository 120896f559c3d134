// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * tb_frwr.c - FRWR memory registration for the RPC-over-RDMA client.
 *
 * An MR is registered by a REG_MR chained in front of the Call SEND and is
 * invalidated either by the server (Send With Invalidate, checked in
 * frwr_reminv()) or by a chain of signaled LOCAL_INVs. Each LOCAL_INV's
 * completion puts its own MR back on the free list.
 */
#include "tb_xprt.h"

static void frwr_mr_unmap(struct xpr_mr *mr)
{
	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(mr->mr_device, mr->mr_sg, mr->mr_nents,
				mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
}

/* hands @mr back to the transport's free list */
static void frwr_mr_put(struct xpr_mr *mr)
{
	struct xpr_buffer *buf = &mr->mr_xprt->rx_buf;

	frwr_mr_unmap(mr);
	mr->mr_req = NULL;
	spin_lock(&buf->rb_lock);
	list_add(&mr->mr_list, &buf->rb_mrs);
	spin_unlock(&buf->rb_lock);
}

void frwr_mr_release(struct xpr_mr *mr)
{
	int rc;

	frwr_mr_unmap(mr);
	rc = ib_dereg_mr(mr->mr_ibmr); /* OK: rdma-invalidation-leak -- deregistration invalidates the handle */
	if (rc)
		pr_err("xprtrdma: ib_dereg_mr status %d\n", rc);
	kfree(mr->mr_sg);
	kfree(mr);
}

/*
 * frwr_reset - put MRs back on the free list after a failed marshal.
 * Their REG_MRs were built but never posted: frwr_send() was not reached.
 */
void frwr_reset(struct xpr_req *req)
{
	struct xpr_mr *mr;

	while ((mr = xpr_mr_pop(&req->rl_registered)))
		frwr_mr_put(mr); /* OK: rdma-invalidation-leak -- the REG_MR was never posted, no handle reached the server */
}

int frwr_mr_init(struct xpr_xprt *r_xprt, struct xpr_mr *mr)
{
	struct xpr_ep *ep = r_xprt->rx_ep;
	unsigned int depth = ep->re_max_fr_depth;
	struct scatterlist *sg;
	struct ib_mr *frmr;

	frmr = ib_alloc_mr(ep->re_pd, ep->re_mrtype, depth);
	if (IS_ERR(frmr))
		return PTR_ERR(frmr); /* OK: rdma-mr-leak -- nothing was allocated */

	mr->mr_xprt = r_xprt;
	mr->mr_ibmr = frmr;
	mr->mr_device = NULL;
	mr->mr_dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	init_completion(&mr->mr_linv_done);

	sg = kcalloc(depth, sizeof(*sg), GFP_NOFS);
	if (!sg) {
		pr_err("xprtrdma: no memory for an MR scatterlist\n");
		return -ENOMEM; /* BUG: rdma-mr-leak -- mr->mr_ibmr keeps the ib_alloc_mr() result; the caller only kfree()s the struct */
	}
	sg_init_table(sg, depth);
	mr->mr_sg = sg;
	return 0;
}

int frwr_query_device(struct xpr_ep *ep, const struct ib_device *device)
{
	const struct ib_device_attr *attrs = &device->attrs;
	int max_qp_wr, depth, delta;

	if (!(attrs->device_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS) ||
	    attrs->max_fast_reg_page_list_len == 0) {
		pr_err("xprtrdma: %s does not support FRWR\n", device->name);
		return -EINVAL;
	}

	ep->re_mrtype = IB_MR_TYPE_MEM_REG;
	if (attrs->kernel_cap_flags & IBK_SG_GAPS_REG)
		ep->re_mrtype = IB_MR_TYPE_SG_GAPS;
	ep->re_max_fr_depth = min_t(unsigned int, XPR_MAX_DATA_SEGS,
				    attrs->max_fast_reg_page_list_len);

	/*
	 * Per RPC: REG_MR and LOCAL_INV for the head, for each page-list
	 * MR and for the tail, plus the Call SEND.
	 */
	depth = 7;
	if (ep->re_max_fr_depth < XPR_MAX_DATA_SEGS) {
		delta = XPR_MAX_DATA_SEGS - ep->re_max_fr_depth;
		do {
			depth += 2;
			delta -= ep->re_max_fr_depth;
		} while (delta > 0);
	}

	max_qp_wr = attrs->max_qp_wr - XPR_BACKWARD_WRS - 1;
	if (max_qp_wr < XPR_MIN_SLOT_TABLE * depth)
		return -ENOMEM;
	if (ep->re_max_requests * depth > max_qp_wr)
		ep->re_max_requests = max_qp_wr / depth;

	/* OK: rdma-send-queue-undersized -- depth counts every REG_MR, LOCAL_INV and the SEND of one RPC; one spare entry for draining */
	ep->re_attr.cap.max_send_wr = ep->re_max_requests * depth; /* BUG(program): rdma-send-queue-manual-factor -- hand-made per-RPC registration factor */
	ep->re_attr.cap.max_send_wr += XPR_BACKWARD_WRS;
	ep->re_attr.cap.max_send_wr += 1;	/* for ib_drain_sq */
	ep->re_attr.cap.max_recv_wr = ep->re_max_requests + XPR_BACKWARD_WRS + 1;
	return 0;
}

struct xpr_mr_seg *frwr_map(struct xpr_xprt *r_xprt, struct xpr_mr_seg *seg,
			    int nsegs, bool writing, __be32 xid,
			    struct xpr_mr *mr)
{
	struct xpr_ep *ep = r_xprt->rx_ep;
	struct ib_reg_wr *reg_wr;
	struct ib_mr *ibmr;
	int i, n, dma_nents;
	u8 key;

	if (nsegs > ep->re_max_fr_depth)
		nsegs = ep->re_max_fr_depth;
	for (i = 0; i < nsegs; i++, seg++)
		sg_set_page(&mr->mr_sg[i], seg->mr_page, seg->mr_len,
			    seg->mr_pgoff);
	mr->mr_nents = i;
	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	dma_nents = ib_dma_map_sg(ep->re_id->device, mr->mr_sg, mr->mr_nents,
				  mr->mr_dir);
	if (!dma_nents) {
		mr->mr_dir = DMA_NONE;
		return ERR_PTR(-EIO);
	}
	mr->mr_device = ep->re_id->device;

	ibmr = mr->mr_ibmr;
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE);
	if (n != dma_nents)
		return ERR_PTR(-EIO);	/* frwr_reset() unmaps it */

	ibmr->iova &= 0x00000000ffffffff;
	ibmr->iova |= ((u64)be32_to_cpu(xid)) << 32;
	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	reg_wr = &mr->mr_regwr;
	reg_wr->wr.opcode = IB_WR_REG_MR;
	reg_wr->wr.send_flags = 0;
	reg_wr->wr.num_sge = 0;
	reg_wr->mr = ibmr;
	reg_wr->key = ibmr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	return seg;
}

int frwr_send(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_wr;
	struct xpr_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		post_wr = &mr->mr_regwr.wr;
	}
	return ib_post_send(r_xprt->rx_ep->re_id->qp, post_wr, NULL);
}

void frwr_reminv(struct xpr_rep *rep, struct list_head *mrs)
{
	struct xpr_mr *mr;

	list_for_each_entry(mr, mrs, mr_list)
		if (mr->mr_handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			frwr_mr_put(mr); /* OK: rdma-invalidation-leak -- the server invalidated exactly this handle */
			break;	/* only one invalidated MR per RPC */
		}
}

static void frwr_mr_done(struct ib_wc *wc, struct xpr_mr *mr)
{
	if (likely(wc->status == IB_WC_SUCCESS))
		frwr_mr_put(mr); /* OK: rdma-invalidation-leak -- only after a successful LOCAL_INV */
}

static void frwr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xpr_mr *mr = container_of(wc->wr_cqe, struct xpr_mr, mr_cqe);

	frwr_mr_done(wc, mr);
}

static void frwr_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xpr_mr *mr = container_of(wc->wr_cqe, struct xpr_mr, mr_cqe);

	frwr_mr_done(wc, mr);
	complete(&mr->mr_linv_done);
}

static struct ib_send_wr *frwr_build_inv_chain(struct xpr_req *req,
					       struct ib_send_wr **first)
{
	struct ib_send_wr *last = NULL, **prev = first;
	struct xpr_mr *mr;

	while ((mr = xpr_mr_pop(&req->rl_registered))) {
		mr->mr_req = req;
		last = &mr->mr_invwr;
		last->next = NULL;
		last->wr_cqe = &mr->mr_cqe;
		last->sg_list = NULL;
		last->num_sge = 0;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = IB_SEND_SIGNALED;
		last->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = frwr_wc_localinv;

		*prev = last;
		prev = &last->next;
	}
	return last;
}

void frwr_unmap_sync(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	struct ib_send_wr *first = NULL, *last;
	struct xpr_mr *mr;
	int rc;

	last = frwr_build_inv_chain(req, &first);
	if (!last)
		return;

	mr = container_of(last, struct xpr_mr, mr_invwr);
	mr->mr_cqe.done = frwr_wc_localinv_wake;
	reinit_completion(&mr->mr_linv_done);

	rc = ib_post_send(r_xprt->rx_ep->re_id->qp, first, NULL);
	if (!rc) {
		/* OK: rdma-unmap-before-invalidate -- every MR is put back by its own LOCAL_INV completion; this only waits */
		wait_for_completion(&mr->mr_linv_done);
		return;
	}
	/* MRs in the chain that did not get posted are recycled on disconnect */
	xpr_force_disconnect(r_xprt->rx_ep);
}

static void frwr_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xpr_mr *mr = container_of(wc->wr_cqe, struct xpr_mr, mr_cqe);
	struct xpr_rep *rep = mr->mr_req->rl_reply;

	frwr_mr_put(mr); /* BUG: rdma-invalidation-leak -- put back without looking at wc->status; a flushed LOCAL_INV leaves the handle valid */
	if (wc->status != IB_WC_SUCCESS) {
		pr_err("xprtrdma: LOCAL_INV: %s\n", ib_wc_status_msg(wc->status));
		xpr_force_disconnect(rep->rr_rxprt->rx_ep);
		return;
	}
	xpr_complete_rqst(rep);
}

void frwr_unmap_async(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	struct ib_send_wr *first = NULL, *last;
	struct xpr_mr *mr;

	last = frwr_build_inv_chain(req, &first);
	if (!last)
		return;

	/* the final LOCAL_INV completes the RPC */
	mr = container_of(last, struct xpr_mr, mr_invwr);
	mr->mr_cqe.done = frwr_wc_localinv_done;

	if (!ib_post_send(r_xprt->rx_ep->re_id->qp, first, NULL))
		return;

	xpr_force_disconnect(r_xprt->rx_ep);
	xpr_complete_rqst(req->rl_reply);
}

static void frwr_wc_stale_inv(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("xprtrdma: stale LOCAL_INV: %s\n",
		       ib_wc_status_msg(wc->status));
}

/*
 * Retransmit: the registrations of the previous transmission are stale.
 * Invalidate them and put the MRs back so the RPC can be marshaled again.
 */
void frwr_unmap_stale(struct xpr_xprt *r_xprt, struct xpr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first;
	struct xpr_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_invwr.next = NULL;
		mr->mr_invwr.wr_cqe = &mr->mr_cqe;
		mr->mr_invwr.num_sge = 0;
		mr->mr_invwr.opcode = IB_WR_LOCAL_INV;
		mr->mr_invwr.send_flags = 0;
		mr->mr_invwr.ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = frwr_wc_stale_inv;
		*prev = &mr->mr_invwr;
		prev = &mr->mr_invwr.next;
	}
	if (!first)
		return;

	if (ib_post_send(r_xprt->rx_ep->re_id->qp, first, NULL)) {
		xpr_force_disconnect(r_xprt->rx_ep);
		return;
	}

	while ((mr = xpr_mr_pop(&req->rl_registered)))
		frwr_mr_put(mr); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INVs were only posted; pages unmapped and MRs reused before they execute */
}
