// SPDX-License-Identifier: GPL-2.0
/*
 * td_kst_io.c - kst target: data movement, responses and notifications.
 *
 * Write data is pulled by an rdma_rw READ context or by one of the older
 * pull paths (immediate: plain RDMA READ into a local_dma_lkey page; keyed:
 * private FRWR pool); read data goes out as rdma_rw WRITEs chained in front
 * of the signaled response SEND.  Everything posted here takes sq_wr_avail
 * credits except event notifications.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include "td_kst.h"

static void kst_read_done(struct ib_cq *cq, struct ib_wc *wc);
static void kst_pull_done(struct ib_cq *cq, struct ib_wc *wc);
static void kst_send_done(struct ib_cq *cq, struct ib_wc *wc);

static bool kst_take_credits(struct kst_queue *queue, int n)
{
	if (atomic_sub_return(n, &queue->sq_wr_avail) < 0) {
		atomic_add(n, &queue->sq_wr_avail);
		return false;
	}
	return true;
}

static int kst_rdma_read(struct kst_rsp *rsp)
{
	struct kst_queue *queue = rsp->queue;
	int ret;

	ret = rdma_rw_ctx_init(&rsp->rw, queue->qp, queue->port_num, rsp->sg, rsp->sg_cnt,
			       0, rsp->remote_addr, rsp->rkey, DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	rsp->rw_used = true;
	rsp->n_rdma = ret;
	if (!kst_take_credits(queue, rsp->n_rdma)) {
		rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num, rsp->sg,
				    rsp->sg_cnt, DMA_FROM_DEVICE);
		rsp->rw_used = false;
		return -EAGAIN;
	}

	rsp->read_cqe.done = kst_read_done;
	return rdma_rw_ctx_post(&rsp->rw, queue->qp, queue->port_num, &rsp->read_cqe, NULL); // OK: rdma-access-flags-transport, rdma-unsignaled-send-starvation -- rdma_rw builds the READ (remote write for iWARP sinks) and signals its last WR
}

static int kst_pull_immediate(struct kst_rsp *rsp)
{
	struct kst_queue *queue = rsp->queue;
	struct ib_device *dev = queue->dev->ib;

	if (rsp->len > KST_PAGE_SIZE || !kst_take_credits(queue, 1))
		return -EAGAIN;
	rsp->n_rdma = 1;
	rsp->imm_dma = ib_dma_map_single(dev, rsp->imm_page, rsp->len, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(dev, rsp->imm_dma))
		return -ENOMEM;

	rsp->imm_sge = (struct ib_sge){ rsp->imm_dma, rsp->len, queue->dev->pd->local_dma_lkey };

	rsp->imm_wr = (struct ib_rdma_wr){
		.wr = { .opcode = IB_WR_RDMA_READ, .wr_cqe = &rsp->read_cqe,
			.send_flags = IB_SEND_SIGNALED, .sg_list = &rsp->imm_sge, .num_sge = 1 },
		.remote_addr = rsp->remote_addr,
		.rkey = rsp->rkey,
	};
	rsp->read_cqe.done = kst_read_done;
	return ib_post_send(queue->qp, &rsp->imm_wr.wr, NULL); // BUG: rdma-access-flags-transport -- READ sink addressed with local_dma_lkey has no remote write, iWARP cannot place the response
}

static int kst_pull_keyed(struct kst_rsp *rsp, struct scatterlist *sg, int nents)
{
	struct kst_queue *queue = rsp->queue;
	struct ib_device *dev = queue->dev->ib;
	struct ib_send_wr *first = &rsp->pull_reg.wr;
	struct ib_mr *mr;
	int access = IB_ACCESS_LOCAL_WRITE;
	int nr;

	if (!kst_take_credits(queue, 3))	/* LOCAL_INV, REG_MR, READ */
		return -EAGAIN;
	mr = ib_mr_pool_get(queue->qp, &queue->pull_mrs);
	if (!mr)
		goto out_credits;
	nr = ib_dma_map_sg(dev, sg, nents, DMA_FROM_DEVICE);
	if (!nr)
		goto out_put_mr;
	if (ib_map_mr_sg(mr, sg, nr, NULL, KST_PAGE_SIZE) < nr) {
		ib_dma_unmap_sg(dev, sg, nents, DMA_FROM_DEVICE);
		goto out_put_mr;
	}
	rsp->pull_mr = mr;

	/* invalidation is lazy, as in the core's R/W code */
	if (mr->need_inval) {
		memset(&rsp->pull_inv, 0, sizeof(rsp->pull_inv));
		rsp->pull_inv.opcode = IB_WR_LOCAL_INV;
		rsp->pull_inv.ex.invalidate_rkey = mr->lkey;
		rsp->pull_inv.next = &rsp->pull_reg.wr;
		first = &rsp->pull_inv;
	}
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->lkey));

	/* iWARP READ responses are placed with the sink's STag */
	if (rdma_protocol_iwarp(dev, queue->port_num)) // BUG: rdma-access-flags-transport -- REG_MR access chosen by an inline transport test
		access |= IB_ACCESS_REMOTE_WRITE;

	memset(&rsp->pull_reg, 0, sizeof(rsp->pull_reg));
	rsp->pull_reg.wr.opcode = IB_WR_REG_MR;
	rsp->pull_reg.wr.next = &rsp->pull_wr.wr;
	rsp->pull_reg.mr = mr;
	rsp->pull_reg.key = mr->lkey;
	rsp->pull_reg.access = access; // OK: rdma-access-flags-invalid -- remote write is only ever added to LOCAL_WRITE

	rsp->pull_sge = (struct ib_sge){ mr->iova, (u32)mr->length, mr->lkey };

	memset(&rsp->pull_wr, 0, sizeof(rsp->pull_wr));
	/* OK: rdma-access-flags-transport -- this test picks the opcode, the sink's rights were set above */
	if (rdma_cap_read_inv(dev, queue->port_num)) {
		rsp->pull_wr.wr.opcode = IB_WR_RDMA_READ_WITH_INV;
		rsp->pull_wr.wr.ex.invalidate_rkey = mr->lkey;
	} else {
		rsp->pull_wr.wr.opcode = IB_WR_RDMA_READ;
	}
	mr->need_inval = rsp->pull_wr.wr.opcode != IB_WR_RDMA_READ_WITH_INV;
	rsp->pull_cqe.done = kst_pull_done;
	rsp->pull_wr.wr.wr_cqe = &rsp->pull_cqe;
	rsp->pull_wr.wr.send_flags = IB_SEND_SIGNALED;
	rsp->pull_wr.wr.sg_list = &rsp->pull_sge;
	rsp->pull_wr.wr.num_sge = 1;
	rsp->pull_wr.remote_addr = rsp->remote_addr;
	rsp->pull_wr.rkey = rsp->rkey;
	return ib_post_send(queue->qp, first, NULL);

