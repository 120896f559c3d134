// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * rb_verbs.c - endpoint, Send/Receive and reply handling for the rbx
 * RPC-over-RDMA client transport.  Registration lives in rb_frwr.c; the
 * shared structures and the MR free-list helpers are in rb_xprt.h.
 *
 * Sends are signaled selectively: every re_send_batch-th Call asks for a
 * completion, which retires the unsignaled Sends and REG_MRs ahead of it.
 */
#include "rb_xprt.h"

#define RBX_RDMA_MSG	0
#define RBX_RDMA_NOMSG	1
#define RBX_RDMA_ERROR	4

struct rbx_hdr {
	__be32	xid;
	__be32	vers;
	__be32	credits;
	__be32	proc;
};

void rbx_rpc_wake(void *task, int status);	/* RPC client layer */

void rbx_force_disconnect(struct rbx_xprt *x)
{
	rdma_disconnect(x->rx_ep->re_id);
}

void rbx_complete_rqst(struct rbx_req *req, int status)
{
	void *task = req->rl_task;

	req->rl_task = NULL;
	if (task)
		rbx_rpc_wake(task, status);
}

/* ------------------------------------------------------------- endpoint */

int rbx_ep_create(struct rbx_xprt *x, struct rbx_ep *ep)
{
	struct ib_qp_init_attr qp_attr;
	int rc;

	ep->re_cq = ib_alloc_cq(x->rx_dev, x, ep->re_max_requests * 4, 0,
				IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->re_cq))
		return PTR_ERR(ep->re_cq);

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = x;
	qp_attr.send_cq = ep->re_cq;
	qp_attr.recv_cq = ep->re_cq;
	qp_attr.cap.max_send_wr = ep->re_max_requests * (RBX_MAX_SEGS * 2 + 1) + 1;
	qp_attr.cap.max_recv_wr = ep->re_max_requests + 1;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;

	rc = rdma_create_qp(ep->re_id, x->rx_pd, &qp_attr);
	if (rc) {
		ib_free_cq(ep->re_cq);
		return rc;
	}

	ep->re_send_batch = ep->re_max_requests >> 3;
	if (!ep->re_send_batch)
		ep->re_send_batch = 1;
	ep->re_send_count = ep->re_send_batch;
	x->rx_ep = ep;
	return 0;
}

/* ----------------------------------------------------------------- Send */

static void rbx_wc_send(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rbx: Send failed: %s\n", ib_wc_status_msg(wc->status));
}

static void rbx_prepare_send(struct rbx_xprt *x, struct rbx_req *req, u32 len)
{
	struct rbx_ep *ep = x->rx_ep;
	struct ib_send_wr *wr = &req->rl_send_wr;

	req->rl_send_sge.addr = req->rl_send_dma;
	req->rl_send_sge.length = len;
	req->rl_send_sge.lkey = x->rx_pd->local_dma_lkey;

	memset(wr, 0, sizeof(*wr));
	req->rl_send_cqe.done = rbx_wc_send;
	wr->wr_cqe = &req->rl_send_cqe;
	wr->sg_list = &req->rl_send_sge;
	wr->num_sge = 1;
	wr->opcode = IB_WR_SEND;

	if (!ep->re_send_count) {
		wr->send_flags = IB_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- re_send_count counts down on every unsignaled Send below */
		ep->re_send_count = ep->re_send_batch;
	} else {
		wr->send_flags = 0;
		--ep->re_send_count;
	}
}

int rbx_xprt_send_request(struct rbx_xprt *x, struct rbx_req *req, u32 len)
{
	int rc;

	rbx_prepare_send(x, req, len);
	rc = rbx_frwr_send(x, req);
	if (rc) {
		/* retransmitted after the reconnect; the reset reclaims the MRs */
		rbx_force_disconnect(x);
		return -ENOTCONN;
	}
	return 0;
}

/* -------------------------------------------------------------- Receive */

int rbx_post_recv(struct rbx_xprt *x, struct rbx_rep *rep);

static struct rbx_req *rbx_lookup_rqst(struct rbx_xprt *x, __be32 xid)
{
	unsigned int i;

	for (i = 0; i < x->rx_nreqs; i++)
		if (x->rx_reqs[i].rl_task && x->rx_reqs[i].rl_xid == xid)
			return &x->rx_reqs[i];
	return NULL;
}

static void rbx_reply_error(struct rbx_xprt *x, struct rbx_req *req,
			    struct rbx_rep *rep)
{
	struct rbx_mr *mr;

	pr_warn("rbx: RDMA_ERROR reply for xid %08x\n", be32_to_cpu(rep->rr_xid));

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE) { /* BUG: rdma-remote-invalidate-unchecked -- takes the first registered MR as the invalidated one; rr_inv_rkey is never compared */
		/* the server hands back the chunk it was working on */
		mr = rbx_mr_pop(&req->rl_registered);
		if (mr)
			rbx_mr_unmap_and_put(mr);
	}
	if (!list_empty(&req->rl_registered))
		rbx_frwr_unmap_async(x, req);
	else
		rbx_complete_rqst(req, -EIO);
}

