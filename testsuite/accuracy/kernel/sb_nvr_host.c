// SPDX-License-Identifier: GPL-2.0
/*
 * sb_nvr_host.c - NVMe over RDMA style host transport, I/O queues.
 *
 * Every I/O queue owns a pool of fast-registration MRs (ib_mr_pool_*)
 * sized to its depth.  A command that carries data takes an MR, registers
 * its scatterlist with an IB_WR_REG_MR chained in front of the command
 * SEND and advertises the rkey in a keyed SGL with the "invalidate" bit,
 * so the target may answer with SEND_WITH_INV.  A response that arrives
 * without remote invalidation makes the host post its own LOCAL_INV; the
 * request is then finished from that completion.  The request is done
 * when both the SEND and the response (or the LOCAL_INV) completed.
 *
 * Problems in this version:
 *  - the response handler notices a remote invalidation of a different
 *    rkey, starts error recovery and still finishes the request;
 *  - the timeout handler hands the tag and the MR back while the target
 *    may still hold the rkey;
 *  - the send queue is sized with a per-command factor chosen by hand.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <linux/blk-mq.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define SBN_INLINE_SG_CNT	2
#define SBN_CMD_SIZE		64
#define SBN_RSP_SIZE		16
#define SBN_SGL_KEYED_DATA	(0x4 << 4)
#define SBN_SGL_INVALIDATE	0x0f
#define SBN_SC_ABORT_REQ	0x7
#define SBN_AEN_CID		0xfffe

struct sbn_keyed_sgl {
	__le64	addr;
	__le32	length;
	__le32	key;
	u8	type;
	u8	rsvd[7];
};

struct sbn_cmd {
	u8 opcode, flags;
	u16 command_id;
	__le32 nsid;
	__le64 rsvd;
	struct sbn_keyed_sgl dptr;
	__le32 cdw10[6];
};

struct sbn_cqe {
	__le64 result;
	u16 sq_head, sq_id, command_id, status;
};

struct sbn_queue;

struct sbn_qe {
	void			*data;
	u64			dma;
	struct ib_cqe		cqe;
	struct sbn_queue	*queue;
};

struct sbn_request {
	struct sbn_qe		sqe;
	struct sbn_queue	*queue;
	struct request		*rq;
	struct ib_sge		sge[1 + SBN_INLINE_SG_CNT];
	atomic_t		ref;
	u16			status;
	bool			need_inval;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct sg_table		sgt;
	struct scatterlist	first_sgl[SBN_INLINE_SG_CNT];
	int			nents;
	enum dma_data_direction	dir;
};

struct sbn_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*ib_cq;
	struct ib_qp		*qp;
	struct sbn_qe		*rsp_ring;
	struct sbn_request	*reqs;		/* indexed by command_id */
	int			queue_size;
	u32			pages_per_mr;
	int			qid;
	bool			live;
	struct work_struct	err_work;
};

static void sbn_error_recovery(struct sbn_queue *queue)
{
	if (!queue->live)
		return;
	queue->live = false;
	queue_work(system_wq, &queue->err_work);
}

static void sbn_wr_error(struct sbn_queue *queue, struct ib_wc *wc,
			 const char *op)
{
	pr_err("queue %d: %s for CQE 0x%p failed with status %s (%d)\n",
	       queue->qid, op, wc->wr_cqe, ib_wc_status_msg(wc->status),
	       wc->status);
	sbn_error_recovery(queue);
}

static void sbn_unmap_data(struct sbn_queue *queue, struct sbn_request *req)
{
	if (!blk_rq_nr_phys_segments(req->rq))
		return;

	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->sgt.nents, req->dir);
	sg_free_table_chained(&req->sgt, SBN_INLINE_SG_CNT);
}

static void sbn_end_request(struct sbn_request *req)
{
	sbn_unmap_data(req->queue, req);
	blk_mq_end_request(req->rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void sbn_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbn_request *req =
		container_of(wc->wr_cqe, struct sbn_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		sbn_wr_error(req->queue, wc, "MEMREG");
}

static void sbn_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbn_request *req =
		container_of(wc->wr_cqe, struct sbn_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		sbn_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}

	req->need_inval = false;
	if (atomic_dec_and_test(&req->ref))
		sbn_end_request(req);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV's own completion, after checking that it succeeded */
}

static void sbn_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbn_qe *qe = container_of(wc->wr_cqe, struct sbn_qe, cqe);
	struct sbn_request *req = container_of(qe, struct sbn_request, sqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		sbn_wr_error(req->queue, wc, "SEND");
		return;
	}

	if (atomic_dec_and_test(&req->ref))
		sbn_end_request(req);	/* OK: rdma-invalidation-leak -- the response path holds its reference until it has dealt with the rkey (remote invalidation or a completed LOCAL_INV) */
}

static int sbn_inv_rkey(struct sbn_queue *queue, struct sbn_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = sbn_inv_rkey_done;
	wr.wr_cqe = &req->inv_cqe;

	return ib_post_send(queue->qp, &wr, NULL);
}

