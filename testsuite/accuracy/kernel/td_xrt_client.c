// SPDX-License-Identifier: GPL-2.0
/*
 * td_xrt_client.c - RPC-over-RDMA client transport, xprtrdma style.
 *
 * A call is one SEND.  Chunks too large to inline are exposed with FRWR:
 * the call's data chunk (read by the server for arguments, written by it for
 * results) and, when the reply may exceed the inline threshold, a reply
 * chunk the server writes.  The REG_MRs of a call are chained in front of
 * its SEND; when the reply arrives the client chains a LOCAL_INV for each
 * registered MR, signals the last one and waits for it.  Call SENDs are
 * signaled by a countdown reloaded from send_batch; backchannel replies
 * share the QP and keep their own countdown.
 *
 * Problems: max_send_wr reserves one MR per call (REG_MR, SEND, LOCAL_INV)
 * although a call may register both a data and a reply chunk; reply chunks
 * grant remote write without local write; data-chunk rights depend on an
 * inline transport test; the backchannel countdown is never counted down.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define XRT_BC_WRS		8
#define XRT_WRS_PER_CALL	3	/* REG_MR, SEND, LOCAL_INV */
#define XRT_MAX_SEND_SGES	6
#define XRT_MAX_CHUNK_PAGES	64
#define XRT_PAGE_SIZE		4096

struct xrt_ep;

struct xrt_mr {
	struct ib_mr		*mr;
	struct scatterlist	sg[XRT_MAX_CHUNK_PAGES];
	int			nents;
	enum dma_data_direction	dir;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		cqe;
	struct list_head	list;
	u32			handle;
	u32			length;
	u64			offset;
};

struct xrt_req {
	struct xrt_ep		*ep;
	struct list_head	registered;
	struct xrt_mr		*data_mr;
	struct xrt_mr		*reply_mr;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge[XRT_MAX_SEND_SGES];
	int			num_sge;
	struct ib_cqe		send_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
};

struct xrt_bc_rqst {
	struct xrt_ep		*ep;
	struct ib_send_wr	send_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct list_head	list;
};

struct xrt_ep {
	struct rdma_cm_id	*id;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*scq;
	struct ib_cq		*rcq;
	struct ib_qp_init_attr	attr;
	unsigned int		max_requests;
	unsigned int		send_count;
	unsigned int		send_batch;
	unsigned int		bc_send_count;
	unsigned int		bc_batch;
	spinlock_t		lock;
	struct list_head	free_mrs;
	struct list_head	bc_posted;
	struct list_head	bc_free;
};

static void xrt_qp_event(struct ib_event *event, void *context)
{
}

static void xrt_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("xrt: FASTREG: %s\n", ib_wc_status_msg(wc->status));
}

static void xrt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("xrt: SEND: %s\n", ib_wc_status_msg(wc->status));
}

static void xrt_inv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrt_req *req = container_of(wc->wr_cqe, struct xrt_req, inv_cqe);

	complete(&req->inv_done);
}

/* a signaled backchannel SEND retires every reply posted before it */
static void xrt_bc_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrt_bc_rqst *rq = container_of(wc->wr_cqe, struct xrt_bc_rqst, cqe);
	struct xrt_ep *ep = rq->ep;

	spin_lock(&ep->lock);
	list_splice_init(&ep->bc_posted, &ep->bc_free);
	spin_unlock(&ep->lock);
}

