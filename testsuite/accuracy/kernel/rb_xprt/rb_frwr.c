// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * rb_frwr.c - FRWR memory registration for the rbx RPC/RDMA transport.
 *
 * Lifetime of an MR: rbx_frwr_map() takes it from the transport's free list,
 * DMA-maps the chunk and prepares the REG_MR; rbx_frwr_send() chains the
 * REG_MRs in front of the Call's Send.  When the reply arrives the MR is
 * either invalidated by the server (rbx_frwr_reminv(), matched by handle) or
 * by a LOCAL_INV posted from rbx_frwr_unmap_async()/rbx_frwr_unmap_sync();
 * only then is it unmapped and put back on the free list.  See rb_xprt.h.
 */
#include "rb_xprt.h"

/* -------------------------------------------------------------- MR setup */

static int rbx_frwr_mr_init(struct rbx_xprt *x, struct rbx_mr *mr)
{
	struct scatterlist *sg;
	struct ib_mr *frmr;

	frmr = ib_alloc_mr(x->rx_pd, IB_MR_TYPE_MEM_REG, RBX_MAX_DEPTH);
	if (IS_ERR(frmr))
		return PTR_ERR(frmr); /* OK: rdma-mr-leak -- the allocation failed, nothing to release */

	sg = kcalloc(RBX_MAX_DEPTH, sizeof(*sg), GFP_NOFS);
	if (!sg)
		return -ENOMEM; /* BUG: rdma-mr-leak -- frmr is neither stored nor deregistered */

	mr->ibmr = frmr;
	mr->mr_sg = sg;
	mr->mr_xprt = x;
	mr->mr_dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	init_completion(&mr->mr_linv_done);
	sg_init_table(sg, RBX_MAX_DEPTH);
	return 0;
}

void rbx_frwr_mr_release(struct rbx_mr *mr)
{
	int rc;

	rc = ib_dereg_mr(mr->ibmr);
	if (rc)
		pr_err("rbx: ib_dereg_mr failed (%d)\n", rc);
	if (mr->mr_dir != DMA_NONE)
		ib_dma_unmap_sg(mr->mr_xprt->rx_dev, mr->mr_sg, mr->mr_nents,
				mr->mr_dir);
	kfree(mr->mr_sg);
	kfree(mr);
}

void rbx_mrs_destroy(struct rbx_xprt *x)
{
	struct rbx_mr *mr;

	spin_lock(&x->rx_lock);
	while ((mr = list_first_entry_or_null(&x->rx_mrs_all, struct rbx_mr,
					      mr_all))) {
		list_del(&mr->mr_all);
		spin_unlock(&x->rx_lock);
		rbx_frwr_mr_release(mr);
		spin_lock(&x->rx_lock);
	}
	INIT_LIST_HEAD(&x->rx_mrs_free);
	spin_unlock(&x->rx_lock);
}

int rbx_mrs_create(struct rbx_xprt *x)
{
	unsigned int count;

	for (count = 0; count < x->rx_max_mrs; count++) {
		struct rbx_mr *mr;
		int rc;

		mr = kzalloc(sizeof(*mr), GFP_NOFS);
		if (!mr)
			break;
		rc = rbx_frwr_mr_init(x, mr);
		if (rc) {
			kfree(mr);
			break;
		}
		spin_lock(&x->rx_lock);
		list_add(&mr->mr_list, &x->rx_mrs_free);
		list_add(&mr->mr_all, &x->rx_mrs_all);
		spin_unlock(&x->rx_lock);
	}
	return count ? 0 : -ENOMEM;
}

/* ----------------------------------------------------------- registration */

int rbx_frwr_map(struct rbx_xprt *x, struct rbx_req *req,
		 struct rbx_mr_seg *seg, int nsegs, bool writing)
{
	struct ib_reg_wr *reg_wr;
	struct rbx_mr *mr;
	struct ib_mr *ibmr;
	int i, n, dma_nents;
	u8 key;

	mr = rbx_mr_get(x);
	if (!mr)
		return -EAGAIN;

	if (nsegs > RBX_MAX_DEPTH)
		nsegs = RBX_MAX_DEPTH;
	for (i = 0; i < nsegs; i++, seg++)
		sg_set_page(&mr->mr_sg[i], seg->mr_page, seg->mr_len,
			    seg->mr_offset);
	mr->mr_nents = i;
	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	dma_nents = ib_dma_map_sg(x->rx_dev, mr->mr_sg, mr->mr_nents, mr->mr_dir);
	if (!dma_nents)
		goto out_dmamap_err;

	ibmr = mr->ibmr;
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE);
	if (n != dma_nents)
		goto out_mapmr_err;

	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	reg_wr = &mr->mr_regwr;
	memset(reg_wr, 0, sizeof(*reg_wr));
	reg_wr->wr.opcode = IB_WR_REG_MR;
	reg_wr->mr = ibmr;
	reg_wr->key = ibmr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = (u32)ibmr->length;
	mr->mr_offset = ibmr->iova;
	mr->mr_req = req;
	list_add_tail(&mr->mr_list, &req->rl_registered);
	return i;

out_dmamap_err:
	mr->mr_dir = DMA_NONE;
	rbx_mr_put(mr); /* OK: rdma-invalidation-leak -- taken from the free list and not registered */
	return -EIO;

