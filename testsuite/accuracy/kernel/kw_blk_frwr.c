// SPDX-License-Identifier: GPL-2.0
/*
 * kwb -- blk-mq host driver for a capsule protocol over RDMA (nvme-rdma
 * shaped).
 *
 * Each I/O queue owns one RC QP.  Data buffers are exposed to the target
 * with fast-registration MRs taken from per-QP pools (ib_mr_pool_init at
 * queue setup: rdma_mrs for plain I/O, sig_mrs for protection information).
 * A request posts REG_MR chained in front of its command SEND; the target
 * normally invalidates the rkey with SEND_WITH_INV, and the host falls back
 * to a LOCAL_INV when it did not.
 *
 * Correct: pool allocation and teardown, the plain mapping path's error
 * handling, signaled SENDs and LOCAL_INVs.  Not correct: the send queue is
 * sized for REG_MR + SEND only (the LOCAL_INV fallback has no room), host
 * READ buffers are registered with remote write but without local write,
 * the PI mapping path leaks its MR on a short map, and a failed LOCAL_INV
 * post forgets the MR instead of returning it to the pool.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed in this driver
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/scatterlist.h>
#include <linux/blk-mq.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define KWB_SQ_FACTOR		2	/* REG_MR + SEND; the target invalidates */
#define KWB_INLINE_SEGS		1
#define KWB_MAX_SEGS		128
#define KWB_CMD_SIZE		64

struct kwb_keyed_sgl {
	__le64	addr;
	__le32	length;
	__le32	key;
};

struct kwb_cmd {
	u8			opcode;
	u8			flags;
	__le16			cid;
	__le32			nsid;
	__le64			slba;
	struct kwb_keyed_sgl	dptr;
	struct kwb_keyed_sgl	mptr;
	u8			rsvd[16];
};

struct kwb_cqe {
	__le16	cid;
	__le16	status;
	__le32	result;
};

struct kwb_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	struct request_queue	*blkq;
	int			queue_size;
	int			comp_vector;
	bool			pi_support;
	unsigned long		flags;
	struct work_struct	err_work;
};

struct kwb_request {
	struct kwb_queue	*queue;
	struct request		*rq;
	struct kwb_cmd		*cmd;
	u64			cmd_dma;

	struct ib_mr		*mr;
	bool			use_pi;
	struct ib_cqe		reg_cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		sge[1 + KWB_INLINE_SEGS];
	int			num_sge;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	inv_wr;

	struct sg_table		data_sgt;
	struct sg_table		meta_sgt;
	int			nents;
	int			status;
};

static void kwb_memreg_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwb_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwb_inv_done(struct ib_cq *cq, struct ib_wc *wc);

static void kwb_error_recovery(struct kwb_queue *q)
{
	queue_work(system_wq, &q->err_work);
}

static int kwb_create_queue_ib(struct kwb_queue *q)
{
	struct ib_device *ibdev = q->cm_id->device;
	struct ib_qp_init_attr init_attr;
	u32 pages;
	int ret;

	q->ibdev = ibdev;
	q->cq = ib_alloc_cq(ibdev, q, 3 * q->queue_size + 1, q->comp_vector,
			    IB_POLL_SOFTIRQ);
	if (IS_ERR(q->cq))
		return PTR_ERR(q->cq);

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = q;
	init_attr.send_cq = q->cq;
	init_attr.recv_cq = q->cq;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* +1 for ib_drain_qp */
	init_attr.cap.max_send_wr = KWB_SQ_FACTOR * q->queue_size + 1;	// BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a request can hold REG_MR, SEND and the LOCAL_INV fallback (3 WRs) but only 2 per request are reserved; the factor is hand-made
	init_attr.cap.max_recv_wr = q->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + KWB_INLINE_SEGS;
	if (q->pi_support)
		init_attr.create_flags |= IB_QP_CREATE_INTEGRITY_EN;

	ret = rdma_create_qp(q->cm_id, q->pd, &init_attr);
	if (ret)
		goto out_free_cq;
	q->qp = q->cm_id->qp;

	pages = min_t(u32, ibdev->attrs.max_fast_reg_page_list_len, KWB_MAX_SEGS);
	ret = ib_mr_pool_init(q->qp, &q->qp->rdma_mrs, q->queue_size,
			      IB_MR_TYPE_MEM_REG, pages, 0);
	if (ret) {
		pr_err("kwb: failed to init MR pool: %d\n", ret);
		goto out_destroy_qp;
	}
	if (q->pi_support) {
		ret = ib_mr_pool_init(q->qp, &q->qp->sig_mrs, q->queue_size,
				      IB_MR_TYPE_INTEGRITY, pages, pages);
		if (ret) {
			pr_err("kwb: failed to init PI MR pool: %d\n", ret);
			goto out_destroy_mr_pool;
		}
	}
	return 0;

out_destroy_mr_pool:
	ib_mr_pool_destroy(q->qp, &q->qp->rdma_mrs);
out_destroy_qp:
	rdma_destroy_qp(q->cm_id);
out_free_cq:
	ib_free_cq(q->cq);
	return ret;
}

