// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * kv_xprtrdma_frwr.c - RPC-over-RDMA client, FRWR memory registration
 * (xprtrdma style).
 *
 * Each transport keeps a free list of MRs allocated at connect time.  A
 * chunk of an RPC takes an MR, DMA-maps its pages, bumps the key's low
 * byte and records the handle in the RPC-over-RDMA header; the REG_MR WRs
 * of all chunks are chained in front of the RPC's SEND.  When the reply
 * arrives the server may have invalidated one MR with SEND_WITH_INV (the
 * receive completion copies wc_flags and the invalidated rkey into the
 * rep); every MR still registered gets a signaled LOCAL_INV, and MRs return
 * to the free list from the LOCAL_INV completions, once the completion
 * status says the invalidation took place.  A failed LOCAL_INV sends the MR
 * to a recycle worker that deregisters it and allocates a replacement.
 *
 * Known problems kept in this file:
 *  - the single-chunk fast path of the reply handler trusts the server's
 *    invalidation without looking at which rkey it invalidated;
 *  - the synchronous unmap's wake-up handler returns the MR without
 *    checking the completion status;
 *  - the retransmit reset returns MRs right after unsignaled LOCAL_INVs;
 *  - the recycle worker drops the replacement MR if the transport is
 *    shutting down.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-unsignaled-send-starvation -- not the subject of this module; FRWR management is manual by design
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct xr_xprt;
struct xr_req;

struct xr_mr_seg {
	struct page	*mr_page;
	u32		mr_len;
	u32		mr_offset;
};

struct xr_mr {
	struct list_head	mr_list;
	struct list_head	mr_all;
	struct xr_req		*mr_req;
	struct xr_xprt		*mr_xprt;
	struct ib_mr		*mr_ibmr;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	struct work_struct	mr_recycle;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
};

struct xr_rep {
	struct ib_cqe		rr_cqe;
	struct xr_xprt		*rr_rxprt;
	u32			rr_xid;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
};

struct xr_req {
	struct list_head	rl_registered;
	int			rl_nr_mrs;
	struct xr_rep		*rl_reply;
	struct ib_send_wr	rl_send_wr;
	u32			rl_xid;
};

struct xr_xprt {
	struct ib_qp		*qp;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	spinlock_t		mr_lock;
	struct list_head	mrs;
	struct list_head	all_mrs;
	unsigned int		max_frwr_depth;
	unsigned int		mr_count;
	bool			mr_shutdown;
	struct work_struct	disconnect_work;
};

/* RPC layer (another unit) */
struct xr_req *xr_lookup_rqst(struct xr_xprt *xprt, u32 xid);
void xr_complete_rqst(struct xr_req *req);

static void xr_force_disconnect(struct xr_xprt *xprt)
{
	schedule_work(&xprt->disconnect_work);
}

static void xr_flush_disconnect(struct xr_xprt *xprt, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		xr_force_disconnect(xprt);
}

/* ---------------- MR free list ---------------- */

