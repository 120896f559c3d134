/*
 * blkc_io.c - submission, completion, timeout and drain paths of blkc.
 *
 * Correct: a new window key per read, completion after a checked
 * SEND_WITH_INV or after the client's own LOCAL_INV completed, per-I/O MRs
 * deregistered before their request is recycled, the drain that waits for
 * every LOCAL_INV it posted.
 * Not correct: a failed command post leaves the per-I/O registration of the
 * user buffer behind, an error response recycles the request with its window
 * still bound, and the reaper recycles timed-out requests right after an
 * unsignaled LOCAL_INV.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "blkc.h"

struct blkc_req *blkc_req_get(struct blkc_conn *c)
{
	struct blkc_req *req;

	pthread_mutex_lock(&c->lock);
	req = c->free_list;
	if (req) {
		c->free_list = req->next;
		req->next  = NULL;
		req->state = BLKC_REQ_INFLIGHT;
	}
	pthread_mutex_unlock(&c->lock);
	return req;
}

void blkc_req_put(struct blkc_conn *c, struct blkc_req *req)
{
	pthread_mutex_lock(&c->lock);
	req->state   = BLKC_REQ_FREE;
	req->next    = c->free_list;
	c->free_list = req;
	pthread_mutex_unlock(&c->lock);
}

static void blkc_fill_cmd(struct blkc_conn *c, struct blkc_req *req,
			  uint64_t lba, uint64_t addr, uint32_t rkey)
{
	struct blkc_cmd *cmd = req->cmd;
	uint32_t be_rkey = htobe32(rkey);

	cmd->tag  = (uintptr_t)req;
	cmd->lba  = htobe64(lba);
	cmd->len  = htobe32(req->len);
	cmd->op   = (uint8_t)req->op;
	cmd->addr = htobe64(addr);
	memcpy(&cmd->rkey, &be_rkey, sizeof(be_rkey));

	req->cmd_sge.addr   = (uintptr_t)cmd;
	req->cmd_sge.length = sizeof(*cmd);
	req->cmd_sge.lkey   = c->cmd_mr->lkey;
	memset(&req->cmd_wr, 0, sizeof(req->cmd_wr));
	req->cmd_wr.wr_id   = (uintptr_t)req;
	req->cmd_wr.sg_list = &req->cmd_sge;
	req->cmd_wr.num_sge = 1;
	req->cmd_wr.opcode  = IBV_WR_SEND;
}

/* Called from the poller and the reaper; the caller has made the keys dead. */
static void blkc_complete(struct blkc_conn *c, struct blkc_req *req, int status)
{
	blkc_done_fn done = req->done;
	void *arg = req->done_arg;

	if (req->big_mr) {
		ibv_dereg_mr(req->big_mr);
		req->big_mr = NULL;
	} else if (req->op == BLKC_OP_READ && status == 0) {
		memcpy(req->user_buf, req->slot, req->len);
	}
	blkc_req_put(c, req);
	done(arg, status);
}

