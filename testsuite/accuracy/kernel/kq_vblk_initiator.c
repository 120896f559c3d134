// SPDX-License-Identifier: GPL-2.0
/*
 * vblk-rdma: initiator of a small block protocol over RDMA.
 *
 * Every I/O request takes an MR from the QP's MR pool, fast-registers its
 * scatterlist (REG_MR chained in front of the command SEND) and puts the
 * rkey in the command.  The target answers with SEND_WITH_INV when it can;
 * otherwise the host posts a signaled LOCAL_INV and ends the request from
 * its completion, like nvme-rdma.  Passthrough commands ("ioctls") are
 * serialised on the queue, use one MR allocated with the queue, and wait
 * synchronously for the answer.
 *
 * The I/O path is the reference; the passthrough path re-registers its MR
 * under the same key with an invalid access mask, believes any remote
 * invalidation, and unmaps the buffer on timeout while the key is live.
 * The timeout handler ends requests right after an unsignaled LOCAL_INV,
 * a failed post loses the request's pool MR, and queue setup leaks the
 * passthrough MR on one error path.
 *
 * NOT-ANNOTATED: rdma-local-mr-management -- migration notes not annotated in this file
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/blk-mq.h>
#include <linux/scatterlist.h>
#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/unaligned.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define VBLK_IOCTL_TIMEOUT_MS	5000

enum { VBLK_OP_READ = 1, VBLK_OP_WRITE = 2, VBLK_OP_IOCTL = 3 };

struct vblk_cmd {
	u8	opcode;
	u8	flags;
	u16	rsvd;
	__le32	len;
	__le64	cookie;
	__le64	lba;
	__le64	addr;
	__le32	key;
};

struct vblk_rsp {
	__le64	cookie;
	u16	status;
	u16	rsvd[3];
};

struct vblk_queue;

struct vblk_qe {
	struct ib_cqe		cqe;
	struct vblk_queue	*queue;
	struct vblk_rsp		*rsp;
	u64			dma;
};

struct vblk_request {
	struct vblk_queue	*queue;
	struct request		*rq;
	struct vblk_cmd		*cmd;
	u64			cmd_dma;
	struct ib_sge		sge;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		send_cqe;
	struct ib_cqe		inv_cqe;
	struct sg_table		sgt;
	struct scatterlist	first_sgl[SG_CHUNK_SIZE];
	int			nents;
	enum dma_data_direction	dir;
	blk_status_t		status;
};

struct vblk_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	/* includes the passthrough slot: the tag set has queue_size - 1 tags */
	int			queue_size;
	unsigned int		pages_per_mr;
	struct vblk_qe		*rsp_ring;
	struct work_struct	err_work;

	struct mutex		ioctl_lock;
	struct ib_mr		*ioctl_mr;
	struct ib_reg_wr	ioctl_reg_wr;
	struct ib_send_wr	ioctl_send_wr;
	struct ib_send_wr	ioctl_inv_wr;
	struct ib_cqe		ioctl_cqe;
	struct ib_cqe		ioctl_inv_cqe;
	struct vblk_cmd		*ioctl_cmd;
	u64			ioctl_cmd_dma;
	struct ib_sge		ioctl_sge;
	struct completion	ioctl_done;
	struct completion	ioctl_inv_done;
	bool			ioctl_need_inval;
	u16			ioctl_status;
};

static void vblk_error_recovery(struct vblk_queue *queue)
{
	schedule_work(&queue->err_work);
}

static void vblk_wr_error(struct vblk_queue *queue, struct ib_wc *wc,
			  const char *op)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("vblk: %s failed: %s\n", op, ib_wc_status_msg(wc->status));
	vblk_error_recovery(queue);
}

static void vblk_end_request(struct vblk_request *req)
{
	struct vblk_queue *queue = req->queue;

	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	if (req->nents) {
		ib_dma_unmap_sg(queue->dev, req->sgt.sgl, req->nents, req->dir);
		sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
		req->nents = 0;
	}
	blk_mq_end_request(req->rq, req->status);
}

static void vblk_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_request *req = container_of(wc->wr_cqe, struct vblk_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		vblk_wr_error(req->queue, wc, "MEMREG");
}

static void vblk_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_request *req = container_of(wc->wr_cqe, struct vblk_request, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		vblk_wr_error(req->queue, wc, "SEND");
}