int xrt_ep_create(struct xrt_ep *ep)
{
	struct ib_device *dev = ep->id->device;
	unsigned int max_qp_wr;
	int rc, i;

	if (!(dev->attrs.device_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS))
		return -EOPNOTSUPP;
	if (dev->attrs.max_send_sge < XRT_MAX_SEND_SGES) {
		pr_warn("xrt: %s has %d send SGEs, %d needed\n", dev->name,
			dev->attrs.max_send_sge, XRT_MAX_SEND_SGES);
		return -ENOMEM;
	}
	max_qp_wr = dev->attrs.max_qp_wr - XRT_BC_WRS - 1;
	if (ep->max_requests > max_qp_wr / XRT_WRS_PER_CALL)
		ep->max_requests = max_qp_wr / XRT_WRS_PER_CALL;

	ep->attr.event_handler = xrt_qp_event;
	ep->attr.qp_context = ep;
	ep->attr.cap.max_send_wr = ep->max_requests * XRT_WRS_PER_CALL + XRT_BC_WRS + 1; // BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- hand-made factor of 3, but a call with data and reply chunks posts 2 REG_MR + SEND + 2 LOCAL_INV
	ep->attr.cap.max_recv_wr = ep->max_requests + XRT_BC_WRS + 1;
	ep->attr.cap.max_send_sge = XRT_MAX_SEND_SGES; // OK: rdma-queue-cap-unchecked -- compared with attrs.max_send_sge above
	ep->attr.cap.max_recv_sge = 1;
	ep->attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->attr.qp_type = IB_QPT_RC;

	ep->send_batch = ep->max_requests / 8 ? ep->max_requests / 8 : 1;
	ep->send_count = ep->send_batch;
	ep->bc_batch = XRT_BC_WRS / 2;
	ep->bc_send_count = ep->bc_batch;

	ep->scq = ib_alloc_cq(dev, ep, ep->attr.cap.max_send_wr, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->scq))
		return PTR_ERR(ep->scq);
	ep->rcq = ib_alloc_cq(dev, ep, ep->attr.cap.max_recv_wr, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(ep->rcq)) {
		rc = PTR_ERR(ep->rcq);
		goto out_free_scq;
	}
	ep->attr.send_cq = ep->scq;
	ep->attr.recv_cq = ep->rcq;
	rc = rdma_create_qp(ep->id, ep->pd, &ep->attr);
	if (rc)
		goto out_free_rcq;
	ep->qp = ep->id->qp;

	spin_lock_init(&ep->lock);
	INIT_LIST_HEAD(&ep->free_mrs);
	INIT_LIST_HEAD(&ep->bc_posted);
	INIT_LIST_HEAD(&ep->bc_free);
	for (i = 0; i < 2 * ep->max_requests; i++) {
		struct xrt_mr *mr = kzalloc(sizeof(*mr), GFP_KERNEL);

		if (!mr)
			break;
		mr->mr = ib_alloc_mr(ep->pd, IB_MR_TYPE_MEM_REG, XRT_MAX_CHUNK_PAGES);
		if (IS_ERR(mr->mr)) {
			kfree(mr);
			break;
		}
		list_add_tail(&mr->list, &ep->free_mrs);
	}
	return 0;

out_free_rcq:
	ib_free_cq(ep->rcq);
out_free_scq:
	ib_free_cq(ep->scq);
	return rc;
}

static int xrt_frwr_prepare(struct xrt_ep *ep, struct xrt_mr *mr)
{
	struct ib_device *dev = ep->id->device;
	int n;

	n = ib_dma_map_sg(dev, mr->sg, mr->nents, mr->dir);
	if (!n)
		return -EIO;
	if (ib_map_mr_sg(mr->mr, mr->sg, n, NULL, XRT_PAGE_SIZE) != n) {
		ib_dma_unmap_sg(dev, mr->sg, mr->nents, mr->dir);
		return -EIO;
	}
	ib_update_fast_reg_key(mr->mr, ib_inc_rkey(mr->mr->rkey));
	memset(&mr->reg_wr, 0, sizeof(mr->reg_wr));
	mr->reg_wr.mr = mr->mr;
	mr->reg_wr.key = mr->mr->rkey;
	mr->handle = mr->mr->rkey;
	mr->length = (u32)mr->mr->length;
	mr->offset = mr->mr->iova;
	return 0;
}

int xrt_map_data_chunk(struct xrt_ep *ep, struct xrt_req *req, struct xrt_mr *mr, bool writing)
{
	int access, rc;

	mr->dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	rc = xrt_frwr_prepare(ep, mr);
	if (rc)
		return rc;
	access = writing ? IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE : IB_ACCESS_REMOTE_READ;
	/* the server pulls argument chunks with RDMA READ, and iWARP READs
	 * need remote write */
	if (!writing && rdma_protocol_iwarp(ep->id->device, ep->id->port_num)) // BUG: rdma-access-flags-transport -- REG_MR rights chosen by an inline transport test
		access |= IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	mr->reg_wr.access = access; // OK: rdma-access-flags-invalid -- every path that adds remote write also has LOCAL_WRITE
	req->data_mr = mr;
	list_add_tail(&mr->list, &req->registered);
	return 0;
}

int xrt_map_reply_chunk(struct xrt_ep *ep, struct xrt_req *req, struct xrt_mr *mr)
{
	int rc;

	mr->dir = DMA_FROM_DEVICE;
	rc = xrt_frwr_prepare(ep, mr);
	if (rc)
		return rc;
	/* the server RDMA WRITEs the reply here, nothing else */
	mr->reg_wr.access = IB_ACCESS_REMOTE_WRITE; // BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, the REG_MR completes in error
	req->reply_mr = mr;
	list_add_tail(&mr->list, &req->registered);
	return 0;
}