out_mapmr_err:
	pr_err("rbx: failed to map MR (%d/%d)\n", n, dma_nents);
	rbx_mr_unmap_and_put(mr); /* OK: rdma-invalidation-leak -- no REG_MR was built or posted for this MR */
	return -EIO;
}

/* Chain the REG_MRs of the RPC in front of its Send and post them. */
int rbx_frwr_send(struct rbx_xprt *x, struct rbx_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_send_wr;
	struct rbx_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		mr->mr_regwr.wr.wr_cqe = &req->rl_send_cqe;	/* errors only */
		post_wr = &mr->mr_regwr.wr;
	}
	return ib_post_send(x->rx_ep->re_id->qp, post_wr, NULL);
}

/* After a failed marshal: nothing of this RPC has been posted yet. */
void rbx_frwr_reset(struct rbx_req *req)
{
	struct rbx_mr *mr;

	while ((mr = rbx_mr_pop(&req->rl_registered)))
		rbx_mr_unmap_and_put(mr); /* OK: rdma-invalidation-leak -- the REG_MRs were never posted, the handles never left the host */
}

/* The server invalidated one handle with SEND_WITH_INV; find it by key. */
void rbx_frwr_reminv(struct rbx_rep *rep, struct list_head *mrs)
{
	struct rbx_mr *mr;

	list_for_each_entry(mr, mrs, mr_list) {
		if (mr->mr_handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			rbx_mr_unmap_and_put(mr); /* OK: rdma-invalidation-leak -- this is the handle the server invalidated */
			return;
		}
	}
}

/* --------------------------------------------------------- invalidation */

static void rbx_frwr_mr_done(struct ib_wc *wc, struct rbx_mr *mr)
{
	if (likely(wc->status == IB_WC_SUCCESS))
		rbx_mr_unmap_and_put(mr); /* OK: rdma-invalidation-leak -- only when the LOCAL_INV succeeded */
	else
		mr->mr_linv_failed = true;
}

static void rbx_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbx_mr *mr = container_of(wc->wr_cqe, struct rbx_mr, mr_cqe);
	struct rbx_xprt *x = mr->mr_xprt;

	rbx_frwr_mr_done(wc, mr);
	if (wc->status != IB_WC_SUCCESS)
		rbx_force_disconnect(x);
}

static void rbx_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbx_mr *mr = container_of(wc->wr_cqe, struct rbx_mr, mr_cqe);

	mr->mr_linv_failed = wc->status != IB_WC_SUCCESS;
	complete(&mr->mr_linv_done);
}

static void rbx_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbx_mr *mr = container_of(wc->wr_cqe, struct rbx_mr, mr_cqe);
	struct rbx_req *req = mr->mr_req;
	struct rbx_xprt *x = mr->mr_xprt;

	rbx_mr_unmap_and_put(mr); /* BUG: rdma-invalidation-leak -- released even when the LOCAL_INV failed or was flushed */
	if (wc->status != IB_WC_SUCCESS) {
		rbx_force_disconnect(x);
		rbx_complete_rqst(req, -EIO);
		return;
	}
	rbx_complete_rqst(req, 0);
}

/* Used when the RPC ended without a usable reply; sleeps. */
void rbx_frwr_unmap_sync(struct rbx_xprt *x, struct rbx_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct rbx_mr *mr, *last_mr = NULL;
	int rc;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->mr_invwr;
		memset(last, 0, sizeof(*last));
		last->wr_cqe = &mr->mr_cqe;
		last->opcode = IB_WR_LOCAL_INV;
		last->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = rbx_wc_localinv;
		*prev = last;
		prev = &last->next;
		last_mr = mr;
	}
	if (!last_mr)
		return;

	/* Strong send queue ordering: the last completion retires them all. */
	last->send_flags = IB_SEND_SIGNALED;
	last_mr->mr_cqe.done = rbx_wc_localinv_wake;
	reinit_completion(&last_mr->mr_linv_done);

	rc = ib_post_send(x->rx_ep->re_id->qp, first, NULL);
	if (rc) {
		/* the reset after the disconnect deregisters these MRs */
		rbx_force_disconnect(x);
		return;
	}
	wait_for_completion(&last_mr->mr_linv_done);
	if (last_mr->mr_linv_failed) {
		rbx_force_disconnect(x);
		return;
	}

	while ((mr = rbx_mr_pop(&req->rl_registered)))
		rbx_mr_unmap_and_put(mr); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV at the end of the chain completed successfully */
}

/* Reply path: the RPC completes from the last LOCAL_INV's completion. */
void rbx_frwr_unmap_async(struct rbx_xprt *x, struct rbx_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct rbx_mr *mr;
	int rc;

	while ((mr = rbx_mr_pop(&req->rl_registered))) {
		last = &mr->mr_invwr;
		memset(last, 0, sizeof(*last));
		last->wr_cqe = &mr->mr_cqe;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = IB_SEND_SIGNALED;
		last->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = rbx_wc_localinv;
		*prev = last;
		prev = &last->next;
	}
	if (!last)
		return;
	last->wr_cqe->done = rbx_wc_localinv_done;

	rc = ib_post_send(x->rx_ep->re_id->qp, first, NULL);
	if (rc) {
		/* MRs stay on rx_mrs_all; rbx_mrs_destroy() deregisters them */
		rbx_force_disconnect(x);
		rbx_complete_rqst(req, -ENOTCONN);
	}
}
