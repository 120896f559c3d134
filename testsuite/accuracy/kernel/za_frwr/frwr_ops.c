// SPDX-License-Identifier: GPL-2.0
/*
 * frwr_ops.c - FRWR memory registration for the zf RPC-over-RDMA client.
 *
 * Correct: the key bump in zf_map(), the remote-invalidation match in
 * zf_reminv(), the synchronous invalidation that waits for the signaled
 * LOCAL_INV at the end of the chain, putting MRs back after a failed
 * marshal (nothing was posted), deregistration.
 * Not correct: zf_mr_init() leaks the ib_mr when the scatterlist cannot
 * be allocated; the asynchronous invalidation unmaps the chunk pages
 * right after posting the chain, and its completion handler recycles the
 * MRs without looking at the completion status.
 */
#include "zf.h"
#include <linux/slab.h>
#include <linux/string.h>

int zf_mr_init(struct zf_xprt *xprt, struct zf_mr *mr)
{
	unsigned int depth = xprt->rx_max_depth;
	struct scatterlist *sg;
	struct ib_mr *frmr;

	frmr = ib_alloc_mr(xprt->rx_pd, IB_MR_TYPE_MEM_REG, depth);
	if (IS_ERR(frmr))
		goto out_mr_err;

	sg = kcalloc(depth, sizeof(*sg), GFP_KERNEL);
	if (!sg)
		goto out_list_err;

	mr->mr_xprt = xprt;
	mr->mr_ibmr = frmr;
	mr->mr_dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	sg_init_table(sg, depth);
	mr->mr_sg = sg;
	return 0;

out_mr_err:
	pr_err("zf: ib_alloc_mr returned %ld\n", PTR_ERR(frmr));
	return PTR_ERR(frmr);

out_list_err:
	pr_err("zf: sg allocation failure\n");
	return -ENOMEM;		/* BUG: rdma-mr-leak -- frmr from ib_alloc_mr() is never deregistered */
}

static void zf_mr_unmap_pages(struct zf_mr *mr)
{
	if (mr->mr_dir == DMA_NONE)
		return;
	ib_dma_unmap_sg(mr->mr_xprt->rx_dev, mr->mr_sg, mr->mr_nents,
			mr->mr_dir);
	mr->mr_dir = DMA_NONE;
}

void zf_mr_release(struct zf_mr *mr)
{
	int rc;

	rc = ib_dereg_mr(mr->mr_ibmr);	/* OK: rdma-invalidation-leak -- deregistration kills the handle */
	if (rc)
		pr_err("zf: ib_dereg_mr failed (%d)\n", rc);
	zf_mr_unmap_pages(mr);
	kfree(mr->mr_sg);
	kfree(mr);
}

struct zf_mr *zf_mr_get(struct zf_xprt *xprt)
{
	struct zf_mr *mr;

	spin_lock(&xprt->rx_mr_lock);
	mr = list_first_entry_or_null(&xprt->rx_mrs, struct zf_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	spin_unlock(&xprt->rx_mr_lock);
	return mr;
}

void zf_mr_put(struct zf_mr *mr)
{
	struct zf_xprt *xprt = mr->mr_xprt;

	zf_mr_unmap_pages(mr);
	mr->mr_req = NULL;

	spin_lock(&xprt->rx_mr_lock);
	/* OK: rdma-invalidation-leak -- callers hand back an MR once its handle is dead or was never registered */
	list_add(&mr->mr_list, &xprt->rx_mrs);
	spin_unlock(&xprt->rx_mr_lock);
}

void zf_force_disconnect(struct zf_xprt *xprt)
{
	if (!xprt->rx_connected)
		return;
	xprt->rx_connected = false;
	schedule_work(&xprt->rx_disconnect_work);
}

struct zf_seg *zf_map(struct zf_xprt *xprt, struct zf_seg *seg, int nsegs,
		      bool writing, u32 xid, struct zf_mr *mr)
{
	struct ib_reg_wr *reg_wr;
	struct ib_mr *ibmr;
	int i, n, dma_nents;
	u8 key;

	if (nsegs > xprt->rx_max_depth)
		nsegs = xprt->rx_max_depth;
	for (i = 0; i < nsegs;) {
		sg_set_page(&mr->mr_sg[i], seg->page, seg->len, seg->offset);
		++seg;
		++i;
		/* stop at the first hole */
		if (i < nsegs && seg->offset)
			break;
		if ((seg - 1)->offset + (seg - 1)->len < PAGE_SIZE)
			break;
	}
	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = i;

	dma_nents = ib_dma_map_sg(xprt->rx_dev, mr->mr_sg, mr->mr_nents,
				  mr->mr_dir);
	if (!dma_nents)
		goto out_dmamap_err;

	ibmr = mr->mr_ibmr;
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE);
	if (n != dma_nents)
		goto out_mapmr_err;

	ibmr->iova &= 0x00000000ffffffff;
	ibmr->iova |= ((u64)xid) << 32;
	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	reg_wr = &mr->mr_regwr;
	reg_wr->mr = ibmr;	/* OK: rdma-rkey-reuse -- the key byte was bumped just above */
	reg_wr->key = ibmr->rkey;
	reg_wr->access = writing ?
			 IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
			 IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	return seg;

out_dmamap_err:
	mr->mr_dir = DMA_NONE;
	return ERR_PTR(-EIO);

out_mapmr_err:
	pr_err("zf: failed to map mr (%d/%d)\n", n, dma_nents);
	zf_mr_unmap_pages(mr);
	return ERR_PTR(-EIO);
}

