// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0
/*
 * kc_nvmf_host.c - NVMe-oF style RDMA host transport (nvme-rdma style): pool
 * MR per command, IB_WR_REG_MR chained before the SEND, rkey in the keyed SGL,
 * remote invalidation or a signaled LOCAL_INV before the MR goes back.
 * Known problems: SQ sized for 2 WRs per command (3 stay queued); the sync
 * command path skips key rotation, trusts any remote invalidation and recycles
 * the MR after a timeout; an unposted LOCAL_INV still ends the request; abort
 * unmaps right behind an unsignaled LOCAL_INV.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/string.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/blk-mq.h>
#include <linux/unaligned.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define KC_NVMF_MAX_INLINE_SEGMENTS	4
#define KC_NVMF_MAX_SEGMENTS		256
#define KC_NVMF_SYNC_TIMEOUT_MS		3000
#define KC_NVMF_SYNC_CID		0xffff
#define KC_NVMF_SGL_KEYED_INV		0x4f

static bool kc_register_always = true;
module_param(kc_register_always, bool, 0444);

struct kc_nvmf_qe {
	struct ib_cqe		cqe;
	struct kc_nvmf_queue	*queue;
	void			*data;
	u64			dma;
};

struct kc_nvmf_cmd {
	u8	opcode, flags;
	u16	command_id;
	__le64	dptr_addr;
	u8	dptr_len[3], dptr_key[4], dptr_type;
};

struct kc_nvmf_rsp {
	u16	sq_head, sq_id, command_id, status;
};

struct kc_nvmf_request {
	struct request		*rq;
	struct ib_mr		*mr;
	struct kc_nvmf_qe	sqe;
	struct ib_sge		sge[1 + KC_NVMF_MAX_INLINE_SEGMENTS];
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct kc_nvmf_queue	*queue;
	struct scatterlist	*sgl;
	int			nents;
	u16			status;
};

struct kc_nvmf_sync_ctx {
	struct completion	done, inv_done;
	struct ib_cqe		reg_cqe, inv_cqe;
	struct ib_reg_wr	reg_wr;
	int			wc_flags;
	u32			inv_rkey;	/* copied from the response */
	u16			status;
};

struct kc_nvmf_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	struct request_queue	*blkq;
	int			queue_size;
	unsigned int		num_inline_segments;
	struct kc_nvmf_request	*tags;		/* indexed by command_id */
	struct kc_nvmf_qe	sync_sqe;
	struct kc_nvmf_sync_ctx	*sync;		/* sync command in flight */
	struct work_struct	err_work;
};

static void kc_nvmf_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc);

static void kc_nvmf_error_recovery(struct kc_nvmf_queue *queue)
{
	queue_work(system_wq, &queue->err_work);
}

int kc_nvmf_create_queue_ib(struct kc_nvmf_queue *queue)
{
	const int send_wr_factor = 2;	/* REG_MR + SEND */
	struct ib_device *ibdev = queue->ibdev = queue->cm_id->device;
	struct ib_qp_init_attr init_attr = {};
	int ret;

	/* BUG: rdma-remote-access-overbroad -- without register_always any peer that learns pd->unsafe_global_rkey reads and writes all of host memory */
	queue->pd = ib_alloc_pd(ibdev,
		kc_register_always ? 0 : IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(queue->pd))
		return PTR_ERR(queue->pd);
	queue->num_inline_segments = min(KC_NVMF_MAX_INLINE_SEGMENTS,
					 ibdev->attrs.max_send_sge - 1);

	/* +1 for drain */
	/* BUG(file): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- two WRs (REG_MR, SEND) are reserved but each command also queues a LOCAL_INV: 3 per command, by a hand-made factor */
	init_attr.cap.max_send_wr = send_wr_factor * queue->queue_size + 1;
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + queue->num_inline_segments; /* OK: rdma-queue-cap-unchecked -- clamped to attrs.max_send_sge above */
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;
	init_attr.qp_context = queue;
	ret = rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
	if (ret)
		goto out_free_pd;
	queue->qp = queue->cm_id->qp;

	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs,
			      queue->queue_size + 1, IB_MR_TYPE_MEM_REG,
			      min_t(u32, KC_NVMF_MAX_SEGMENTS,
				    ibdev->attrs.max_fast_reg_page_list_len), 0);
	if (ret)
		goto out_destroy_qp;
	return 0;

