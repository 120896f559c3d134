// SPDX-License-Identifier: GPL-2.0
/*
 * tb_nvmr_host.c - NVMe over Fabrics RDMA host, I/O queue data path.
 *
 * One RC QP per I/O queue. A command with more segments than fit inline
 * takes a fast-registration MR from the QP's MR pool, registers the
 * command's scatterlist with a REG_MR chained in front of the command
 * capsule SEND, and puts the rkey into a keyed SGL descriptor. The target
 * normally answers with SEND_WITH_INV; the response handler compares the
 * invalidated rkey with the request's MR and otherwise posts a signaled
 * LOCAL_INV and ends the request from its completion. The MR goes back to
 * the pool from the blk-mq ->complete() callback.
 *
 * Known problems in this version: a short ib_map_mr_sg() returns without
 * putting the pool MR back; the timeout handler fails a request of a
 * non-live queue on the spot, handing its pages and MR back while the rkey
 * it advertised is still valid; the send queue is sized with a hand-made
 * "3 WRs per command" factor.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/atomic.h>
#include <linux/blk-mq.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/unaligned.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define TB_NVMR_MAX_SEGMENTS		256
#define TB_NVMR_INLINE_SEGMENTS		4
#define TB_NVMR_CQE_BUF_SIZE		16

#define TB_SGL_FMT_KEYED_DATA		0x40
#define TB_SGL_FMT_INVALIDATE		0x0f
#define TB_SC_HOST_ABORTED_CMD		0x371

struct tb_keyed_sgl_desc {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct tb_nvme_cmd {
	u8			opcode, flags;
	u16			command_id;
	__le32			nsid;
	__le64			rsvd2[2];
	struct tb_keyed_sgl_desc dptr;
	__le32			cdw10[6];
};

struct tb_nvme_cqe {
	__le64	result;
	__le16	sq_head, sq_id;
	u16	command_id;
	__le16	status;
};

struct tb_rdma_queue;

struct tb_qe {
	void			*data;
	u64			dma;
	struct ib_cqe		cqe;
	struct tb_rdma_queue	*queue;
};

struct tb_rdma_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
};
struct tb_rdma_queue {
	struct tb_qe		*rsp_ring;
	int			queue_size;
	int			idx;
	bool			live;
	struct tb_rdma_device	*device;
	struct ib_cq		*ib_cq;
	struct ib_qp		*qp;
	struct rdma_cm_id	*cm_id;
	struct work_struct	err_work;
	u32			max_fr_pages;
};

struct tb_rdma_request {
	struct tb_qe		sqe;
	struct ib_sge		sge[1 + TB_NVMR_INLINE_SEGMENTS];
	u32			num_sge;
	atomic_t		ref;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct tb_rdma_queue	*queue;
	struct sg_table		sgt;
	struct scatterlist	first_sgl[SG_CHUNK_SIZE];
	int			nents;
	u16			status;
};

/* provided by the fabrics core */
struct request *tb_nvme_find_rq(struct tb_rdma_queue *queue, u16 command_id);
struct request_queue *tb_nvme_request_queue(struct tb_rdma_queue *queue);

static void tb_nvmr_error_recovery(struct tb_rdma_queue *queue)
{
	queue->live = false;
	schedule_work(&queue->err_work);
}

static void tb_nvmr_wr_error(struct tb_rdma_queue *queue, struct ib_wc *wc,
			     const char *op)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("%s for CQE 0x%p failed with status %s (%d)\n", op,
		       wc->wr_cqe, ib_wc_status_msg(wc->status), wc->status);
	tb_nvmr_error_recovery(queue);
}

