// SPDX-License-Identifier: GPL-2.0
/*
 * rsw: the RDMA transport of a remote-memory swap client (the shape of the
 * out-of-tree far-memory swap modules that ride on frontswap/zswap), which
 * ported xprtrdma's FRWR scheme: a per-queue free list of MRs allocated at
 * setup, one fast registration per page-in or page-out, the key sent to the
 * memory server in the request, the server doing the RDMA. Written fresh
 * for the held-out batch.
 *
 * Page-in: the server RDMA WRITEs into the client's pages (REMOTE_WRITE);
 * page-out: the server RDMA READs them (REMOTE_READ). On the reply, page-in
 * requests get a signaled LOCAL_INV and the MR goes back to the free list
 * from its completion.
 *
 * Defects:
 *  - page-out replies skip the LOCAL_INV "because the server only read the
 *    pages" and recycle the MR: its REMOTE_READ key stays valid while the
 *    swap slot's pages go back to the page allocator, so the server can
 *    read whatever lands there next;
 *  - the port dropped frwr_map's key bump: an MR from the free list is
 *    registered again with the rkey of its previous I/O;
 *  - the send queue is sized with the ULP's own "REG, SEND, INV" factor
 *    (right in value, the arithmetic cap.max_rdma_ctxs replaces).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RSW_MAX_PAGES	32

struct rsw_frmr {
	struct list_head	list;
	struct ib_mr		*data_mr;
};

struct rsw_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	int			depth;
	spinlock_t		lock;
	struct list_head	free_frmrs;
	struct rsw_frmr		*frmrs;
};

struct rsw_wire_req {
	__be64	addr;
	__be32	rkey;
	__be32	len;
	__be64	swap_offset;
	u8	opcode;
};

struct rsw_request {
	struct rsw_queue	*queue;
	struct rsw_frmr		*frmr;
	struct scatterlist	sgl[RSW_MAX_PAGES];
	int			nents;
	bool			page_out;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct ib_cqe		inv_cqe;
	struct rsw_wire_req	*msg;
	u64			msg_dma;
};

void rsw_end_request(struct rsw_request *req, int error);

static struct rsw_frmr *rsw_get_frmr(struct rsw_queue *queue)
{
	struct rsw_frmr *frmr;

	spin_lock(&queue->lock);
	frmr = list_first_entry_or_null(&queue->free_frmrs, struct rsw_frmr,
					list);
	if (frmr)
		list_del(&frmr->list);
	spin_unlock(&queue->lock);
	return frmr;
}

static void rsw_put_frmr(struct rsw_queue *queue, struct rsw_frmr *frmr)
{
	spin_lock(&queue->lock);
	list_add(&frmr->list, &queue->free_frmrs);
	spin_unlock(&queue->lock);
}

/**
 * rsw_create_queue_ib - create the QP and the MR free list of a queue
 * @queue: the swap queue
 */
