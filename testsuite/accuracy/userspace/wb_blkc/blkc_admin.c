/*
 * blkc_admin.c - admin queue.
 *
 * Admin commands are rare and synchronous: the caller spins on the admin
 * CQ until its response arrives.  Identify data is written by the target
 * through a window over a 4 KiB buffer registered on the first identify.
 * The send queue holds BIND_MW, SEND and LOCAL_INV for every slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "blkc.h"

#define BLKC_AQ_SPIN_LIMIT	(1 << 24)

static int blkc_aq_post_rsp(struct blkc_aq *aq, unsigned i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&aq->rsps[i],
		.length = sizeof(aq->rsps[i]),
		.lkey = aq->rsp_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(aq->qp, &wr, &bad);
}

int blkc_aq_create(struct blkc_ctrl *ctrl, struct rdma_cm_id *id)
{
	struct blkc_aq *aq = &ctrl->aq;
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap = {
			/* OK: rdma-send-queue-undersized -- BIND_MW, SEND and LOCAL_INV for each admin slot, plus one */
			.max_send_wr = 3 * BLKC_AQ_DEPTH + 1,
			.max_recv_wr = BLKC_AQ_DEPTH,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			/* OK: rdma-queue-cap-unchecked -- the granted inline size is read back after creation */
			.max_inline_data = BLKC_AQ_INLINE,
		},
	};
	unsigned i;

	aq->cm_id = id;
	aq->cq = ibv_create_cq(ctrl->verbs, 4 * BLKC_AQ_DEPTH, aq, NULL, 0);
	if (!aq->cq)
		return -ENOMEM;
	init.send_cq = aq->cq;
	init.recv_cq = aq->cq;
	if (rdma_create_qp(id, ctrl->pd, &init))
		goto err_cq;
	aq->qp = id->qp;
	aq->inline_max = init.cap.max_inline_data;
	if (aq->inline_max < sizeof(struct blkc_cmd)) {
		fprintf(stderr, "blkc: admin QP granted only %u bytes inline\n", aq->inline_max);
		goto err_qp;
	}

	aq->rsp_mr = ibv_reg_mr(ctrl->pd, aq->rsps, sizeof(aq->rsps), IBV_ACCESS_LOCAL_WRITE);
	if (!aq->rsp_mr)
		goto err_qp;
	for (i = 0; i < BLKC_AQ_DEPTH; i++) {
		aq->reqs[i].mw = ibv_alloc_mw(ctrl->pd, IBV_MW_TYPE_2);
		if (!aq->reqs[i].mw)
			goto err_mw;
		aq->reqs[i].rkey = aq->reqs[i].mw->rkey;
	}
	for (i = 0; i < BLKC_AQ_DEPTH; i++)
		if (blkc_aq_post_rsp(aq, i))
			goto err_all;
	return 0;

err_all:
	i = BLKC_AQ_DEPTH;
err_mw:
	while (i--)
		ibv_dealloc_mw(aq->reqs[i].mw);
	ibv_dereg_mr(aq->rsp_mr);
err_qp:
	rdma_destroy_qp(id);
err_cq:
	ibv_destroy_cq(aq->cq);
	return -ENOMEM;
}

static struct blkc_areq *blkc_aq_get(struct blkc_aq *aq, uint16_t *tag)
{
	unsigned i;

	for (i = 0; i < BLKC_AQ_DEPTH; i++) {
		if (!aq->reqs[i].busy) {
			aq->reqs[i].busy = true;
			aq->reqs[i].done = false;
			aq->reqs[i].mapped = false;
			*tag = i;
			return &aq->reqs[i];
		}
	}
	return NULL;
}

static int blkc_aq_post_inv(struct blkc_aq *aq, struct blkc_areq *areq, uint16_t tag)
{
	struct ibv_send_wr *bad;

	memset(&areq->inv_wr, 0, sizeof(areq->inv_wr));
	areq->inv_wr.wr_id = 0x10000 | tag;
	areq->inv_wr.opcode = IBV_WR_LOCAL_INV;
	areq->inv_wr.invalidate_rkey = areq->rkey;
	areq->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(aq->qp, &areq->inv_wr, &bad);
}

static void blkc_aq_handle_rsp(struct blkc_aq *aq, const struct ibv_wc *wc)
{
	struct blkc_rsp *rsp = &aq->rsps[wc->wr_id];
	struct blkc_areq *areq;

	if (rsp->tag >= BLKC_AQ_DEPTH)
		return;
	areq = &aq->reqs[rsp->tag];
	areq->status = rsp->status;
	/* BUG: rdma-remote-invalidate-unchecked -- whatever key the target invalidated, the identify window is taken as dead */
	if (wc->wc_flags & IBV_WC_WITH_INV)
		areq->mapped = false;
	if (areq->mapped && blkc_aq_post_inv(aq, areq, rsp->tag) == 0)
		return;			/* done when the LOCAL_INV completes */
	areq->done = true;
}

