// SPDX-License-Identifier: GPL-2.0
/*
 * kyr verbs: endpoint creation and teardown, the MR free list, and the
 * receive ring for RPC Replies. See ky_rpcrdma.h for the module overview.
 */
#include <linux/module.h>
#include <linux/slab.h>
#include "ky_rpcrdma.h"

static unsigned int kyr_slot_table_entries = 128;
module_param(kyr_slot_table_entries, uint, 0644);
MODULE_PARM_DESC(kyr_slot_table_entries, "RPC slots per transport");

static void kyr_qp_event_handler(struct ib_event *event, void *context)
{
	pr_warn("kyr: QP event on endpoint %p\n", context);
}

/*
 * Size the send queue: every RPC in flight may post, besides its Send,
 * one REG_MR for each chunk segment.
 */
static int kyr_ep_size_queues(struct kyr_ep *ep)
{
	struct ib_device *device = ep->id->device;
	unsigned int max_qp_wr, depth;

	ep->max_fr_depth = min_t(unsigned int, KYR_MAX_FR_PAGES,
				 device->attrs.max_fast_reg_page_list_len);

	/* one REG_MR per segment, and the RDMA Send */
	depth = KYR_MAX_SEGS + 1;

	max_qp_wr = device->attrs.max_qp_wr;
	max_qp_wr -= KYR_BC_WRS;
	max_qp_wr -= 1;
	if (max_qp_wr < KYR_MIN_SLOTS * depth)
		return -ENOMEM;
	if (ep->max_requests * depth > max_qp_wr)
		ep->max_requests = max_qp_wr / depth;

	// BUG(program): rdma-send-queue-undersized -- an RPC posts up to KYR_MAX_SEGS REG_MRs, the Send and KYR_MAX_SEGS LOCAL_INVs (2*KYR_MAX_SEGS+1) but only KYR_MAX_SEGS+1 entries are reserved per RPC
	ep->attr.cap.max_send_wr = ep->max_requests * depth;	// BUG: rdma-send-queue-manual-factor -- hand-made factor for the registration work requests of each RPC
	ep->attr.cap.max_send_wr += KYR_BC_WRS;
	ep->attr.cap.max_send_wr += 1;		/* for ib_drain_sq */
	ep->attr.cap.max_recv_wr = ep->max_requests + KYR_BC_WRS + 1;
	ep->attr.cap.max_send_sge = KYR_SEND_SGES;	// OK: rdma-queue-cap-unchecked -- three SGEs, below what every RDMA device accepts
	ep->attr.cap.max_recv_sge = 1;

	ep->send_batch = ep->max_requests >> 3;
	if (!ep->send_batch)
		ep->send_batch = 1;
	return 0;
}

static void kyr_mr_refresh_worker(struct work_struct *work);

int kyr_ep_create(struct kyr_xprt *r_xprt, struct rdma_cm_id *id)
{
	struct kyr_ep *ep;
	int rc;

	ep = kzalloc(sizeof(*ep), GFP_KERNEL);
	if (!ep)
		return -ENOMEM;
	ep->id = id;
	ep->max_requests = kyr_slot_table_entries;

	rc = kyr_ep_size_queues(ep);
	if (rc)
		goto out_free;

	ep->pd = ib_alloc_pd(id->device, 0);
	if (IS_ERR(ep->pd)) {
		rc = PTR_ERR(ep->pd);
		goto out_free;
	}

	ep->send_cq = ib_alloc_cq(id->device, ep, ep->attr.cap.max_send_wr,
				  0, IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->send_cq)) {
		rc = PTR_ERR(ep->send_cq);
		goto out_dealloc_pd;
	}
	ep->recv_cq = ib_alloc_cq(id->device, ep, ep->attr.cap.max_recv_wr,
				  0, IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->recv_cq)) {
		rc = PTR_ERR(ep->recv_cq);
		goto out_free_scq;
	}

	ep->attr.event_handler = kyr_qp_event_handler;
	ep->attr.qp_context = ep;
	ep->attr.send_cq = ep->send_cq;
	ep->attr.recv_cq = ep->recv_cq;
	ep->attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->attr.qp_type = IB_QPT_RC;

	rc = rdma_create_qp(id, ep->pd, &ep->attr);
	if (rc)
		goto out_free_rcq;

	ep->send_count = ep->send_batch;
	r_xprt->rx_ep = ep;
	INIT_WORK(&r_xprt->rx_refresh_worker, kyr_mr_refresh_worker);
	kyr_mrs_refresh(r_xprt);
	return 0;

