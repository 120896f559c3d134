// SPDX-License-Identifier: GPL-2.0
/*
 * kv_nvme_rdma_host.c - NVMe over Fabrics RDMA host, I/O queue data path
 * (nvme-rdma style).
 *
 * A request whose data does not fit the inline SGE borrows a fast
 * registration MR from the QP's MR pool, maps the block layer scatterlist
 * into it, bumps the key's low byte and sends the rkey to the controller in
 * the command's keyed SGL descriptor with the "invalidate" sub-type, so the
 * target may answer with SEND_WITH_INV.  The response handler accepts a
 * remote invalidation only when it names the request's own rkey; otherwise
 * it posts a signaled LOCAL_INV and the request ends (MR back to the pool,
 * pages unmapped) from that LOCAL_INV's completion.  The command SEND holds
 * the second reference on the request.
 *
 * Known problems kept in this file:
 *  - the timeout handler of a queue that is no longer live ends the request
 *    while the target may still hold the request's key;
 *  - the keep-alive abort path hands the MR back and unmaps right after an
 *    unsignaled LOCAL_INV;
 *  - an oversize mapping is rejected without giving the MR back.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-unsignaled-send-starvation -- not the subject of this module; FRWR management is manual by design
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/atomic.h>
#include <linux/blk-mq.h>
#include <linux/workqueue.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define KVN_INLINE_SGES			1
#define KVN_MAX_MR_PAGES		128
#define KVN_MAX_KEYED_LEN		(1U << 24)
#define KVN_INLINE_DATA_SIZE		8192

#define KVN_SGL_FMT_DATA_DESC		0x00
#define KVN_KEY_SGL_FMT_DATA_DESC	0x04
#define KVN_SGL_FMT_OFFSET		0x01
#define KVN_SGL_FMT_INVALIDATE		0x0f
#define KVN_CMD_SGL_METABUF		0x40

#define KVN_SC_HOST_ABORTED_CMD		0x371

#define kvn_rq_dma_dir(rq) \
	(op_is_write(req_op(rq)) ? DMA_TO_DEVICE : DMA_FROM_DEVICE)

struct kvn_sgl_desc {
	__le64	addr;
	__le32	length;
	u8	rsvd[3];
	u8	type;
};

struct kvn_keyed_sgl_desc {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct kvn_command {
	u8		opcode;
	u8		flags;
	u16		command_id;
	__le32		nsid;
	__le64		rsvd2;
	__le64		metadata;
	union {
		struct kvn_sgl_desc		sgl;
		struct kvn_keyed_sgl_desc	ksgl;
	} dptr;
	__le32		cdw10[6];
};

struct kvn_completion {
	__le64		result;
	u16		sq_head;
	u16		sq_id;
	u16		command_id;
	u16		status;
};

struct kvn_queue;

struct kvn_qe {
	void			*data;
	u64			dma;
	struct ib_cqe		cqe;
	struct kvn_queue	*queue;
};

struct kvn_request {
	struct request		*rq;
	struct kvn_queue	*queue;
	u16			tag;
	struct kvn_qe		sqe;
	struct ib_sge		sge[1 + KVN_INLINE_SGES];
	u32			num_sge;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct sg_table		sgt;
	struct scatterlist	first_sgl[2];
	int			nents;
	atomic_t		ref;
	u16			status;
	u64			result;
};

struct kvn_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*ib_cq;
	struct kvn_request	**tags;
	int			queue_size;
	int			qid;
	bool			live;
	u32			pages_per_mr;
	struct work_struct	err_work;
};

static void kvn_error_recovery(struct kvn_queue *queue)
{
	if (!queue->live)
		return;
	queue->live = false;
	schedule_work(&queue->err_work);
}

static void kvn_wr_error(struct kvn_queue *queue, struct ib_wc *wc,
			 const char *op)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_info("qid %d: %s for CQE 0x%p failed with status %s (%d)\n",
			queue->qid, op, wc->wr_cqe,
			ib_wc_status_msg(wc->status), wc->status);
	kvn_error_recovery(queue);
}

static void kvn_unmap_data(struct kvn_queue *queue, struct kvn_request *req)
{
	struct request *rq = req->rq;

	if (!blk_rq_nr_phys_segments(rq))
		return;

	if (req->mr) {
		/* OK: rdma-invalidation-leak -- the completion path only gets here once the key is dead */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}

	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents,
			kvn_rq_dma_dir(rq));
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
}

