// SPDX-License-Identifier: GPL-2.0
/*
 * kc_nbd_cq.c - completion handlers and timeouts.  Known problems: a failed
 * command skips the invalidation; zone reports trust any remote invalidation;
 * the timeout handler recycles the request right behind its LOCAL_INV.
 */
#include "kc_nbd.h"

#define kc_nbd_error_recovery(q)	queue_work(system_wq, &(q)->err_work)

static void kc_nbd_end_req(struct kc_nbd_queue *q, struct kc_nbd_req *req,
			   blk_status_t sts)
{
	struct request *rq = req->rq;

	if (req->nents)
		ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, req->dir);
	req->nents = 0;
	kc_nbd_put_req(q, req);
	blk_mq_end_request(rq, sts);
}

void kc_nbd_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nbd_req *req =
		container_of(wc->wr_cqe, struct kc_nbd_req, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kc_nbd_error_recovery(req->q);
}

void kc_nbd_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nbd_req *req =
		container_of(wc->wr_cqe, struct kc_nbd_req, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kc_nbd_error_recovery(req->q);
}

static void kc_nbd_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nbd_req *req =
		container_of(wc->wr_cqe, struct kc_nbd_req, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kc_nbd_error_recovery(req->q);
		return;
	}
	/* fresh key for the next registration of this MR */
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	kc_nbd_end_req(req->q, req, BLK_STS_OK); /* OK: rdma-unmap-before-invalidate -- runs from the LOCAL_INV completion */
}

static void kc_nbd_inv_quiet_done(struct ib_cq *cq, struct ib_wc *wc) { }

static int kc_nbd_post_inv(struct kc_nbd_queue *q, struct kc_nbd_req *req,
			   void (*done)(struct ib_cq *cq, struct ib_wc *wc))
{
	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_cqe.done = done;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	return ib_post_send(q->qp, &req->inv_wr, NULL);
}

/* Zone reports always come back with SEND_WITH_INV from the target. */
static void kc_nbd_report_rsp(struct kc_nbd_queue *q, struct kc_nbd_req *req,
			      struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- wc->ex.invalidate_rkey is not compared with req->mr->rkey before the report buffer is released */
		kc_nbd_end_req(q, req, BLK_STS_OK);
	else if (kc_nbd_post_inv(q, req, kc_nbd_inv_done))
		kc_nbd_error_recovery(q);
}

void kc_nbd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nbd_rx *rx = container_of(wc->wr_cqe, struct kc_nbd_rx, cqe);
	struct kc_nbd_queue *q = rx->q;
	struct kc_nbd_req *req;
	u32 inv_rkey;

	if (unlikely(wc->status != IB_WC_SUCCESS || rx->rsp->tag >= q->depth)) {
		kc_nbd_error_recovery(q);
		return;
	}
	req = &q->reqs[rx->rsp->tag];

	if (!req->reg_wr.mr) {
		kc_nbd_end_req(q, req, rx->rsp->status ? BLK_STS_IOERR : BLK_STS_OK);
	} else if (rx->rsp->status) {
		/* the target failed the command before touching our pages */
		kc_nbd_end_req(q, req, BLK_STS_IOERR); /* BUG: rdma-invalidation-leak -- the target still holds a live rkey for these pages; neither SEND_WITH_INV nor LOCAL_INV happened on this path */
	} else if (req->kind == KC_NBD_CMD_REPORT) {
		kc_nbd_report_rsp(q, req, wc);
	} else if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's */
		inv_rkey = wc->ex.invalidate_rkey;
		if (unlikely(inv_rkey != req->mr->rkey))
			kc_nbd_error_recovery(q);
		else
			kc_nbd_end_req(q, req, BLK_STS_OK);
	} else if (kc_nbd_post_inv(q, req, kc_nbd_inv_done)) {
		kc_nbd_error_recovery(q);
	}
	kc_nbd_post_recv(q, rx);
}

enum blk_eh_timer_return kc_nbd_timeout(struct kc_nbd_req *req)
{
	struct kc_nbd_queue *q = req->q;

	/* fence the buffer before the block layer gets it back */
	if (req->reg_wr.mr && kc_nbd_post_inv(q, req, kc_nbd_inv_quiet_done))
		kc_nbd_error_recovery(q);
	kc_nbd_end_req(q, req, BLK_STS_TIMEOUT); /* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV is not waited for (and may not even have been posted) before the pages are unmapped and the request reused */
	return BLK_EH_DONE;
}