static void kwb_destroy_queue_ib(struct kwb_queue *q)
{
	ib_drain_qp(q->qp);
	if (q->pi_support)
		ib_mr_pool_destroy(q->qp, &q->qp->sig_mrs);
	ib_mr_pool_destroy(q->qp, &q->qp->rdma_mrs);
	rdma_destroy_qp(q->cm_id);
	ib_free_cq(q->cq);
}

static void kwb_set_keyed_sgl(struct kwb_keyed_sgl *sg, u64 addr, u32 len, u32 key)
{
	sg->addr = cpu_to_le64(addr);
	sg->length = cpu_to_le32(len);
	sg->key = cpu_to_le32(key);
}

static void kwb_prep_reg_wr(struct kwb_request *req, int opcode)
{
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_cqe.done = kwb_memreg_done;
	req->reg_wr.wr.opcode = opcode;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
}

static int kwb_map_sg_fr(struct kwb_queue *q, struct kwb_request *req, int count)
{
	int access;
	int nr;

	req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);	// OK: rdma-registration-in-datapath -- taken from the pool allocated at queue setup, nothing is allocated here
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	nr = ib_map_mr_sg(req->mr, req->data_sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL;	// OK: rdma-mr-leak -- the MR went back to rdma_mrs just above
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	kwb_prep_reg_wr(req, IB_WR_REG_MR);
	access = IB_ACCESS_REMOTE_READ;		/* host write: the target pulls */
	if (rq_data_dir(req->rq) != WRITE)
		access = IB_ACCESS_REMOTE_WRITE;	/* host read: the target pushes */
	req->reg_wr.access = access;	// BUG: rdma-access-flags-invalid -- on the host-read path the MR gets IB_ACCESS_REMOTE_WRITE without IB_ACCESS_LOCAL_WRITE; the REG_MR completes in error

	kwb_set_keyed_sgl(&req->cmd->dptr, req->mr->iova, req->mr->length,
			  req->mr->rkey);
	return 0;
}

static int kwb_map_sg_pi(struct kwb_queue *q, struct kwb_request *req,
			 int count, int pi_count)
{
	int nr;

	req->mr = ib_mr_pool_get(q->qp, &q->qp->sig_mrs);	// OK: rdma-registration-in-datapath -- from the PI pool set up with the queue
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;
	req->use_pi = true;

	nr = ib_map_mr_sg_pi(req->mr, req->data_sgt.sgl, count, NULL,
			     req->meta_sgt.sgl, pi_count, NULL, SZ_4K);
	if (unlikely(nr))
		return -EINVAL;	// BUG: rdma-mr-leak -- the integrity MR taken from sig_mrs is not put back on a failed map

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	kwb_prep_reg_wr(req, IB_WR_REG_MR_INTEGRITY);
	/* OK: rdma-access-flags-invalid -- local write is granted together with remote write */
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	kwb_set_keyed_sgl(&req->cmd->dptr, req->mr->iova, req->mr->length,
			  req->mr->rkey);
	return 0;
}