static void vblk_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_request *req = container_of(wc->wr_cqe, struct vblk_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		vblk_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}
	vblk_end_request(req);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released once the LOCAL_INV completed successfully
}

static int vblk_inv_rkey(struct vblk_queue *queue, struct vblk_request *req)
{
	req->inv_cqe.done = vblk_inv_rkey_done;
	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	return ib_post_send(queue->qp, &req->inv_wr, NULL);
}

static void vblk_process_rsp(struct vblk_queue *queue, struct vblk_rsp *rsp,
			     struct ib_wc *wc)
{
	struct vblk_request *req = (void *)(uintptr_t)le64_to_cpu(rsp->cookie);
	int ret;

	req->status = rsp->status ? BLK_STS_IOERR : BLK_STS_OK;
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(!req->mr || wc->ex.invalidate_rkey != req->mr->rkey)) {	// OK: rdma-remote-invalidate-unchecked -- compared with the request's key
			pr_err("vblk: bogus remote invalidation of rkey %#x\n",
			       wc->ex.invalidate_rkey);
			vblk_error_recovery(queue);
			return;
		}
		vblk_end_request(req);	// OK: rdma-invalidation-leak -- the target invalidated this request's key
	} else if (req->mr) {
		ret = vblk_inv_rkey(queue, req);
		if (unlikely(ret < 0)) {
			pr_err("vblk: LOCAL_INV post failed (%d)\n", ret);
			vblk_error_recovery(queue);
		}
		/* the request ends from vblk_inv_rkey_done() */
	} else {
		vblk_end_request(req);
	}
}

static void vblk_ioctl_rsp(struct vblk_queue *queue, struct vblk_rsp *rsp,
			   struct ib_wc *wc)
{
	queue->ioctl_status = rsp->status;
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)	// BUG: rdma-remote-invalidate-unchecked -- whichever key the target invalidated, the passthrough MR is taken as dead
		queue->ioctl_need_inval = false;
	complete(&queue->ioctl_done);
}

static int vblk_post_recv(struct vblk_queue *queue, struct vblk_qe *qe);

static void vblk_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_qe *qe = container_of(wc->wr_cqe, struct vblk_qe, cqe);
	struct vblk_queue *queue = qe->queue;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		vblk_wr_error(queue, wc, "RECV");
		return;
	}
	ib_dma_sync_single_for_cpu(queue->dev, qe->dma, sizeof(*qe->rsp), DMA_FROM_DEVICE);
	if (qe->rsp->cookie == 0)
		vblk_ioctl_rsp(queue, qe->rsp, wc);
	else
		vblk_process_rsp(queue, qe->rsp, wc);
	ib_dma_sync_single_for_device(queue->dev, qe->dma, sizeof(*qe->rsp), DMA_FROM_DEVICE);
	vblk_post_recv(queue, qe);
}

static int vblk_post_recv(struct vblk_queue *queue, struct vblk_qe *qe)
{
	struct ib_sge sge = { .addr = qe->dma, .length = sizeof(*qe->rsp),
			      .lkey = queue->pd->local_dma_lkey };
	struct ib_recv_wr wr = { .sg_list = &sge, .num_sge = 1 };

	qe->cqe.done = vblk_recv_done;
	wr.wr_cqe = &qe->cqe;
	return ib_post_recv(queue->qp, &wr, NULL);
}

static int vblk_map_data(struct vblk_queue *queue, struct vblk_request *req)
{
	struct vblk_cmd *cmd = req->cmd;
	int count, nr;

	req->sgt.sgl = req->first_sgl;
	if (sg_alloc_table_chained(&req->sgt, blk_rq_nr_phys_segments(req->rq),
				   req->sgt.sgl, SG_CHUNK_SIZE))
		return -ENOMEM;
	count = blk_rq_map_sg(NULL, req->rq, req->sgt.sgl);
	req->dir = rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	req->nents = ib_dma_map_sg(queue->dev, req->sgt.sgl, count, req->dir);
	if (unlikely(req->nents <= 0)) {
		sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
		req->nents = 0;
		return -EIO;
	}

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr)) {
		ib_dma_unmap_sg(queue->dev, req->sgt.sgl, req->nents, req->dir);
		sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
		req->nents = 0;
		return -EAGAIN;
	}
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, req->nents, NULL, SZ_4K);
	if (unlikely(nr < req->nents)) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);	// OK: rdma-mr-leak -- short map puts the MR back
		req->mr = NULL;
		return nr < 0 ? nr : -EINVAL;
	}
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = vblk_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;	// OK: rdma-rkey-reuse -- key rotated just above
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = req->dir == DMA_TO_DEVICE ? IB_ACCESS_REMOTE_READ :
			     IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;	// OK: rdma-access-flags-invalid -- remote write only together with local write

	cmd->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le32(req->mr->rkey, &cmd->key);
	cmd->len = cpu_to_le32(blk_rq_payload_bytes(req->rq));
	return 0;
}

