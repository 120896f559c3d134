// SPDX-License-Identifier: GPL-2.0
/*
 * td_nvr_host.c - block-storage initiator over RDMA, nvme-rdma style.
 *
 * Each I/O queue is an RC QP created through the RDMA CM.  A command with
 * data registers its scatterlist with a fast-registration MR from the QP's
 * pool (REG_MR chained in front of the command SEND); the target invalidates
 * the key with SEND_WITH_INV or the host posts a LOCAL_INV when the response
 * arrives.  Every SEND and LOCAL_INV is signaled.  A per-controller
 * heartbeat QP carries one-way keepalives.
 *
 * Problems: the I/O queue reserves exactly "MR, SEND, INV" per command and
 * nothing for ib_drain_qp(); READ commands expose their buffer for remote
 * write without local write; heartbeats are never signaled.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/blk-mq.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define NVR_MAX_INLINE_SEGMENTS	4
#define NVR_MAX_SEGMENTS	256
#define NVR_HB_DEPTH		16
#define NVR_HB_INTERVAL_MS	5000

struct nvr_cmd {
	u8	opcode;
	u8	flags;
	u16	command_id;
	u32	nsid;
	u64	addr;
	u32	length;
	u32	key;
	u64	slba;
};

struct nvr_rsp {
	u16	command_id;
	u16	status;
	u32	rsvd;
};

struct nvr_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			num_inline_segments;
};

struct nvr_queue;

struct nvr_qe {
	struct ib_cqe	cqe;
	struct nvr_queue *queue;
	void		*data;
	u64		dma;
};

struct nvr_request {
	struct nvr_queue	*queue;
	struct request		*rq;
	struct nvr_qe		sqe;
	struct ib_sge		sge[1 + NVR_MAX_INLINE_SEGMENTS];
	u32			num_sge;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct sg_table		sgt;
	enum dma_data_direction	dir;
};

struct nvr_queue {
	struct nvr_device	*device;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			queue_size;
	int			cq_size;
	struct nvr_request	*reqs;
};

struct nvr_ctrl {
	struct nvr_device	*device;
	struct ib_qp		*hb_qp;
	struct ib_cq		*hb_cq;
	struct nvr_qe		hb_qe;
	u32			hb_seq;
	struct delayed_work	hb_work;
};

static void nvr_qp_event(struct ib_event *event, void *context)
{
}

static int nvr_create_qp(struct nvr_queue *queue, const int factor)
{
	struct nvr_device *dev = queue->device;
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.event_handler = nvr_qp_event;
	init_attr.cap.max_send_wr = factor * queue->queue_size; // BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- hand-made factor of 3 WRs per command and no slot left for ib_drain_qp()
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + dev->num_inline_segments; // OK: rdma-queue-cap-unchecked -- derived from attrs.max_send_sge in nvr_find_device()
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;

	ret = rdma_create_qp(queue->cm_id, dev->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

static int nvr_create_queue_ib(struct nvr_queue *queue)
{
	struct ib_device *ibdev = queue->device->dev;
	const int send_wr_factor = 3;		/* MR, SEND, INV */
	const int cq_factor = send_wr_factor + 1;	/* + RECV */
	int ret;

	queue->cq_size = cq_factor * queue->queue_size + 1;
	queue->ib_cq = ib_alloc_cq(ibdev, queue, queue->cq_size, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	ret = nvr_create_qp(queue, send_wr_factor);
	if (ret)
		goto out_destroy_cq;

	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
			      IB_MR_TYPE_MEM_REG, NVR_MAX_SEGMENTS, 0);
	if (ret)
		goto out_destroy_qp;
	return 0;

out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_destroy_cq:
	ib_free_cq(queue->ib_cq);
	return ret;
}

static void nvr_destroy_queue_ib(struct nvr_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->ib_cq);
}

static void nvr_find_device(struct nvr_device *ndev)
{
	ndev->num_inline_segments = min(NVR_MAX_INLINE_SEGMENTS,
					ndev->dev->attrs.max_send_sge - 1);
}

