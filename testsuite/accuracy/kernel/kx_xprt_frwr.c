// SPDX-License-Identifier: GPL-2.0
/*
 * kx_xprt_frwr.c - RPC-over-RDMA client, FRWR memory registration.
 *
 * Every RPC owns a free list of FRWR MRs.  Chunks are registered by
 * xfr_map(); the REG_MRs are chained in front of the RPC Call SEND and
 * the MRs sit on req->rl_registered until the Reply arrives.  The server
 * may invalidate one of them with SEND_WITH_INV; the others are
 * invalidated with a LOCAL_INV chain, either waited for (xfr_unmap_sync,
 * used when the RPC is retired from process context) or completed
 * asynchronously (xfr_unmap_async, from the Reply handler).  Each MR
 * tracks its own state so that flushed work requests can be recovered.
 * The PD outlives reconnects; only the QP is replaced.
 *
 * Correct here: MR setup, the Reply handler's remote invalidation
 * handling, the synchronous LOCAL_INV chain, the per-MR LOCAL_INV
 * completion, recovery of MRs whose REG_MR was flushed.
 * Wrong here: the key "rotation" in xfr_map, MR replacement after a flush,
 * the last LOCAL_INV completion of the async chain, the RPC release path
 * (trusts any remote invalidation, recycles MRs behind unsignaled
 * LOCAL_INVs) and the reconnect reset (recycles registered MRs as is).
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

enum xfr_mr_state {
	XFR_IS_INVALID,
	XFR_IS_VALID,
	XFR_FLUSHED_FR,
	XFR_FLUSHED_LI,
};

struct xfr_xprt {
	struct ib_qp		*qp;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			max_fr_depth;
	spinlock_t		mr_lock;
	struct list_head	mrs_all;
	struct work_struct	disconnect_work;
};

struct xfr_req;

struct xfr_mr {
	struct list_head	mr_list;
	struct list_head	mr_all;
	struct xfr_req		*mr_req;
	struct xfr_xprt		*mr_xprt;
	struct ib_mr		*ibmr;
	struct scatterlist	*sg;
	int			nents;
	enum dma_data_direction	dir;
	enum xfr_mr_state	state;
	struct ib_cqe		cqe;
	struct completion	linv_done;
	int			linv_status;
	union {
		struct ib_reg_wr	regwr;
		struct ib_send_wr	invwr;
	};
	u32			handle;
	u32			length;
	u64			offset;
};

struct xfr_rep {
	struct ib_cqe		rr_cqe;
	struct xfr_xprt		*rr_xprt;
	struct xfr_req		*rr_req;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
};

struct xfr_req {
	struct list_head	rl_free_mrs;
	struct list_head	rl_registered;
	struct ib_send_wr	rl_wr;
	struct xfr_rep		*rl_reply;
};

struct xfr_seg {
	struct page	*page;
	u32		len;
	u32		offset;
};

void xfr_complete_rqst(struct xfr_rep *rep);

static void xfr_force_disconnect(struct xfr_xprt *xprt)
{
	schedule_work(&xprt->disconnect_work);
}

static struct xfr_mr *xfr_mr_pop(struct list_head *list)
{
	struct xfr_mr *mr;

	mr = list_first_entry_or_null(list, struct xfr_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	return mr;
}

static void xfr_mr_put(struct xfr_mr *mr)
{
	if (mr->nents) {
		ib_dma_unmap_sg(mr->mr_xprt->dev, mr->sg, mr->nents, mr->dir);
		mr->nents = 0;
	}
	list_add(&mr->mr_list, &mr->mr_req->rl_free_mrs);
}

int xfr_mr_init(struct xfr_xprt *xprt, struct xfr_mr *mr)
{
	struct ib_mr *frmr;
	struct scatterlist *sg;

	frmr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, xprt->max_fr_depth);
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);

	sg = kcalloc(xprt->max_fr_depth, sizeof(*sg), GFP_NOFS);
	if (!sg) {
		ib_dereg_mr(frmr);
		return -ENOMEM; /* OK: rdma-mr-leak -- deregistered just above */
	}

	mr->mr_xprt = xprt;
	mr->ibmr = frmr;
	mr->sg = sg;
	mr->nents = 0;
	mr->state = XFR_IS_INVALID;
	init_completion(&mr->linv_done);
	sg_init_table(sg, xprt->max_fr_depth);

	spin_lock(&xprt->mr_lock);
	list_add(&mr->mr_all, &xprt->mrs_all);
	spin_unlock(&xprt->mr_lock);
	return 0;
}

/* An MR whose REG_MR was flushed is in an unknown state: replace it. */
static void xfr_mr_reset(struct xfr_mr *mr)
{
	struct xfr_xprt *xprt = mr->mr_xprt;
	struct ib_mr *fresh;

	fresh = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, xprt->max_fr_depth);
	if (IS_ERR(fresh)) {
		pr_warn("xfr: MR %p not recovered (%ld)\n", mr, PTR_ERR(fresh));
		return;
	}
	mr->ibmr = fresh; /* BUG: rdma-mr-leak -- the old MR is dropped without ib_dereg_mr() */
	mr->state = XFR_IS_INVALID;
}