static void xr_mr_unmap(struct xr_xprt *xprt, struct xr_mr *mr)
{
	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(xprt->dev, mr->mr_sg, mr->mr_nents, mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
}

static struct xr_mr *xr_mr_pop(struct list_head *list)
{
	struct xr_mr *mr;

	mr = list_first_entry_or_null(list, struct xr_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	return mr;
}

static struct xr_mr *xr_mr_get(struct xr_xprt *xprt)
{
	struct xr_mr *mr;

	spin_lock(&xprt->mr_lock);
	mr = xr_mr_pop(&xprt->mrs);
	spin_unlock(&xprt->mr_lock);
	return mr;
}

static void xr_mr_put(struct xr_mr *mr)
{
	struct xr_xprt *xprt = mr->mr_xprt;

	xr_mr_unmap(xprt, mr);
	spin_lock(&xprt->mr_lock);
	list_add(&mr->mr_list, &xprt->mrs);
	spin_unlock(&xprt->mr_lock);
}

static void xr_mr_recycle_work(struct work_struct *work);

static int xr_mr_init(struct xr_xprt *xprt, struct xr_mr *mr)
{
	unsigned int depth = xprt->max_frwr_depth;
	struct scatterlist *sg;
	struct ib_mr *frmr;
	int rc;

	frmr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, depth);
	if (IS_ERR(frmr))
		goto out_mr_err;

	sg = kcalloc(depth, sizeof(*sg), GFP_NOFS);
	if (!sg)
		goto out_list_err;

	mr->mr_xprt = xprt;
	mr->mr_ibmr = frmr;
	mr->mr_dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	INIT_WORK(&mr->mr_recycle, xr_mr_recycle_work);
	init_completion(&mr->mr_linv_done);
	sg_init_table(sg, depth);
	mr->mr_sg = sg;
	return 0;

out_mr_err:
	rc = PTR_ERR(frmr);
	return rc;	/* OK: rdma-mr-leak -- ib_alloc_mr() failed, nothing to release */

out_list_err:
	ib_dereg_mr(frmr);	/* OK: rdma-mr-leak -- released before the error return */
	return -ENOMEM;
}

static void xr_mr_release(struct xr_mr *mr)
{
	if (mr->mr_ibmr)
		ib_dereg_mr(mr->mr_ibmr);
	xr_mr_unmap(mr->mr_xprt, mr);	/* OK: rdma-invalidation-leak -- deregistered first */
	kfree(mr->mr_sg);
	kfree(mr);
}

static int xr_mrs_create(struct xr_xprt *xprt)
{
	unsigned int count;

	for (count = 0; count < xprt->mr_count; count++) {
		struct xr_mr *mr;
		int rc;

		mr = kzalloc(sizeof(*mr), GFP_NOFS);
		if (!mr)
			break;
		rc = xr_mr_init(xprt, mr);
		if (rc) {
			kfree(mr);	/* OK: rdma-mr-leak -- xr_mr_init() released its MR before failing */
			break;
		}
		spin_lock(&xprt->mr_lock);
		list_add_tail(&mr->mr_list, &xprt->mrs);
		list_add(&mr->mr_all, &xprt->all_mrs);
		spin_unlock(&xprt->mr_lock);
	}
	return count ? 0 : -ENOMEM;
}

static void xr_mrs_destroy(struct xr_xprt *xprt)
{
	struct xr_mr *mr;

	spin_lock(&xprt->mr_lock);
	xprt->mr_shutdown = true;
	while ((mr = list_first_entry_or_null(&xprt->all_mrs, struct xr_mr,
					      mr_all))) {
		list_del(&mr->mr_all);
		list_del_init(&mr->mr_list);
		spin_unlock(&xprt->mr_lock);
		xr_mr_release(mr);
		spin_lock(&xprt->mr_lock);
	}
	spin_unlock(&xprt->mr_lock);
}

/* A LOCAL_INV on @mr failed: only deregistration is sure to kill its key. */
static void xr_mr_recycle_work(struct work_struct *work)
{
	struct xr_mr *mr = container_of(work, struct xr_mr, mr_recycle);
	struct xr_xprt *xprt = mr->mr_xprt;
	struct ib_mr *frmr;

	ib_dereg_mr(mr->mr_ibmr);
	mr->mr_ibmr = NULL;	/* OK: rdma-mr-leak -- deregistered just above */
	xr_mr_unmap(xprt, mr);	/* OK: rdma-invalidation-leak -- the key died with ib_dereg_mr() */

	frmr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, xprt->max_frwr_depth);
	if (IS_ERR(frmr)) {
		pr_warn("xprtrdma: MR recycle failed (%ld)\n", PTR_ERR(frmr));
		spin_lock(&xprt->mr_lock);
		list_del(&mr->mr_all);
		spin_unlock(&xprt->mr_lock);
		kfree(mr->mr_sg);
		kfree(mr);
		return;
	}

	spin_lock(&xprt->mr_lock);
	if (xprt->mr_shutdown) {
		/* xr_mrs_destroy() owns all_mrs now */
		spin_unlock(&xprt->mr_lock);
		return;	/* BUG: rdma-mr-leak -- the replacement MR in frmr is never stored or deregistered */
	}
	mr->mr_ibmr = frmr;
	list_add(&mr->mr_list, &xprt->mrs);
	spin_unlock(&xprt->mr_lock);
}