out_free_rcq:
	ib_free_cq(ep->recv_cq);
out_free_scq:
	ib_free_cq(ep->send_cq);
out_dealloc_pd:
	ib_dealloc_pd(ep->pd);
out_free:
	kfree(ep);
	return rc;
}

static void kyr_mrs_create(struct kyr_xprt *r_xprt)
{
	unsigned int count;

	for (count = 0; count < KYR_MR_BATCH; count++) {
		struct kyr_mr *mr;

		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			break;
		if (kyr_frwr_mr_init(r_xprt, mr)) {
			kfree(mr);
			break;
		}

		spin_lock(&r_xprt->rx_lock);
		list_add(&mr->mr_list, &r_xprt->rx_mrs);
		list_add(&mr->mr_all, &r_xprt->rx_all_mrs);
		r_xprt->rx_mr_count++;
		spin_unlock(&r_xprt->rx_lock);
	}
}

static void kyr_mr_refresh_worker(struct work_struct *work)
{
	struct kyr_xprt *r_xprt = container_of(work, struct kyr_xprt,
					       rx_refresh_worker);

	kyr_mrs_create(r_xprt);
}

void kyr_mrs_refresh(struct kyr_xprt *r_xprt)
{
	queue_work(r_xprt->rx_wq, &r_xprt->rx_refresh_worker);
}

struct kyr_mr *kyr_mr_get(struct kyr_xprt *r_xprt)
{
	struct kyr_mr *mr = NULL;

	spin_lock(&r_xprt->rx_lock);
	if (!list_empty(&r_xprt->rx_mrs)) {
		mr = list_first_entry(&r_xprt->rx_mrs, struct kyr_mr, mr_list);
		list_del_init(&mr->mr_list);
	}
	spin_unlock(&r_xprt->rx_lock);

	/* caller backs off; more MRs arrive from the refresh worker */
	if (!mr)
		queue_work(r_xprt->rx_wq, &r_xprt->rx_refresh_worker);
	return mr;
}

void kyr_mr_put(struct kyr_mr *mr)
{
	struct kyr_xprt *r_xprt = mr->xprt;

	spin_lock(&r_xprt->rx_lock);
	list_add(&mr->mr_list, &r_xprt->rx_mrs);
	spin_unlock(&r_xprt->rx_lock);
}

static void kyr_mrs_destroy(struct kyr_xprt *r_xprt)
{
	struct kyr_mr *mr, *tmp;

	cancel_work_sync(&r_xprt->rx_refresh_worker);
	list_for_each_entry_safe(mr, tmp, &r_xprt->rx_all_mrs, mr_all) {
		list_del(&mr->mr_all);
		kyr_frwr_mr_release(mr);
		r_xprt->rx_mr_count--;
	}
}

void kyr_ep_destroy(struct kyr_xprt *r_xprt)
{
	struct kyr_ep *ep = r_xprt->rx_ep;

	if (ep->id->qp) {
		ib_drain_qp(ep->id->qp);
		rdma_destroy_qp(ep->id);
	}
	kyr_mrs_destroy(r_xprt);
	ib_free_cq(ep->recv_cq);
	ib_free_cq(ep->send_cq);
	ib_dealloc_pd(ep->pd);
	kfree(ep);
	r_xprt->rx_ep = NULL;
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kyr RPC-over-RDMA client transport");
