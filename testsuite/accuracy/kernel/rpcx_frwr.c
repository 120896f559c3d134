// SPDX-License-Identifier: GPL-2.0
/*
 * rpcx_frwr.c - FRWR memory registration for the RPCX RDMA transport.
 *
 * An RPC's data chunks are registered with fast-registration MRs taken
 * from the transport's free list (rb_mrs).  The REG_MR work requests are
 * chained in front of the RPC Call's SEND, and the Reply either carries a
 * remote invalidation of one of the RPC's handles or the client posts a
 * chain of LOCAL_INVs and lets the Reply finish from the last LOCAL_INV's
 * completion.  MRs whose state is unknown after an error are destroyed
 * and replaced from a worker.  Send completions are requested every
 * re_send_batch SENDs.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RPCX_MAX_SEND_SGES	16
#define RPCX_MAX_MRS_PER_REQ	3
/* the Call's SEND plus a REG_MR for each of the three chunks */
#define RPCX_SEND_DEPTH		(1 + RPCX_MAX_MRS_PER_REQ)

struct rpcx_ep {
	struct rdma_cm_id	*re_id;
	struct ib_pd		*re_pd;
	unsigned int		re_max_requests;
	unsigned int		re_max_fr_depth;
	unsigned int		re_send_batch;
	unsigned int		re_send_count;
	spinlock_t		re_mr_lock;
	struct list_head	re_mrs;		/* free MRs */
	struct list_head	re_all_mrs;
};

struct rpcx_req {
	struct list_head	rl_registered;
	struct ib_send_wr	rl_sendwr;
	struct ib_cqe		rl_cqe;
	void			(*rl_done)(struct rpcx_req *req);
};

struct rpcx_mr {
	struct list_head	mr_list;
	struct list_head	mr_all;
	struct rpcx_ep		*mr_ep;
	struct ib_mr		*mr_ibmr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_cqe		mr_cqe;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct rpcx_req		*mr_req;
	struct work_struct	mr_recycle;
	u32			mr_handle;
};

static void frwr_mr_recycle_worker(struct work_struct *work);

static int frwr_mr_init(struct rpcx_ep *ep, struct rpcx_mr *mr)
{
	unsigned int depth = ep->re_max_fr_depth;
	struct scatterlist *sg;
	struct ib_mr *frmr;

	/* BUG: rdma-local-mr-management -- the transport allocates its own FRWR MRs */
	frmr = ib_alloc_mr(ep->re_pd, IB_MR_TYPE_MEM_REG, depth); /* OK: rdma-registration-in-datapath -- called at connect time and from the refresh worker, never per RPC */
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);

	sg = kcalloc(depth, sizeof(*sg), GFP_NOFS);
	if (!sg)
		return -ENOMEM; // BUG: rdma-mr-leak -- frmr is neither deregistered nor stored on this error return

	mr->mr_ep = ep;
	mr->mr_ibmr = frmr;
	mr->mr_sg = sg;
	mr->mr_dir = DMA_NONE;
	INIT_WORK(&mr->mr_recycle, frwr_mr_recycle_worker);
	return 0;
}

static void frwr_mr_unmap(struct rpcx_mr *mr)
{
	if (mr->mr_dir != DMA_NONE) {
		ib_dma_unmap_sg(mr->mr_ep->re_id->device, mr->mr_sg,
				mr->mr_nents, mr->mr_dir);
		mr->mr_dir = DMA_NONE;
	}
}

static void frwr_mr_put(struct rpcx_mr *mr)
{
	frwr_mr_unmap(mr);
	spin_lock(&mr->mr_ep->re_mr_lock);
	list_add(&mr->mr_list, &mr->mr_ep->re_mrs);
	spin_unlock(&mr->mr_ep->re_mr_lock);
}

struct rpcx_mr *rpcx_mr_get(struct rpcx_ep *ep)
{
	struct rpcx_mr *mr;

	spin_lock(&ep->re_mr_lock);
	mr = list_first_entry_or_null(&ep->re_mrs, struct rpcx_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	spin_unlock(&ep->re_mr_lock);
	return mr;
}

int rpcx_mrs_create(struct rpcx_ep *ep, unsigned int count)
{
	struct rpcx_mr *mr;

	while (count--) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr || frwr_mr_init(ep, mr)) {
			kfree(mr);
			return -ENOMEM;
		}
		list_add(&mr->mr_all, &ep->re_all_mrs);
		frwr_mr_put(mr);
	}
	return 0;
}