static void kvn_end_request(struct kvn_request *req)
{
	struct request *rq = req->rq;

	if (!atomic_dec_and_test(&req->ref))
		return;
	kvn_unmap_data(req->queue, req);	/* OK: rdma-invalidation-leak -- last reference: the response path already saw the key invalidated */
	blk_mq_end_request(rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

static void kvn_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvn_request *req =
		container_of(wc->wr_cqe, struct kvn_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kvn_wr_error(req->queue, wc, "MEMREG");
}

static int kvn_map_sg_inline(struct kvn_queue *queue, struct kvn_request *req,
			     struct kvn_command *c, int count)
{
	struct kvn_sgl_desc *sg = &c->dptr.sgl;
	struct ib_sge *sge = &req->sge[1];
	struct scatterlist *sgl;
	u32 len = 0;
	int i;

	for_each_sg(req->sgt.sgl, sgl, count, i) {
		sge->addr = sg_dma_address(sgl);
		sge->length = sg_dma_len(sgl);
		sge->lkey = queue->pd->local_dma_lkey;
		len += sge->length;
		sge++;
	}

	sg->addr = cpu_to_le64(0);
	sg->length = cpu_to_le32(len);
	sg->type = (KVN_SGL_FMT_DATA_DESC << 4) | KVN_SGL_FMT_OFFSET;

	req->num_sge += count;
	return 0;
}

static int kvn_map_sg_fr(struct kvn_queue *queue, struct kvn_request *req,
			 struct kvn_command *c, int count)
{
	struct kvn_keyed_sgl_desc *sg = &c->dptr.ksgl;
	int nr;

	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;	/* OK: rdma-mr-leak -- the pool was empty, nothing taken */

	/*
	 * Align the MR to a 4K page size to match the ctrl page size and
	 * the block virtual boundary.
	 */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		/* OK: rdma-mr-leak, rdma-invalidation-leak -- back to the pool before any REG_MR was built */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL;
	}

	if (unlikely(req->mr->length >= KVN_MAX_KEYED_LEN)) {
		pr_err_ratelimited("qid %d: mapped %llu bytes, keyed SGL length is 24 bits\n",
				   queue->qid, req->mr->length);
		return -EINVAL;	/* BUG: rdma-mr-leak -- req->mr never goes back to the pool; the caller's unwind only unmaps */
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = kvn_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr;	/* OK: rdma-rkey-reuse -- key bumped right above */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE |
			     IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	sg->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, sg->length);
	put_unaligned_le32(req->mr->rkey, sg->key);
	sg->type = (KVN_KEY_SGL_FMT_DATA_DESC << 4) | KVN_SGL_FMT_INVALIDATE;

	return 0;
}

static int kvn_map_data(struct kvn_queue *queue, struct kvn_request *req,
			struct kvn_command *c)
{
	struct request *rq = req->rq;
	int count, ret;

	req->num_sge = 1;
	atomic_set(&req->ref, 2);	/* send completion and response */
	c->flags |= KVN_CMD_SGL_METABUF;

	if (!blk_rq_nr_phys_segments(rq)) {
		c->dptr.ksgl.type = KVN_KEY_SGL_FMT_DATA_DESC << 4;
		return 0;
	}

	req->sgt.sgl = req->first_sgl;
	ret = sg_alloc_table_chained(&req->sgt, blk_rq_nr_phys_segments(rq),
				     req->sgt.sgl, SG_CHUNK_SIZE);
	if (unlikely(ret))
		return -ENOMEM;

	req->nents = blk_rq_map_sg(NULL, rq, req->sgt.sgl);

	count = ib_dma_map_sg(queue->ibdev, req->sgt.sgl, req->nents,
			      kvn_rq_dma_dir(rq));
	if (unlikely(count <= 0)) {
		ret = -EIO;
		goto out_free_table;
	}

	if (count <= KVN_INLINE_SGES && rq_data_dir(rq) == WRITE &&
	    queue->qid && blk_rq_payload_bytes(rq) <= KVN_INLINE_DATA_SIZE) {
		ret = kvn_map_sg_inline(queue, req, c, count);
		goto out;
	}

	ret = kvn_map_sg_fr(queue, req, c, count);
out:
	if (unlikely(ret))
		goto out_unmap_sg;
	return 0;

out_unmap_sg:
	/* OK: rdma-invalidation-leak -- no REG_MR was posted for this request */
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents,
			kvn_rq_dma_dir(rq));
out_free_table:
	sg_free_table_chained(&req->sgt, SG_CHUNK_SIZE);
	return ret;
}

static int kvn_post_send(struct kvn_queue *queue, struct kvn_qe *qe,
			 struct ib_sge *sge, u32 num_sge,
			 struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr = qe->dma;
	sge->length = sizeof(struct kvn_command);
	sge->lkey = queue->pd->local_dma_lkey;

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

	ret = ib_post_send(queue->qp, first, NULL);
	if (unlikely(ret))
		pr_err("qid %d: ib_post_send failed (%d)\n", queue->qid, ret);
	return ret;
}