out_put_mr:
	ib_mr_pool_put(queue->qp, &queue->pull_mrs, mr);
out_credits:
	atomic_add(3, &queue->sq_wr_avail);
	return -EAGAIN;
}

static int kst_queue_response(struct kst_rsp *rsp)
{
	struct kst_queue *queue = rsp->queue;
	struct ib_send_wr *first_wr = &rsp->send_wr;
	int ret;

	rsp->send_cqe.done = kst_send_done;
	rsp->send_wr.next = NULL;
	rsp->send_wr.wr_cqe = &rsp->send_cqe;
	rsp->send_wr.sg_list = &rsp->send_sge;
	rsp->send_wr.num_sge = 1;
	rsp->send_wr.opcode = IB_WR_SEND;
	rsp->send_wr.send_flags = IB_SEND_SIGNALED; // OK: rdma-unsignaled-send-starvation -- the SEND chained behind the R/W WRITEs carries the completion
	rsp->send_credits = 1;

	if (rsp->dir == DMA_TO_DEVICE && rsp->sg_cnt) {
		ret = rdma_rw_ctx_init(&rsp->rw, queue->qp, queue->port_num, rsp->sg, rsp->sg_cnt,
				       0, rsp->remote_addr, rsp->rkey, DMA_TO_DEVICE);
		if (ret < 0)
			return ret;
		rsp->rw_used = true;
		rsp->send_credits += ret;
		first_wr = rdma_rw_ctx_wrs(&rsp->rw, queue->qp, queue->port_num, NULL, &rsp->send_wr);
	}
	if (!kst_take_credits(queue, rsp->send_credits)) {
		if (rsp->rw_used) {
			rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num, rsp->sg,
					    rsp->sg_cnt, DMA_TO_DEVICE);
			rsp->rw_used = false;
		}
		return -EAGAIN;
	}
	return ib_post_send(queue->qp, first_wr, NULL);
}

