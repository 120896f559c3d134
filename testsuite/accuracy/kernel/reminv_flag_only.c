// SPDX-License-Identifier: GPL-2.0
/*
 * pmf: the response path of an invented persistent-memory-over-fabrics
 * initiator ("pmf"). Commands carry the rkey of a fast-registered buffer;
 * the target answers with SEND_WITH_INV so the initiator can skip its own
 * LOCAL_INV.
 *
 * The bug (the classic one): pmf_handle_rsp() clears need_inval as soon as
 * the completion says some key was invalidated, without looking at which
 * one. A target that invalidates another key leaves this request's key alive
 * while its buffer is recycled. pmf_handle_flush_rsp() compares the key
 * directly before accepting, which is right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct pmf_queue {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	spinlock_t		lock;
	struct list_head	free_reqs;
};

struct pmf_req {
	struct pmf_queue	*queue;
	struct ib_mr		*mr;
	bool			need_inval;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct list_head	entry;
	struct scatterlist	*sgl;
	int			nents;
	int			status;
};

void pmf_complete_io(struct pmf_req *req, int status);
void pmf_queue_error(struct pmf_queue *queue);

static void pmf_put_req(struct pmf_req *req)
{
	struct pmf_queue *queue = req->queue;
	unsigned long flags;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the initiator returns MRs to its own pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->ibdev, req->sgl, req->nents, DMA_BIDIRECTIONAL);
	spin_lock_irqsave(&queue->lock, flags);
	list_add_tail(&req->entry, &queue->free_reqs);
	spin_unlock_irqrestore(&queue->lock, flags);
}

static void pmf_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct pmf_req *req = container_of(wc->wr_cqe, struct pmf_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		pmf_queue_error(req->queue);
		return;
	}
	pmf_complete_io(req, req->status);
	pmf_put_req(req);
}

static void pmf_finish(struct pmf_req *req)
{
	if (req->need_inval) {
		req->inv_wr.opcode = IB_WR_LOCAL_INV;
		req->inv_wr.next = NULL;
		req->inv_wr.num_sge = 0;
		req->inv_wr.send_flags = IB_SEND_SIGNALED;
		req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
		req->inv_cqe.done = pmf_inv_done;
		req->inv_wr.wr_cqe = &req->inv_cqe;
		if (ib_post_send(req->queue->qp, &req->inv_wr, NULL))
			pmf_queue_error(req->queue);
		return;
	}
	pmf_complete_io(req, req->status);
	pmf_put_req(req);
}

void pmf_handle_rsp(struct pmf_req *req, int status, struct ib_wc *wc)
{
	req->status = status;
	/* BUG: rdma-remote-invalidate-unchecked -- whichever key the target invalidated, this request's is taken as dead */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
		req->need_inval = false;
	pmf_finish(req);
}

void pmf_handle_flush_rsp(struct pmf_req *req, int status, struct ib_wc *wc)
{
	req->status = status;
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's before need_inval is cleared */
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) && req->mr &&
	    wc->ex.invalidate_rkey == req->mr->rkey)
		req->need_inval = false;
	pmf_finish(req);
}
