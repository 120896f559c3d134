// SPDX-License-Identifier: GPL-2.0
/*
 * kyr FRWR: fast registration of RPC chunks.
 *
 * An MR is mapped by kyr_frwr_map() when the Call is marshaled; its REG_MR
 * is not posted there but chained in front of the Call's Send by
 * kyr_frwr_send(). When the Reply arrives, kyr_frwr_unmap_sync() posts one
 * LOCAL_INV per MR as a single chain and waits for the last one.
 */
#include <linux/slab.h>
#include "ky_rpcrdma.h"

static void kyr_wc_fastreg(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyr: FASTREG: %s (%u)\n",
		       ib_wc_status_msg(wc->status), wc->vendor_err);
}

static void kyr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	/* unsignaled: only a flushed or failed LOCAL_INV gets here */
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyr: LOCAL_INV: %s\n", ib_wc_status_msg(wc->status));
}

static void kyr_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyr_mr *mr = container_of(wc->wr_cqe, struct kyr_mr, cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyr: LOCAL_INV: %s\n", ib_wc_status_msg(wc->status));
	complete(&mr->linv_done);
}

int kyr_frwr_mr_init(struct kyr_xprt *r_xprt, struct kyr_mr *mr)
{
	struct kyr_ep *ep = r_xprt->rx_ep;
	unsigned int depth = ep->max_fr_depth;
	struct scatterlist *sg;
	struct ib_mr *frmr;

	// OK: rdma-registration-in-datapath -- only kyr_mrs_create() calls this, at connect and from the refresh worker
	frmr = ib_alloc_mr(ep->pd, IB_MR_TYPE_MEM_REG, depth);
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);

	sg = kcalloc(depth, sizeof(*sg), GFP_KERNEL);
	if (!sg) {
		ib_dereg_mr(frmr);
		return -ENOMEM;
	}
	sg_init_table(sg, depth);

	mr->ibmr = frmr;
	mr->sg = sg;
	mr->xprt = r_xprt;
	mr->dir = DMA_NONE;
	INIT_LIST_HEAD(&mr->mr_list);
	init_completion(&mr->linv_done);
	return 0;
}

void kyr_frwr_mr_release(struct kyr_mr *mr)
{
	int rc;

	// OK: rdma-registration-in-datapath -- reached only from kyr_mrs_destroy() at endpoint teardown
	rc = ib_dereg_mr(mr->ibmr);
	if (rc)
		pr_err("kyr: ib_dereg_mr(%p) returned %d\n", mr->ibmr, rc);
	kfree(mr->sg);
	kfree(mr);
}

static int kyr_chunk_access(enum kyr_chunktype type)
{
	switch (type) {
	case kyr_readch:
		return IB_ACCESS_REMOTE_READ;
	case kyr_writech:
		return IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	case kyr_replych:
		return IB_ACCESS_REMOTE_WRITE;
	default:
		return 0;
	}
}

/*
 * Map up to max_fr_depth segments that form one contiguous run. Returns
 * the first segment not mapped, or an ERR_PTR.
 */
struct kyr_seg *kyr_frwr_map(struct kyr_xprt *r_xprt, struct kyr_seg *seg,
			     int nsegs, enum kyr_chunktype type, u32 xid,
			     struct kyr_mr *mr)
{
	struct kyr_ep *ep = r_xprt->rx_ep;
	struct ib_device *device = ep->id->device;
	struct ib_reg_wr *reg_wr;
	struct ib_mr *ibmr;
	int i, dma_nents;
	u8 key;

	if (nsegs > ep->max_fr_depth)
		nsegs = ep->max_fr_depth;
	for (i = 0; i < nsegs;) {
		sg_set_page(&mr->sg[i], seg->page, seg->len, seg->offset);
		++seg;
		++i;
		if (i < nsegs && (seg->offset & ~PAGE_MASK))
			break;
		if (((seg - 1)->offset + (seg - 1)->len) & ~PAGE_MASK)
			break;
	}
	mr->dir = type == kyr_readch ? DMA_TO_DEVICE : DMA_FROM_DEVICE;

	mr->nents = ib_dma_map_sg(device, mr->sg, i, mr->dir);
	if (!mr->nents)
		goto out_dmamap_err;

	ibmr = mr->ibmr;
	dma_nents = ib_map_mr_sg(ibmr, mr->sg, mr->nents, NULL, PAGE_SIZE);
	if (dma_nents < mr->nents)
		goto out_mapmr_err;

