// SPDX-License-Identifier: GPL-2.0
/*
 * kx_nvmr_host.c - NVMe-over-Fabrics RDMA host transport, I/O queue path.
 *
 * Every command with data takes a fast-registration MR from the QP's MR
 * pool, registers the mapped scatterlist with a REG_MR chained in front of
 * the command SEND and advertises the rkey in the keyed SGL descriptor.
 * The target answers either with SEND_WITH_INV of that rkey or with a plain
 * SEND, in which case the host posts a signaled LOCAL_INV and ends the
 * request from its completion.  Admin log pages are read into a buffer
 * registered with a one-shot MR.
 *
 * Correct here: the data MR mapping and key rotation, the interrupt queue
 * response handler (remote invalidation compared with the rkey), the
 * LOCAL_INV completion, the synchronous reclaim used by the abort work and
 * the log page error handling after the command was issued.
 * Wrong here: the polled queue response handler (trusts any remote
 * invalidation, fails the request when its LOCAL_INV could not be posted),
 * the timeout handler (hands the MR back while the target still holds the
 * rkey), the queue-stop cancel loop (unmaps right behind an unsignaled
 * LOCAL_INV) and the log page short-map path (leaks the MR).
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <linux/unaligned.h>
#include <linux/atomic.h>
#include <linux/blk-mq.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define NVR_INLINE_SG_CNT	2
#define NVR_MAX_SEGMENTS	256

#define NVR_KEY_SGL_DATA	0x4
#define NVR_SGL_INVALIDATE	0xf
#define NVR_ADMIN_GET_LOG_PAGE	0x02
#define NVR_SC_HOST_PATH_ERROR	0x370
#define NVR_SC_HOST_ABORTED	0x371

struct nvr_keyed_sgl {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct nvr_cmd {
	u8			opcode;
	u8			flags;
	u16			command_id;
	__le32			nsid;
	__le32			cdw10;
	struct nvr_keyed_sgl	dptr;
};

struct nvr_rsp {
	__le64	result;
	u16	sq_head;
	u16	sq_id;
	u16	command_id;
	u16	status;
};

struct nvr_queue;

struct nvr_qe {
	struct nvr_queue	*queue;
	void			*data;
	u64			dma;
	struct ib_cqe		cqe;
};

struct nvr_request {
	struct nvr_queue	*queue;
	struct request		*rq;
	struct nvr_qe		sqe;
	struct ib_sge		sge;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	int			inv_status;
	struct work_struct	abort_work;
	struct sg_table		data_sgl;
	struct scatterlist	first_sgl[NVR_INLINE_SG_CNT];
	int			nents;
	enum dma_data_direction	dir;
	bool			inflight;
	u16			status;
	atomic_t		ref;
};

struct nvr_ctrl {
	struct ib_pd		*pd;
	struct nvr_queue	*queues;
	struct work_struct	err_work;
	bool			resetting;
	struct ib_cqe		admin_reg_cqe;
};

struct nvr_queue {
	struct nvr_ctrl		*ctrl;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_device	*dev;
	struct nvr_request	*reqs;
	int			queue_size;
	bool			live;
	bool			polled;
};

static struct workqueue_struct *nvr_wq;

/* lives in the admin queue code */
int nvr_admin_exec(struct nvr_ctrl *ctrl, struct nvr_cmd *cmd,
		   struct ib_send_wr *first);
int nvr_post_recv(struct nvr_queue *queue, struct nvr_qe *qe);

static void nvr_error_recovery(struct nvr_ctrl *ctrl)
{
	if (ctrl->resetting)
		return;
	ctrl->resetting = true;
	queue_work(nvr_wq, &ctrl->err_work);
}

static void nvr_wr_error(struct nvr_queue *queue, struct ib_wc *wc,
			 const char *op)
{
	if (queue->live)
		pr_info("%s for CQE 0x%p failed with status %s (%d)\n", op,
			wc->wr_cqe, ib_wc_status_msg(wc->status), wc->status);
	nvr_error_recovery(queue->ctrl);
}

static void nvr_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req =
		container_of(wc->wr_cqe, struct nvr_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		nvr_wr_error(req->queue, wc, "MEMREG");
}

static void nvr_unmap_data(struct nvr_queue *queue, struct nvr_request *req)
{
	if (!blk_rq_nr_phys_segments(req->rq))
		return;

	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->dev, req->data_sgl.sgl, req->nents, req->dir);
	sg_free_table_chained(&req->data_sgl, NVR_INLINE_SG_CNT);
	req->inflight = false;
}