static void rbx_reply_handler(struct rbx_xprt *x, struct rbx_rep *rep)
{
	struct rbx_req *req;

	req = rbx_lookup_rqst(x, rep->rr_xid);
	if (!req) {
		pr_warn("rbx: reply for unknown xid %08x\n",
			be32_to_cpu(rep->rr_xid));
		rbx_post_recv(x, rep);
		return;
	}
	req->rl_reply = rep;

	if (be32_to_cpu(rep->rr_proc) == RBX_RDMA_ERROR) {
		rbx_reply_error(x, req, rep);
		return;
	}

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE) /* OK: rdma-remote-invalidate-unchecked -- rbx_frwr_reminv() matches rr_inv_rkey against each MR's handle */
		rbx_frwr_reminv(rep, &req->rl_registered);
	if (!list_empty(&req->rl_registered))
		rbx_frwr_unmap_async(x, req);
	else
		rbx_complete_rqst(req, 0);
}

static void rbx_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbx_rep *rep = container_of(wc->wr_cqe, struct rbx_rep, rr_cqe);
	struct rbx_xprt *x = rep->rr_xprt;
	struct rbx_hdr *hdr = rep->rr_buf;

	if (wc->status != IB_WC_SUCCESS) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			rbx_force_disconnect(x);
		return;
	}

	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
	ib_dma_sync_single_for_cpu(x->rx_dev, rep->rr_dma, RBX_INLINE_SIZE,
				   DMA_FROM_DEVICE);
	rep->rr_xid = hdr->xid;
	rep->rr_proc = hdr->proc;
	rbx_reply_handler(x, rep);
}

int rbx_post_recv(struct rbx_xprt *x, struct rbx_rep *rep)
{
	rep->rr_cqe.done = rbx_wc_receive;
	rep->rr_sge.addr = rep->rr_dma;
	rep->rr_sge.length = RBX_INLINE_SIZE;
	rep->rr_sge.lkey = x->rx_pd->local_dma_lkey;
	rep->rr_recv_wr.next = NULL;
	rep->rr_recv_wr.wr_cqe = &rep->rr_cqe;
	rep->rr_recv_wr.sg_list = &rep->rr_sge;
	rep->rr_recv_wr.num_sge = 1;
	return ib_post_recv(x->rx_ep->re_id->qp, &rep->rr_recv_wr, NULL);
}

/* ---------------------------------------------------- RPC release/abort */

struct rbx_req *rbx_req_get(struct rbx_xprt *x)
{
	struct rbx_req *req;

	spin_lock(&x->rx_lock);
	req = list_first_entry_or_null(&x->rx_reqs_free, struct rbx_req, rl_free);
	if (req)
		list_del_init(&req->rl_free);
	spin_unlock(&x->rx_lock);
	return req;
}

/* Normal end of an RPC that has no reply pending any more. */
void rbx_xprt_release_rqst(struct rbx_xprt *x, struct rbx_req *req)
{
	if (!list_empty(&req->rl_registered))
		rbx_frwr_unmap_sync(x, req);
	if (!list_empty(&req->rl_registered))
		return;		/* invalidation failed: held until the reset */

	req->rl_task = NULL;
	spin_lock(&x->rx_lock);
	list_add(&req->rl_free, &x->rx_reqs_free); /* OK: rdma-invalidation-leak -- rbx_frwr_unmap_sync() invalidated and detached every MR */
	spin_unlock(&x->rx_lock);
}

/* The RPC layer gave up on the request (major timeout or fatal signal). */
void rbx_xprt_abort_rqst(struct rbx_xprt *x, struct rbx_req *req)
{
	struct rbx_mr *mr;

	req->rl_task = NULL;
	while ((mr = rbx_mr_pop(&req->rl_registered)))
		rbx_mr_unmap_and_put(mr); /* BUG: rdma-invalidation-leak -- the server still holds these handles; the pages and MRs are reused while they are valid */

	spin_lock(&x->rx_lock);
	list_add(&req->rl_free, &x->rx_reqs_free);
	spin_unlock(&x->rx_lock);
}

/* ------------------------------------------------ disconnect recovery */

/* DISCONNECTED event: drain, then drop every MR still attached to an RPC. */
void rbx_reqs_reset(struct rbx_xprt *x)
{
	unsigned int i;

	ib_drain_qp(x->rx_ep->re_id->qp);

	for (i = 0; i < x->rx_nreqs; i++) {
		struct rbx_req *req = &x->rx_reqs[i];
		struct rbx_mr *mr;

		/* MR state is unknown and the PD lives on: deregister them. */
		while ((mr = rbx_mr_pop(&req->rl_registered))) {
			spin_lock(&x->rx_lock);
			list_del(&mr->mr_all);
			spin_unlock(&x->rx_lock);

			ib_dereg_mr(mr->ibmr);
			if (mr->mr_dir != DMA_NONE)
				ib_dma_unmap_sg(x->rx_dev, mr->mr_sg, mr->mr_nents,
						mr->mr_dir); /* OK: rdma-invalidation-leak -- the MR was deregistered just above */
			kfree(mr->mr_sg);
			kfree(mr);
		}
	}
	queue_work(system_wq, &x->rx_refresh_work);
}

static void rbx_refresh_worker(struct work_struct *work)
{
	struct rbx_xprt *x = container_of(work, struct rbx_xprt, rx_refresh_work);

	if (rbx_mrs_create(x))
		pr_warn("rbx: could not replenish MRs\n");
}

void rbx_xprt_init(struct rbx_xprt *x)
{
	spin_lock_init(&x->rx_lock);
	INIT_LIST_HEAD(&x->rx_mrs_free);
	INIT_LIST_HEAD(&x->rx_mrs_all);
	INIT_LIST_HEAD(&x->rx_reqs_free);
	INIT_WORK(&x->rx_refresh_work, rbx_refresh_worker);
}
