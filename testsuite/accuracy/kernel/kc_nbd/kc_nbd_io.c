// SPDX-License-Identifier: GPL-2.0
/*
 * kc_nbd_io.c - submission, REG_MR chained before the command SEND.  Known
 * problems: no LOCAL_WRITE for zone reports; keys rotate only when a LOCAL_INV
 * recycles the MR, not after SEND_WITH_INV; the signal counter never moves.
 */
#include "kc_nbd.h"

static struct kc_nbd_req *kc_nbd_get_req(struct kc_nbd_queue *q)
{
	struct kc_nbd_req *req;
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	req = list_first_entry_or_null(&q->free_list, struct kc_nbd_req, list);
	if (req)
		list_del_init(&req->list);
	spin_unlock_irqrestore(&q->lock, flags);
	return req;
}

void kc_nbd_put_req(struct kc_nbd_queue *q, struct kc_nbd_req *req)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	list_add(&req->list, &q->free_list);
	spin_unlock_irqrestore(&q->lock, flags);
}

static int kc_nbd_reg_access(struct kc_nbd_req *req)
{
	switch (req->kind) {
	case KC_NBD_CMD_WRITE:
		return IB_ACCESS_REMOTE_READ;		/* the target pulls */
	case KC_NBD_CMD_READ:
		return IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	case KC_NBD_CMD_REPORT:
		return IB_ACCESS_REMOTE_WRITE;		/* the target fills it */
	}
	return 0;
}

/* Returns 1 when the buffer went out under the PD's global rkey. */
static int kc_nbd_map_req(struct kc_nbd_queue *q, struct kc_nbd_req *req)
{
	struct kc_nbd_wire_cmd *cmd = req->cmd;
	int count, nr;

	req->nents = blk_rq_map_sg(q->blkq, req->rq, req->sgl);
	count = ib_dma_map_sg(q->ibdev, req->sgl, req->nents, req->dir);
	if (!count)
		return -EIO;

	req->reg_wr.mr = NULL;
	if (count == 1 && req->kind == KC_NBD_CMD_READ && q->fast_small_reads) {
		cmd->addr = cpu_to_le64(sg_dma_address(req->sgl));
		cmd->rkey = cpu_to_le32(q->pd->unsafe_global_rkey);
		return 1;
	}

	nr = ib_map_mr_sg(req->mr, req->sgl, count, NULL, SZ_4K);
	if (nr < count) {
		ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, req->dir);
		return nr < 0 ? nr : -EINVAL;
	}

	memset(&req->reg_wr, 0, sizeof(req->reg_wr));
	req->reg_cqe.done = kc_nbd_reg_done;
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.next = &req->send_wr;
	req->reg_wr.mr = req->mr; /* BUG: rdma-rkey-reuse -- after a SEND_WITH_INV nothing rotates the key (only kc_nbd_inv_done() does), so the MR comes back under the key the target already held */
	req->reg_wr.key = req->mr->rkey;
	/* OK: rdma-remote-access-overbroad -- the rkey goes to the target in the wire command */
	req->reg_wr.access = kc_nbd_reg_access(req); /* BUG: rdma-access-flags-invalid -- a zone report gets REMOTE_WRITE without LOCAL_WRITE */

	cmd->addr = cpu_to_le64(req->mr->iova);
	cmd->rkey = cpu_to_le32(req->mr->rkey);
	return 0;
}

blk_status_t kc_nbd_queue_rq(struct kc_nbd_queue *q, struct request *rq)
{
	struct kc_nbd_req *req = kc_nbd_get_req(q);
	int ret;

	if (!req)
		return BLK_STS_RESOURCE;
	req->rq = rq;
	req->kind = req_op(rq) == KC_NBD_REQ_OP_DRV_IN ? KC_NBD_CMD_REPORT :
		    op_is_write(req_op(rq)) ? KC_NBD_CMD_WRITE : KC_NBD_CMD_READ;
	req->dir = req->kind == KC_NBD_CMD_WRITE ? DMA_TO_DEVICE : DMA_FROM_DEVICE;
	blk_mq_start_request(rq);

	ret = kc_nbd_map_req(q, req);
	if (ret < 0) {
		kc_nbd_put_req(q, req);
		return BLK_STS_IOERR;
	}
	req->cmd->opcode = req->kind;
	req->cmd->tag = req->tag;
	req->cmd->len = cpu_to_le32(blk_rq_payload_bytes(rq));

	req->sge.addr = req->cmd_dma;
	req->sge.length = sizeof(*req->cmd);
	req->sge.lkey = q->pd->local_dma_lkey;
	req->send_cqe.done = kc_nbd_send_done;
	req->send_wr = (struct ib_send_wr) { .wr_cqe = &req->send_cqe,
		.sg_list = &req->sge, .num_sge = 1, .opcode = IB_WR_SEND };
	/* reap the send queue every KC_NBD_SIGNAL_EVERY commands */
	if (atomic_read(&q->since_signal) >= KC_NBD_SIGNAL_EVERY) { /* BUG(program): rdma-unsignaled-send-starvation -- since_signal is only ever reset, never incremented anywhere: no command SEND is signaled */
		req->send_wr.send_flags = IB_SEND_SIGNALED;
		atomic_set(&q->since_signal, 0);
	}

	ret = ib_post_send(q->qp, ret ? &req->send_wr : &req->reg_wr.wr, NULL);
	if (ret) {
		ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, req->dir); /* OK: rdma-invalidation-leak -- REG_MR and SEND were refused together, the key never reached the target */
		kc_nbd_put_req(q, req);
		return BLK_STS_IOERR;
	}
	return BLK_STS_OK;
}
