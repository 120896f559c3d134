// SPDX-License-Identifier: GPL-2.0
/*
 * nvr: the I/O path of an NVMe over Fabrics RDMA host queue, in the shape of
 * drivers/nvme/host/rdma.c (written fresh for the accuracy corpus).
 *
 * A command's data is fast-registered from the queue's MR pool and described
 * to the controller with a keyed SGL; the REG_MR is chained in front of the
 * command SEND. The controller may invalidate the key with SEND_WITH_INV; the
 * host accepts that only when the invalidated rkey is the request's own and
 * otherwise posts a signaled LOCAL_INV whose completion ends the request.
 *
 * Correct here: the key is rotated for every registration, the access flags
 * carry LOCAL_WRITE, a short ib_map_mr_sg() puts the MR back, the remote
 * invalidation is compared, and the MR goes back to the pool only after its
 * key is dead. The one finding is the send queue: sized with nvme-rdma's
 * hand-made "MR, SEND, INV" factor, which is right in value but is the
 * arithmetic cap.max_rdma_ctxs replaces (a migration note).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/atomic.h>
#include <linux/unaligned.h>
#include <linux/blk-mq.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define NVR_MAX_INLINE_SEGMENTS	4
#define NVR_MAX_SEGMENTS	256
#define NVR_KEY_SGL_INVALIDATE	0x0f

struct nvr_keyed_sgl_desc {
	__le64	addr;
	u8	length[3];
	u8	key[4];
	u8	type;
};

struct nvr_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			num_inline_segments;
};

struct nvr_qe {
	u64		dma;
	struct ib_cqe	cqe;
};

struct nvr_queue {
	struct nvr_device	*device;
	struct ib_qp		*qp;
	struct ib_cq		*ib_cq;
	int			queue_size;
	int			cq_size;
	u32			pages_per_mr;
	void			*ctrl;
};

struct nvr_request {
	struct nvr_qe		sqe;
	struct ib_sge		sge[1 + NVR_MAX_INLINE_SEGMENTS];
	u32			num_sge;
	atomic_t		ref;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		reg_cqe;
	struct nvr_queue	*queue;
	struct sg_table		sgt;
	int			nents;
	enum dma_data_direction	dir;
	__le16			status;
};

void nvr_error_recovery(void *ctrl);
struct nvr_request *nvr_tag_to_req(struct nvr_queue *queue, u16 command_id);

static int nvr_create_qp(struct nvr_queue *queue, const int factor)
{
	struct nvr_device *dev = queue->device;
	struct ib_qp_init_attr init_attr;

	memset(&init_attr, 0, sizeof(init_attr));
	/* +1 for ib_drain_qp */
	/* BUG: rdma-send-queue-manual-factor -- the depth is multiplied by a hand-made "MR, SEND, INV" factor; cap.max_rdma_ctxs sizes this in the core */
	init_attr.cap.max_send_wr = factor * queue->queue_size + 1; /* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV per request fit the factor 3, plus one entry for the drain */
	init_attr.cap.max_recv_wr = queue->queue_size + 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_send_sge = 1 + dev->num_inline_segments;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every command SEND and every LOCAL_INV is signaled */
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->ib_cq;
	init_attr.recv_cq = queue->ib_cq;
	init_attr.qp_context = queue;

	queue->qp = ib_create_qp(dev->pd, &init_attr);
	return IS_ERR(queue->qp) ? PTR_ERR(queue->qp) : 0;
}

int nvr_create_queue_ib(struct nvr_queue *queue)
{
	struct ib_device *ibdev = queue->device->dev;
	const int send_wr_factor = 3;		/* MR, SEND, INV */
	const int cq_factor = send_wr_factor + 1;	/* + RECV */
	int ret;

	queue->cq_size = cq_factor * queue->queue_size + 1;
	queue->ib_cq = ib_cq_pool_get(ibdev, queue->cq_size, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(queue->ib_cq))
		return PTR_ERR(queue->ib_cq);

	ret = nvr_create_qp(queue, send_wr_factor);
	if (ret)
		goto out_put_cq;

	queue->pages_per_mr = min_t(u32, NVR_MAX_SEGMENTS,
				    ibdev->attrs.max_fast_reg_page_list_len);
	/* BUG: rdma-local-mr-management -- the ULP keeps its own MR pool; rdma_rw owns one per QP */
	ret = ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->queue_size,
			      IB_MR_TYPE_MEM_REG, queue->pages_per_mr, 0); /* OK: rdma-registration-in-datapath -- the pool is filled once at queue setup */
	if (ret)
		goto out_destroy_qp;
	return 0;

out_destroy_qp:
	ib_destroy_qp(queue->qp);
out_put_cq:
	ib_cq_pool_put(queue->ib_cq, queue->cq_size);
	return ret;
}

void nvr_destroy_queue_ib(struct nvr_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	ib_destroy_qp(queue->qp);
	ib_cq_pool_put(queue->ib_cq, queue->cq_size);
}