out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_free_pd:
	ib_dealloc_pd(queue->pd);
	return ret;
}

static int kc_nvmf_post_inv(struct kc_nvmf_queue *queue, u32 rkey,
			    struct ib_cqe *cqe)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = cqe,
		.send_flags	    = cqe ? IB_SEND_SIGNALED : 0,
		.ex.invalidate_rkey = rkey,
	};

	return ib_post_send(queue->qp, &wr, NULL);
}

static void kc_nvmf_unmap_data(struct kc_nvmf_queue *queue,
			       struct kc_nvmf_request *req)
{
	if (!req->nents)
		return;
	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->ibdev, req->sgl, req->nents,
			rq_data_dir(req->rq) == WRITE ?
			DMA_TO_DEVICE : DMA_FROM_DEVICE);
	req->nents = 0;
}

static void kc_nvmf_end_request(struct kc_nvmf_request *req)
{
	kc_nvmf_unmap_data(req->queue, req);
	blk_mq_end_request(req->rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void kc_nvmf_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nvmf_request *req =
		container_of(wc->wr_cqe, struct kc_nvmf_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kc_nvmf_error_recovery(req->queue);
	kc_nvmf_end_request(req);
}

static void kc_nvmf_wr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("WR failed: %s\n", ib_wc_status_msg(wc->status));
}

static int kc_nvmf_map_data(struct kc_nvmf_queue *queue,
			    struct kc_nvmf_request *req, struct kc_nvmf_cmd *c)
{
	enum dma_data_direction dir;
	int count, nr;

	if (!blk_rq_nr_phys_segments(req->rq))
		return 0;		/* no data, null SGL */
	dir = rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	req->nents = blk_rq_map_sg(queue->blkq, req->rq, req->sgl);
	count = ib_dma_map_sg(queue->ibdev, req->sgl, req->nents, dir);
	if (unlikely(count <= 0))
		return -EIO;

	if (count == 1 && !kc_register_always) {
		c->dptr_addr = cpu_to_le64(sg_dma_address(req->sgl));
		put_unaligned_le24(sg_dma_len(req->sgl), c->dptr_len);
		put_unaligned_le32(queue->pd->unsafe_global_rkey, c->dptr_key);
		return 0;
	}

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr)) {
		nr = -EAGAIN;
		goto out_unmap;
	}

	nr = ib_map_mr_sg(req->mr, req->sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		goto out_unmap; /* OK: rdma-mr-leak -- the MR went back to the pool just above */
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = kc_nvmf_wr_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- key rotated with ib_inc_rkey() just above */
	req->reg_wr.key = req->mr->rkey;
	/* OK: rdma-access-flags-invalid -- the writable branch carries LOCAL_WRITE */
	req->reg_wr.access = dir == DMA_TO_DEVICE ? IB_ACCESS_REMOTE_READ :
			     IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	c->dptr_addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, c->dptr_len);
	put_unaligned_le32(req->mr->rkey, c->dptr_key);
	c->dptr_type = KC_NVMF_SGL_KEYED_INV;
	return 0;

out_unmap:
	ib_dma_unmap_sg(queue->ibdev, req->sgl, req->nents, dir);
	req->nents = 0;
	return nr < 0 ? nr : -EINVAL;
}

static int kc_nvmf_post_send(struct kc_nvmf_queue *queue,
			     struct kc_nvmf_qe *qe, struct ib_sge *sge,
			     struct ib_send_wr *first)
{
	struct ib_send_wr wr = {
		.wr_cqe	    = &qe->cqe,
		.sg_list    = sge,
		.num_sge    = 1,
		.opcode	    = IB_WR_SEND,
		.send_flags = IB_SEND_SIGNALED, /* OK: rdma-unsignaled-send-starvation -- every command SEND is signaled */
	};