/* Spin until the admin command in @areq has finished. */
static int blkc_aq_wait(struct blkc_aq *aq, struct blkc_areq *areq)
{
	struct ibv_wc wc;
	long spins = 0;
	int n;

	while (!areq->done) {
		if (++spins > BLKC_AQ_SPIN_LIMIT)
			return -ETIMEDOUT;
		n = ibv_poll_cq(aq->cq, 1, &wc);
		if (n <= 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS)
			return -EIO;
		if (wc.opcode & IBV_WC_RECV) {
			blkc_aq_handle_rsp(aq, &wc);
			blkc_aq_post_rsp(aq, wc.wr_id);
		} else if (wc.opcode == IBV_WC_LOCAL_INV) {
			aq->reqs[wc.wr_id & 0xffff].mapped = false;
			aq->reqs[wc.wr_id & 0xffff].done = true;
		}
	}
	return areq->status ? -EIO : 0;
}

static int blkc_aq_send(struct blkc_aq *aq, struct blkc_areq *areq, struct ibv_send_wr *first)
{
	struct ibv_send_wr *bad;

	areq->sge.addr = (uintptr_t)&areq->cmd;
	areq->sge.length = sizeof(areq->cmd);
	areq->sge.lkey = 0;		/* always inline, checked at creation */
	memset(&areq->send_wr, 0, sizeof(areq->send_wr));
	areq->send_wr.opcode = IBV_WR_SEND;
	areq->send_wr.sg_list = &areq->sge;
	areq->send_wr.num_sge = 1;
	areq->send_wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	return ibv_post_send(aq->qp, first ? first : &areq->send_wr, &bad);
}

int blkc_identify(struct blkc_ctrl *ctrl, void *out, size_t len)
{
	struct blkc_aq *aq = &ctrl->aq;
	struct blkc_areq *areq;
	uint16_t tag;
	int ret;

	if (len > BLKC_ID_BUF_SZ)
		return -EINVAL;
	if (!aq->id_mr) {
		aq->id_buf = aligned_alloc(4096, BLKC_ID_BUF_SZ);
		if (!aq->id_buf)
			return -ENOMEM;
		/* OK: rdma-registration-in-datapath -- registered on the first identify and kept */
		aq->id_mr = ibv_reg_mr(ctrl->pd, aq->id_buf, BLKC_ID_BUF_SZ, IBV_ACCESS_MW_BIND);
		if (!aq->id_mr)
			return -errno;
	}
	areq = blkc_aq_get(aq, &tag);
	if (!areq)
		return -EBUSY;

	areq->rkey = ibv_inc_rkey(areq->rkey);
	memset(&areq->bind_wr, 0, sizeof(areq->bind_wr));
	areq->bind_wr.opcode = IBV_WR_BIND_MW;
	areq->bind_wr.bind_mw.mw = areq->mw;
	areq->bind_wr.bind_mw.rkey = areq->rkey;
	areq->bind_wr.bind_mw.bind_info.mr = aq->id_mr;
	areq->bind_wr.bind_mw.bind_info.addr = (uintptr_t)aq->id_buf;
	areq->bind_wr.bind_mw.bind_info.length = BLKC_ID_BUF_SZ;
	/* BUG: rdma-access-flags-invalid -- the target writes identify data through this window, but id_mr was registered without LOCAL_WRITE */
	areq->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	areq->bind_wr.next = &areq->send_wr;
	areq->mapped = true;

	memset(&areq->cmd, 0, sizeof(areq->cmd));
	areq->cmd.opcode = BLKC_ADM_IDENTIFY;
	areq->cmd.tag = tag;
	areq->cmd.addr = (uintptr_t)aq->id_buf;
	areq->cmd.len = BLKC_ID_BUF_SZ;
	areq->cmd.rkey = areq->rkey;

	/* OK: rdma-unsignaled-send-starvation -- the bind is unsignaled, the command SEND behind it is signaled */
	ret = blkc_aq_send(aq, areq, &areq->bind_wr);
	if (!ret)
		ret = blkc_aq_wait(aq, areq);
	if (!ret)
		memcpy(out, aq->id_buf, len);
	areq->busy = false;
	return ret;
}

int blkc_keep_alive(struct blkc_ctrl *ctrl)
{
	struct blkc_aq *aq = &ctrl->aq;
	struct blkc_areq *areq;
	uint16_t tag;
	int ret;

	areq = blkc_aq_get(aq, &tag);
	if (!areq)
		return -EBUSY;
	memset(&areq->cmd, 0, sizeof(areq->cmd));
	areq->cmd.opcode = BLKC_ADM_KEEP_ALIVE;
	areq->cmd.tag = tag;
	ret = blkc_aq_send(aq, areq, NULL);
	if (!ret)
		ret = blkc_aq_wait(aq, areq);
	areq->busy = false;
	return ret;
}