static int blkc_submit_big_read(struct blkc_conn *c, struct blkc_req *req,
				uint64_t lba)
{
	struct ibv_send_wr *bad;

	req->big_mr = ibv_reg_mr(c->pd, req->user_buf, req->len,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-local-mr-management -- per-I/O registration whose rkey goes to the server
	if (!req->big_mr) {
		blkc_req_put(c, req);
		return -ENOMEM;
	}

	blkc_fill_cmd(c, req, lba, (uintptr_t)req->user_buf, req->big_mr->rkey);
	req->deadline_ms = blkc_now_ms() + BLKC_IO_TIMEOUT_MS;
	if (ibv_post_send(c->qp, &req->cmd_wr, &bad)) {
		blkc_req_put(c, req);
		return -EIO; // BUG: rdma-mr-leak, rdma-invalidation-leak -- the request is recycled with big_mr still registered for remote write over the caller's buffer
	}
	return 0;
}

int blkc_submit_read(struct blkc_conn *c, uint64_t lba, void *buf, uint32_t len,
		     blkc_done_fn done, void *arg)
{
	struct blkc_req *req;
	struct ibv_send_wr *bad = NULL;

	req = blkc_req_get(c);
	if (!req)
		return -EAGAIN;
	req->op       = BLKC_OP_READ;
	req->user_buf = buf;
	req->len      = len;
	req->done     = done;
	req->done_arg = arg;
	req->big_mr   = NULL;

	if (len > BLKC_SLOT_SIZE)
		return blkc_submit_big_read(c, req, lba);

	req->rkey = ibv_inc_rkey(req->rkey);
	memset(&req->bind_wr, 0, sizeof(req->bind_wr));
	req->bind_wr.wr_id        = (uintptr_t)req;
	req->bind_wr.opcode       = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the client binds a window per read to expose the slot
	req->bind_wr.bind_mw.mw   = req->mw;
	req->bind_wr.bind_mw.rkey = req->rkey; // OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() for this read
	req->bind_wr.bind_mw.bind_info.mr     = c->slab_mr;
	req->bind_wr.bind_mw.bind_info.addr   = (uintptr_t)req->slot;
	req->bind_wr.bind_mw.bind_info.length = len;
	req->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	req->bind_wr.next = &req->cmd_wr;

	blkc_fill_cmd(c, req, lba, (uintptr_t)req->slot, req->rkey);
	req->deadline_ms = blkc_now_ms() + BLKC_IO_TIMEOUT_MS;
	if (ibv_post_send(c->qp, &req->bind_wr, &bad)) {
		if (bad != &req->bind_wr)
			return 0;	/* bound but no command: the reaper times it out */
		blkc_req_put(c, req); // OK: rdma-invalidation-leak -- the bind itself was rejected; nothing was exposed
		return -EIO;
	}
	return 0;
}

int blkc_write_small(struct blkc_conn *c, uint64_t lba, const void *data,
		     uint32_t len, blkc_done_fn done, void *arg)
{
	struct blkc_req *req;
	struct ibv_send_wr *bad;
	size_t idx;

	if (len > BLKC_SLOT_SIZE)
		return -EINVAL;
	req = blkc_req_get(c);
	if (!req)
		return -EAGAIN;
	req->op       = BLKC_OP_WRITE;
	req->len      = len;
	req->done     = done;
	req->done_arg = arg;
	req->big_mr   = NULL;
	memcpy(req->slot, data, len);
	idx = (size_t)(req - c->reqs);

	req->data_sge.addr   = (uintptr_t)req->slot;
	req->data_sge.length = len;
	req->data_sge.lkey   = c->slab_mr->lkey;
	memset(&req->data_wr, 0, sizeof(req->data_wr));
	req->data_wr.wr_id   = (uintptr_t)req;
	req->data_wr.sg_list = &req->data_sge;
	req->data_wr.num_sge = 1;
	req->data_wr.opcode  = IBV_WR_RDMA_WRITE;
	req->data_wr.wr.rdma.remote_addr = c->srv_stage_addr + idx * BLKC_SLOT_SIZE;
	req->data_wr.wr.rdma.rkey        = c->srv_stage_rkey;
	req->data_wr.next = &req->cmd_wr;

	blkc_fill_cmd(c, req, lba, 0, 0);
	req->deadline_ms = blkc_now_ms() + BLKC_IO_TIMEOUT_MS;
	if (ibv_post_send(c->qp, &req->data_wr, &bad)) {
		blkc_req_put(c, req); // OK: rdma-invalidation-leak -- writes never bind the request's window
		return -EIO;
	}
	return 0;
}

static void blkc_handle_reply(struct blkc_conn *c, const struct ibv_wc *wc,
			      const struct blkc_rsp *rsp)
{
	struct blkc_req *req = (struct blkc_req *)(uintptr_t)rsp->tag;
	int status = (int)be32toh((uint32_t)rsp->status);
	struct ibv_send_wr *bad;
	int live;

	pthread_mutex_lock(&c->lock);
	live = req->state == BLKC_REQ_INFLIGHT;
	pthread_mutex_unlock(&c->lock);
	if (!live)
		return;		/* the reaper got there first */

	if (req->op == BLKC_OP_WRITE || req->big_mr) {
		blkc_complete(c, req, status); // OK: rdma-invalidation-leak -- no window was bound; a per-I/O MR is deregistered by blkc_complete()
		return;
	}
	if (status != 0) {
		/* the server gave up on the I/O and will not touch the slot */
		blkc_complete(c, req, status); // BUG: rdma-invalidation-leak -- error responses are plain SENDs: the window is still bound when the request is recycled
		return;
	}
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == req->rkey) {
		blkc_complete(c, req, 0); // OK: rdma-invalidation-leak -- the server invalidated exactly this window's key
		return;
	}

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.wr_id           = (uintptr_t)req | BLKC_WRID_INV;
	req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
	req->inv_wr.send_flags      = IBV_SEND_SIGNALED;
	req->inv_wr.invalidate_rkey = req->rkey;
	req->state = BLKC_REQ_INVALIDATING;
	if (ibv_post_send(c->qp, &req->inv_wr, &bad)) {
		blkc_log("LOCAL_INV post failed for %p", (void *)req);
		req->state = BLKC_REQ_INFLIGHT;	/* the reaper retries */
	}
}