static int sbn_map_data(struct sbn_queue *queue, struct sbn_request *req,
			struct sbn_cmd *c)
{
	struct sbn_keyed_sgl *sg = &c->dptr;
	int ret, nr;

	req->sgt.sgl = req->first_sgl;
	ret = sg_alloc_table_chained(&req->sgt,
			blk_rq_nr_phys_segments(req->rq), req->sgt.sgl,
			SBN_INLINE_SG_CNT);
	if (ret)
		return -ENOMEM;
	req->sgt.nents = blk_rq_map_sg(NULL, req->rq, req->sgt.sgl);
	req->dir = rq_data_dir(req->rq) == WRITE ? DMA_TO_DEVICE :
						   DMA_FROM_DEVICE;

	req->nents = ib_dma_map_sg(queue->ibdev, req->sgt.sgl,
				   req->sgt.nents, req->dir);
	if (unlikely(req->nents <= 0)) {
		ret = -EIO;
		goto out_free_table;
	}

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr)) {
		ret = -EAGAIN;
		goto out_unmap_sg;
	}

	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, req->nents, NULL, SZ_4K);
	if (unlikely(nr < req->nents)) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- nothing was registered or advertised with this MR yet */
		req->mr = NULL;
		ret = nr < 0 ? nr : -EINVAL;
		goto out_unmap_sg;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = sbn_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	req->need_inval = true;

	sg->addr = cpu_to_le64(req->mr->iova);
	sg->length = cpu_to_le32(req->mr->length);
	sg->key = cpu_to_le32(req->mr->rkey);
	sg->type = SBN_SGL_KEYED_DATA | SBN_SGL_INVALIDATE;
	return 0;

out_unmap_sg:
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->sgt.nents, req->dir);
out_free_table:
	sg_free_table_chained(&req->sgt, SBN_INLINE_SG_CNT);
	return ret;
}

static int sbn_post_send(struct sbn_queue *queue, struct sbn_qe *qe,
			 struct ib_sge *sge, u32 num_sge,
			 struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr = qe->dma;
	sge->length = SBN_CMD_SIZE;
	sge->lkey = queue->pd->local_dma_lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = sge;
	wr.num_sge = num_sge;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;

	ret = ib_post_send(queue->qp, first, NULL);
	if (unlikely(ret))
		pr_err("queue %d: ib_post_send failed (%d)\n", queue->qid, ret);
	return ret;
}

static blk_status_t sbn_queue_rq(struct sbn_queue *queue, struct request *rq)
{
	struct sbn_request *req = blk_mq_rq_to_pdu(rq);
	struct sbn_cmd *c = req->sqe.data;
	int err;

	if (!queue->live)
		return BLK_STS_RESOURCE;

	req->queue = queue;
	req->rq = rq;
	req->mr = NULL;
	req->status = 0;
	req->need_inval = false;
	atomic_set(&req->ref, 2);	/* SEND and response */

	memset(c, 0, sizeof(*c));
	c->command_id = req - queue->reqs;
	blk_mq_start_request(rq);

	if (blk_rq_nr_phys_segments(rq)) {
		err = sbn_map_data(queue, req, c);
		if (unlikely(err < 0))
			goto err;
	}

	req->sqe.cqe.done = sbn_send_done;
	err = sbn_post_send(queue, &req->sqe, req->sge, 1,
			    req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(err))
		goto err_unmap;

	return BLK_STS_OK;

err_unmap:
	sbn_unmap_data(queue, req);	/* OK: rdma-invalidation-leak -- the post failed, the REG_MR never reached the device and the command never left */
err:
	return err == -ENOMEM || err == -EAGAIN ? BLK_STS_RESOURCE :
						  BLK_STS_IOERR;
}

static int sbn_handle_aen(struct sbn_queue *queue, struct sbn_cqe *cqe,
			  struct ib_wc *wc)
{
	if (unlikely(wc->wc_flags & IB_WC_WITH_INVALIDATE)) {
		pr_err("queue %d: remote invalidation on an AEN completion\n",
		       queue->qid);
		return -EPROTO;	/* OK: rdma-remote-invalidate-unchecked -- an AEN carries no key; the invalidation is refused, not accepted */
	}

	pr_info("queue %d: async event 0x%llx\n", queue->qid,
		le64_to_cpu(cqe->result));
	return 0;
}

static void sbn_process_rsp(struct sbn_queue *queue, struct sbn_cqe *cqe,
			    struct ib_wc *wc)
{
	struct sbn_request *req;
	int ret;

	if (unlikely(cqe->command_id >= queue->queue_size)) {
		pr_err("queue %d: bogus command id %u\n", queue->qid,
		       cqe->command_id);
		sbn_error_recovery(queue);
		return;
	}
	req = &queue->reqs[cqe->command_id];
	req->status = cqe->status >> 1;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("queue %d: bogus remote invalidation of rkey %#x\n",
			       queue->qid, wc->ex.invalidate_rkey);
			sbn_error_recovery(queue);
		}
		req->need_inval = false;	/* BUG: rdma-remote-invalidate-unchecked -- on a mismatch the request is still finished below while its own rkey stays valid */
	} else if (req->need_inval) {
		ret = sbn_inv_rkey(queue, req);
		if (unlikely(ret < 0)) {
			pr_err("queue %d: LOCAL_INV of rkey %#x failed (%d)\n",
			       queue->qid, req->mr->rkey, ret);
			sbn_error_recovery(queue);
		}
		/* finished from sbn_inv_rkey_done() */
		return;
	}

	if (atomic_dec_and_test(&req->ref))
		sbn_end_request(req);
}