static blk_status_t vblk_queue_rq(struct blk_mq_hw_ctx *hctx,
				  const struct blk_mq_queue_data *bd)
{
	struct vblk_request *req = blk_mq_rq_to_pdu(bd->rq);
	struct vblk_queue *queue = req->queue;
	struct ib_send_wr *first;
	int err;

	req->rq = bd->rq;
	req->status = BLK_STS_OK;
	memset(req->cmd, 0, sizeof(*req->cmd));
	req->cmd->opcode = rq_data_dir(bd->rq) == WRITE ? VBLK_OP_WRITE : VBLK_OP_READ;
	req->cmd->cookie = cpu_to_le64((uintptr_t)req);
	blk_mq_start_request(bd->rq);

	err = vblk_map_data(queue, req);
	if (unlikely(err))
		return err == -ENOMEM || err == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;

	req->sge.addr = req->cmd_dma;
	req->sge.length = sizeof(*req->cmd);
	req->sge.lkey = queue->pd->local_dma_lkey;
	req->send_cqe.done = vblk_send_done;
	memset(&req->send_wr, 0, sizeof(req->send_wr));
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	first = &req->send_wr;
	if (req->mr) {
		req->reg_wr.wr.next = &req->send_wr;
		first = &req->reg_wr.wr;
	}
	ib_dma_sync_single_for_device(queue->dev, req->cmd_dma, sizeof(*req->cmd), DMA_TO_DEVICE);
	err = ib_post_send(queue->qp, first, NULL);
	if (unlikely(err)) {
		// OK: rdma-invalidation-leak -- the REG_MR was not posted, no key reached the target
		ib_dma_unmap_sg(queue->dev, req->sgt.sgl, req->nents, req->dir);
		sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
		req->nents = 0;
		return BLK_STS_IOERR;	// BUG: rdma-mr-leak -- the pool MR in req->mr is never put back
	}
	return BLK_STS_OK;
}

static enum blk_eh_timer_return vblk_timeout(struct request *rq)
{
	struct vblk_request *req = blk_mq_rq_to_pdu(rq);
	struct vblk_queue *queue = req->queue;

	pr_warn("vblk: request %p timed out\n", req);
	if (req->mr) {
		memset(&req->inv_wr, 0, sizeof(req->inv_wr));
		req->inv_wr.opcode = IB_WR_LOCAL_INV;
		req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
		if (ib_post_send(queue->qp, &req->inv_wr, NULL)) {
			vblk_error_recovery(queue);
			return BLK_EH_RESET_TIMER;
		}
	}
	req->status = BLK_STS_TIMEOUT;
	// OK: rdma-invalidation-leak -- the LOCAL_INV was posted
	vblk_end_request(req);	// BUG: rdma-unmap-before-invalidate -- pages unmapped and MR back in the pool right after an unsignaled LOCAL_INV
	return BLK_EH_DONE;
}

/* blk_mq_ops stand-in: the block layer glue lives in vblk_main.c */
struct vblk_mq_ops {
	blk_status_t (*queue_rq)(struct blk_mq_hw_ctx *hctx,
				 const struct blk_mq_queue_data *bd);
	enum blk_eh_timer_return (*timeout)(struct request *rq);
};

const struct vblk_mq_ops vblk_rdma_mq_ops = {
	.queue_rq	= vblk_queue_rq,
	.timeout	= vblk_timeout,
};

static void vblk_ioctl_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_queue *queue = container_of(wc->wr_cqe, struct vblk_queue, ioctl_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		vblk_wr_error(queue, wc, "IOCTL SEND");
}

