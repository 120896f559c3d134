/*
 * blkc_io.c - I/O submission and completion.
 *
 * A request with data posts BIND_MW -> SEND as one chain.  The response
 * normally arrives as SEND_WITH_INV for the request's window; the key is
 * compared before the window is taken as dead, otherwise (or on mismatch)
 * the request posts its own LOCAL_INV and completes from its completion.
 * Buffers outside the pool are registered for the duration of the command.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include "blkc.h"

#define BLKC_WC_BATCH	16

enum { BLKC_WR_SEND = 1, BLKC_WR_INV = 2 };
#define BLKC_WRID(req, t)	((uint64_t)(uintptr_t)(req) | (t))
#define BLKC_WRID_REQ(id)	((struct blkc_req *)(uintptr_t)((id) & ~3ULL))

static struct blkc_req *blkc_req_get(struct blkc_queue *q)
{
	struct blkc_req *req = q->free_reqs;

	if (req)
		q->free_reqs = req->next_free;
	return req;
}

static void blkc_req_put(struct blkc_req *req)
{
	struct blkc_queue *q = req->q;

	req->next_free = q->free_reqs;
	q->free_reqs = req;
}

static bool blkc_in_pool(struct blkc_ctrl *ctrl, const void *buf, size_t len)
{
	const char *p = buf;

	return p >= ctrl->pool && p + len <= ctrl->pool + BLKC_POOL_SZ;
}

static int blkc_map_data(struct blkc_queue *q, struct blkc_req *req)
{
	struct blkc_ctrl *ctrl = q->ctrl;
	int acc = IBV_ACCESS_MW_BIND;

	req->user_mr = NULL;
	if (!blkc_in_pool(ctrl, req->data, req->len)) {
		if (req->opcode == BLKC_CMD_READ)
			acc |= IBV_ACCESS_LOCAL_WRITE;
		/* BUG: rdma-registration-in-datapath -- the caller's buffer is registered for this one command */
		req->user_mr = ibv_reg_mr(ctrl->pd, req->data, req->len, acc);
		if (!req->user_mr)
			return -errno;
	}

	req->rkey = ibv_inc_rkey(req->rkey);
	memset(&req->bind_wr, 0, sizeof(req->bind_wr));
	req->bind_wr.opcode = IBV_WR_BIND_MW;
	req->bind_wr.bind_mw.mw = req->mw;
	req->bind_wr.bind_mw.rkey = req->rkey;
	req->bind_wr.bind_mw.bind_info.mr = req->user_mr ? req->user_mr : ctrl->pool_mr;
	req->bind_wr.bind_mw.bind_info.addr = (uintptr_t)req->data;
	req->bind_wr.bind_mw.bind_info.length = req->len;
	/* OK: rdma-access-flags-invalid -- REMOTE_WRITE only for READ commands, whose user_mr got LOCAL_WRITE above */
	req->bind_wr.bind_mw.bind_info.mw_access_flags =
		req->opcode == BLKC_CMD_READ ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	/* OK: rdma-unsignaled-send-starvation -- the bind is retired by the signaled command SEND behind it */
	req->bind_wr.send_flags = 0;
	req->bind_wr.next = &req->send_wr;
	req->mapped = true;
	return 0;
}

static void blkc_unmap_data(struct blkc_req *req)
{
	if (req->user_mr) {
		ibv_dereg_mr(req->user_mr); /* BUG: rdma-registration-in-datapath -- per-command registration torn down on the completion path */
		req->user_mr = NULL;
	}
}

static void blkc_req_complete(struct blkc_req *req)
{
	if (--req->pending > 0)
		return;
	blkc_unmap_data(req);
	req->done(req, req->status);
	blkc_req_put(req);
}

int blkc_submit(struct blkc_queue *q, uint8_t opcode, uint64_t slba, void *buf,
		size_t len, void (*done)(struct blkc_req *, int), void *priv)
{
	struct blkc_req *req;
	struct blkc_cmd *cmd;
	struct ibv_send_wr *first, *bad;
	int ret;

	req = blkc_req_get(q);
	if (!req)
		return -EBUSY;
	req->opcode = opcode;
	req->data = buf;
	req->len = len;
	req->done = done;
	req->priv = priv;
	req->status = 0;
	req->mapped = false;
	req->pending = 2;		/* SEND completion + response */

	cmd = &q->cmds[req->tag];
	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = opcode;
	cmd->tag = req->tag;
	cmd->slba = slba;
	cmd->nlb = len / 512;

	first = &req->send_wr;
	if (len) {
		ret = blkc_map_data(q, req);
		if (ret)
			goto err_put;
		cmd->addr = (uintptr_t)buf;
		cmd->len = len;
		cmd->rkey = req->rkey;
		first = &req->bind_wr;
	}

	req->send_sge.addr = (uintptr_t)cmd;
	req->send_sge.length = sizeof(*cmd);
	req->send_sge.lkey = q->cmd_mr->lkey;
	memset(&req->send_wr, 0, sizeof(req->send_wr));
	req->send_wr.wr_id = BLKC_WRID(req, BLKC_WR_SEND);
	req->send_wr.opcode = IBV_WR_SEND;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = IBV_SEND_SIGNALED;

	ret = ibv_post_send(q->qp, first, &bad);
	if (ret)
		goto err_unmap;
	return 0;

err_unmap:
	blkc_unmap_data(req);
err_put:
	blkc_req_put(req);
	return -ret;
}

static int blkc_post_inv(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr *bad;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.wr_id = BLKC_WRID(req, BLKC_WR_INV);
	req->inv_wr.opcode = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->rkey;
	req->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(q->qp, &req->inv_wr, &bad);
}

static void blkc_handle_rsp(struct blkc_queue *q, const struct ibv_wc *wc)
{
	struct blkc_rsp *rsp = &q->rsps[wc->wr_id];
	struct blkc_req *req;

	if (rsp->tag >= q->depth) {
		fprintf(stderr, "blkc q%d: bogus tag %u\n", q->qid, rsp->tag);
		return;
	}
	req = &q->reqs[rsp->tag];
	req->status = rsp->status;

	/* OK: rdma-remote-invalidate-unchecked -- the key the target invalidated must be this request's */
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey == req->rkey) {
			req->mapped = false;
		} else {
			fprintf(stderr, "blkc q%d: tag %u: invalidated %#x, expected %#x\n",
				q->qid, req->tag, wc->invalidated_rkey, req->rkey);
			req->status = -EIO;
		}
	}
	if (req->mapped) {
		req->pending++;
		if (blkc_post_inv(q, req)) {
			req->pending--;
			req->status = -EIO;	/* leave the window; the queue is going down */
		}
	}
	blkc_req_complete(req);
}

int blkc_poll(struct blkc_queue *q)
{
	struct ibv_wc wc[BLKC_WC_BATCH];
	int n, i, done = 0;

	n = ibv_poll_cq(q->cq, BLKC_WC_BATCH, wc);
	if (n < 0)
		return n;
	for (i = 0; i < n; i++) {
		struct blkc_req *req;

		if (wc[i].opcode & IBV_WC_RECV) {
			if (wc[i].status == IBV_WC_SUCCESS)
				blkc_handle_rsp(q, &wc[i]);
			blkc_post_rsp(q, wc[i].wr_id);
			done++;
			continue;
		}
		req = BLKC_WRID_REQ(wc[i].wr_id);
		if (wc[i].status != IBV_WC_SUCCESS)
			req->status = -EIO;
		if (wc[i].opcode == IBV_WC_LOCAL_INV)
			req->mapped = false;
		blkc_req_complete(req);
	}
	return done;
}
