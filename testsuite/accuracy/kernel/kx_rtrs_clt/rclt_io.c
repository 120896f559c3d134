// SPDX-License-Identifier: GPL-2.0
/*
 * rclt_io.c - rclt requests: submission, completion, timeout and abort.
 *
 * READ requests register their own MR (req->mr) and send its rkey in the
 * request message; the server writes the data, may invalidate the rkey
 * with SEND_WITH_INV, and finishes with RDMA_WRITE_WITH_IMM.  When the
 * server did not invalidate, the completion posts a signaled LOCAL_INV and
 * the request finishes from its completion.  WRITE requests use a pool MR
 * from rclt_mr.c.
 *
 * Correct here: request ring allocation, the READ/WRITE error paths, the
 * LOCAL_INV completion, rclt_complete_req() (also when it waits for the
 * invalidation on behalf of an abort) and the WRITE response handling.
 * Wrong here: the READ registration never moves its key, the READ side of
 * the receive handler trusts any remote invalidation, the timeout work
 * fails READs with their rkey still live, and resizing the per-request MRs
 * drops the old ones.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/jiffies.h>
#include <asm/byteorder.h>
#include "rclt.h"

enum {
	RCLT_MSG_READ	= 1,
	RCLT_MSG_WRITE	= 2,
};

void rclt_con_error(struct rclt_con *con)
{
	if (!con->connected)
		return;
	con->connected = false;
	wake_up_all(&con->wait_mr);
	schedule_work(&con->err_work);
}

static void rclt_write_done_work(struct work_struct *work);

static void rclt_free_reqs(struct rclt_con *con)
{
	int i;

	if (!con->reqs)
		return;
	for (i = 0; i < con->queue_depth; i++) {
		if (con->reqs[i].mr)
			ib_dereg_mr(con->reqs[i].mr);
		kfree(con->reqs[i].msg);
	}
	kfree(con->reqs);
	con->reqs = NULL;
}

int rclt_alloc_reqs(struct rclt_con *con)
{
	struct rclt_io_req *req;
	int i;

	con->reqs = kcalloc(con->queue_depth, sizeof(*con->reqs), GFP_KERNEL);
	if (!con->reqs)
		return -ENOMEM;

	for (i = 0; i < con->queue_depth; i++) {
		req = &con->reqs[i];
		req->con = con;
		req->msg_id = i;
		req->msg = kzalloc(sizeof(*req->msg), GFP_KERNEL);
		if (!req->msg)
			goto out;
		req->mr = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, con->max_pages);
		if (IS_ERR(req->mr)) {
			req->mr = NULL;
			goto out; /* OK: rdma-mr-leak -- rclt_free_reqs() deregisters every slot's MR */
		}
		init_completion(&req->inv_comp);
		INIT_WORK(&req->done_work, rclt_write_done_work);
	}
	return 0;

out:
	rclt_free_reqs(con);
	return -ENOMEM;
}

/* After a reconnect the server may allow larger I/Os. */
int rclt_update_max_pages(struct rclt_con *con, u32 max_pages)
{
	struct ib_mr *mr;
	int i;

	for (i = 0; i < con->queue_depth; i++) {
		mr = ib_alloc_mr(con->pd, IB_MR_TYPE_MEM_REG, max_pages);
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		con->reqs[i].mr = mr; /* BUG: rdma-mr-leak -- the slot's previous MR is overwritten without ib_dereg_mr() */
	}
	con->max_pages = max_pages;
	return 0;
}

struct rclt_io_req *rclt_get_req(struct rclt_con *con)
{
	int i;

	for (i = 0; i < con->queue_depth; i++) {
		struct rclt_io_req *req = &con->reqs[i];

		if (!req->in_use) {
			req->in_use = true;
			req->start_jiffies = jiffies;
			return req;
		}
	}
	return NULL;
}

static void rclt_finish_req(struct rclt_io_req *req, int err)
{
	if (req->dir == DMA_FROM_DEVICE && req->sg_cnt)
		ib_dma_unmap_sg(req->con->dev, req->sglist, req->sg_cnt,
				req->dir);
	req->sg_cnt = 0;
	req->in_use = false;
	req->conf(req->priv, err);
}

static void rclt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rclt_io_req *req = container_of(wc->wr_cqe, struct rclt_io_req,
					       send_cqe);

	if (wc->status != IB_WC_SUCCESS)
		rclt_con_error(req->con);
}

static int rclt_post_msg(struct rclt_con *con, struct rclt_io_req *req,
			 struct ib_send_wr *head)
{
	struct ib_send_wr wr = {};

	req->msg_sge.addr = req->msg_dma;
	req->msg_sge.length = sizeof(*req->msg);
	req->msg_sge.lkey = con->pd->local_dma_lkey;
	req->send_cqe.done = rclt_send_done;

