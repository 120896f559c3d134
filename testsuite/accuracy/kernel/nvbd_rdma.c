// SPDX-License-Identifier: GPL-2.0
/*
 * nvbd_rdma.c - RDMA transport of the NVBD block initiator.
 *
 * Each blk-mq request owns one command capsule and, for data that does not
 * fit in the capsule, one fast-registration MR taken from the QP's MR pool.
 * The REG_MR work request is chained in front of the command SEND; the
 * target answers with SEND_WITH_INVALIDATE when it can, otherwise the host
 * posts a LOCAL_INV from the response path and completes the request from
 * that work request's completion.  A request is finished when both its
 * SEND completion and its response (or invalidation) have been seen.
 *
 * register_always=0 gives the PD a global rkey for targets without keyed SGLs.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/blk-mq.h>
#include <linux/unaligned.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define NVBD_MAX_SEGMENTS		256
#define NVBD_MAX_INLINE_SEGMENTS	4
#define NVBD_KEYED_SGL			0x40

static bool register_always = true;
module_param(register_always, bool, 0444);
MODULE_PARM_DESC(register_always, "Always use memory registration");

struct nvbd_keyed_sgl {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct nvbd_cmd {
	u8			opcode;
	u16			command_id;
	struct nvbd_keyed_sgl	dptr;
};

struct nvbd_rsp {
	u16	command_id;
	u16	status;
};

struct nvbd_ctrl;

struct nvbd_queue {
	struct nvbd_ctrl	*ctrl;
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			queue_size;
	u32			max_fr_pages;
};

struct nvbd_ctrl {
	struct ib_pd		*pd;
	struct ib_device	*ibdev;
	void			(*error_recovery)(struct nvbd_ctrl *ctrl);
};

struct nvbd_request {
	struct request		*rq;
	struct nvbd_queue	*queue;
	struct ib_cqe		send_cqe;
	struct ib_cqe		reg_cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_sge		sge[1 + NVBD_MAX_INLINE_SEGMENTS];
	struct ib_mr		*mr;
	struct sg_table		sgt;
	int			nents;
	struct nvbd_cmd		*cmd;
	u64			cmd_dma;
	atomic_t		ref;
	u16			status;
};

#define nvbd_dma_dir(rq) (rq_data_dir(rq) ? DMA_TO_DEVICE : DMA_FROM_DEVICE)

int nvbd_alloc_pd(struct nvbd_ctrl *ctrl)
{
	unsigned int flags = 0;

	if (!register_always)
		flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	/* BUG: rdma-remote-access-overbroad -- a module parameter turns on the PD-wide rkey for all of kernel memory */
	ctrl->pd = ib_alloc_pd(ctrl->ibdev, flags);
	if (IS_ERR(ctrl->pd))
		return PTR_ERR(ctrl->pd);
	return 0;
}

int nvbd_create_qp(struct nvbd_queue *queue)
{
	struct ib_qp_init_attr init_attr;
	const int factor = 3;	/* MR, SEND, INV */
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	/* BUG: rdma-send-queue-manual-factor -- the depth is multiplied by a hand-kept count of REG_MR/SEND/LOCAL_INV */
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1; /* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV per request plus one entry for the drain */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	/* BUG(file): rdma-queue-cap-unchecked -- five send SGEs requested without looking at attrs.max_send_sge */
	init_attr.cap.max_send_sge = 1 + NVBD_MAX_INLINE_SEGMENTS;
	/* OK: rdma-unsignaled-send-starvation -- every command SEND is posted signaled */
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;

	ret = rdma_create_qp(queue->cm_id, queue->ctrl->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

int nvbd_init_mrs(struct nvbd_queue *queue)
{
	queue->max_fr_pages = min_t(u32, NVBD_MAX_SEGMENTS,
				    queue->ibdev->attrs.max_fast_reg_page_list_len);
	/* BUG: rdma-local-mr-management -- the ULP keeps its own fast-registration pool */
	return ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
			       IB_MR_TYPE_MEM_REG, queue->max_fr_pages, 0);
}

void nvbd_destroy_queue_ib(struct nvbd_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->ib_cq);
}

static int nvbd_map_sg_fr(struct nvbd_queue *queue, struct nvbd_request *req,
			  struct nvbd_cmd *c, int count)
{
	struct nvbd_keyed_sgl *sg = &c->dptr;
	int nr;

	/* BUG: rdma-local-mr-management -- per-I/O MR from the ULP's own pool */
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	if (unlikely(count > queue->max_fr_pages))
		return -EINVAL; // BUG: rdma-mr-leak -- the pool MR stays in req->mr and is never put back

	/* BUG: rdma-local-mr-management -- hand-made page list mapping */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		/* BUG: rdma-local-mr-management -- pool put by the ULP */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-mr-leak, rdma-invalidation-leak -- handed back before any REG_MR was posted */
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL;
	}

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr; // BUG: rdma-rkey-reuse -- pooled MR registered again under the rkey the previous command exposed
	req->reg_wr.key = req->mr->rkey;
	/* OK: rdma-access-flags-invalid -- remote write comes with local write */
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	sg->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, sg->length);
	put_unaligned_le32(req->mr->rkey, sg->key); /* OK: rdma-remote-access-overbroad -- the rkey goes to the target in the keyed SGL */
	sg->type = NVBD_KEYED_SGL;
	return 0;
}