int rsw_create_queue_ib(struct rsw_queue *queue)
{
	const int factor = 3;	/* REG_MR, SEND, LOCAL_INV */
	struct ib_qp_init_attr init_attr;
	int i, ret;

	memset(&init_attr, 0, sizeof(init_attr));
	/* BUG: rdma-send-queue-manual-factor -- the depth is multiplied by the ULP's own REG/SEND/INV factor; cap.max_rdma_ctxs sizes this in the core */
	init_attr.cap.max_send_wr = factor * queue->depth + 1; /* OK: rdma-send-queue-undersized -- a request posts at most REG_MR, SEND and LOCAL_INV, plus one entry for the drain */
	init_attr.cap.max_recv_wr = queue->depth + 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->cq;
	init_attr.recv_cq = queue->cq;
	init_attr.qp_context = queue;

	ret = rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
	if (ret)
		return ret;
	queue->qp = queue->cm_id->qp;

	queue->frmrs = kcalloc(queue->depth, sizeof(*queue->frmrs),
			       GFP_KERNEL);
	if (!queue->frmrs) {
		ret = -ENOMEM;
		goto out_destroy_qp;
	}
	INIT_LIST_HEAD(&queue->free_frmrs);
	for (i = 0; i < queue->depth; i++) {
		struct rsw_frmr *frmr = &queue->frmrs[i];

		/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
		frmr->data_mr = ib_alloc_mr(queue->pd, IB_MR_TYPE_MEM_REG,
					    RSW_MAX_PAGES);
		if (IS_ERR(frmr->data_mr)) {
			ret = PTR_ERR(frmr->data_mr);
			goto out_free_mrs;
		}
		list_add_tail(&frmr->list, &queue->free_frmrs);
	}
	return 0;

out_free_mrs:
	while (--i >= 0)
		ib_dereg_mr(queue->frmrs[i].data_mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
	kfree(queue->frmrs);
out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
	return ret;
}

void rsw_destroy_queue_ib(struct rsw_queue *queue)
{
	int i;

	ib_drain_qp(queue->qp);
	for (i = 0; i < queue->depth; i++)
		ib_dereg_mr(queue->frmrs[i].data_mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
	kfree(queue->frmrs);
	rdma_destroy_qp(queue->cm_id);
}

static void rsw_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rsw_request *req =
		container_of(wc->wr_cqe, struct rsw_request, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		rsw_end_request(req, -EIO);
}

static int rsw_map_frmr(struct rsw_queue *queue, struct rsw_request *req)
{
	struct rsw_frmr *frmr;
	int n;

	frmr = rsw_get_frmr(queue);
	if (!frmr)
		return -EAGAIN;

	if (!ib_dma_map_sg(queue->dev, req->sgl, req->nents,
			   req->page_out ? DMA_TO_DEVICE : DMA_FROM_DEVICE)) {
		rsw_put_frmr(queue, frmr);
		return -EIO;
	}

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its MR itself */
	n = ib_map_mr_sg(frmr->data_mr, req->sgl, req->nents, NULL, PAGE_SIZE);
	if (n < req->nents) {
		ib_dma_unmap_sg(queue->dev, req->sgl, req->nents,
				req->page_out ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
		rsw_put_frmr(queue, frmr);
		return n < 0 ? n : -EINVAL;
	}

	req->frmr = frmr;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	req->reg_wr.wr.num_sge = 0;
	/* BUG: rdma-rkey-reuse -- an MR from the free list is registered again with the key of its previous I/O; nothing calls ib_update_fast_reg_key() */
	req->reg_wr.mr = frmr->data_mr;
	req->reg_wr.key = frmr->data_mr->rkey;
	req->reg_wr.access = req->page_out ?
		IB_ACCESS_REMOTE_READ :
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	req->msg->addr = cpu_to_be64(frmr->data_mr->iova);
	req->msg->rkey = cpu_to_be32(frmr->data_mr->rkey);
	req->msg->len = cpu_to_be32(frmr->data_mr->length);
	return 0;
}

/**
 * rsw_submit - send a page-in or page-out request to the memory server
 * @queue: the queue
 * @req: the request, pages in req->sgl
 */
int rsw_submit(struct rsw_queue *queue, struct rsw_request *req)
{
	int ret;

	req->queue = queue;
	ret = rsw_map_frmr(queue, req);
	if (ret)
		return ret;

	req->send_sge.addr = req->msg_dma;
	req->send_sge.length = sizeof(*req->msg);
	req->send_sge.lkey = queue->pd->local_dma_lkey;

	req->send_cqe.done = rsw_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	req->reg_wr.wr.next = &req->send_wr;
	ret = ib_post_send(queue->qp, &req->reg_wr.wr, NULL);
	if (ret) {
		/* nothing was posted: the key never reached the server */
		ib_dma_unmap_sg(queue->dev, req->sgl, req->nents,
				req->page_out ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
		rsw_put_frmr(queue, req->frmr);
		req->frmr = NULL;
	}
	return ret;
}

static void rsw_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rsw_request *req =
		container_of(wc->wr_cqe, struct rsw_request, inv_cqe);
	struct rsw_queue *queue = req->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		rsw_end_request(req, -EIO);
		return;
	}
	ib_dma_unmap_sg(queue->dev, req->sgl, req->nents, DMA_FROM_DEVICE);
	rsw_put_frmr(queue, req->frmr);
	req->frmr = NULL;
	rsw_end_request(req, 0);
}

/**
 * rsw_process_reply - the memory server finished a request
 * @queue: the queue
 * @req: the request the reply names
 * @status: the server's status
 */
void rsw_process_reply(struct rsw_queue *queue, struct rsw_request *req,
		       int status)
{
	int ret;

	if (req->page_out) {
		/* the server only read the pages: no invalidation needed */
		/* BUG: rdma-invalidation-leak -- the REMOTE_READ key of the page-out registration is still valid; page-in replies post a LOCAL_INV first */
		rsw_put_frmr(queue, req->frmr);
		req->frmr = NULL;
		ib_dma_unmap_sg(queue->dev, req->sgl, req->nents,
				DMA_TO_DEVICE);
		rsw_end_request(req, status);
		return;
	}

	req->inv_cqe.done = rsw_inv_done;
	req->inv_wr.next = NULL;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.num_sge = 0;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->frmr->data_mr->rkey;

	ret = ib_post_send(queue->qp, &req->inv_wr, NULL);
	if (ret) {
		pr_err("rsw: LOCAL_INV post failed (%d)\n", ret);
		rdma_disconnect(queue->cm_id);
	}
}