static void nvr_end_request(struct nvr_request *req)
{
	blk_mq_complete_request(blk_mq_rq_from_pdu(req));
}

void nvr_unmap_data(struct nvr_request *req)
{
	struct nvr_queue *queue = req->queue;

	if (!req->nents)
		return;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the ULP returns MRs to its own pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- runs from the request's completion, after a checked remote invalidation or the LOCAL_INV completed */
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->device->dev, req->sgt.sgl, req->nents, req->dir);
	req->nents = 0;
}

static void nvr_memreg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req =
		container_of(wc->wr_cqe, struct nvr_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		nvr_error_recovery(req->queue->ctrl);
}

static int nvr_map_sg_fr(struct nvr_queue *queue, struct nvr_request *req,
			 struct nvr_keyed_sgl_desc *sg, int count)
{
	int nr;

	/* BUG: rdma-local-mr-management -- per-I/O MR taken from the ULP's own pool */
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into the MR itself */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the ULP's pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-mr-leak, rdma-invalidation-leak -- short map: the MR is returned, and nothing was posted */
		req->mr = NULL;
		if (nr < 0)
			return nr;
		return -EINVAL;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));

	req->reg_cqe.done = nvr_memreg_done;
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- a fast registration work request built by the ULP */
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- the key was rotated just above */
	req->reg_wr.key = req->mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- REMOTE_WRITE comes with LOCAL_WRITE, and the rkey goes to the controller in the keyed SGL */
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE;

	sg->addr = cpu_to_le64(req->mr->iova);
	put_unaligned_le24(req->mr->length, sg->length);
	put_unaligned_le32(req->mr->rkey, sg->key);
	sg->type = NVR_KEY_SGL_INVALIDATE;
	return 0;
}

static void nvr_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_qe *qe = container_of(wc->wr_cqe, struct nvr_qe, cqe);
	struct nvr_request *req = container_of(qe, struct nvr_request, sqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvr_error_recovery(req->queue->ctrl);
		return;
	}
	if (atomic_dec_and_test(&req->ref))
		nvr_end_request(req);
}

static int nvr_post_send(struct nvr_queue *queue, struct nvr_qe *qe,
			 struct ib_sge *sge, u32 num_sge,
			 struct ib_send_wr *first)
{
	struct ib_send_wr wr;
	int ret;

	sge->addr = qe->dma;
	sge->length = 64;	/* the command capsule */
	sge->lkey = queue->device->pd->local_dma_lkey;

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
		pr_err("post send failed: %d\n", ret);
	return ret;
}

blk_status_t nvr_queue_rq(struct nvr_queue *queue, struct request *rq,
			  struct nvr_keyed_sgl_desc *c, int count)
{
	struct nvr_request *req = blk_mq_rq_to_pdu(rq);
	int err;

	req->queue = queue;
	req->num_sge = 1;
	atomic_set(&req->ref, 2);	/* send and recv completions */
	req->sqe.cqe.done = nvr_send_done;

	err = nvr_map_sg_fr(queue, req, c, count);
	if (unlikely(err < 0))
		return BLK_STS_RESOURCE;

	err = nvr_post_send(queue, &req->sqe, req->sge, req->num_sge,
			    req->mr ? &req->reg_wr.wr : NULL);
	if (unlikely(err)) {
		nvr_unmap_data(req); /* OK: rdma-invalidation-leak -- the REG_MR+SEND chain was not posted, the key never reached the controller */
		return BLK_STS_IOERR;
	}
	return BLK_STS_OK;
}

static void nvr_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvr_request *req =
		container_of(wc->wr_cqe, struct nvr_request, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		nvr_error_recovery(req->queue->ctrl);
		return;
	}
	if (atomic_dec_and_test(&req->ref))
		nvr_end_request(req);
}

static int nvr_inv_rkey(struct nvr_queue *queue, struct nvr_request *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
		.wr_cqe		    = &req->reg_cqe,
	};

	req->reg_cqe.done = nvr_inv_rkey_done;

	return ib_post_send(queue->qp, &wr, NULL);
}

void nvr_process_nvme_rsp(struct nvr_queue *queue, u16 command_id,
			  __le16 status, struct ib_wc *wc)
{
	struct nvr_request *req = nvr_tag_to_req(queue, command_id);
	int ret;

	req->status = status;

	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's and a mismatch tears the queue down */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("Bogus remote invalidation for rkey %#x\n",
			       req->mr ? req->mr->rkey : 0);
			nvr_error_recovery(queue->ctrl);
		}
	} else if (req->mr) {
		ret = nvr_inv_rkey(queue, req);
		if (unlikely(ret < 0)) {
			pr_err("Queue invalidation of rkey %#x failed (%d)\n",
			       req->mr->rkey, ret);
			nvr_error_recovery(queue->ctrl);
		}
		/* the local invalidation completion will end the request */
		return;
	}

	if (atomic_dec_and_test(&req->ref))
		nvr_end_request(req);
}