static void vblk_ioctl_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct vblk_queue *queue = container_of(wc->wr_cqe, struct vblk_queue, ioctl_inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		vblk_wr_error(queue, wc, "IOCTL LOCAL_INV");
	complete(&queue->ioctl_inv_done);
}

int vblk_ioctl(struct vblk_queue *queue, void *buf, unsigned int len)
{
	struct ib_device *dev = queue->dev;
	struct scatterlist sg;
	int ret, nr;

	mutex_lock(&queue->ioctl_lock);
	sg_init_one(&sg, buf, len);
	if (ib_dma_map_sg(dev, &sg, 1, DMA_BIDIRECTIONAL) != 1) {
		ret = -EIO;
		goto out_unlock;
	}
	nr = ib_map_mr_sg(queue->ioctl_mr, &sg, 1, NULL, PAGE_SIZE);
	if (nr != 1) {
		ret = -EINVAL;
		goto out_unmap;
	}

	memset(&queue->ioctl_reg_wr, 0, sizeof(queue->ioctl_reg_wr));
	queue->ioctl_reg_wr.wr.opcode = IB_WR_REG_MR;
	queue->ioctl_reg_wr.mr = queue->ioctl_mr;	// BUG: rdma-rkey-reuse -- the passthrough MR is registered again under the key of the previous ioctl
	queue->ioctl_reg_wr.key = queue->ioctl_mr->rkey;
	queue->ioctl_reg_wr.access = IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, the REG_MR completes in error
	queue->ioctl_reg_wr.wr.next = &queue->ioctl_send_wr;

	memset(queue->ioctl_cmd, 0, sizeof(*queue->ioctl_cmd));
	queue->ioctl_cmd->opcode = VBLK_OP_IOCTL;
	queue->ioctl_cmd->len = cpu_to_le32(len);
	queue->ioctl_cmd->addr = cpu_to_le64(queue->ioctl_mr->iova);
	put_unaligned_le32(queue->ioctl_mr->rkey, &queue->ioctl_cmd->key);

	queue->ioctl_sge.addr = queue->ioctl_cmd_dma;
	queue->ioctl_sge.length = sizeof(*queue->ioctl_cmd);
	queue->ioctl_sge.lkey = queue->pd->local_dma_lkey;
	queue->ioctl_cqe.done = vblk_ioctl_send_done;
	memset(&queue->ioctl_send_wr, 0, sizeof(queue->ioctl_send_wr));
	queue->ioctl_send_wr.opcode = IB_WR_SEND;
	queue->ioctl_send_wr.wr_cqe = &queue->ioctl_cqe;
	queue->ioctl_send_wr.sg_list = &queue->ioctl_sge;
	queue->ioctl_send_wr.num_sge = 1;
	queue->ioctl_send_wr.send_flags = IB_SEND_SIGNALED;

	queue->ioctl_need_inval = true;
	reinit_completion(&queue->ioctl_done);
	ret = ib_post_send(queue->qp, &queue->ioctl_reg_wr.wr, NULL);
	if (ret)
		goto out_unmap;	// OK: rdma-invalidation-leak -- the REG_MR was never posted
	if (!wait_for_completion_timeout(&queue->ioctl_done,
					 msecs_to_jiffies(VBLK_IOCTL_TIMEOUT_MS))) {
		ret = -ETIMEDOUT;
		goto out_unmap;	// BUG: rdma-invalidation-leak -- the target still holds a valid rkey for the buffer the caller gets back
	}

	if (queue->ioctl_need_inval) {
		queue->ioctl_inv_cqe.done = vblk_ioctl_inv_done;
		memset(&queue->ioctl_inv_wr, 0, sizeof(queue->ioctl_inv_wr));
		queue->ioctl_inv_wr.opcode = IB_WR_LOCAL_INV;
		queue->ioctl_inv_wr.send_flags = IB_SEND_SIGNALED;
		queue->ioctl_inv_wr.wr_cqe = &queue->ioctl_inv_cqe;
		queue->ioctl_inv_wr.ex.invalidate_rkey = queue->ioctl_mr->rkey;
		reinit_completion(&queue->ioctl_inv_done);
		ret = ib_post_send(queue->qp, &queue->ioctl_inv_wr, NULL);
		if (ret) {
			vblk_error_recovery(queue);
			goto out_unlock;
		}
		wait_for_completion(&queue->ioctl_inv_done);
	}
	ret = queue->ioctl_status ? -EIO : 0;
out_unmap:
	ib_dma_unmap_sg(dev, &sg, 1, DMA_BIDIRECTIONAL);	// OK: rdma-unmap-before-invalidate -- the LOCAL_INV was waited for above
out_unlock:
	mutex_unlock(&queue->ioctl_lock);
	return ret;
}