	wr.wr_cqe = &req->send_cqe;
	wr.sg_list = &req->msg_sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;
	if (head) {
		head->next = &wr;
		return ib_post_send(con->qp, head, NULL);
	}
	return ib_post_send(con->qp, &wr, NULL);
}

int rclt_read_req(struct rclt_con *con, struct rclt_io_req *req)
{
	struct rclt_msg_io *msg = req->msg;
	struct ib_reg_wr rwr;
	int count, n, err;

	req->dir = DMA_FROM_DEVICE;
	count = ib_dma_map_sg(con->dev, req->sglist, req->sg_cnt, req->dir);
	if (!count)
		return -EINVAL;

	n = ib_map_mr_sg(req->mr, req->sglist, count, NULL, SZ_4K);
	if (n != count) {
		ib_dma_unmap_sg(con->dev, req->sglist, req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- nothing registered yet */
		req->sg_cnt = 0;
		return n < 0 ? n : -EINVAL;
	}

	rwr = (struct ib_reg_wr) {
		.wr.opcode	= IB_WR_REG_MR,
		.wr.wr_cqe	= &con->fast_reg_cqe,
		.mr		= req->mr, /* BUG: rdma-rkey-reuse -- req->mr is invalidated after every READ and registered again under the same rkey */
		.key		= req->mr->rkey,
		.access		= IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE,
	};

	msg->type = cpu_to_le32(RCLT_MSG_READ);
	msg->msg_id = cpu_to_le32(req->msg_id);
	msg->flags = cpu_to_le32(RCLT_MSG_NEED_INVAL_F);
	msg->sg_cnt = cpu_to_le32(1);
	msg->desc[0].addr = cpu_to_le64(req->mr->iova);
	msg->desc[0].key = cpu_to_le32(req->mr->rkey);
	msg->desc[0].len = cpu_to_le32(req->mr->length);
	req->need_inv = true;

	err = rclt_post_msg(con, req, &rwr.wr);
	if (err) {
		req->need_inv = false;
		ib_dma_unmap_sg(con->dev, req->sglist, req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- the REG_MR + SEND chain was not posted */
		req->sg_cnt = 0;
		return err;
	}
	return 0;
}

int rclt_write_req(struct rclt_con *con, struct rclt_io_req *req)
{
	struct rclt_msg_io *msg = req->msg;
	int err;

	req->dir = DMA_TO_DEVICE;
	req->wmr = rclt_mr_register(con, req->sglist, req->sg_cnt, false);
	if (!req->wmr)
		return -EAGAIN;

	msg->type = cpu_to_le32(RCLT_MSG_WRITE);
	msg->msg_id = cpu_to_le32(req->msg_id);
	msg->flags = cpu_to_le32(RCLT_MSG_NEED_INVAL_F);
	msg->sg_cnt = cpu_to_le32(1);
	msg->desc[0].addr = cpu_to_le64(req->wmr->mr->iova);
	msg->desc[0].key = cpu_to_le32(req->wmr->mr->rkey);
	msg->desc[0].len = cpu_to_le32(req->wmr->mr->length);

	err = rclt_post_msg(con, req, NULL);
	if (err) {
		rclt_mr_deregister(req->wmr);
		req->wmr = NULL;
	}
	return err;
}

static void rclt_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rclt_io_req *req = container_of(wc->wr_cqe, struct rclt_io_req,
					       inv_cqe);

	req->inv_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	if (req->need_inv_comp) {
		complete(&req->inv_comp);
		return;
	}
	if (req->inv_status) {
		pr_err("rclt: LOCAL_INV for msg %u failed: %s\n", req->msg_id,
		       ib_wc_status_msg(wc->status));
		rclt_con_error(req->con);
		return;
	}
	rclt_finish_req(req, req->inv_errno); /* OK: rdma-invalidation-leak -- LOCAL_INV status checked above */
}

static int rclt_inv_rkey(struct rclt_io_req *req)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = &req->inv_cqe,
		.send_flags	    = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = req->mr->rkey,
	};

	req->inv_cqe.done = rclt_inv_done;
	return ib_post_send(req->con->qp, &wr, NULL);
}

static void rclt_complete_req(struct rclt_io_req *req, int err, bool can_wait)
{
	if (req->need_inv) {
		req->need_inv = false;
		req->inv_errno = err;
		req->need_inv_comp = can_wait;
		if (can_wait)
			reinit_completion(&req->inv_comp);

		if (rclt_inv_rkey(req)) {
			/* failed by the error work once the QP is drained */
			pr_err("rclt: LOCAL_INV for msg %u not posted\n",
			       req->msg_id);
			rclt_con_error(req->con);
			return;
		}
		if (!can_wait)
			return;	/* finished from rclt_inv_done() */

		wait_for_completion(&req->inv_comp);
		if (req->inv_status) {
			rclt_con_error(req->con);
			return;
		}
	}
	rclt_finish_req(req, err); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- reached only with the rkey invalidated: LOCAL_INV awaited, or the server's invalidation */
}