/* ---------------- registration ---------------- */

static void xr_wc_fastreg(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xr_mr *mr = container_of(wc->wr_cqe, struct xr_mr, mr_cqe);

	xr_flush_disconnect(mr->mr_xprt, wc);
}

static int xr_frwr_map(struct xr_xprt *xprt, struct xr_mr_seg *seg,
		       int nsegs, bool writing, u32 xid, struct xr_mr *mr)
{
	struct ib_reg_wr *reg_wr;
	struct ib_mr *ibmr;
	int i, n;
	u8 key;

	if (nsegs > xprt->max_frwr_depth)
		nsegs = xprt->max_frwr_depth;
	for (i = 0; i < nsegs; i++, seg++)
		sg_set_page(&mr->mr_sg[i], seg->mr_page, seg->mr_len,
			    seg->mr_offset);

	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = ib_dma_map_sg(xprt->dev, mr->mr_sg, i, mr->mr_dir);
	if (!mr->mr_nents) {
		mr->mr_dir = DMA_NONE;
		return -EIO;
	}

	ibmr = mr->mr_ibmr;
	n = ib_map_mr_sg(ibmr, mr->mr_sg, mr->mr_nents, NULL, PAGE_SIZE);
	if (n != mr->mr_nents)
		return -EIO;

	ibmr->iova &= 0x00000000ffffffffULL;
	ibmr->iova |= ((u64)cpu_to_be32(xid)) << 32;
	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	reg_wr = &mr->mr_regwr;
	reg_wr->mr = ibmr;	/* OK: rdma-rkey-reuse -- ++key above gives every registration a new key */
	reg_wr->key = ibmr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	return i;
}

/* Register one chunk and encode its RDMA segment; returns segments used. */
static int xr_register_chunk(struct xr_xprt *xprt, struct xr_req *req,
			     struct xr_mr_seg *seg, int nsegs, bool writing,
			     __be32 **pp)
{
	__be32 *p = *pp;
	struct xr_mr *mr;
	int n;

	mr = xr_mr_get(xprt);
	if (!mr)
		return -EAGAIN;
	mr->mr_req = req;

	n = xr_frwr_map(xprt, seg, nsegs, writing, req->rl_xid, mr);
	if (n < 0) {
		xr_mr_put(mr);	/* OK: rdma-invalidation-leak -- no REG_MR was posted with this key */
		return n;
	}
	list_add_tail(&mr->mr_list, &req->rl_registered);
	req->rl_nr_mrs++;

	*p++ = cpu_to_be32(mr->mr_handle);
	*p++ = cpu_to_be32(mr->mr_length);
	*p++ = cpu_to_be32((u32)(mr->mr_offset >> 32));
	*p++ = cpu_to_be32((u32)mr->mr_offset);
	*pp = p;
	return n;
}

static int xr_send(struct xr_xprt *xprt, struct xr_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_send_wr;
	struct xr_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		mr->mr_regwr.wr.wr_cqe = &mr->mr_cqe;
		mr->mr_regwr.wr.num_sge = 0;
		mr->mr_regwr.wr.opcode = IB_WR_REG_MR;	/* OK: rdma-rkey-reuse -- xr_frwr_map() rotated each key */
		mr->mr_regwr.wr.send_flags = 0;
		post_wr = &mr->mr_regwr.wr;
		mr->mr_cqe.done = xr_wc_fastreg;
	}

	return ib_post_send(xprt->qp, post_wr, NULL);
}

