// SPDX-License-Identifier: GPL-2.0
/*
 * blkr: an invented remote block device initiator over RDMA. One queue per
 * hardware context; every request with data is fast-registered (pool MR,
 * key rotated) and the REG_MR is chained in front of the command SEND. The
 * server answers with SEND_WITH_INV when it could invalidate the key;
 * otherwise the initiator posts a signaled LOCAL_INV and completes the
 * request from its completion. The remote invalidation is compared with the
 * request's key.
 *
 * Bugs: the send queue counts "REG_MR + SEND" per request and forgets the
 * LOCAL_INV the initiator posts when the server did not invalidate, so with
 * a full queue of such requests the LOCAL_INV post fails (and the factor is
 * hand-made in any case); and a failed DMA mapping after the MR was taken
 * returns without putting the MR back in the pool.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/blk-mq.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define BLKR_MAX_PAGES	128

struct blkr_queue {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			depth;
	void			*dev;
};

struct blkr_cmd_wire {
	__be64	addr;
	__be32	rkey;
	__be32	len;
	__be16	tag;
};

struct blkr_req {
	struct blkr_queue	*queue;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
	struct ib_cqe		inv_cqe;
	struct sg_table		sgt;
	int			nents;
	enum dma_data_direction	dir;
	struct blkr_cmd_wire	*cmd;
	u64			cmd_dma;
	blk_status_t		status;
};

void blkr_fail_queue(struct blkr_queue *queue);
struct blkr_req *blkr_find_req(struct blkr_queue *queue, u16 tag);

int blkr_create_queue(struct blkr_queue *queue)
{
	struct ib_qp_init_attr init_attr;

	memset(&init_attr, 0, sizeof(init_attr));
	/* REG_MR + SEND per request, +1 for drain */
	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a request can post REG_MR, SEND and LOCAL_INV (three WRs) but only two per request are reserved; and the factor is the hand-made registration arithmetic */
	init_attr.cap.max_send_wr = 2 * queue->depth + 1;
	init_attr.cap.max_recv_wr = queue->depth;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.send_cq = queue->cq;
	init_attr.recv_cq = queue->cq;

	queue->qp = ib_create_qp(queue->pd, &init_attr);
	if (IS_ERR(queue->qp))
		return PTR_ERR(queue->qp);

	/* BUG: rdma-local-mr-management -- the driver keeps its own MR pool */
	if (ib_mr_pool_init(queue->qp, &queue->qp->rdma_mrs, queue->depth,
			    IB_MR_TYPE_MEM_REG, BLKR_MAX_PAGES, 0)) {
		ib_destroy_qp(queue->qp);
		return -ENOMEM;
	}
	return 0;
}

void blkr_destroy_queue(struct blkr_queue *queue)
{
	ib_drain_qp(queue->qp);
	ib_mr_pool_destroy(queue->qp, &queue->qp->rdma_mrs);
	ib_destroy_qp(queue->qp);
}

static void blkr_complete(struct blkr_req *req)
{
	struct blkr_queue *queue = req->queue;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the driver's pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- called once the key is dead: checked remote invalidation or completed LOCAL_INV */
		req->mr = NULL;
	}
	ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, req->dir);
	blk_mq_end_request(blk_mq_rq_from_pdu(req), req->status);
}

static void blkr_reg_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct blkr_req *req = container_of(wc->wr_cqe, struct blkr_req,
					    send_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		blkr_fail_queue(req->queue);
}

int blkr_queue_rq(struct blkr_queue *queue, struct blkr_req *req)
{
	int nr, ret;

	/* BUG: rdma-local-mr-management -- per-request MR from the driver's pool */
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;

	req->nents = ib_dma_map_sg(queue->ibdev, req->sgt.sgl, req->sgt.nents,
				   req->dir);
	if (unlikely(req->nents <= 0))
		return -EIO; /* BUG: rdma-mr-leak -- the pool MR in req->mr is not put back */

	/* BUG: rdma-local-mr-management -- the driver maps pages into its MR */
	nr = ib_map_mr_sg(req->mr, req->sgt.sgl, req->nents, NULL, SZ_4K);
	if (nr < req->nents) {
		ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, req->dir);
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-mr-leak -- the short-map path puts the MR back */
		req->mr = NULL;
		return -EINVAL;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the driver */
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- rotated just before */
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = req->dir == DMA_FROM_DEVICE ?
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
		IB_ACCESS_REMOTE_READ; /* OK: rdma-access-flags-invalid -- the sink of server WRITEs has LOCAL_WRITE */

	req->cmd->addr = cpu_to_be64(req->mr->iova);
	req->cmd->rkey = cpu_to_be32(req->mr->rkey);
	req->cmd->len = cpu_to_be32(req->mr->length);

	req->send_sge.addr = req->cmd_dma;
	req->send_sge.length = sizeof(*req->cmd);
	req->send_sge.lkey = queue->pd->local_dma_lkey;
	req->send_cqe.done = blkr_reg_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(queue->qp, &req->reg_wr.wr, NULL);
	if (ret) {
		ib_dma_unmap_sg(queue->ibdev, req->sgt.sgl, req->nents, req->dir);
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(queue->qp, &queue->qp->rdma_mrs, req->mr); /* OK: rdma-invalidation-leak -- the chain was not posted, the key never left */
		req->mr = NULL;
	}
	return ret;
}

static void blkr_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct blkr_req *req = container_of(wc->wr_cqe, struct blkr_req,
					    inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		blkr_fail_queue(req->queue);
		return;
	}
	blkr_complete(req);
}

void blkr_recv_rsp(struct blkr_queue *queue, u16 tag, blk_status_t status,
		   struct ib_wc *wc)
{
	struct blkr_req *req = blkr_find_req(queue, tag);

	req->status = status;
	/* OK: rdma-remote-invalidate-unchecked -- accepted only when the invalidated rkey is the request's */
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
	    req->mr && wc->ex.invalidate_rkey == req->mr->rkey) {
		blkr_complete(req);
		return;
	}

	if (req->mr) {
		req->inv_wr.opcode = IB_WR_LOCAL_INV;
		req->inv_wr.next = NULL;
		req->inv_wr.num_sge = 0;
		req->inv_wr.send_flags = IB_SEND_SIGNALED;
		req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
		req->inv_cqe.done = blkr_inv_done;
		req->inv_wr.wr_cqe = &req->inv_cqe;
		if (ib_post_send(queue->qp, &req->inv_wr, NULL))
			blkr_fail_queue(queue);
		return;
	}
	blkr_complete(req);
}