static void blkc_handle_inv(struct blkc_conn *c, const struct ibv_wc *wc)
{
	struct blkc_req *req = (struct blkc_req *)(uintptr_t)(wc->wr_id & ~BLKC_WRID_MASK);

	if (wc->status != IBV_WC_SUCCESS) {
		blkc_log("LOCAL_INV failed: %s", ibv_wc_status_str(wc->status));
		return;		/* QP is in error; the window dies with the connection */
	}
	blkc_complete(c, req, 0); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- from the successful completion of this request's LOCAL_INV
}

void blkc_poll(struct blkc_conn *c)
{
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_wc wc[16];
	struct ibv_sge sge;
	int i, n;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].opcode & IBV_WC_RECV) {
			size_t slot = (size_t)(wc[i].wr_id >> 2);
			char *msg = (char *)c->rx_ring + slot * BLKC_RX_MSG_SIZE;

			if (wc[i].status == IBV_WC_SUCCESS)
				blkc_handle_reply(c, &wc[i], (const struct blkc_rsp *)msg);
			sge.addr   = (uintptr_t)msg;
			sge.length = BLKC_RX_MSG_SIZE;
			sge.lkey   = c->rx_mr->lkey;
			memset(&rwr, 0, sizeof(rwr));
			rwr.wr_id   = wc[i].wr_id;
			rwr.sg_list = &sge;
			rwr.num_sge = 1;
			ibv_post_recv(c->qp, &rwr, &rbad);
		} else if (wc[i].wr_id & BLKC_WRID_INV) {
			blkc_handle_inv(c, &wc[i]);
		}
	}
}

void *blkc_reaper_main(void *arg)
{
	struct blkc_conn *c = arg;
	struct blkc_req *expired[BLKC_QUEUE_DEPTH];
	struct ibv_send_wr *bad;
	struct blkc_req *req;
	uint64_t now;
	int i, nexp;

	while (!c->stopping) {
		usleep(100 * 1000);
		now  = blkc_now_ms();
		nexp = 0;
		pthread_mutex_lock(&c->lock);
		for (i = 0; i < BLKC_QUEUE_DEPTH; i++) {
			req = &c->reqs[i];
			if (req->state == BLKC_REQ_INFLIGHT && now >= req->deadline_ms) {
				req->state = BLKC_REQ_TIMEDOUT;
				expired[nexp++] = req;
			}
		}
		pthread_mutex_unlock(&c->lock);

		for (i = 0; i < nexp; i++) {
			req = expired[i];
			blkc_log("request %p timed out", (void *)req);
			if (req->op == BLKC_OP_READ && !req->big_mr) {
				memset(&req->inv_wr, 0, sizeof(req->inv_wr));
				req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
				req->inv_wr.invalidate_rkey = req->rkey;
				if (ibv_post_send(c->qp, &req->inv_wr, &bad)) {
					blkc_log("cannot invalidate %p, leaving it out", (void *)req);
					continue;
				}
			}
			blkc_complete(c, req, -ETIMEDOUT); // BUG: rdma-unmap-before-invalidate -- the LOCAL_INV above is unsignaled and not waited for; the slot is handed out again
		}
	}
	return NULL;
}

/* Disconnect: kill every window still out and wait until all are dead. */
int blkc_drain(struct blkc_conn *c)
{
	struct ibv_send_wr *bad;
	struct blkc_req *req;
	unsigned pending = 0;
	struct ibv_wc wc;
	int i, n, err = 0;

	for (i = 0; i < BLKC_QUEUE_DEPTH; i++) {
		req = &c->reqs[i];
		if (req->state != BLKC_REQ_INFLIGHT || req->op != BLKC_OP_READ || req->big_mr)
			continue;
		memset(&req->inv_wr, 0, sizeof(req->inv_wr));
		req->inv_wr.wr_id           = (uintptr_t)req | BLKC_WRID_DRAIN;
		req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
		req->inv_wr.send_flags      = IBV_SEND_SIGNALED;
		req->inv_wr.invalidate_rkey = req->rkey;
		if (ibv_post_send(c->qp, &req->inv_wr, &bad)) {
			err = -EIO;
			break;
		}
		req->state = BLKC_REQ_INVALIDATING;
		pending++;
	}

	while (pending > 0) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0 || !(wc.wr_id & BLKC_WRID_DRAIN))
			continue;
		pending--;
		if (wc.status != IBV_WC_SUCCESS) {
			err = -EIO;
			continue;
		}
		req = (struct blkc_req *)(uintptr_t)(wc.wr_id & ~BLKC_WRID_MASK);
		blkc_complete(c, req, -ECONNABORTED); // OK: rdma-unmap-before-invalidate -- this request's own LOCAL_INV completed successfully
	}
	return err;
}