static int kwb_map_data(struct kwb_queue *q, struct kwb_request *req)
{
	struct request *rq = req->rq;
	int count, ret;

	req->num_sge = 1;
	req->use_pi = false;
	req->mr = NULL;
	if (!blk_rq_nr_phys_segments(rq))
		return 0;

	ret = sg_alloc_table_chained(&req->data_sgt, blk_rq_nr_phys_segments(rq),
				     NULL, 0);
	if (ret)
		return -ENOMEM;
	req->nents = blk_rq_map_sg(q->blkq, rq, req->data_sgt.sgl);
	count = ib_dma_map_sg(q->ibdev, req->data_sgt.sgl, req->nents,
			      rq_data_dir(rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	if (unlikely(count <= 0)) {
		ret = -EIO;
		goto out_free_table;
	}

	if (q->pi_support && req->meta_sgt.nents)
		ret = kwb_map_sg_pi(q, req, count, req->meta_sgt.nents);
	else
		ret = kwb_map_sg_fr(q, req, count);
	if (ret)
		goto out_unmap_sg;
	return 0;

out_unmap_sg:
	ib_dma_unmap_sg(q->ibdev, req->data_sgt.sgl, req->nents,
			rq_data_dir(rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
out_free_table:
	sg_free_table_chained(&req->data_sgt, 0);
	return ret;
}

static void kwb_unmap_data(struct kwb_queue *q, struct kwb_request *req)
{
	struct request *rq = req->rq;

	if (!blk_rq_nr_phys_segments(rq))
		return;
	if (req->mr) {
		ib_mr_pool_put(q->qp, req->use_pi ? &q->qp->sig_mrs : &q->qp->rdma_mrs,
			       req->mr);
		req->mr = NULL;	// OK: rdma-mr-leak -- returned to its pool on the line above
	}
	ib_dma_unmap_sg(q->ibdev, req->data_sgt.sgl, req->nents,
			rq_data_dir(rq) == WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE);
	sg_free_table_chained(&req->data_sgt, 0);
}

static int kwb_post_send(struct kwb_queue *q, struct kwb_request *req,
			 struct ib_send_wr *first)
{
	struct ib_send_wr *wr = &req->send_wr;

	req->sge[0].addr = req->cmd_dma;
	req->sge[0].length = sizeof(struct kwb_cmd);
	req->sge[0].lkey = q->pd->local_dma_lkey;

	req->send_cqe.done = kwb_send_done;
	wr->next = NULL;
	wr->wr_cqe = &req->send_cqe;
	wr->sg_list = req->sge;
	wr->num_sge = req->num_sge;
	wr->opcode = IB_WR_SEND;
	wr->send_flags = IB_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- every command SEND is signaled, which also retires the unsignaled REG_MR in front of it

	if (first)
		first->next = wr;
	else
		first = wr;
	return ib_post_send(q->qp, first, NULL);
}

blk_status_t kwb_queue_rq(struct kwb_queue *q, const struct blk_mq_queue_data *bd)
{
	struct request *rq = bd->rq;
	struct kwb_request *req = blk_mq_rq_to_pdu(rq);
	int ret;

	req->queue = q;
	req->rq = rq;
	req->status = 0;
	ib_dma_sync_single_for_cpu(q->ibdev, req->cmd_dma, sizeof(*req->cmd),
				   DMA_TO_DEVICE);
	ret = kwb_map_data(q, req);
	if (unlikely(ret))
		return ret == -EAGAIN ? BLK_STS_RESOURCE : BLK_STS_IOERR;
	ib_dma_sync_single_for_device(q->ibdev, req->cmd_dma, sizeof(*req->cmd),
				      DMA_TO_DEVICE);

	blk_mq_start_request(rq);
	ret = kwb_post_send(q, req, req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(ret)) {
		kwb_unmap_data(q, req);
		return BLK_STS_IOERR;
	}
	return BLK_STS_OK;
}

static int kwb_inv_rkey(struct kwb_queue *q, struct kwb_request *req)
{
	int ret;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_cqe.done = kwb_inv_done;
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;

	ret = ib_post_send(q->qp, &req->inv_wr, NULL);
	if (unlikely(ret)) {
		pr_err("kwb: LOCAL_INV post failed: %d\n", ret);
		req->mr = NULL;	// BUG: rdma-mr-leak -- the pool MR is dropped without ib_mr_pool_put(); kwb_unmap_data() will not see it
		kwb_error_recovery(q);
	}
	return ret;
}

static void kwb_end_request(struct kwb_request *req)
{
	kwb_unmap_data(req->queue, req);
	blk_mq_end_request(req->rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

void kwb_process_response(struct kwb_queue *q, struct kwb_request *req,
			  struct ib_wc *wc, struct kwb_cqe *cqe)
{
	req->status = le32_to_cpu(cqe->result) ? -EIO : 0;
	if (!req->mr) {
		kwb_end_request(req);
		return;
	}
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
	    wc->ex.invalidate_rkey == req->mr->rkey) {
		kwb_end_request(req);
		return;
	}
	if (kwb_inv_rkey(q, req)) {
		req->status = -EIO;
		kwb_end_request(req);
	}
}

static void kwb_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwb_request *req = container_of(wc->wr_cqe, struct kwb_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("kwb: MEMREG failed: %s\n", ib_wc_status_msg(wc->status));
		kwb_error_recovery(req->queue);
	}
}

static void kwb_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwb_request *req = container_of(wc->wr_cqe, struct kwb_request, send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("kwb: SEND failed: %s\n", ib_wc_status_msg(wc->status));
		kwb_error_recovery(req->queue);
	}
}

static void kwb_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwb_request *req = container_of(wc->wr_cqe, struct kwb_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("kwb: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		kwb_error_recovery(req->queue);
		return;
	}
	kwb_end_request(req);
}

int kwb_start_queue(struct kwb_queue *q, struct rdma_cm_id *cm_id,
		    struct ib_pd *pd, int queue_size, bool pi)
{
	q->cm_id = cm_id;
	q->pd = pd;
	q->queue_size = queue_size;
	q->pi_support = pi;
	return kwb_create_queue_ib(q);
}

void kwb_stop_queue(struct kwb_queue *q)
{
	kwb_destroy_queue_ib(q);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kwb block host over RDMA");