	ibmr->iova &= 0x00000000ffffffff;
	ibmr->iova |= ((u64)xid) << 32;

	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, key);	// BUG: rdma-rkey-reuse -- stores back the low byte the key already has; every registration of this MR reuses the same rkey

	reg_wr = &mr->reg_wr;
	reg_wr->mr = ibmr;
	reg_wr->key = ibmr->rkey;
	reg_wr->access = kyr_chunk_access(type);	// BUG: rdma-access-flags-invalid -- for a reply chunk kyr_chunk_access() gives REMOTE_WRITE without LOCAL_WRITE; the REG_MR fails

	mr->handle = ibmr->rkey;	// OK: rdma-remote-access-overbroad -- the handle goes to the server in the chunk list (marshal.c)
	mr->length = ibmr->length;
	mr->offset = ibmr->iova;
	return seg;

out_mapmr_err:
	pr_err("kyr: failed to map mr %p (%d/%d)\n", mr, dma_nents, mr->nents);
	ib_dma_unmap_sg(device, mr->sg, mr->nents, mr->dir);
out_dmamap_err:
	mr->dir = DMA_NONE;
	return ERR_PTR(-EIO);
}

/* Post the REG_MRs of the Call's chunks and then the Send itself. */
int kyr_frwr_send(struct kyr_xprt *r_xprt, struct kyr_req *req)
{
	struct ib_send_wr *post_wr, *send_wr = &req->rl_wr;
	struct kyr_ep *ep = r_xprt->rx_ep;
	struct kyr_mr *mr;

	post_wr = send_wr;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->cqe.done = kyr_wc_fastreg;
		mr->reg_wr.wr.next = post_wr;
		mr->reg_wr.wr.wr_cqe = &mr->cqe;
		mr->reg_wr.wr.num_sge = 0;
		mr->reg_wr.wr.opcode = IB_WR_REG_MR;
		mr->reg_wr.wr.send_flags = 0;
		post_wr = &mr->reg_wr.wr;
	}

	// BUG: rdma-unsignaled-send-starvation -- send_count is set to send_batch at connect and reset here but never counted down, so no Send is ever signaled
	if (!ep->send_count) {
		send_wr->send_flags |= IB_SEND_SIGNALED;
		ep->send_count = ep->send_batch;
	} else {
		send_wr->send_flags &= ~IB_SEND_SIGNALED;
	}

	return ib_post_send(ep->id->qp, post_wr, NULL);
}

static void kyr_mr_unmap(struct kyr_mr *mr)
{
	struct ib_device *device = mr->xprt->rx_ep->id->device;

	if (mr->dir != DMA_NONE) {
		ib_dma_unmap_sg(device, mr->sg, mr->nents, mr->dir);
		mr->dir = DMA_NONE;
	}
}

void kyr_frwr_unmap_sync(struct kyr_xprt *r_xprt, struct kyr_req *req)
{
	struct ib_send_wr *first, **prev, *last = NULL;
	struct kyr_ep *ep = r_xprt->rx_ep;
	const struct ib_send_wr *bad_wr;
	struct kyr_mr *mr;
	int rc;

	prev = &first;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		last = &mr->inv_wr;
		last->next = NULL;
		last->wr_cqe = &mr->cqe;
		last->sg_list = NULL;
		last->num_sge = 0;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = 0;
		last->ex.invalidate_rkey = mr->handle;
		mr->cqe.done = kyr_wc_localinv;

		*prev = last;
		prev = &last->next;
	}
	if (!last)
		return;

	/* LOCAL_INVs execute in order: wait for the last one only */
	mr = container_of(last, struct kyr_mr, inv_wr);
	mr->cqe.done = kyr_wc_localinv_wake;
	last->send_flags = IB_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- the chain ends with a signaled LOCAL_INV, which retires the ones before it
	reinit_completion(&mr->linv_done);

	rc = ib_post_send(ep->id->qp, first, &bad_wr);
	if (rc) {
		pr_err("kyr: LOCAL_INV post failed (%d), disconnecting\n", rc);
		rdma_disconnect(ep->id);
		return;
	}
	wait_for_completion(&mr->linv_done);

	while (!list_empty(&req->rl_registered)) {
		mr = list_first_entry(&req->rl_registered, struct kyr_mr,
				      mr_list);
		list_del_init(&mr->mr_list);
		kyr_mr_unmap(mr);
		kyr_mr_put(mr);
	}
}

/* The Call was never sent: the MRs were mapped but not registered. */
void kyr_frwr_reset(struct kyr_req *req)
{
	struct kyr_mr *mr;

	while (!list_empty(&req->rl_registered)) {
		mr = list_first_entry(&req->rl_registered, struct kyr_mr,
				      mr_list);
		list_del_init(&mr->mr_list);
		kyr_mr_unmap(mr);
		kyr_mr_put(mr);
	}
}