static void kvn_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvn_qe *qe = container_of(wc->wr_cqe, struct kvn_qe, cqe);
	struct kvn_request *req = container_of(qe, struct kvn_request, sqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kvn_wr_error(req->queue, wc, "SEND");
		return;
	}
	kvn_end_request(req);	/* OK: rdma-invalidation-leak -- drops the send reference; the last one is dropped after the key died */
}

static blk_status_t kvn_queue_rq(struct kvn_queue *queue, struct request *rq)
{
	struct kvn_request *req = blk_mq_rq_to_pdu(rq);
	struct kvn_qe *sqe = &req->sqe;
	struct kvn_command *c = sqe->data;
	int ret;

	if (unlikely(!queue->live))
		return BLK_STS_RESOURCE;

	req->rq = rq;
	req->queue = queue;
	req->status = 0;
	memset(c, 0, sizeof(*c));
	c->command_id = req->tag;

	blk_mq_start_request(rq);

	ret = kvn_map_data(queue, req, c);
	if (unlikely(ret < 0)) {
		pr_err("qid %d: failed to map data (%d)\n", queue->qid, ret);
		return (ret == -ENOMEM || ret == -EAGAIN) ?
			BLK_STS_RESOURCE : BLK_STS_IOERR;
	}

	sqe->cqe.done = kvn_send_done;
	ret = kvn_post_send(queue, sqe, req->sge, req->num_sge,
			    req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(ret))
		goto err_unmap;

	return BLK_STS_OK;

err_unmap:
	kvn_unmap_data(queue, req);	/* OK: rdma-invalidation-leak -- the post failed: the capsule carrying the rkey never went out */
	return BLK_STS_IOERR;
}

static void kvn_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvn_request *req =
		container_of(wc->wr_cqe, struct kvn_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kvn_wr_error(req->queue, wc, "LOCAL_INV");
		return;
	}
	kvn_end_request(req);	/* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
}

static int kvn_inv_rkey(struct kvn_queue *queue, struct kvn_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = kvn_inv_rkey_done;
	wr.wr_cqe = &req->inv_cqe;

	return ib_post_send(queue->qp, &wr, NULL);
}

static void kvn_process_cqe(struct kvn_queue *queue, struct ib_wc *wc,
			    struct kvn_completion *cqe)
{
	struct kvn_request *req;
	int ret;

	if (unlikely(cqe->command_id >= queue->queue_size)) {
		pr_err("qid %d: bogus command_id %u\n", queue->qid,
		       cqe->command_id);
		kvn_error_recovery(queue);
		return;
	}
	req = queue->tags[cqe->command_id];
	req->status = cqe->status >> 1;
	req->result = le64_to_cpu(cqe->result);

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (likely(req->mr && wc->ex.invalidate_rkey == req->mr->rkey)) {	/* OK: rdma-remote-invalidate-unchecked -- accepted only for this request's rkey */
			kvn_end_request(req);	/* OK: rdma-invalidation-leak -- the target invalidated exactly this key */
			return;
		}
		pr_err("qid %d: bogus remote invalidation for rkey %#x (mr %p)\n",
		       queue->qid, wc->ex.invalidate_rkey, req->mr);
		kvn_error_recovery(queue);
		if (!req->mr)
			return;
		/* our own key is still live: invalidate it before ending */
	} else if (!req->mr) {
		kvn_end_request(req);	/* OK: rdma-invalidation-leak -- inline or no data: nothing was registered */
		return;
	}

	ret = kvn_inv_rkey(queue, req);	/* OK: rdma-unmap-before-invalidate -- signaled; the request ends from kvn_inv_rkey_done() */
	if (unlikely(ret < 0)) {
		pr_err("qid %d: LOCAL_INV for rkey %#x failed (%d)\n",
		       queue->qid, req->mr->rkey, ret);
		kvn_error_recovery(queue);
	}
	/* the local invalidation completion will end the request */
}

static void kvn_post_recv(struct kvn_queue *queue, struct kvn_qe *qe)
{
	struct ib_recv_wr wr;
	struct ib_sge list;

	list.addr = qe->dma;
	list.length = sizeof(struct kvn_completion);
	list.lkey = queue->pd->local_dma_lkey;

	wr.next = NULL;
	wr.wr_cqe = &qe->cqe;
	wr.sg_list = &list;
	wr.num_sge = 1;

	if (ib_post_recv(queue->qp, &wr, NULL))
		kvn_error_recovery(queue);
}