static void xrt_set_signal(struct xrt_ep *ep, struct ib_send_wr *wr, bool has_chunks)
{
	/* OK: rdma-unsignaled-send-starvation -- send_count is decremented on each unsignaled SEND and reloaded when it reaches zero */
	if (!ep->send_count || has_chunks) {
		wr->send_flags |= IB_SEND_SIGNALED;
		ep->send_count = ep->send_batch;
	} else {
		wr->send_flags &= ~IB_SEND_SIGNALED;
		--ep->send_count;
	}
}

int xrt_send_call(struct xrt_ep *ep, struct xrt_req *req)
{
	struct ib_send_wr *post_wr = &req->send_wr;
	struct xrt_mr *mr;

	req->send_cqe.done = xrt_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = req->send_sge;
	req->send_wr.num_sge = req->num_sge;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = 0;
	xrt_set_signal(ep, &req->send_wr, !list_empty(&req->registered));

	list_for_each_entry(mr, &req->registered, list) {
		mr->cqe.done = xrt_reg_done;
		mr->reg_wr.wr.next = post_wr;
		mr->reg_wr.wr.wr_cqe = &mr->cqe;
		mr->reg_wr.wr.num_sge = 0;
		mr->reg_wr.wr.opcode = IB_WR_REG_MR;
		mr->reg_wr.wr.send_flags = 0;
		post_wr = &mr->reg_wr.wr;
	}
	return ib_post_send(ep->qp, post_wr, NULL);
}

/* reply received: fence the chunks off before the pages go back */
void xrt_unmap_sync(struct xrt_ep *ep, struct xrt_req *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct xrt_mr *mr, *tmp;

	list_for_each_entry(mr, &req->registered, list) {
		mr->cqe.done = xrt_reg_done;
		memset(&mr->inv_wr, 0, sizeof(mr->inv_wr));
		mr->inv_wr.wr_cqe = &mr->cqe;
		mr->inv_wr.opcode = IB_WR_LOCAL_INV;
		mr->inv_wr.ex.invalidate_rkey = mr->handle;
		*prev = &mr->inv_wr;
		prev = &mr->inv_wr.next;
		last = &mr->inv_wr;
	}
	if (!last)
		return;

	last->send_flags = IB_SEND_SIGNALED;
	req->inv_cqe.done = xrt_inv_wake;
	last->wr_cqe = &req->inv_cqe;
	reinit_completion(&req->inv_done);
	if (ib_post_send(ep->qp, first, NULL)) {
		pr_err("xrt: LOCAL_INV post failed, disconnecting\n");
		rdma_disconnect(ep->id);
		return;
	}
	wait_for_completion(&req->inv_done);

	spin_lock(&ep->lock);
	list_for_each_entry_safe(mr, tmp, &req->registered, list) {
		list_del(&mr->list);
		ib_dma_unmap_sg(ep->id->device, mr->sg, mr->nents, mr->dir);
		list_add_tail(&mr->list, &ep->free_mrs);
	}
	spin_unlock(&ep->lock);
	req->data_mr = NULL;
	req->reply_mr = NULL;
}

int xrt_bc_send_reply(struct xrt_ep *ep, struct xrt_bc_rqst *rq)
{
	rq->cqe.done = xrt_bc_send_done;
	rq->send_wr.next = NULL;
	rq->send_wr.wr_cqe = &rq->cqe;
	rq->send_wr.sg_list = &rq->sge;
	rq->send_wr.num_sge = 1;
	rq->send_wr.opcode = IB_WR_SEND;
	rq->send_wr.send_flags = 0;
	if (!ep->bc_send_count) { // BUG: rdma-unsignaled-send-starvation -- bc_send_count is loaded with bc_batch and never counted down, so no backchannel reply is signaled and bc_posted is never recycled
		rq->send_wr.send_flags = IB_SEND_SIGNALED;
		ep->bc_send_count = ep->bc_batch;
	}
	spin_lock(&ep->lock);
	list_add_tail(&rq->list, &ep->bc_posted);
	spin_unlock(&ep->lock);
	return ib_post_send(ep->qp, &rq->send_wr, NULL);
}

void xrt_ep_destroy(struct xrt_ep *ep)
{
	struct xrt_mr *mr, *tmp;

	rdma_disconnect(ep->id);
	ib_drain_qp(ep->qp);
	list_for_each_entry_safe(mr, tmp, &ep->free_mrs, list) {
		list_del(&mr->list);
		ib_dereg_mr(mr->mr);
		kfree(mr);
	}
	rdma_destroy_qp(ep->id);
	ib_free_cq(ep->rcq);
	ib_free_cq(ep->scq);
}

MODULE_DESCRIPTION("td xrt RPC-over-RDMA client transport");
MODULE_LICENSE("GPL");