static void zf_wc_fastreg(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zf_mr *mr = container_of(wc->wr_cqe, struct zf_mr, mr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		zf_force_disconnect(mr->mr_xprt);
}

int zf_send(struct zf_xprt *xprt, struct zf_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_send_wr;
	struct zf_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		struct ib_reg_wr *frwr = &mr->mr_regwr;

		mr->mr_cqe.done = zf_wc_fastreg;
		frwr->wr.next = post_wr;
		frwr->wr.wr_cqe = &mr->mr_cqe;
		frwr->wr.num_sge = 0;
		frwr->wr.opcode = IB_WR_REG_MR;
		frwr->wr.send_flags = 0;
		post_wr = &frwr->wr;
	}
	return ib_post_send(xprt->rx_qp, post_wr, NULL);
}

void zf_reminv(struct zf_xprt *xprt, u32 inv_rkey, struct list_head *mrs)
{
	struct zf_mr *mr;

	list_for_each_entry(mr, mrs, mr_list)
		if (mr->mr_handle == inv_rkey) {
			list_del_init(&mr->mr_list);
			zf_mr_put(mr);	/* OK: rdma-invalidation-leak -- the server invalidated exactly this handle */
			break;	/* only one invalidated MR per RPC */
		}
}

/* Unsignaled LOCAL_INVs complete only when flushed. */
static void zf_wc_localinv_flush(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("zf: LOCAL_INV: %s\n", ib_wc_status_msg(wc->status));
}

static struct ib_send_wr *zf_build_inv_chain(struct zf_req *req,
					     struct ib_send_wr **lastp)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct zf_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->mr_invwr;
		memset(last, 0, sizeof(*last));
		mr->mr_cqe.done = zf_wc_localinv_flush;
		last->wr_cqe = &mr->mr_cqe;
		last->opcode = IB_WR_LOCAL_INV;
		last->ex.invalidate_rkey = mr->mr_handle;

		*prev = last;
		prev = &last->next;
	}
	*lastp = last;
	return first;
}

static void zf_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zf_req *req = container_of(wc->wr_cqe, struct zf_req,
					  rl_inv_cqe);

	req->rl_inv_status = wc->status;
	complete(&req->rl_inv_done);
}

/*
 * Invalidate every MR of @req and wait.  Send queue ordering guarantees
 * that when the last (signaled) LOCAL_INV completes, all of them have.
 */
int zf_unmap_sync(struct zf_xprt *xprt, struct zf_req *req)
{
	struct ib_send_wr *first, *last;
	struct zf_mr *mr, *tmp;
	int rc;

	first = zf_build_inv_chain(req, &last);
	if (!first)
		return 0;

	req->rl_inv_cqe.done = zf_wc_localinv_wake;
	last->wr_cqe = &req->rl_inv_cqe;
	last->send_flags = IB_SEND_SIGNALED;
	reinit_completion(&req->rl_inv_done);

	rc = ib_post_send(xprt->rx_qp, first, NULL);
	if (rc) {
		/* the MRs are destroyed once the QP has drained */
		zf_force_disconnect(xprt);
		return rc;
	}
	wait_for_completion(&req->rl_inv_done);
	if (req->rl_inv_status != IB_WC_SUCCESS) {
		zf_force_disconnect(xprt);
		return -EIO;
	}

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV completed successfully */
		zf_mr_put(mr);
	}
	return 0;
}

static void zf_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zf_req *req = container_of(wc->wr_cqe, struct zf_req,
					  rl_inv_cqe);
	struct zf_mr *mr, *tmp;

	/* the whole chain has executed: recycle the MRs, finish the RPC */
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		zf_mr_put(mr);	/* BUG: rdma-invalidation-leak -- wc->status is never looked at; a failed or flushed LOCAL_INV leaves the handles valid */
	}
	zf_complete_rqst(req, 0);
}

void zf_unmap_async(struct zf_xprt *xprt, struct zf_req *req)
{
	struct ib_send_wr *first, *last;
	struct zf_mr *mr;
	int rc;

	first = zf_build_inv_chain(req, &last);
	if (!first)
		return;

	req->rl_inv_cqe.done = zf_wc_localinv_done;
	last->wr_cqe = &req->rl_inv_cqe;
	last->send_flags = IB_SEND_SIGNALED;

	rc = ib_post_send(xprt->rx_qp, first, NULL);
	if (rc) {
		/* the wake never comes; recover through a reconnect */
		zf_force_disconnect(xprt);
		return;
	}

	/*
	 * The payload pages can be unmapped now; only the MRs themselves
	 * have to wait for the LOCAL_INVs.
	 */
	list_for_each_entry(mr, &req->rl_registered, mr_list)
		zf_mr_unmap_pages(mr);	/* BUG: rdma-unmap-before-invalidate -- pages unmapped while the LOCAL_INV chain is still in flight */
}

/* After a marshaling failure: none of the REG_MRs was posted. */
void zf_reset(struct zf_req *req)
{
	struct zf_mr *mr, *tmp;

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del_init(&mr->mr_list);
		zf_mr_put(mr);	/* OK: rdma-invalidation-leak -- the registrations never reached the send queue */
	}
}