static void nvr_end_request(struct nvr_request *req)
{
	struct request *rq = req->rq;

	if (!atomic_dec_and_test(&req->ref))
		return;
	nvr_unmap_data(req->queue, req);
	blk_mq_end_request(rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void nvr_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_qe *qe = container_of(wc->wr_cqe, struct nvr_qe, cqe);
	struct nvr_request *req = container_of(qe, struct nvr_request, sqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvr_wr_error(req->queue, wc, "SEND");
		return;
	}
	/* OK: rdma-invalidation-leak -- last reference drops only after the response side invalidated */
	nvr_end_request(req);
}

static void nvr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req =
		container_of(wc->wr_cqe, struct nvr_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvr_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}
	nvr_end_request(req); /* OK: rdma-invalidation-leak -- LOCAL_INV completed successfully */
}

static int nvr_inv_rkey(struct nvr_queue *queue, struct nvr_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = nvr_inv_rkey_done;
	wr.wr_cqe = &req->inv_cqe;
	return ib_post_send(queue->qp, &wr, NULL);
}

static int nvr_map_sg_fr(struct nvr_queue *queue, struct nvr_request *req,
			 struct nvr_cmd *c, int count)
{
	struct nvr_keyed_sgl *sg = &c->dptr;
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	nr = ib_map_mr_sg(req->mr, req->data_sgl.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		/* OK: rdma-invalidation-leak -- nothing was registered with this MR yet */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL; /* OK: rdma-mr-leak -- MR went back to the pool above */
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = nvr_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- key rotated just above */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	sg->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, sg->length);
	put_unaligned_le32(req->mr->rkey, sg->key);
	sg->type = (NVR_KEY_SGL_DATA << 4) | NVR_SGL_INVALIDATE;
	return 0;
}

static int nvr_map_data(struct nvr_queue *queue, struct nvr_request *req,
			struct nvr_cmd *c)
{
	int ret, count;

	req->data_sgl.sgl = req->first_sgl;
	ret = sg_alloc_table_chained(&req->data_sgl,
				     blk_rq_nr_phys_segments(req->rq),
				     req->data_sgl.sgl, NVR_INLINE_SG_CNT);
	if (ret)
		return -ENOMEM;

	req->data_sgl.nents = blk_rq_map_sg(NULL, req->rq, req->data_sgl.sgl);
	req->dir = rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	count = ib_dma_map_sg(queue->dev, req->data_sgl.sgl,
			      req->data_sgl.nents, req->dir);
	if (unlikely(count <= 0)) {
		ret = -EIO;
		goto out_free_table;
	}
	req->nents = req->data_sgl.nents;

	ret = nvr_map_sg_fr(queue, req, c, count);
	if (ret)
		goto out_unmap;
	return 0;

out_unmap:
	/* OK: rdma-invalidation-leak -- the failed map never posted a REG_MR */
	ib_dma_unmap_sg(queue->dev, req->data_sgl.sgl, req->nents, req->dir);
out_free_table:
	sg_free_table_chained(&req->data_sgl, NVR_INLINE_SG_CNT);
	return ret;
}

static void nvr_process_rsp(struct nvr_queue *queue, struct nvr_rsp *rsp,
			    struct ib_wc *wc)
{
	struct nvr_request *req;
	int ret;

	if (unlikely(rsp->command_id >= queue->queue_size)) {
		nvr_error_recovery(queue->ctrl);
		return;
	}
	req = &queue->reqs[rsp->command_id];
	req->status = rsp->status >> 1;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- compared with the request's rkey */
		if (unlikely(!req->mr || wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("bogus remote invalidation for rkey %#x\n",
			       wc->ex.invalidate_rkey);
			/* the queue is drained before the request is failed */
			nvr_error_recovery(queue->ctrl);
			return;
		}
	} else if (req->mr) {
		ret = nvr_inv_rkey(queue, req); /* OK: rdma-unmap-before-invalidate -- nothing released here; ends from the LOCAL_INV completion */
		if (unlikely(ret < 0)) {
			pr_err("posting LOCAL_INV for rkey %#x failed (%d)\n",
			       req->mr->rkey, ret);
			nvr_error_recovery(queue->ctrl);
		}
		return;
	}

	nvr_end_request(req); /* OK: rdma-invalidation-leak -- rkey checked against the remote invalidation */
}

/*
 * Polled queues reap their responses from ->poll() and complete inline,
 * without going through the tag lookup of the interrupt path.
 */
static void nvr_poll_process_rsp(struct nvr_queue *queue, struct nvr_rsp *rsp,
				 struct ib_wc *wc)
{
	struct nvr_request *req = &queue->reqs[rsp->command_id];
	int ret;

