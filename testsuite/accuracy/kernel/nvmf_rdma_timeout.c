// SPDX-License-Identifier: GPL-2.0
/*
 * nvt: command completion and timeout handling of an NVMe/RDMA-style host
 * that can abort single commands while the queue stays live.
 *
 * Data is fast-registered per command (pool MR, rotated key, REG_MR chained
 * before the command capsule). On the response the host either accepts a
 * remote invalidation after a helper compared the key, or posts a signaled
 * LOCAL_INV and finishes the command from its completion.
 *
 * The bug: the per-command timeout handler fails the command and returns its
 * MR to the pool while the controller still holds a valid rkey for it; the
 * next owner of those pages can be written by the late data transfer. Real
 * hosts either tear the whole queue down (QP in error, pool destroyed) or
 * invalidate first.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/unaligned.h>
#include <linux/blk-mq.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define NVT_Q_LIVE		0x1
#define NVT_SC_ABORTED		0x371

struct nvt_queue {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	unsigned long		flags;
	int			qid;
	void			*ctrl;
};

struct nvt_request {
	struct nvt_queue	*queue;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct sg_table		sgt;
	int			nents;
	enum dma_data_direction	dir;
	u16			status;
	u8			key_desc[4];
	u64			cmd_dma;
};

void nvt_error_recovery(void *ctrl);
struct nvt_request *nvt_lookup_req(struct nvt_queue *queue, u16 tag);

static void nvt_unmap_data(struct nvt_queue *queue, struct nvt_request *req)
{
	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the ULP returns MRs to its own pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	if (req->nents) {
		ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, req->dir);
		req->nents = 0;
	}
}

static void nvt_complete_rq(struct nvt_request *req)
{
	struct request *rq = blk_mq_rq_from_pdu(req);

	nvt_unmap_data(req->queue, req); /* OK: rdma-invalidation-leak -- only reached after a checked remote invalidation or the LOCAL_INV completion */
	blk_mq_end_request(rq, req->status ? BLK_STS_IOERR : BLK_STS_OK);
}

int nvt_map_data(struct nvt_queue *queue, struct nvt_request *req)
{
	int count, nr;

	count = ib_dma_map_sg(queue->ibdev, req->sgt.sgl, req->sgt.nents,
			      req->dir);
	if (unlikely(count <= 0))
		return -EIO;
	req->nents = req->sgt.nents;

	/* BUG: rdma-local-mr-management -- per-command MR from the ULP's own pool */
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr)) {
		ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, req->dir);
		req->nents = 0;
		return -EAGAIN;
	}

	/* BUG: rdma-local-mr-management -- the ULP maps pages into its MR */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, count, NULL, SZ_4K);
	if (unlikely(nr < count)) {
		nvt_unmap_data(queue, req); /* OK: rdma-mr-leak -- the helper puts the MR back on the short map */
		return nr < 0 ? nr : -EINVAL;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- rotated right before */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			     IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- LOCAL_WRITE accompanies REMOTE_WRITE */
	put_unaligned_le32(req->mr->rkey, req->key_desc);
	return 0;
}

int nvt_submit(struct nvt_queue *queue, struct nvt_request *req)
{
	req->send_sge.addr = req->cmd_dma;
	req->send_sge.length = 64;
	req->send_sge.lkey = queue->pd->local_dma_lkey;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(queue->qp, req->mr ? &req->reg_wr.wr :
				       &req->send_wr, NULL);
}

static void nvt_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nvt_request *req =
		container_of(wc->wr_cqe, struct nvt_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		nvt_error_recovery(req->queue->ctrl);
		return;
	}
	nvt_complete_rq(req);
}

static bool nvt_remote_inv_ok(struct nvt_request *req, u32 rkey)
{
	if (unlikely(!req->mr || rkey != req->mr->rkey)) {
		pr_err("remote invalidation of unexpected rkey %#x\n", rkey);
		return false;
	}
	return true;
}

void nvt_handle_rsp(struct nvt_queue *queue, u16 tag, u16 status,
		    struct ib_wc *wc)
{
	struct nvt_request *req = nvt_lookup_req(queue, tag);

	req->status = status;
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey goes to a helper that compares it with the request's */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (!nvt_remote_inv_ok(req, wc->ex.invalidate_rkey)) {
			nvt_error_recovery(queue->ctrl);
			return;
		}
	} else if (req->mr) {
		req->inv_wr.opcode = IB_WR_LOCAL_INV;
		req->inv_wr.next = NULL;
		req->inv_wr.num_sge = 0;
		req->inv_wr.send_flags = IB_SEND_SIGNALED;
		req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
		req->inv_cqe.done = nvt_inv_done;
		req->inv_wr.wr_cqe = &req->inv_cqe;
		if (ib_post_send(queue->qp, &req->inv_wr, NULL))
			nvt_error_recovery(queue->ctrl);
		return;
	}
	nvt_complete_rq(req);
}

enum blk_eh_timer_return nvt_timeout(struct request *rq)
{
	struct nvt_request *req = blk_mq_rq_to_pdu(rq);
	struct nvt_queue *queue = req->queue;

	pr_warn("queue %d: I/O timed out\n", queue->qid);

	if (!(queue->flags & NVT_Q_LIVE)) {
		/* connection setup or teardown: the whole queue goes away */
		nvt_error_recovery(queue->ctrl);
		return BLK_EH_RESET_TIMER;
	}

	/* the queue is live: fail just this command */
	req->status = NVT_SC_ABORTED;
	nvt_unmap_data(queue, req); /* BUG: rdma-invalidation-leak -- the controller may still hold the command and its rkey; the MR goes back to the pool with the key valid */
	blk_mq_end_request(rq, BLK_STS_TIMEOUT);
	return BLK_EH_DONE;
}