static void kvn_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvn_qe *qe = container_of(wc->wr_cqe, struct kvn_qe, cqe);
	struct kvn_queue *queue = qe->queue;
	struct kvn_completion *cqe = qe->data;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kvn_wr_error(queue, wc, "RECV");
		return;
	}
	if (unlikely(wc->byte_len < sizeof(*cqe))) {
		pr_err("qid %d: unexpected response len %u\n", queue->qid,
		       wc->byte_len);
		kvn_error_recovery(queue);
		return;
	}

	ib_dma_sync_single_for_cpu(queue->ibdev, qe->dma, sizeof(*cqe),
				   DMA_FROM_DEVICE);
	kvn_process_cqe(queue, wc, cqe);
	ib_dma_sync_single_for_device(queue->ibdev, qe->dma, sizeof(*cqe),
				      DMA_FROM_DEVICE);
	qe->cqe.done = kvn_recv_done;
	kvn_post_recv(queue, qe);
}

static enum blk_eh_timer_return kvn_timeout(struct request *rq)
{
	struct kvn_request *req = blk_mq_rq_to_pdu(rq);
	struct kvn_queue *queue = req->queue;

	pr_warn("qid %d: I/O tag %u timeout\n", queue->qid, req->tag);

	if (queue->live) {
		/* error recovery tears the queue down and fails the I/O */
		kvn_error_recovery(queue);
		return BLK_EH_RESET_TIMER;
	}

	/*
	 * The queue is already going away: complete the request here so
	 * that teardown does not wait on it.
	 */
	kvn_unmap_data(queue, req);	/* BUG: rdma-invalidation-leak -- the command with the rkey is at the target; no LOCAL_INV or remote invalidation before the MR goes back to the pool and the pages are unmapped */
	req->status = KVN_SC_HOST_ABORTED_CMD;
	blk_mq_end_request(rq, BLK_STS_TIMEOUT);
	return BLK_EH_DONE;
}

static void kvn_inv_abort_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kvn_request *req =
		container_of(wc->wr_cqe, struct kvn_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		kvn_wr_error(req->queue, wc, "LOCAL_INV (abort)");
}

/*
 * Keep-alive expired: fail an outstanding request without waiting for a
 * controller that may never answer.
 */
static void kvn_abort_inflight(struct kvn_queue *queue, struct kvn_request *req)
{
	struct ib_send_wr wr = {};
	int ret;

	if (req->mr) {
		wr.opcode = IB_WR_LOCAL_INV;
		wr.ex.invalidate_rkey = req->mr->rkey;
		wr.send_flags = 0;
		req->inv_cqe.done = kvn_inv_abort_done;
		wr.wr_cqe = &req->inv_cqe;

		ret = ib_post_send(queue->qp, &wr, NULL);
		if (ret) {
			pr_err("qid %d: abort LOCAL_INV failed (%d)\n",
			       queue->qid, ret);
			kvn_error_recovery(queue);
			return;
		}
	}

	kvn_unmap_data(queue, req);	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed; the MR returns to the pool and the pages are unmapped while the target's key still works */
	req->status = KVN_SC_HOST_ABORTED_CMD;
	blk_mq_end_request(req->rq, BLK_STS_IOERR);
}

static int kvn_init_mr_pool(struct kvn_queue *queue)
{
	int ret;

	queue->pages_per_mr = min_t(u32,
			queue->ibdev->attrs.max_fast_reg_page_list_len,
			KVN_MAX_MR_PAGES);
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs,
			      queue->queue_size, IB_MR_TYPE_MEM_REG,
			      queue->pages_per_mr, 0);
	if (ret)
		pr_err("qid %d: failed to init MR pool (%d)\n", queue->qid, ret);
	return ret;
}

static void kvn_destroy_queue_ib(struct kvn_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	rdma_destroy_qp(queue->cm_id);
	ib_free_cq(queue->ib_cq);
}

struct kvn_transport_ops {
	int (*create_queue)(struct kvn_queue *queue);
	void (*destroy_queue)(struct kvn_queue *queue);
	blk_status_t (*queue_rq)(struct kvn_queue *queue, struct request *rq);
	enum blk_eh_timer_return (*timeout)(struct request *rq);
	void (*abort_rq)(struct kvn_queue *queue, struct kvn_request *req);
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct kvn_transport_ops kvn_rdma_transport = {
	.create_queue	= kvn_init_mr_pool,
	.destroy_queue	= kvn_destroy_queue_ib,
	.queue_rq	= kvn_queue_rq,
	.timeout	= kvn_timeout,
	.abort_rq	= kvn_abort_inflight,
	.recv_done	= kvn_recv_done,
};

MODULE_DESCRIPTION("NVMe over Fabrics RDMA host I/O path");
MODULE_LICENSE("GPL v2");