/* ---------------- invalidation ---------------- */

static void xr_mr_done(struct ib_wc *wc, struct xr_mr *mr)
{
	if (likely(wc->status == IB_WC_SUCCESS)) {
		xr_mr_put(mr);	/* OK: rdma-invalidation-leak -- only once the LOCAL_INV succeeded */
		return;
	}
	schedule_work(&mr->mr_recycle);
}

static void xr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xr_mr *mr = container_of(wc->wr_cqe, struct xr_mr, mr_cqe);
	struct xr_xprt *xprt = mr->mr_xprt;

	xr_mr_done(wc, mr);	/* OK: rdma-invalidation-leak -- xr_mr_done() checks the status */
	xr_flush_disconnect(xprt, wc);
}

static void xr_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xr_mr *mr = container_of(wc->wr_cqe, struct xr_mr, mr_cqe);
	struct xr_xprt *xprt = mr->mr_xprt;
	struct xr_req *req = mr->mr_req;

	xr_mr_done(wc, mr);	/* OK: rdma-invalidation-leak -- xr_mr_done() checks the status */
	if (wc->status != IB_WC_SUCCESS) {
		xr_flush_disconnect(xprt, wc);
		return;
	}
	xr_complete_rqst(req);
}

static void xr_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xr_mr *mr = container_of(wc->wr_cqe, struct xr_mr, mr_cqe);
	struct xr_xprt *xprt = mr->mr_xprt;

	xr_mr_put(mr);	/* BUG: rdma-invalidation-leak -- a flushed or failed LOCAL_INV still returns the MR and unmaps its pages with the key alive */
	complete(&mr->mr_linv_done);
	xr_flush_disconnect(xprt, wc);
}

static void xr_build_inv(struct xr_mr *mr, struct ib_send_wr *next)
{
	struct ib_send_wr *wr = &mr->mr_invwr;

	wr->next = next;
	wr->wr_cqe = &mr->mr_cqe;
	wr->sg_list = NULL;
	wr->num_sge = 0;
	wr->opcode = IB_WR_LOCAL_INV;
	wr->send_flags = IB_SEND_SIGNALED;
	wr->ex.invalidate_rkey = mr->mr_handle;
	mr->mr_cqe.done = xr_wc_localinv;
}

/* Invalidate every MR of @req; the last completion completes the RPC. */
static void xr_frwr_unmap_async(struct xr_xprt *xprt, struct xr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first;
	struct xr_mr *mr, *last = NULL;
	int rc;

	while ((mr = xr_mr_pop(&req->rl_registered))) {
		xr_build_inv(mr, NULL);
		*prev = &mr->mr_invwr;
		prev = &mr->mr_invwr.next;
		last = mr;
	}
	req->rl_nr_mrs = 0;
	if (!last)
		return;
	last->mr_cqe.done = xr_wc_localinv_done;

	rc = ib_post_send(xprt->qp, first, NULL);
	if (!rc)
		return;

	/* the MRs are deregistered once the QP has drained */
	pr_err("xprtrdma: LOCAL_INV post failed (%d)\n", rc);
	xr_force_disconnect(xprt);
}

/* Used when the RPC is released early (signal, timeout): wait here. */
static void xr_frwr_unmap_sync(struct xr_xprt *xprt, struct xr_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first;
	struct xr_mr *mr, *last = NULL;
	int rc;

	while ((mr = xr_mr_pop(&req->rl_registered))) {
		xr_build_inv(mr, NULL);
		*prev = &mr->mr_invwr;
		prev = &mr->mr_invwr.next;
		last = mr;
	}
	req->rl_nr_mrs = 0;
	if (!last)
		return;
	last->mr_cqe.done = xr_wc_localinv_wake;
	reinit_completion(&last->mr_linv_done);

	rc = ib_post_send(xprt->qp, first, NULL);
	if (!rc) {
		wait_for_completion(&last->mr_linv_done);
		return;
	}
	pr_err("xprtrdma: LOCAL_INV post failed (%d)\n", rc);
	xr_force_disconnect(xprt);
}