	req->status = rsp->status >> 1;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* BUG: rdma-remote-invalidate-unchecked -- whichever rkey the target invalidated, the MR is released as if it were this one */
		nvr_end_request(req);
		return;
	}

	if (!req->mr) {
		nvr_end_request(req);
		return;
	}

	ret = nvr_inv_rkey(queue, req);
	if (unlikely(ret < 0)) {
		req->status = NVR_SC_HOST_PATH_ERROR;
		nvr_end_request(req); /* BUG: rdma-invalidation-leak -- the LOCAL_INV was never posted, the MR goes back with its rkey live */
	}
}

static void nvr_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_qe *qe = container_of(wc->wr_cqe, struct nvr_qe, cqe);
	struct nvr_queue *queue = qe->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvr_wr_error(queue, wc, "RECV");
		return;
	}
	if (unlikely(wc->byte_len < sizeof(struct nvr_rsp))) {
		nvr_error_recovery(queue->ctrl);
		return;
	}
	ib_dma_sync_single_for_cpu(queue->dev, qe->dma, sizeof(struct nvr_rsp),
				   DMA_FROM_DEVICE);
	if (queue->polled)
		nvr_poll_process_rsp(queue, qe->data, wc);
	else
		nvr_process_rsp(queue, qe->data, wc);
	ib_dma_sync_single_for_device(queue->dev, qe->dma,
				      sizeof(struct nvr_rsp), DMA_FROM_DEVICE);
	nvr_post_recv(queue, qe);
}

static int nvr_post_send(struct nvr_queue *queue, struct nvr_qe *qe,
			 struct ib_sge *sge, u32 num_sge,
			 struct ib_send_wr *first)
{
	struct ib_send_wr wr;

	sge->addr = qe->dma;
	sge->length = sizeof(struct nvr_cmd);
	sge->lkey = queue->ctrl->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = sge;
	wr.num_sge = num_sge;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;

	return ib_post_send(queue->qp, first, NULL);
}

static blk_status_t nvr_queue_rq(struct nvr_queue *queue, struct request *rq)
{
	struct nvr_request *req = blk_mq_rq_to_pdu(rq);
	struct nvr_cmd *c = req->sqe.data;
	int ret;

	req->rq = rq;
	req->queue = queue;
	req->mr = NULL;
	atomic_set(&req->ref, 2);
	blk_mq_start_request(rq);

	if (blk_rq_nr_phys_segments(rq)) {
		ret = nvr_map_data(queue, req, c);
		if (unlikely(ret))
			return ret == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;
	}

	req->sqe.cqe.done = nvr_send_done;
	ib_dma_sync_single_for_device(queue->dev, req->sqe.dma,
				      sizeof(struct nvr_cmd), DMA_TO_DEVICE);
	req->inflight = true;
	ret = nvr_post_send(queue, &req->sqe, &req->sge, 1,
			    req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(ret))
		goto err_unmap;
	return BLK_STS_OK;

err_unmap:
	nvr_unmap_data(queue, req); /* OK: rdma-invalidation-leak -- the post failed, the REG_MR never went out */
	return ret == -ENOMEM ? BLK_STS_RESOURCE : BLK_STS_IOERR;
}

static enum blk_eh_timer_return nvr_timeout(struct request *rq)
{
	struct nvr_request *req = blk_mq_rq_to_pdu(rq);
	struct nvr_queue *queue = req->queue;

	pr_warn("I/O timeout, queue live %d\n", queue->live);

	/* fail the command right away, error recovery reconnects the queue */
	req->status = NVR_SC_HOST_ABORTED;
	nvr_error_recovery(queue->ctrl);
	nvr_unmap_data(queue, req); /* BUG: rdma-invalidation-leak -- QP still connected and the target holds the rkey; no LOCAL_INV */
	blk_mq_end_request(rq, BLK_STS_TIMEOUT);
	return BLK_EH_DONE;
}

static void nvr_inv_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req =
		container_of(wc->wr_cqe, struct nvr_request, inv_cqe);

	req->inv_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&req->inv_done);
}

static int nvr_reclaim_sync(struct nvr_queue *queue, struct nvr_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};
	int ret;

	init_completion(&req->inv_done);
	req->inv_cqe.done = nvr_inv_sync_done;
	wr.wr_cqe = &req->inv_cqe;
	ret = ib_post_send(queue->qp, &wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&req->inv_done);
	return req->inv_status;
}

static void nvr_abort_work(struct work_struct *work)
{
	struct nvr_request *req =
		container_of(work, struct nvr_request, abort_work);
	struct nvr_queue *queue = req->queue;
	int ret;

	if (req->mr) {
		ret = nvr_reclaim_sync(queue, req);
		if (ret) {
			pr_err("abort: could not invalidate rkey (%d)\n", ret);
			nvr_error_recovery(queue->ctrl);
			return;
		}
	}
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- signaled LOCAL_INV completed above */
	nvr_unmap_data(queue, req);
	blk_mq_end_request(req->rq, BLK_STS_IOERR);
}

