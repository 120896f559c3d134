// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * tb_verbs.c - endpoint, QP and MR list management for the RPC-over-RDMA
 * client. The QP's send queue depth comes from frwr_query_device().
 */
#include "tb_xprt.h"

#define XPR_MRS_PER_REQ		4

void xpr_force_disconnect(struct xpr_ep *ep)
{
	if (rdma_disconnect(ep->re_id))
		pr_err("xprtrdma: rdma_disconnect failed\n");
}

/* provided by the RPC client glue */
void xpr_rqst_done(struct xpr_rep *rep, int status);

void xpr_complete_rqst(struct xpr_rep *rep)
{
	xpr_rqst_done(rep, 0);
}

struct xpr_mr *xpr_mr_get(struct xpr_xprt *r_xprt)
{
	struct xpr_buffer *buf = &r_xprt->rx_buf;
	struct xpr_mr *mr;

	spin_lock(&buf->rb_lock);
	mr = xpr_mr_pop(&buf->rb_mrs);
	spin_unlock(&buf->rb_lock);
	return mr;
}

static void xpr_mrs_create(struct xpr_xprt *r_xprt)
{
	struct xpr_buffer *buf = &r_xprt->rx_buf;
	unsigned int count;

	for (count = 0; count < buf->rb_max_requests * XPR_MRS_PER_REQ; count++) {
		struct xpr_mr *mr;
		int rc;

		mr = kzalloc(sizeof(*mr), GFP_NOFS);
		if (!mr)
			break;

		rc = frwr_mr_init(r_xprt, mr);
		if (rc) {
			kfree(mr); /* OK: rdma-mr-leak -- the MR left behind is frwr_mr_init()'s leak, reported there */
			break;
		}

		spin_lock(&buf->rb_lock);
		xpr_mr_push(mr, &buf->rb_mrs);
		list_add(&mr->mr_all, &buf->rb_all_mrs);
		spin_unlock(&buf->rb_lock);
	}
}

static void xpr_mrs_destroy(struct xpr_xprt *r_xprt)
{
	struct xpr_buffer *buf = &r_xprt->rx_buf;
	struct xpr_mr *mr;

	spin_lock(&buf->rb_lock);
	while ((mr = list_first_entry_or_null(&buf->rb_all_mrs,
					      struct xpr_mr, mr_all))) {
		list_del(&mr->mr_list);
		list_del(&mr->mr_all);
		spin_unlock(&buf->rb_lock);

		frwr_mr_release(mr); /* OK: rdma-invalidation-leak, rdma-mr-leak -- ib_dereg_mr() in frwr_mr_release() */

		spin_lock(&buf->rb_lock);
	}
	spin_unlock(&buf->rb_lock);
}

int xpr_ep_create(struct xpr_xprt *r_xprt, struct rdma_cm_id *id)
{
	struct xpr_ep *ep;
	int rc;

	ep = kzalloc(sizeof(*ep), GFP_KERNEL);
	if (!ep)
		return -ENOMEM;
	ep->re_id = id;
	ep->re_max_requests = r_xprt->rx_buf.rb_max_requests;

	rc = frwr_query_device(ep, id->device);
	if (rc)
		goto out_free;

	ep->re_attr.qp_context = ep;
	ep->re_attr.srq = NULL;
	ep->re_attr.cap.max_inline_data = 0;
	ep->re_attr.cap.max_send_sge = 2;
	ep->re_attr.cap.max_recv_sge = 1;
	ep->re_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->re_attr.qp_type = IB_QPT_RC;
	ep->re_attr.port_num = ~0;

	ep->re_send_cq = ib_alloc_cq(id->device, r_xprt,
				     ep->re_attr.cap.max_send_wr, 0,
				     IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->re_send_cq)) {
		rc = PTR_ERR(ep->re_send_cq);
		goto out_free;
	}
	ep->re_recv_cq = ib_alloc_cq(id->device, r_xprt,
				     ep->re_attr.cap.max_recv_wr, 0,
				     IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->re_recv_cq)) {
		rc = PTR_ERR(ep->re_recv_cq);
		goto out_send_cq;
	}
	ep->re_attr.send_cq = ep->re_send_cq;
	ep->re_attr.recv_cq = ep->re_recv_cq;

	ep->re_pd = ib_alloc_pd(id->device, 0);
	if (IS_ERR(ep->re_pd)) {
		rc = PTR_ERR(ep->re_pd);
		goto out_recv_cq;
	}

	rc = rdma_create_qp(id, ep->re_pd, &ep->re_attr);
	if (rc)
		goto out_pd;

	r_xprt->rx_ep = ep;
	spin_lock_init(&r_xprt->rx_buf.rb_lock);
	INIT_LIST_HEAD(&r_xprt->rx_buf.rb_mrs);
	INIT_LIST_HEAD(&r_xprt->rx_buf.rb_all_mrs);
	xpr_mrs_create(r_xprt);
	return 0;

out_pd:
	ib_dealloc_pd(ep->re_pd);
out_recv_cq:
	ib_free_cq(ep->re_recv_cq);
out_send_cq:
	ib_free_cq(ep->re_send_cq);
out_free:
	kfree(ep);
	return rc;
}

void xpr_ep_destroy(struct xpr_xprt *r_xprt)
{
	struct xpr_ep *ep = r_xprt->rx_ep;

	if (ep->re_id->qp) {
		ib_drain_qp(ep->re_id->qp);
		rdma_destroy_qp(ep->re_id);
	}
	xpr_mrs_destroy(r_xprt);
	ib_free_cq(ep->re_recv_cq);
	ib_free_cq(ep->re_send_cq);
	ib_dealloc_pd(ep->re_pd);
	r_xprt->rx_ep = NULL;
	kfree(ep);
}