static int sbn_post_recv(struct sbn_queue *queue, struct sbn_qe *qe)
{
	struct ib_sge sge = {
		.addr = qe->dma, .length = SBN_RSP_SIZE,
		.lkey = queue->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &qe->cqe, .sg_list = &sge, .num_sge = 1,
	};

	return ib_post_recv(queue->qp, &wr, NULL);
}

static void sbn_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbn_qe *qe = container_of(wc->wr_cqe, struct sbn_qe, cqe);
	struct sbn_queue *queue = qe->queue;
	struct sbn_cqe *cqe = qe->data;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		sbn_wr_error(queue, wc, "RECV");
		return;
	}

	ib_dma_sync_single_for_cpu(queue->ibdev, qe->dma, SBN_RSP_SIZE,
				   DMA_FROM_DEVICE);
	if (unlikely(cqe->command_id == SBN_AEN_CID))
		sbn_handle_aen(queue, cqe, wc);
	else
		sbn_process_rsp(queue, cqe, wc);
	ib_dma_sync_single_for_device(queue->ibdev, qe->dma, SBN_RSP_SIZE,
				      DMA_FROM_DEVICE);

	sbn_post_recv(queue, qe);
}

static enum blk_eh_timer_return sbn_timeout(struct request *rq)
{
	struct sbn_request *req = blk_mq_rq_to_pdu(rq);
	struct sbn_queue *queue = req->queue;

	pr_warn("queue %d: I/O tag %ld timed out, aborting\n", queue->qid,
		(long)(req - queue->reqs));

	/*
	 * Fail the command back to the block layer and recycle the tag; the
	 * queue itself stays connected.
	 */
	req->status = SBN_SC_ABORT_REQ;
	sbn_unmap_data(queue, req);	/* BUG: rdma-invalidation-leak -- the MR goes back to the pool with its rkey still valid at the target, no LOCAL_INV was posted */
	blk_mq_end_request(rq, BLK_STS_TIMEOUT);
	return BLK_EH_DONE;
}

static int sbn_create_qp(struct sbn_queue *queue, const int factor)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	/* +1 for ib_drain_qp */
	/* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV of a command fit the 3 entries per slot, plus one for the drain */
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1; /* BUG: rdma-send-queue-manual-factor -- hand-made MR/SEND/INV factor instead of declaring max_rdma_ctxs */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + SBN_INLINE_SG_CNT;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;
	init_attr.qp_context = queue;

	ret = rdma_create_qp(queue->cm_id, queue->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

static int sbn_create_queue_ib(struct sbn_queue *queue)
{
	int ret, i;

	queue->ibdev = queue->cm_id->device;
	queue->ib_cq = ib_cq_pool_get(queue->ibdev, 4 * queue->queue_size + 1,
				      queue->qid, IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	/* MR, SEND, INV */
	ret = sbn_create_qp(queue, 3);
	if (ret)
		goto out_put_cq;

	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs,
			      queue->queue_size, IB_MR_TYPE_MEM_REG,
			      queue->pages_per_mr, 0);
	if (ret)
		goto out_destroy_qp;

	for (i = 0; i < queue->queue_size; i++) {
		queue->rsp_ring[i].queue = queue;
		queue->rsp_ring[i].cqe.done = sbn_recv_done;
		ret = sbn_post_recv(queue, &queue->rsp_ring[i]);
		if (ret)
			goto out_destroy_mr_pool;
	}
	queue->live = true;
	return 0;

out_destroy_mr_pool:
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_put_cq:
	ib_cq_pool_put(queue->ib_cq, 4 * queue->queue_size + 1);
	return ret;
}

static void sbn_stop_queue(struct sbn_queue *queue)
{
	queue->live = false;
	rdma_disconnect(queue->cm_id);
	ib_drain_qp(queue->qp);
}

static void sbn_destroy_queue_ib(struct sbn_queue *queue)
{
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_cq_pool_put(queue->ib_cq, 4 * queue->queue_size + 1);
}

struct sbn_queue_ops {
	int (*start)(struct sbn_queue *queue);
	void (*stop)(struct sbn_queue *queue);
	void (*free)(struct sbn_queue *queue);
	blk_status_t (*queue_rq)(struct sbn_queue *queue, struct request *rq);
	enum blk_eh_timer_return (*timeout)(struct request *rq);
};

const struct sbn_queue_ops sbn_rdma_queue_ops = {
	.start		= sbn_create_queue_ib,
	.stop		= sbn_stop_queue,
	.free		= sbn_destroy_queue_ib,
	.queue_rq	= sbn_queue_rq,
	.timeout	= sbn_timeout,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb NVMe/RDMA style host queues");