	sge->addr   = qe->dma;
	sge->length = sizeof(struct kc_nvmf_cmd);
	sge->lkey   = queue->pd->local_dma_lkey;

	if (first)
		first->next = &wr;
	else
		first = &wr;
	return ib_post_send(queue->qp, first, NULL);
}

blk_status_t kc_nvmf_queue_rq(struct kc_nvmf_queue *queue,
			      const struct blk_mq_queue_data *bd)
{
	struct kc_nvmf_request *req = blk_mq_rq_to_pdu(bd->rq);
	struct kc_nvmf_cmd *c = req->sqe.data;
	int err;

	req->rq = bd->rq;
	req->queue = queue;
	req->status = 0;
	blk_mq_start_request(bd->rq);

	err = kc_nvmf_map_data(queue, req, c);
	if (unlikely(err < 0))
		return err == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;

	req->sqe.cqe.done = kc_nvmf_wr_done;
	err = kc_nvmf_post_send(queue, &req->sqe, req->sge,
			req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(err)) {
		kc_nvmf_unmap_data(queue, req); /* OK: rdma-invalidation-leak -- the REG_MR+SEND chain was refused, the key never reached the target */
		return BLK_STS_IOERR;
	}
	return BLK_STS_OK;
}

static void kc_nvmf_process_rsp(struct kc_nvmf_queue *queue,
				struct kc_nvmf_rsp *cqe, struct ib_wc *wc)
{
	struct kc_nvmf_request *req = &queue->tags[cqe->command_id];
	int ret;

	req->status = (u16)cqe->status >> 1;
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's below */
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("Bogus remote invalidation\n");
			kc_nvmf_error_recovery(queue);
		}
	} else if (req->mr) {
		req->reg_cqe.done = kc_nvmf_inv_rkey_done;
		ret = kc_nvmf_post_inv(queue, req->mr->rkey, &req->reg_cqe);
		if (unlikely(ret < 0)) {
			pr_err("Queueing INV WR failed (%d)\n", ret);
			kc_nvmf_error_recovery(queue);
			/* don't leave the request hanging until recovery */
			kc_nvmf_end_request(req); /* BUG: rdma-invalidation-leak -- the LOCAL_INV was never posted, yet the MR goes back to the pool with its rkey live */
		}
		/* the local invalidation completion will end the request */
		return;
	}
	kc_nvmf_end_request(req);
}

void kc_nvmf_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kc_nvmf_qe *qe = container_of(wc->wr_cqe, struct kc_nvmf_qe, cqe);
	struct kc_nvmf_queue *queue = qe->queue;
	struct kc_nvmf_rsp *cqe = qe->data;

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kc_nvmf_error_recovery(queue);
	else if (queue->sync && cqe->command_id == KC_NVMF_SYNC_CID) {
		queue->sync->status = (u16)cqe->status >> 1;
		queue->sync->wc_flags = wc->wc_flags;
		queue->sync->inv_rkey = wc->ex.invalidate_rkey;
		complete(&queue->sync->done);
	} else if (likely(cqe->command_id < queue->queue_size)) {
		kc_nvmf_process_rsp(queue, cqe, wc);
	}
}

static void kc_nvmf_sync_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	complete(&container_of(wc->wr_cqe, struct kc_nvmf_sync_ctx,
			       inv_cqe)->inv_done);
}

static struct ib_mr *kc_nvmf_sync_reg(struct kc_nvmf_queue *queue,
				      struct kc_nvmf_sync_ctx *ctx,
				      struct scatterlist *sg,
				      enum dma_data_direction dir)
{
	struct ib_mr *mr;
	int n;

	mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!mr)
		return ERR_PTR(-EAGAIN);
	if (ib_dma_map_sg(queue->ibdev, sg, 1, dir) != 1)
		return ERR_PTR(-EIO); /* BUG: rdma-mr-leak -- the pool MR taken above is neither put back nor returned */

	n = ib_map_mr_sg(mr, sg, 1, NULL, SZ_4K);
	if (n != 1) {
		ib_dma_unmap_sg(queue->ibdev, sg, 1, dir);
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, mr);
		return ERR_PTR(n < 0 ? n : -EINVAL);
	}

	ctx->reg_wr.wr.opcode = IB_WR_REG_MR;
	ctx->reg_wr.wr.wr_cqe = &ctx->reg_cqe;
	ctx->reg_wr.mr = mr; /* BUG: rdma-rkey-reuse -- pool MR registered again under the key of its previous user, no ib_update_fast_reg_key() */
	ctx->reg_wr.key = mr->rkey;
	/* Connect data is read by the target, log pages are written by it */
	/* BUG: rdma-access-flags-invalid -- DMA_FROM_DEVICE gets REMOTE_WRITE without LOCAL_WRITE, the REG_MR completes in error */
	ctx->reg_wr.access = dir == DMA_TO_DEVICE ? IB_ACCESS_REMOTE_READ :
						    IB_ACCESS_REMOTE_WRITE;
	return mr;
}

int kc_nvmf_sync_cmd(struct kc_nvmf_queue *queue, struct kc_nvmf_cmd *c,
		     void *buf, unsigned int len, enum dma_data_direction dir)
{
	struct kc_nvmf_sync_ctx ctx = {};
	struct scatterlist sg;
	struct ib_sge sge;
	struct ib_mr *mr;
	long ret;

	init_completion(&ctx.done);
	init_completion(&ctx.inv_done);
	ctx.reg_cqe.done = kc_nvmf_wr_done;
	sg_init_one(&sg, buf, len);
	mr = kc_nvmf_sync_reg(queue, &ctx, &sg, dir);
	if (IS_ERR(mr))
		return PTR_ERR(mr);

	c->command_id = KC_NVMF_SYNC_CID;
	c->dptr_addr = cpu_to_le64(mr->iova);
	put_unaligned_le24(mr->length, c->dptr_len);
	put_unaligned_le32(mr->rkey, c->dptr_key);
	c->dptr_type = KC_NVMF_SGL_KEYED_INV;
	queue->sync = &ctx;

	ret = kc_nvmf_post_send(queue, &queue->sync_sqe, &sge, &ctx.reg_wr.wr);
	if (ret)
		goto out_put;
	ret = wait_for_completion_interruptible_timeout(&ctx.done,
			msecs_to_jiffies(KC_NVMF_SYNC_TIMEOUT_MS));
	if (ret <= 0) {
		ret = ret ? : -ETIMEDOUT;
		goto out_put;
	}

	/* the target already invalidated the buffer */
	if (ctx.wc_flags & IB_WC_WITH_INVALIDATE) /* BUG: rdma-remote-invalidate-unchecked -- ctx.inv_rkey is never compared with mr->rkey before the LOCAL_INV is skipped */
		goto out_done;

	ctx.inv_cqe.done = kc_nvmf_sync_inv_done;
	ret = kc_nvmf_post_inv(queue, mr->rkey, &ctx.inv_cqe);
	if (ret)
		goto out_put;
	wait_for_completion(&ctx.inv_done);
out_done:
	ret = ctx.status ? -EIO : 0;
out_put:
	queue->sync = NULL;
	ib_dma_unmap_sg(queue->ibdev, &sg, 1, dir); /* OK: rdma-unmap-before-invalidate -- on the LOCAL_INV path its completion was waited for */
	/* BUG: rdma-invalidation-leak -- after a timeout or signal (or an unposted LOCAL_INV) the MR returns to the pool while the target still holds a live rkey */
	ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, mr);
	return ret;
}

/* Timeout handler: fail every command still waiting for its response. */
void kc_nvmf_abort_inflight(struct kc_nvmf_queue *queue)
{
	struct kc_nvmf_request *req;
	int i;

	for (i = 0; i < queue->queue_size; i++) {
		req = &queue->tags[i];
		if (!req->nents)
			continue;
		if (req->mr)	/* fire and forget */
			kc_nvmf_post_inv(queue, req->mr->rkey, NULL);
		kc_nvmf_unmap_data(queue, req); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed; pages unmapped and MR recycled under a live key */
		blk_mq_end_request(req->rq, BLK_STS_IOERR);
	}
}

MODULE_LICENSE("GPL");