/* The key of an MR in an unknown state dies with the MR. */
static void frwr_mr_recycle_worker(struct work_struct *work)
{
	struct rpcx_mr *mr = container_of(work, struct rpcx_mr, mr_recycle);
	struct rpcx_ep *ep = mr->mr_ep;

	frwr_mr_unmap(mr);
	/* BUG: rdma-local-mr-management -- deregistration by the ULP */
	ib_dereg_mr(mr->mr_ibmr); /* OK: rdma-registration-in-datapath -- runs from a worker, once per failed MR */
	mr->mr_ibmr = NULL;
	kfree(mr->mr_sg);
	if (frwr_mr_init(ep, mr) == 0)
		frwr_mr_put(mr);
}

int frwr_map(struct rpcx_ep *ep, struct rpcx_mr *mr, struct page **pages,
	     int npages, bool writing, u32 xid)
{
	struct ib_mr *ibmr;
	int i, dma_nents, n;
	u8 key;

	for (i = 0; i < npages && i < ep->re_max_fr_depth; i++)
		sg_set_page(&mr->mr_sg[i], pages[i], PAGE_SIZE, 0);
	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = i;

	dma_nents = ib_dma_map_sg(ep->re_id->device, mr->mr_sg, mr->mr_nents,
				  mr->mr_dir);
	if (!dma_nents)
		return -EIO;

	ibmr = mr->mr_ibmr;
	/* BUG: rdma-local-mr-management -- page list built by the ULP */
	n = ib_map_mr_sg(ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE);
	if (n != dma_nents) {
		frwr_mr_unmap(mr);
		return -EIO;
	}

	ibmr->iova &= 0x00000000ffffffff;
	ibmr->iova |= ((u64)xid) << 32;
	key = (u8)(ibmr->rkey & 0x000000FF);
	ib_update_fast_reg_key(ibmr, ++key);

	mr->mr_regwr.mr = ibmr; /* OK: rdma-rkey-reuse -- the key byte was incremented just above */
	mr->mr_regwr.key = ibmr->rkey;
	/* OK: rdma-access-flags-invalid -- a Write chunk gets local write with remote write */
	mr->mr_regwr.access = writing ? IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
					IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey; /* OK: rdma-remote-access-overbroad -- the handle is encoded into the chunk list */
	return n;
}

int frwr_send(struct rpcx_ep *ep, struct rpcx_req *req)
{
	struct ib_send_wr *post_wr, *send_wr = &req->rl_sendwr;
	struct rpcx_mr *mr;

	send_wr->wr_cqe = &req->rl_cqe;
	send_wr->opcode = IB_WR_SEND;
	send_wr->send_flags = 0;
	if (!ep->re_send_count) {
		send_wr->send_flags |= IB_SEND_SIGNALED;
		ep->re_send_count = ep->re_send_batch; /* OK: rdma-unsignaled-send-starvation -- the counter is re-armed here and counted down below */
	} else
		--ep->re_send_count;

	post_wr = send_wr;
	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		mr->mr_regwr.wr.wr_cqe = &mr->mr_cqe;
		mr->mr_regwr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR posted by the ULP
		mr->mr_regwr.wr.send_flags = 0;
		post_wr = &mr->mr_regwr.wr;
	}
	return ib_post_send(ep->re_id->qp, post_wr, NULL);
}

static void frwr_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rpcx_mr *mr = container_of(wc->wr_cqe, struct rpcx_mr, mr_cqe);

	if (likely(wc->status == IB_WC_SUCCESS))
		frwr_mr_put(mr); /* OK: rdma-invalidation-leak -- only a LOCAL_INV that succeeded returns the MR */
	else
		schedule_work(&mr->mr_recycle);
}

static void frwr_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rpcx_mr *mr = container_of(wc->wr_cqe, struct rpcx_mr, mr_cqe);
	struct rpcx_req *req = mr->mr_req;

	/* BUG: rdma-invalidation-leak -- wc->status is not looked at: after a failed LOCAL_INV the handle is still valid on the free list */
	frwr_mr_put(mr);
	req->rl_done(req);
}

/* Pops every MR of the RPC; all LOCAL_INVs are signaled. */
static struct ib_send_wr *frwr_build_linv(struct rpcx_req *req,
					  struct rpcx_mr **lastp)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last;
	struct rpcx_mr *mr;

	while ((mr = list_first_entry_or_null(&req->rl_registered,
					      struct rpcx_mr, mr_list))) {
		list_del_init(&mr->mr_list);
		mr->mr_req = req;
		last = &mr->mr_invwr;
		last->next = NULL;
		last->wr_cqe = &mr->mr_cqe;
		last->opcode = IB_WR_LOCAL_INV;
		last->send_flags = IB_SEND_SIGNALED;
		last->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = frwr_wc_localinv;
		*prev = last;
		prev = &last->next;
		*lastp = mr;
	}
	return first;
}