int kst_send_notify(struct kst_queue *queue, u32 event)
{
	struct ib_sge sge = { queue->notify_dma, sizeof(u32), queue->dev->pd->local_dma_lkey };
	struct ib_send_wr wr = {
		.wr_cqe = &queue->notify_cqe, .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_SEND,
	};

	*queue->notify_buf = event;
	ib_dma_sync_single_for_device(queue->dev->ib, queue->notify_dma, sizeof(u32), DMA_TO_DEVICE);
	if (atomic_read(&queue->notify_unsignaled) >= KST_NOTIFY_SIGNAL_EVERY) { // BUG: rdma-unsignaled-send-starvation -- notify_unsignaled is only ever set to 0, no notification is signaled
		wr.send_flags |= IB_SEND_SIGNALED;
		atomic_set(&queue->notify_unsignaled, 0);
	}
	return ib_post_send(queue->qp, &wr, NULL);
}

void kst_handle_capsule(struct kst_queue *queue, struct kst_cmd *cmd, struct kst_rsp *rsp)
{
	struct kst_capsule *c = cmd->capsule;
	int ret;

	rsp->cmd = cmd;
	rsp->remote_addr = c->raddr;
	rsp->rkey = c->rkey;
	rsp->len = c->len;
	rsp->rw_used = false;
	if (c->flags & KST_F_IMMEDIATE)
		ret = kst_pull_immediate(rsp);
	else if ((c->flags & KST_F_KEYED) && rsp->sg_cnt > queue->max_read_sge)
		ret = kst_pull_keyed(rsp, rsp->sg, rsp->sg_cnt);
	else if (rsp->dir == DMA_FROM_DEVICE)
		ret = kst_rdma_read(rsp);
	else
		ret = kst_queue_response(rsp);
	if (ret)
		pr_err_ratelimited("kst: cid %u failed to post: %d\n", c->cid, ret);
}

static void kst_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kst_rsp *rsp = container_of(wc->wr_cqe, struct kst_rsp, read_cqe);
	struct kst_queue *queue = rsp->queue;

	atomic_add(rsp->n_rdma, &queue->sq_wr_avail);
	if (rsp->rw_used) {
		rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num, rsp->sg,
				    rsp->sg_cnt, DMA_FROM_DEVICE);
		rsp->rw_used = false;
	} else {
		ib_dma_unmap_single(queue->dev->ib, rsp->imm_dma, rsp->len, DMA_FROM_DEVICE);
	}
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("kst: RDMA READ failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	kst_queue_response(rsp);
}

static void kst_pull_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kst_rsp *rsp = container_of(wc->wr_cqe, struct kst_rsp, pull_cqe);
	struct kst_queue *queue = rsp->queue;

	atomic_add(3, &queue->sq_wr_avail);
	ib_dma_unmap_sg(queue->dev->ib, rsp->sg, rsp->sg_cnt, DMA_FROM_DEVICE);
	/* LOCAL_WRITE-only on IB, invalidated by the READ on iWARP */
	ib_mr_pool_put(queue->qp, &queue->pull_mrs, rsp->pull_mr);
	rsp->pull_mr = NULL;
	if (likely(wc->status == IB_WC_SUCCESS))
		kst_queue_response(rsp);
}

static void kst_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kst_rsp *rsp = container_of(wc->wr_cqe, struct kst_rsp, send_cqe);
	struct kst_queue *queue = rsp->queue;

	atomic_add(rsp->send_credits, &queue->sq_wr_avail);
	if (rsp->rw_used) {
		rdma_rw_ctx_destroy(&rsp->rw, queue->qp, queue->port_num, rsp->sg,
				    rsp->sg_cnt, DMA_TO_DEVICE);
		rsp->rw_used = false;
	}
	kst_post_recv(queue, rsp->cmd);
}