static void nvr_wr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("nvr: WR failed: %s\n", ib_wc_status_msg(wc->status));
}

static void nvr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req = container_of(wc->wr_cqe, struct nvr_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("nvr: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	ib_mr_pool_put(req->queue->qp, &req->queue->qp->rdma_mrs, req->mr);
	req->mr = NULL;
	ib_dma_unmap_sg(req->queue->device->dev, req->sgt.sgl, req->sgt.nents, req->dir);
	blk_mq_complete_request(req->rq);
}

static int nvr_map_sg_fr(struct nvr_queue *queue, struct nvr_request *req,
			 struct nvr_cmd *c, int count)
{
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return nr < 0 ? nr : -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = nvr_wr_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	/* least privilege: the target only reads WRITE data, only writes READ data */
	req->reg_wr.access = req->dir == DMA_TO_DEVICE ?
			IB_ACCESS_REMOTE_READ : IB_ACCESS_REMOTE_WRITE; // BUG: rdma-access-flags-invalid -- the READ-command path grants REMOTE_WRITE without LOCAL_WRITE

	c->addr = req->mr->iova;
	c->length = (u32)req->mr->length;
	c->key = req->mr->rkey;
	return 0;
}

/* driver-owned buffers (identify, log pages): always filled by the target */
static int nvr_map_kbuf(struct nvr_queue *queue, struct nvr_request *req,
			struct nvr_cmd *c)
{
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	if (ib_map_mr_sg(req->mr, req->sgt.sgl, 1, NULL, SZ_4K) != 1) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = nvr_wr_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; // OK: rdma-access-flags-invalid -- remote write comes with local write

	c->addr = req->mr->iova;
	c->length = (u32)req->mr->length;
	c->key = req->mr->rkey;
	return 0;
}

static int nvr_post_send(struct nvr_queue *queue, struct nvr_qe *qe,
			 struct ib_sge *sge, u32 num_sge, struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr = qe->dma;
	sge->length = sizeof(struct nvr_cmd);
	sge->lkey = queue->device->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = sge;
	wr.num_sge = num_sge;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED; // OK: rdma-unsignaled-send-starvation -- every command SEND asks for a completion

	if (first)
		first->next = &wr;
	else
		first = &wr;

	ret = ib_post_send(queue->qp, first, NULL);
	if (unlikely(ret))
		pr_err("nvr: ib_post_send failed: %d\n", ret);
	return ret;
}

int nvr_queue_rq(struct nvr_queue *queue, struct nvr_request *req, bool kbuf)
{
	struct nvr_cmd *c = req->sqe.data;
	int count, ret;

	req->queue = queue;
	req->sqe.cqe.done = nvr_wr_done;
	req->num_sge = 1;
	req->mr = NULL;
	if (req->sgt.nents) {
		count = ib_dma_map_sg(queue->device->dev, req->sgt.sgl, req->sgt.nents, req->dir);
		if (unlikely(count <= 0))
			return -EIO;
		ret = kbuf ? nvr_map_kbuf(queue, req, c) : nvr_map_sg_fr(queue, req, c, count);
		if (ret) {
			ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->sgt.nents, req->dir);
			return ret;
		}
	}
	return nvr_post_send(queue, &req->sqe, req->sge, req->num_sge,
			     req->mr ? &req->reg_wr.wr : NULL);
}

static int nvr_inv_rkey(struct nvr_queue *queue, struct nvr_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED, /* OK: rdma-unsignaled-send-starvation -- the request completes from this LOCAL_INV's completion */
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->reg_cqe.done = nvr_inv_rkey_done;
	wr.wr_cqe = &req->reg_cqe;
	return ib_post_send(queue->qp, &wr, NULL);
}