/* Called while stopping a queue; the target may still be processing. */
static void nvr_cancel_inflight(struct nvr_queue *queue)
{
	struct ib_send_wr wr;
	int i;

	for (i = 0; i < queue->queue_size; i++) {
		struct nvr_request *req = &queue->reqs[i];

		if (!req->inflight || !req->mr)
			continue;

		memset(&wr, 0, sizeof(wr));
		wr.opcode = IB_WR_LOCAL_INV;
		wr.ex.invalidate_rkey = req->mr->rkey;
		req->reg_cqe.done = nvr_memreg_done;
		wr.wr_cqe = &req->reg_cqe;
		if (ib_post_send(queue->qp, &wr, NULL))
			continue;

		req->status = NVR_SC_HOST_ABORTED;
		nvr_unmap_data(queue, req); /* BUG: rdma-unmap-before-invalidate -- unsignaled LOCAL_INV just posted, nothing waits for it */
		blk_mq_end_request(req->rq, BLK_STS_IOERR);
	}
}

static int nvr_get_log_page(struct nvr_ctrl *ctrl, u8 lid, void *buf,
			    size_t len)
{
	struct nvr_queue *queue = &ctrl->queues[0];
	struct ib_reg_wr reg_wr = {};
	struct nvr_cmd cmd = {};
	struct scatterlist sg;
	struct ib_mr *mr;
	int nents, n, ret;

	mr = ib_alloc_mr(ctrl->pd, IB_MR_TYPE_MEM_REG,
			 DIV_ROUND_UP(len, PAGE_SIZE));
	if (IS_ERR(mr))
		return PTR_ERR(mr);

	sg_init_one(&sg, buf, len);
	nents = ib_dma_map_sg(queue->dev, &sg, 1, DMA_FROM_DEVICE);
	if (!nents) {
		ret = -EIO;
		goto out_dereg; /* OK: rdma-mr-leak -- the label deregisters */
	}

	n = ib_map_mr_sg(mr, &sg, nents, NULL, SZ_4K);
	if (n < nents) {
		ib_dma_unmap_sg(queue->dev, &sg, 1, DMA_FROM_DEVICE);
		return n < 0 ? n : -EINVAL; /* BUG: rdma-mr-leak -- the freshly allocated MR is neither deregistered nor stored */
	}

	reg_wr.wr.opcode = IB_WR_REG_MR;
	reg_wr.wr.wr_cqe = &ctrl->admin_reg_cqe;
	reg_wr.mr = mr; /* OK: rdma-rkey-reuse -- brand new MR, registered once and deregistered below */
	reg_wr.key = mr->rkey;
	reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	cmd.opcode = NVR_ADMIN_GET_LOG_PAGE;
	cmd.cdw10 = cpu_to_le32(lid | ((len / 4 - 1) << 16));
	cmd.dptr.addr = cpu_to_le64(mr->iova);
	put_unaligned_le24(len, cmd.dptr.length);
	put_unaligned_le32(mr->rkey, cmd.dptr.key);
	cmd.dptr.type = NVR_KEY_SGL_DATA << 4;

	ret = nvr_admin_exec(ctrl, &cmd, &reg_wr.wr);

	/* success or timeout, deregistering kills the rkey before unmapping */
	ib_dereg_mr(mr);
	ib_dma_unmap_sg(queue->dev, &sg, 1, DMA_FROM_DEVICE); /* OK: rdma-invalidation-leak -- MR deregistered first */
	return ret;

out_dereg:
	ib_dereg_mr(mr);
	return ret;
}

static void nvr_destroy_queue(struct nvr_queue *queue)
{
	nvr_cancel_inflight(queue);
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
}

struct nvr_io_ops {
	blk_status_t (*queue_rq)(struct nvr_queue *queue, struct request *rq);
	enum blk_eh_timer_return (*timeout)(struct request *rq);
	void (*destroy_queue)(struct nvr_queue *queue);
	int (*get_log_page)(struct nvr_ctrl *ctrl, u8 lid, void *buf,
			    size_t len);
	work_func_t abort_work;
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct nvr_io_ops nvr_rdma_io_ops = {
	.queue_rq	= nvr_queue_rq,
	.timeout	= nvr_timeout,
	.destroy_queue	= nvr_destroy_queue,
	.get_log_page	= nvr_get_log_page,
	.abort_work	= nvr_abort_work,
	.recv_done	= nvr_recv_done,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("NVMe over RDMA host transport (I/O path)");