void xfr_mrs_destroy(struct xfr_xprt *xprt)
{
	struct xfr_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &xprt->mrs_all, mr_all) {
		list_del(&mr->mr_all);
		ib_dereg_mr(mr->ibmr);
		kfree(mr->sg);
		kfree(mr);
	}
}

static void xfr_wc_fastreg(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mr *mr = container_of(wc->wr_cqe, struct xfr_mr, cqe);

	if (wc->status != IB_WC_SUCCESS) {
		mr->state = XFR_FLUSHED_FR;
		xfr_force_disconnect(mr->mr_xprt);
	}
}

struct xfr_seg *xfr_map(struct xfr_xprt *xprt, struct xfr_seg *seg,
			int nsegs, bool writing, struct xfr_mr *mr)
{
	struct ib_mr *ibmr = mr->ibmr;
	struct ib_reg_wr *reg_wr;
	int i, n, dma_nents;
	u8 key;

	if (nsegs > xprt->max_fr_depth)
		nsegs = xprt->max_fr_depth;
	for (i = 0; i < nsegs; i++, seg++)
		sg_set_page(&mr->sg[i], seg->page, seg->len, seg->offset);
	mr->nents = i;
	mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;

	dma_nents = ib_dma_map_sg(xprt->dev, mr->sg, mr->nents, mr->dir);
	if (!dma_nents)
		goto out_dmamap_err;

	n = ib_map_mr_sg(ibmr, mr->sg, dma_nents, NULL, PAGE_SIZE);
	if (n != dma_nents)
		goto out_mapmr_err;

	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, key); /* BUG: rdma-rkey-reuse -- writes back the key the MR already has; the previous RPC's rkey is valid again */

	reg_wr = &mr->regwr;
	memset(reg_wr, 0, sizeof(*reg_wr));
	reg_wr->wr.opcode = IB_WR_REG_MR;
	reg_wr->wr.wr_cqe = &mr->cqe;
	mr->cqe.done = xfr_wc_fastreg;
	reg_wr->mr = ibmr;
	reg_wr->key = ibmr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	mr->handle = ibmr->rkey;
	mr->length = ibmr->length;
	mr->offset = ibmr->iova;
	mr->state = XFR_IS_VALID;
	return seg;

out_mapmr_err:
	ib_dma_unmap_sg(xprt->dev, mr->sg, mr->nents, mr->dir); /* OK: rdma-invalidation-leak -- nothing registered on this path */
	mr->nents = 0;
out_dmamap_err:
	return ERR_PTR(-EIO);
}

int xfr_register_chunk(struct xfr_xprt *xprt, struct xfr_req *req,
		       struct xfr_seg *seg, int nsegs, bool writing,
		       u32 *handle)
{
	struct xfr_seg *next;
	struct xfr_mr *mr;

	mr = xfr_mr_pop(&req->rl_free_mrs);
	if (!mr)
		return -EAGAIN;
	mr->mr_req = req;

	next = xfr_map(xprt, seg, nsegs, writing, mr);
	if (IS_ERR(next)) {
		list_add(&mr->mr_list, &req->rl_free_mrs); /* OK: rdma-invalidation-leak -- the REG_MR was never posted */
		return PTR_ERR(next);
	}
	list_add_tail(&mr->mr_list, &req->rl_registered);
	*handle = mr->handle;
	return 0;
}

int xfr_send(struct xfr_xprt *xprt, struct xfr_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_wr;
	struct xfr_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->regwr.wr.next = post_wr;
		mr->regwr.wr.send_flags = 0;
		post_wr = &mr->regwr.wr;
	}
	return ib_post_send(xprt->qp, post_wr, NULL);
}

static void xfr_reminv(struct xfr_rep *rep, struct list_head *mrs)
{
	struct xfr_mr *mr;

	list_for_each_entry(mr, mrs, mr_list) {
		if (mr->handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			mr->state = XFR_IS_INVALID;
			xfr_mr_put(mr); /* OK: rdma-invalidation-leak -- this MR's handle is the rkey the server invalidated */
			break;	/* only one remotely invalidated MR per RPC */
		}
	}
}

static void xfr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mr *mr = container_of(wc->wr_cqe, struct xfr_mr, cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		mr->state = XFR_FLUSHED_LI;
		xfr_force_disconnect(mr->mr_xprt);
		return;
	}
	mr->state = XFR_IS_INVALID;
	xfr_mr_put(mr); /* OK: rdma-invalidation-leak -- LOCAL_INV completed successfully */
}

static void xfr_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mr *mr = container_of(wc->wr_cqe, struct xfr_mr, cqe);
	struct xfr_rep *rep = mr->mr_req->rl_reply;

	mr->state = XFR_IS_INVALID;
	xfr_mr_put(mr); /* BUG: rdma-invalidation-leak -- released whether or not the LOCAL_INV succeeded; a flushed one leaves the rkey live */
	xfr_complete_rqst(rep);
}