static void tb_nvmr_unmap_data(struct tb_rdma_queue *queue, struct request *rq)
{
	struct tb_rdma_request *req = blk_mq_rq_to_pdu(rq);

	if (!blk_rq_nr_phys_segments(rq))
		return;

	if (req->mr) {
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL; /* OK: rdma-mr-leak -- cleared only after ib_mr_pool_put() */
	}

	ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->nents,
			rq_data_dir(rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
}

static void tb_nvmr_end_request(struct tb_rdma_request *req)
{
	struct request *rq = blk_mq_rq_from_pdu(req);

	if (!atomic_dec_and_test(&req->ref))
		return;
	if (!blk_mq_complete_request_remote(rq))
		blk_mq_complete_request(rq);
}

/* blk_mq_ops->complete */
static void tb_nvmr_complete_rq(struct request *rq)
{
	struct tb_rdma_request *req = blk_mq_rq_to_pdu(rq);

	/* OK: rdma-invalidation-leak -- reached only after the checked remote invalidation or the LOCAL_INV completion */
	tb_nvmr_unmap_data(req->queue, rq);
	blk_mq_end_request(rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void tb_nvmr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tb_rdma_request *req =
		container_of(wc->wr_cqe, struct tb_rdma_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		tb_nvmr_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}
	tb_nvmr_end_request(req); /* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
}

static int tb_nvmr_inv_rkey(struct tb_rdma_queue *queue,
			    struct tb_rdma_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->reg_cqe.done = tb_nvmr_inv_rkey_done;
	wr.wr_cqe = &req->reg_cqe;

	return ib_post_send(queue->qp, &wr, NULL);
}

static int tb_nvmr_map_sg_fr(struct tb_rdma_queue *queue,
			     struct tb_rdma_request *req,
			     struct tb_nvme_cmd *c, int count)
{
	struct tb_keyed_sgl_desc *sg = &c->dptr;
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN; /* OK: rdma-mr-leak -- the pool had nothing to give */

	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		pr_err("tb_nvmr: mapped %d of %d segments\n", nr, count);
		return nr < 0 ? nr : -EINVAL; /* BUG: rdma-mr-leak -- req->mr from ib_mr_pool_get() is never put back on this path */
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	sg->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, sg->length);
	put_unaligned_le32(req->mr->rkey, sg->key);
	sg->type = TB_SGL_FMT_KEYED_DATA | TB_SGL_FMT_INVALIDATE;

	return 0;
}

static int tb_nvmr_map_data(struct tb_rdma_queue *queue, struct request *rq,
			    struct tb_nvme_cmd *c)
{
	struct tb_rdma_request *req = blk_mq_rq_to_pdu(rq);
	struct ib_device *ibdev = queue->device->dev;
	enum dma_data_direction dir;
	int count, ret;

	req->num_sge = 1;
	req->mr = NULL;
	atomic_set(&req->ref, 2); /* send completion and response */

	if (!blk_rq_nr_phys_segments(rq))
		return 0;

	dir = rq_data_dir(rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	req->sgt.sgl = req->first_sgl;
	ret = sg_alloc_table_chained(&req->sgt, blk_rq_nr_phys_segments(rq),
				     req->sgt.sgl, SG_CHUNK_SIZE);
	if (ret)
		return -ENOMEM;

	req->nents = blk_rq_map_sg(tb_nvme_request_queue(queue), rq, req->sgt.sgl);
	count = ib_dma_map_sg(ibdev, req->sgt.sgl, req->nents, dir);
	if (unlikely(count <= 0)) {
		ret = -EIO;
		goto out_free_table;
	}

	ret = tb_nvmr_map_sg_fr(queue, req, c, count);
	if (!ret)
		return 0;

	ib_dma_unmap_sg(ibdev, req->sgt.sgl, req->nents, dir);
out_free_table:
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
	return ret;
}

static void tb_nvmr_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tb_qe *qe = container_of(wc->wr_cqe, struct tb_qe, cqe);
	struct tb_rdma_request *req =
		container_of(qe, struct tb_rdma_request, sqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		tb_nvmr_wr_error(req->queue, wc, "SEND");
		return;
	}
	tb_nvmr_end_request(req);
}

static int tb_nvmr_post_send(struct tb_rdma_queue *queue, struct tb_qe *qe,
			     struct ib_sge *sge, u32 num_sge,
			     struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr   = qe->dma;
	sge->length = sizeof(struct tb_nvme_cmd);
	sge->lkey   = queue->device->pd->local_dma_lkey;

	wr.next       = NULL;
	wr.wr_cqe     = &qe->cqe;
	wr.sg_list    = sge;
	wr.num_sge    = num_sge;
	wr.opcode     = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	if (first)
		first->next = &wr;
	else
		first = &wr;

	ret = ib_post_send(queue->qp, first, NULL);
	if (unlikely(ret))
		pr_err("tb_nvmr: ib_post_send failed: %d\n", ret);
	return ret;
}

static blk_status_t tb_nvmr_queue_rq(struct tb_rdma_queue *queue,
				     struct request *rq)
{
	struct tb_rdma_request *req = blk_mq_rq_to_pdu(rq);
	struct tb_nvme_cmd *c = req->sqe.data;
	int err;

	req->queue = queue;
	blk_mq_start_request(rq);

	err = tb_nvmr_map_data(queue, rq, c);
	if (unlikely(err < 0))
		goto err;

	req->sqe.cqe.done = tb_nvmr_send_done;
	err = tb_nvmr_post_send(queue, &req->sqe, req->sge, req->num_sge,
				req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(err))
		goto err_unmap;

	return BLK_STS_OK;

err_unmap:
	tb_nvmr_unmap_data(queue, rq); /* OK: rdma-invalidation-leak -- the post carrying the REG_MR failed, the rkey never reached the target */
err:
	if (err == -ENOMEM || err == -EAGAIN)
		return BLK_STS_RESOURCE;
	return BLK_STS_IOERR;
}

static void tb_nvmr_process_rsp(struct tb_rdma_queue *queue,
				struct tb_nvme_cqe *cqe, struct ib_wc *wc)
{
	struct tb_rdma_request *req;
	struct request *rq;

	rq = tb_nvme_find_rq(queue, cqe->command_id);
	if (!rq) {
		pr_err("tb_nvmr: bogus command id %u on queue %d\n",
		       cqe->command_id, queue->idx);
		tb_nvmr_error_recovery(queue);
		return;
	}
	req = blk_mq_rq_to_pdu(rq);
	req->status = cqe->status;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared and a mismatch returns */
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("tb_nvmr: bogus remote invalidation of rkey %#x\n",
			       wc->ex.invalidate_rkey);
			tb_nvmr_error_recovery(queue);
			return;
		}
	} else if (req->mr) {
		int ret = tb_nvmr_inv_rkey(queue, req);

		if (unlikely(ret < 0)) {
			pr_err("tb_nvmr: LOCAL_INV for MR %#x failed: %d\n",
			       req->mr->rkey, ret);
			tb_nvmr_error_recovery(queue);
		}
		/* OK: rdma-unmap-before-invalidate -- nothing is released here; the LOCAL_INV completion ends the request */
		return;
	}

	tb_nvmr_end_request(req);
}