static void nvbd_unmap_data(struct nvbd_queue *queue, struct nvbd_request *req)
{
	struct request *rq = req->rq;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- pool put by the ULP */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- judged at the callers: each one decides whether the key is dead */
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, nvbd_dma_dir(rq));
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
}

static void nvbd_end_request(struct nvbd_request *req)
{
	if (!atomic_dec_and_test(&req->ref))
		return;
	nvbd_unmap_data(req->queue, req);
	blk_mq_end_request(req->rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void nvbd_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvbd_request *req =
		container_of(wc->wr_cqe, struct nvbd_request, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		req->queue->ctrl->error_recovery(req->queue->ctrl);
	else
		nvbd_end_request(req);
}

static void nvbd_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvbd_request *req =
		container_of(wc->wr_cqe, struct nvbd_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		return req->queue->ctrl->error_recovery(req->queue->ctrl);
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the MR goes back and the pages are unmapped from the LOCAL_INV completion */
	nvbd_end_request(req);
}

static int nvbd_inv_rkey(struct nvbd_queue *queue, struct nvbd_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->reg_cqe.done = nvbd_inv_rkey_done;
	wr.wr_cqe = &req->reg_cqe;
	return ib_post_send(queue->qp, &wr, NULL);
}

void nvbd_process_rsp(struct nvbd_queue *queue, struct nvbd_rsp *rsp,
			     struct nvbd_request *req, struct ib_wc *wc)
{
	int ret;

	req->status = rsp->status;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey must be this request's */
		if (unlikely(!req->mr || wc->ex.invalidate_rkey != req->mr->rkey)) {
			queue->ctrl->error_recovery(queue->ctrl);
			return;
		}
	} else if (req->mr) {
		ret = nvbd_inv_rkey(queue, req);
		if (unlikely(ret < 0)) {
			req->status = 1;
			/* BUG: rdma-invalidation-leak -- the LOCAL_INV was never posted, yet the MR goes back to the pool with the target's key live */
			nvbd_end_request(req); /* OK: rdma-unmap-before-invalidate -- the failed post queued no LOCAL_INV to race with */
		}
		return;
	}
	/* OK: rdma-invalidation-leak -- only reached with no MR or after the remote invalidation matched req->mr->rkey */
	nvbd_end_request(req);
}

static int nvbd_post_send(struct nvbd_queue *queue, struct nvbd_request *req,
			  int num_sge, struct ib_send_wr *first)
{
	struct ib_send_wr wr;

	req->sge[0].addr = req->cmd_dma;
	req->sge[0].length = sizeof(struct nvbd_cmd);
	req->sge[0].lkey = queue->ctrl->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &req->send_cqe;
	wr.sg_list = req->sge;
	wr.num_sge = num_sge;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;
	return ib_post_send(queue->qp, first, NULL);
}

blk_status_t nvbd_queue_rq(struct nvbd_queue *queue, struct request *rq)
{
	struct nvbd_request *req = blk_mq_rq_to_pdu(rq);
	int count, ret;

	req->rq = rq;
	req->queue = queue;
	req->mr = NULL;
	req->send_cqe.done = nvbd_send_done;
	atomic_set(&req->ref, 2);

	req->sgt.sgl = (struct scatterlist *)(req + 1);
	ret = sg_alloc_table_chained(&req->sgt, blk_rq_nr_phys_segments(rq),
				     req->sgt.sgl, SG_CHUNK_SIZE);
	if (ret)
		return BLK_STS_RESOURCE;

	req->nents = blk_rq_map_sg(NULL, rq, req->sgt.sgl);
	count = ib_dma_map_sg(queue->ibdev, req->sgt.sgl, req->nents,
			      nvbd_dma_dir(rq));
	if (unlikely(count <= 0)) {
		sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
		return BLK_STS_RESOURCE;
	}

	ret = nvbd_map_sg_fr(queue, req, req->cmd, count);
	if (ret)
		goto err_dma_unmap;

	blk_mq_start_request(rq);
	ret = nvbd_post_send(queue, req, 1, req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(ret))
		goto err_unmap;
	return BLK_STS_OK;

err_unmap:
	/* OK: rdma-invalidation-leak, rdma-mr-leak -- the chain was not posted, so no key reached the target; the MR is put back */
	nvbd_unmap_data(queue, req);
	return ret == -ENOMEM || ret == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;

err_dma_unmap:
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, nvbd_dma_dir(rq));
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
	return ret == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;
}

enum blk_eh_timer_return nvbd_timeout(struct request *rq)
{
	struct nvbd_request *req = blk_mq_rq_to_pdu(rq);

	req->status = 1;
	/* BUG: rdma-invalidation-leak -- the command is still owned by the target; its MR returns to the pool with the exposed rkey valid */
	nvbd_unmap_data(req->queue, req);
	blk_mq_end_request(rq, BLK_STS_TIMEOUT);
	return BLK_EH_DONE;
}

MODULE_DESCRIPTION("NVBD RDMA host transport");
MODULE_LICENSE("GPL v2");