static void xfr_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_mr *mr = container_of(wc->wr_cqe, struct xfr_mr, cqe);

	mr->linv_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&mr->linv_done);
}

static struct ib_send_wr *xfr_prep_linv(struct xfr_mr *mr, bool signaled)
{
	struct ib_send_wr *wr = &mr->invwr;

	memset(wr, 0, sizeof(*wr));
	wr->opcode = IB_WR_LOCAL_INV;
	wr->wr_cqe = &mr->cqe;
	wr->send_flags = signaled ? IB_SEND_SIGNALED : 0;
	wr->ex.invalidate_rkey = mr->handle;
	return wr;
}

/* Retire an RPC from process context; waits for the whole chain. */
void xfr_unmap_sync(struct xfr_xprt *xprt, struct xfr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct xfr_mr *mr, *tmp;
	int rc;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = xfr_prep_linv(mr, false);
		mr->cqe.done = xfr_wc_localinv;
		*prev = last;
		prev = &last->next;
	}
	if (!last)
		return;

	mr = container_of(last, struct xfr_mr, invwr);
	last->send_flags = IB_SEND_SIGNALED;
	mr->cqe.done = xfr_wc_localinv_wake;
	reinit_completion(&mr->linv_done);

	rc = ib_post_send(xprt->qp, first, NULL);
	if (rc) {
		/* MRs are recovered once the QP has drained */
		xfr_force_disconnect(xprt);
		return;
	}
	wait_for_completion(&mr->linv_done);
	if (mr->linv_status) {
		xfr_force_disconnect(xprt);
		return;
	}

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		mr->state = XFR_IS_INVALID;
		xfr_mr_put(mr); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled tail of the chain completed, so did everything before it */
	}
}

/* From the Reply handler: the RPC completes from the last LOCAL_INV. */
static void xfr_unmap_async(struct xfr_xprt *xprt, struct xfr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct xfr_mr *mr;

	while ((mr = xfr_mr_pop(&req->rl_registered))) {
		mr->mr_req = req;
		last = xfr_prep_linv(mr, true);
		mr->cqe.done = xfr_wc_localinv;
		*prev = last;
		prev = &last->next;
	}
	if (WARN_ON_ONCE(!last))
		return;
	mr = container_of(last, struct xfr_mr, invwr);
	mr->cqe.done = xfr_wc_localinv_done;

	/* OK: rdma-unmap-before-invalidate -- nothing is released here, every MR goes back from its own completion */
	if (ib_post_send(xprt->qp, first, NULL))
		xfr_force_disconnect(xprt);
}

static void xfr_reply_handler(struct xfr_rep *rep)
{
	struct xfr_req *req = rep->rr_req;

	req->rl_reply = rep;
	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		xfr_reminv(rep, &req->rl_registered); /* OK: rdma-remote-invalidate-unchecked -- xfr_reminv() matches rr_inv_rkey against each MR */

	if (!list_empty(&req->rl_registered)) {
		xfr_unmap_async(rep->rr_xprt, req);
		return;
	}
	xfr_complete_rqst(rep);
}

void xfr_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xfr_rep *rep = container_of(wc->wr_cqe, struct xfr_rep, rr_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		xfr_force_disconnect(rep->rr_xprt);
		return;
	}
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	xfr_reply_handler(rep);
}

/* The RPC is going away (signal, major timeout) before its Reply was processed. */
void xfr_release_rqst(struct xfr_xprt *xprt, struct xfr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first;
	struct xfr_rep *rep = req->rl_reply;
	struct xfr_mr *mr, *tmp;

	if (rep && (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)) {
		/* BUG: rdma-remote-invalidate-unchecked -- assumes the first registered MR is the one the server invalidated */
		mr = xfr_mr_pop(&req->rl_registered);
		if (mr) {
			mr->state = XFR_IS_INVALID;
			xfr_mr_put(mr);
		}
	}

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		*prev = xfr_prep_linv(mr, false);
		prev = &mr->invwr.next;
	}
	if (!first)
		return;
	if (ib_post_send(xprt->qp, first, NULL)) {
		xfr_force_disconnect(xprt);
		return;
	}

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		mr->state = XFR_IS_INVALID;
		xfr_mr_put(mr); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV chain is unsignaled and nothing waits for it */
	}
}

/* Reconnect: the old QP is gone, prepare the RPC for retransmission. */
void xfr_reset_req(struct xfr_req *req)
{
	struct xfr_mr *mr;

	while ((mr = xfr_mr_pop(&req->rl_registered))) {
		if (mr->state == XFR_FLUSHED_FR) {
			xfr_mr_reset(mr);
			xfr_mr_put(mr); /* OK: rdma-invalidation-leak -- the REG_MR was flushed, this key never became valid */
			continue;
		}
		mr->state = XFR_IS_INVALID;
		xfr_mr_put(mr); /* BUG: rdma-invalidation-leak -- the PD survives the reconnect, so the rkey still works on the new connection */
	}
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("RPC-over-RDMA FRWR registration");