static int vblk_create_qp(struct vblk_queue *queue)
{
	struct ib_qp_init_attr init_attr;
	const int factor = 3;	/* MR, SEND, INV */
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	/* +1 for ib_drain_qp */
	// OK: rdma-send-queue-undersized -- three WRs per request plus the drain's
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor for REG_MR and LOCAL_INV
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->cq;
	init_attr.recv_cq = queue->cq;

	ret = rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

int vblk_init_queue(struct vblk_queue *queue)
{
	int i, ret;

	mutex_init(&queue->ioctl_lock);
	init_completion(&queue->ioctl_done);
	init_completion(&queue->ioctl_inv_done);
	queue->cq = ib_alloc_cq(queue->dev, queue, 4 * queue->queue_size + 1, 0,
				IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->cq))
		return PTR_ERR(queue->cq);
	ret = vblk_create_qp(queue);
	if (ret)
		goto out_free_cq;
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
			      IB_MR_TYPE_MEM_REG, queue->pages_per_mr, 0);
	if (ret)
		goto out_destroy_qp;

	queue->ioctl_mr = ib_alloc_mr(queue->pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(queue->ioctl_mr)) {
		ret = PTR_ERR(queue->ioctl_mr);
		goto out_destroy_pool;
	}
	queue->ioctl_cmd = kzalloc(sizeof(*queue->ioctl_cmd), GFP_KERNEL);
	if (!queue->ioctl_cmd) {
		ret = -ENOMEM;
		goto out_destroy_pool;	// BUG: rdma-mr-leak -- skips the ib_dereg_mr() of ioctl_mr
	}
	queue->ioctl_cmd_dma = ib_dma_map_single(queue->dev, queue->ioctl_cmd,
						 sizeof(*queue->ioctl_cmd), DMA_TO_DEVICE);
	queue->rsp_ring = kcalloc(queue->queue_size, sizeof(*queue->rsp_ring), GFP_KERNEL);
	if (!queue->rsp_ring) {
		ret = -ENOMEM;
		goto out_free_cmd;
	}
	for (i = 0; i < queue->queue_size; i++) {
		struct vblk_qe *qe = &queue->rsp_ring[i];

		qe->queue = queue;
		qe->rsp = kzalloc(sizeof(*qe->rsp), GFP_KERNEL);
		if (!qe->rsp) {
			ret = -ENOMEM;
			goto out_free_ring;
		}
		qe->dma = ib_dma_map_single(queue->dev, qe->rsp, sizeof(*qe->rsp),
					    DMA_FROM_DEVICE);
		ret = vblk_post_recv(queue, qe);
		if (ret)
			goto out_free_ring;
	}
	return 0;

out_free_ring:
	ib_drain_qp(queue->qp);
	while (i-- > 0)
		kfree(queue->rsp_ring[i].rsp);
	kfree(queue->rsp_ring);
out_free_cmd:
	kfree(queue->ioctl_cmd);
	ib_dereg_mr(queue->ioctl_mr);	// OK: rdma-mr-leak -- released on the paths that reach this label
out_destroy_pool:
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_free_cq:
	ib_free_cq(queue->cq);
	return ret;
}

void vblk_destroy_queue(struct vblk_queue *queue)
{
	int i;

	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	ib_dereg_mr(queue->ioctl_mr);	// OK: rdma-invalidation-leak -- deregistration kills the passthrough key
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->cq);
	for (i = 0; i < queue->queue_size; i++)
		kfree(queue->rsp_ring[i].rsp);
	kfree(queue->rsp_ring);
	kfree(queue->ioctl_cmd);
}

MODULE_DESCRIPTION("vblk RDMA initiator");
MODULE_LICENSE("GPL");