/*
 * A retransmission re-registers every chunk: drop the registrations of
 * the previous attempt without holding up the retransmit.
 */
static void xr_frwr_reset(struct xr_xprt *xprt, struct xr_req *req)
{
	struct xr_mr *mr;

	while ((mr = xr_mr_pop(&req->rl_registered))) {
		xr_build_inv(mr, NULL);
		mr->mr_invwr.send_flags = 0;
		if (ib_post_send(xprt->qp, &mr->mr_invwr, NULL)) {
			xr_force_disconnect(xprt);
			break;
		}
		xr_mr_put(mr);	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV was only queued; the pages are unmapped and the MR reused before it executes */
	}
	req->rl_nr_mrs = 0;
}

/* ---------------- replies ---------------- */

static void xr_frwr_reminv(struct xr_rep *rep, struct xr_req *req)
{
	struct xr_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		if (mr->mr_handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			req->rl_nr_mrs--;
			xr_mr_put(mr);	/* OK: rdma-invalidation-leak -- the server invalidated exactly this MR's key */
			break;	/* only one invalidated MR per RPC */
		}
	}
}

static void xr_reply_handler(struct xr_rep *rep)
{
	struct xr_xprt *xprt = rep->rr_rxprt;
	struct xr_req *req;
	struct xr_mr *mr;

	req = xr_lookup_rqst(xprt, rep->rr_xid);
	if (!req)
		return;
	req->rl_reply = rep;

	/* common case: a single chunk that the server invalidated for us */
	/* BUG: rdma-remote-invalidate-unchecked -- rr_inv_rkey is never compared with the chunk's handle */
	if (req->rl_nr_mrs == 1 && (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)) {
		mr = list_first_entry(&req->rl_registered, struct xr_mr,
				      mr_list);
		list_del_init(&mr->mr_list);
		req->rl_nr_mrs = 0;
		xr_mr_put(mr);
		xr_complete_rqst(req);
		return;
	}

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		xr_frwr_reminv(rep, req);	/* OK: rdma-remote-invalidate-unchecked -- xr_frwr_reminv() matches rr_inv_rkey against each handle */

	if (!list_empty(&req->rl_registered))
		xr_frwr_unmap_async(xprt, req);	/* OK: rdma-unmap-before-invalidate -- the MRs go back from the signaled LOCAL_INVs' completions */
	else
		xr_complete_rqst(req);
}

static void xr_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xr_rep *rep = container_of(wc->wr_cqe, struct xr_rep, rr_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		xr_flush_disconnect(rep->rr_rxprt, wc);
		return;
	}
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	xr_reply_handler(rep);
}

struct xr_memreg_ops {
	int (*init)(struct xr_xprt *xprt);
	void (*destroy)(struct xr_xprt *xprt);
	int (*register_chunk)(struct xr_xprt *xprt, struct xr_req *req,
			      struct xr_mr_seg *seg, int nsegs, bool writing,
			      __be32 **pp);
	int (*send)(struct xr_xprt *xprt, struct xr_req *req);
	void (*unmap_sync)(struct xr_xprt *xprt, struct xr_req *req);
	void (*reset)(struct xr_xprt *xprt, struct xr_req *req);
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct xr_memreg_ops xr_frwr_memreg_ops = {
	.init		= xr_mrs_create,
	.destroy	= xr_mrs_destroy,
	.register_chunk	= xr_register_chunk,
	.send		= xr_send,
	.unmap_sync	= xr_frwr_unmap_sync,
	.reset		= xr_frwr_reset,
	.recv_done	= xr_wc_receive,
};

MODULE_DESCRIPTION("RPC/RDMA client FRWR registration");
MODULE_LICENSE("Dual BSD/GPL");