static void nvr_process_rsp(struct nvr_queue *queue, struct nvr_request *req, struct ib_wc *wc)
{
	/* target status was copied into the request by nvr_recv_done() */
	if (!req->mr) {
		blk_mq_complete_request(req->rq);
		return;
	}
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("nvr: bogus remote invalidation for rkey %#x\n", req->mr->rkey);
			nvr_inv_rkey(queue, req);
			return;
		}
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->sgt.nents, req->dir);
		blk_mq_complete_request(req->rq);
		return;
	}
	if (nvr_inv_rkey(queue, req))
		pr_err("nvr: queue %p failed to post LOCAL_INV\n", queue);
}

static int nvr_create_hb_qp(struct nvr_ctrl *ctrl)
{
	struct ib_qp_init_attr init_attr;

	ctrl->hb_cq = ib_alloc_cq(ctrl->device->dev, ctrl, NVR_HB_DEPTH, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(ctrl->hb_cq))
		return PTR_ERR(ctrl->hb_cq);

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.cap.max_send_wr = NVR_HB_DEPTH;
	init_attr.cap.max_recv_wr = 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = ctrl->hb_cq;
	init_attr.recv_cq = ctrl->hb_cq;
	ctrl->hb_qp = ib_create_qp(ctrl->device->pd, &init_attr);
	if (IS_ERR(ctrl->hb_qp)) {
		ib_free_cq(ctrl->hb_cq);
		return PTR_ERR(ctrl->hb_qp);
	}
	return 0;
}

static void nvr_hb_work(struct work_struct *work)
{
	struct nvr_ctrl *ctrl = container_of(to_delayed_work(work), struct nvr_ctrl, hb_work);
	u32 *seq = ctrl->hb_qe.data;
	struct ib_sge sge = { ctrl->hb_qe.dma, sizeof(*seq), ctrl->device->pd->local_dma_lkey };
	struct ib_send_wr wr = {
		.wr_cqe = &ctrl->hb_qe.cqe, .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_SEND,
	};

	*seq = ++ctrl->hb_seq;
	ib_dma_sync_single_for_device(ctrl->device->dev, ctrl->hb_qe.dma, sizeof(*seq), DMA_TO_DEVICE);
	/* one-way keepalive, the peer only counts them */
	if (ib_post_send(ctrl->hb_qp, &wr, NULL)) // BUG(file): rdma-unsignaled-send-starvation -- hb_qp is IB_SIGNAL_REQ_WR and no heartbeat is signaled; posts fail after 16 beats
		pr_warn("nvr: heartbeat post failed\n");
	queue_delayed_work(system_wq, &ctrl->hb_work, msecs_to_jiffies(NVR_HB_INTERVAL_MS));
}

void nvr_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_qe *qe = container_of(wc->wr_cqe, struct nvr_qe, cqe);
	struct nvr_queue *queue = qe->queue;
	struct nvr_rsp *rsp = qe->data;

	if (unlikely(wc->status != IB_WC_SUCCESS) || rsp->command_id >= queue->queue_size)
		return;
	nvr_process_rsp(queue, &queue->reqs[rsp->command_id], wc);
}

int nvr_ctrl_setup(struct nvr_ctrl *ctrl, struct nvr_queue *queues, int nr)
{
	int i, ret;

	nvr_find_device(ctrl->device);
	for (i = 0; i < nr; i++) {
		queues[i].device = ctrl->device;
		ret = nvr_create_queue_ib(&queues[i]);
		if (ret)
			goto out_destroy;
	}
	ret = nvr_create_hb_qp(ctrl);
	if (ret)
		goto out_destroy;
	ctrl->hb_qe.cqe.done = nvr_wr_done;
	ctrl->hb_qe.dma = ib_dma_map_single(ctrl->device->dev, ctrl->hb_qe.data,
					    sizeof(u32), DMA_TO_DEVICE);
	INIT_DELAYED_WORK(&ctrl->hb_work, nvr_hb_work);
	queue_delayed_work(system_wq, &ctrl->hb_work, msecs_to_jiffies(NVR_HB_INTERVAL_MS));
	return 0;

out_destroy:
	while (--i >= 0)
		nvr_destroy_queue_ib(&queues[i]);
	return ret;
}

MODULE_DESCRIPTION("td nvr RDMA block initiator");
MODULE_LICENSE("GPL");