static void tb_nvmr_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tb_qe *qe = container_of(wc->wr_cqe, struct tb_qe, cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS ||
		     wc->byte_len < TB_NVMR_CQE_BUF_SIZE)) {
		tb_nvmr_wr_error(qe->queue, wc, "RECV");
		return;
	}
	tb_nvmr_process_rsp(qe->queue, qe->data, wc);
}

static enum blk_eh_timer_return tb_nvmr_timeout(struct request *rq)
{
	struct tb_rdma_request *req = blk_mq_rq_to_pdu(rq);
	struct tb_rdma_queue *queue = req->queue;

	pr_warn("tb_nvmr: I/O tag timeout on queue %d\n", queue->idx);

	if (!queue->live) {
		/*
		 * Connecting or deleting: nobody is going to answer this
		 * command, so fail it right away.
		 */
		req->status = TB_SC_HOST_ABORTED_CMD;
		tb_nvmr_unmap_data(queue, rq); /* BUG: rdma-invalidation-leak -- the REG_MR went out with the capsule; MR and pages are handed back with the rkey still valid */
		blk_mq_end_request(rq, BLK_STS_IOERR);
		return BLK_EH_DONE;
	}

	tb_nvmr_error_recovery(queue);
	return BLK_EH_RESET_TIMER;
}

static int tb_nvmr_create_qp(struct tb_rdma_queue *queue, const int factor)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.event_handler = NULL;
	init_attr.qp_context = queue;
	/* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV per command: 3 per slot plus one for ib_drain_qp() */
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1; /* BUG(file): rdma-send-queue-manual-factor -- the "MR, SEND, INV" factor is hand-made */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + TB_NVMR_INLINE_SEGMENTS;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;

	ret = rdma_create_qp(queue->cm_id, queue->device->pd, &init_attr);
	queue->qp = queue->cm_id->qp;
	return ret;
}

static int tb_nvmr_create_queue_ib(struct tb_rdma_queue *queue)
{
	struct ib_device *ibdev = queue->device->dev;
	const int send_wr_factor = 3;	/* MR, SEND, INV */
	const int cq_factor = send_wr_factor + 1;	/* + RECV */
	int ret;

	/* OK: rdma-send-queue-manual-factor -- this sizes the CQ, not the send queue */
	queue->ib_cq = ib_alloc_cq(ibdev, queue, cq_factor * queue->queue_size + 1,
				   queue->idx, IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	ret = tb_nvmr_create_qp(queue, send_wr_factor);
	if (ret)
		goto out_destroy_ib_cq;

	queue->max_fr_pages = min_t(u32, TB_NVMR_MAX_SEGMENTS,
				    ibdev->attrs.max_fast_reg_page_list_len);
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs,
			      queue->queue_size, IB_MR_TYPE_MEM_REG,
			      queue->max_fr_pages, 0);
	if (ret) {
		pr_err("tb_nvmr: failed to init MR pool for queue %d\n",
		       queue->idx);
		goto out_destroy_qp;
	}

	return 0;

out_destroy_qp:
	rdma_destroy_qp(queue->cm_id);
out_destroy_ib_cq:
	ib_free_cq(queue->ib_cq);
	return ret;
}

static void tb_nvmr_destroy_queue_ib(struct tb_rdma_queue *queue)
{
	ib_drain_qp(queue->qp);
	/* OK: rdma-invalidation-leak -- ib_mr_pool_destroy() deregisters every MR, which kills the keys */
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->ib_cq);
}

/* used by the transport glue (tb_nvmr_core.o) */
void *tb_nvmr_entry_points[] = {
	tb_nvmr_queue_rq, tb_nvmr_complete_rq, tb_nvmr_timeout,
	tb_nvmr_recv_done, tb_nvmr_create_queue_ib, tb_nvmr_destroy_queue_ib,
};

MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("NVMe over Fabrics RDMA host (tb)");