/* Upper layer cancels a request; process context. */
void rclt_abort_req(struct rclt_io_req *req)
{
	if (req->dir == DMA_TO_DEVICE) {
		if (rclt_mr_deregister(req->wmr)) {
			rclt_con_error(req->con);
			return;
		}
		req->wmr = NULL;
		rclt_finish_req(req, -ECANCELED); /* OK: rdma-invalidation-leak -- rclt_mr_deregister() waited for the pool MR's LOCAL_INV */
		return;
	}
	rclt_complete_req(req, -ECANCELED, true);
}

static void rclt_process_read_inv(struct rclt_con *con, struct rclt_io_req *req,
				  struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* BUG: rdma-remote-invalidate-unchecked -- any rkey the server invalidated cancels this request's LOCAL_INV */
		req->need_inv = false;
	}
}

static void rclt_process_write_rsp(struct rclt_con *con,
				   struct rclt_io_req *req, struct ib_wc *wc,
				   int status)
{
	struct rclt_mr *wmr = req->wmr;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* OK: rdma-remote-invalidate-unchecked -- compared with the pool MR's rkey */
		if (wc->ex.invalidate_rkey != wmr->mr->rkey) {
			pr_err("rclt: server invalidated %#x, expected %#x\n",
			       wc->ex.invalidate_rkey, wmr->mr->rkey);
			rclt_con_error(con);
			return;
		}
		wmr->need_invalidate = false;
	}
	req->status = status;
	schedule_work(&req->done_work);
}

static void rclt_write_done_work(struct work_struct *work)
{
	struct rclt_io_req *req = container_of(work, struct rclt_io_req,
					       done_work);

	if (rclt_mr_deregister(req->wmr)) {
		rclt_con_error(req->con);
		return;
	}
	req->wmr = NULL;
	rclt_finish_req(req, req->status); /* OK: rdma-invalidation-leak -- the pool MR was invalidated (and waited for) by rclt_mr_deregister() */
}

void rclt_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rclt_rx *rx = container_of(wc->wr_cqe, struct rclt_rx, cqe);
	struct rclt_con *con = rx->con;
	struct rclt_io_req *req;
	u32 msg_id, imm;

	if (wc->status != IB_WC_SUCCESS) {
		rclt_con_error(con);
		return;
	}

	if (wc->opcode == IB_WC_RECV_RDMA_WITH_IMM) {
		imm = be32_to_cpu(wc->ex.imm_data);
		msg_id = imm & 0xffff;
		if (msg_id >= con->queue_depth) {
			rclt_con_error(con);
			return;
		}
		req = &con->reqs[msg_id];
		rclt_complete_req(req, (imm >> 16) ? -EIO : 0, false);
	} else {
		msg_id = le32_to_cpu(rx->buf->msg_id);
		if (msg_id >= con->queue_depth) {
			rclt_con_error(con);
			return;
		}
		req = &con->reqs[msg_id];
		if (req->dir == DMA_TO_DEVICE)
			rclt_process_write_rsp(con, req, wc,
					       le32_to_cpu(rx->buf->status));
		else
			rclt_process_read_inv(con, req, wc);
	}
	rclt_post_recv(con, rx);
}

void rclt_timeout_work(struct work_struct *work)
{
	struct rclt_con *con = container_of(to_delayed_work(work),
					    struct rclt_con, timeout_dwork);
	unsigned long tmo = msecs_to_jiffies(RCLT_IO_TIMEOUT_MS);
	int i;

	for (i = 0; i < con->queue_depth; i++) {
		struct rclt_io_req *req = &con->reqs[i];

		if (!req->in_use || jiffies - req->start_jiffies < tmo)
			continue;

		pr_warn("rclt: msg %u timed out\n", req->msg_id);
		if (req->dir == DMA_TO_DEVICE) {
			rclt_mr_deregister_nowait(req->wmr);
			req->wmr = NULL;
			rclt_finish_req(req, -ETIMEDOUT);
			continue;
		}
		req->need_inv = false;
		rclt_finish_req(req, -ETIMEDOUT); /* BUG: rdma-invalidation-leak -- the server still holds req->mr's rkey; buffer unmapped and slot reused without LOCAL_INV */
	}
	queue_delayed_work(system_wq, &con->timeout_dwork, tmo);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rclt block transport client");