void frwr_unmap_async(struct rpcx_ep *ep, struct rpcx_req *req)
{
	struct rpcx_mr *mr, *last = NULL;
	struct ib_send_wr *first, *wr;
	int rc;

	mr = list_first_entry(&req->rl_registered, struct rpcx_mr, mr_list);
	if (mr->mr_list.next == &req->rl_registered) {
		/* One chunk: nothing to wait for before the Reply completes. */
		list_del_init(&mr->mr_list);
		mr->mr_invwr.next = NULL;
		mr->mr_invwr.wr_cqe = &mr->mr_cqe;
		mr->mr_invwr.opcode = IB_WR_LOCAL_INV;
		mr->mr_invwr.send_flags = 0;
		mr->mr_invwr.ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = frwr_wc_localinv;
		rc = ib_post_send(ep->re_id->qp, &mr->mr_invwr, NULL);
		if (rc)
			schedule_work(&mr->mr_recycle); /* OK: rdma-invalidation-leak -- the recycle worker deregisters the MR, which kills the key */
		else
			frwr_mr_put(mr); // BUG: rdma-unmap-before-invalidate -- pages unmapped and the MR reused while the unsignaled LOCAL_INV is still queued
		req->rl_done(req);
		return;
	}

	first = frwr_build_linv(req, &last);
	last->mr_cqe.done = frwr_wc_localinv_done;
	rc = ib_post_send(ep->re_id->qp, first, NULL);
	if (rc) {
		for (wr = first; wr; wr = wr->next) {
			mr = container_of(wr, struct rpcx_mr, mr_invwr);
			/* BUG: rdma-invalidation-leak -- the chain was not posted, the handles stay valid on the free list */
			frwr_mr_put(mr);
		}
		req->rl_done(req);
	}
}

static void frwr_reminv(struct rpcx_req *req, u32 inv_rkey)
{
	struct rpcx_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list)
		if (mr->mr_handle == inv_rkey) {
			list_del_init(&mr->mr_list);
			frwr_mr_put(mr); /* OK: rdma-invalidation-leak -- the peer invalidated exactly this handle */
			return;
		}
}

void rpcx_reply_handler(struct rpcx_ep *ep, struct rpcx_req *req,
			int wc_flags, u32 inv_rkey, bool single_chunk)
{
	struct rpcx_mr *mr;

	if (single_chunk && (wc_flags & IB_WC_WITH_INVALIDATE)) {
		/* BUG: rdma-remote-invalidate-unchecked -- the only chunk is assumed to be the one the server invalidated */
		mr = list_first_entry(&req->rl_registered, struct rpcx_mr, mr_list);
		list_del_init(&mr->mr_list);
		frwr_mr_put(mr);
	} else if (wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- frwr_reminv() matches inv_rkey against each handle */
		frwr_reminv(req, inv_rkey);
	}
	if (list_empty(&req->rl_registered))
		return req->rl_done(req);
	frwr_unmap_async(ep, req);
}

int rpcx_ep_create(struct rpcx_ep *ep)
{
	struct ib_qp_init_attr attr = { .qp_type = IB_QPT_RC };
	struct ib_device *device = ep->re_id->device;
	unsigned int max_sge = min_t(unsigned int, device->attrs.max_send_sge,
				     RPCX_MAX_SEND_SGES);

	ep->re_max_fr_depth = min_t(unsigned int, 32,
				    device->attrs.max_fast_reg_page_list_len);
	attr.cap.max_send_sge = max_sge; /* OK: rdma-queue-cap-unchecked -- clamped to attrs.max_send_sge */
	attr.cap.max_recv_sge = 1;
	/* BUG: rdma-send-queue-manual-factor -- a hand-kept per-RPC work request count times the credit limit */
	attr.cap.max_send_wr = ep->re_max_requests * RPCX_SEND_DEPTH + 1; // BUG(file): rdma-send-queue-undersized -- the LOCAL_INV chain is not counted: up to 3 REG_MR, 3 LOCAL_INV and the SEND per RPC against 4 entries
	attr.cap.max_recv_wr = ep->re_max_requests + 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->re_send_batch = ep->re_max_requests >> 3;
	ep->re_send_count = ep->re_send_batch;
	spin_lock_init(&ep->re_mr_lock);
	INIT_LIST_HEAD(&ep->re_mrs);
	INIT_LIST_HEAD(&ep->re_all_mrs);
	return rdma_create_qp(ep->re_id, ep->re_pd, &attr);
}

void rpcx_ep_destroy(struct rpcx_ep *ep)
{
	struct rpcx_mr *mr, *tmp;

	ib_drain_qp(ep->re_id->qp);
	list_for_each_entry_safe(mr, tmp, &ep->re_all_mrs, mr_all) {
		list_del(&mr->mr_all);
		frwr_mr_unmap(mr);
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(mr->mr_ibmr);
		kfree(mr->mr_sg);
		kfree(mr);
	}
	rdma_destroy_qp(ep->re_id);
}
