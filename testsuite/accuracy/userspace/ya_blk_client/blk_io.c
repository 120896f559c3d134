/*
 * blk_io.c - command submission, response handling and timeouts.
 *
 * Right: the normal response path deregisters the slot's data MR before
 * blk_io_finish() recycles the slot and frees the bounce copy; a failed
 * submission deregisters first; in-capsule writes expose nothing; a response
 * carrying a remote invalidation is refused.  Wrong: a response rejected
 * with INVALID_FIELD skips the deregistration ("the target never touched
 * the buffer"), and an I/O whose ABORT went unanswered is failed back to the
 * caller with its key still registered.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "blk.h"

#define blk_err(q, fmt, ...) \
	fprintf(stderr, "blk qp %u: " fmt "\n", (q)->qp->qp_num, ##__VA_ARGS__)

#define BLK_WRID_CMD(tag)   ((uint64_t)(tag) | (1ull << 32))
#define BLK_WRID_IS_CMD(id) (((id) >> 32) == 1)

static int blk_post_capsule(struct blk_queue *q, unsigned tag, size_t len)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr   = (uintptr_t)&q->cmds[tag];
	sge.length = (uint32_t)len;
	sge.lkey   = q->cmd_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id      = BLK_WRID_CMD(tag);
	wr.sg_list    = &sge;
	wr.num_sge    = 1;
	wr.opcode     = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(q->qp, &wr, &bad);
}

/* hand the slot and its bounce copy back, then complete to the caller */
static void blk_io_finish(struct blk_queue *q, unsigned tag, int err)
{
	struct blk_io *io = q->io[tag];

	if (q->bounce[tag]) {
		if (!err && !io->write)
			memcpy(io->buf, q->bounce[tag], io->len);
		free(q->bounce[tag]);
		q->bounce[tag] = NULL;
	}
	blk_free_tag(q, tag);
	io->done(io, err);
}

int blk_submit(struct blk_queue *q, struct blk_io *io)
{
	struct blk_capsule *cmd;
	void *data = io->buf;
	size_t hdr = offsetof(struct blk_capsule, data);
	int access, tag, ret;

	tag = blk_alloc_tag(q);
	if (tag < 0)
		return -EAGAIN;
	q->io[tag] = io;
	q->deadline[tag] = time(NULL) + BLK_IO_TIMEOUT_SEC;

	cmd = &q->cmds[tag];
	memset(cmd, 0, hdr);
	cmd->opcode = io->write ? BLK_OPC_WRITE : BLK_OPC_READ;
	cmd->tag    = (uint16_t)tag;
	cmd->slba   = io->slba;
	cmd->nlb    = (uint32_t)(io->len / 512);

	if (io->write && io->len <= BLK_INCAPSULE_MAX) {
		cmd->flags = BLK_CMD_F_INCAPSULE;
		memcpy(cmd->data, io->buf, io->len);
		ret = blk_post_capsule(q, tag, hdr + io->len);
		if (ret)
			blk_free_tag(q, tag); // OK: rdma-invalidation-leak -- in-capsule data, no key was made
		return ret ? -EIO : 0;
	}

	if ((uintptr_t)io->buf & 4095) {
		q->bounce[tag] = aligned_alloc(4096, (io->len + 4095) & ~(size_t)4095);
		if (!q->bounce[tag]) {
			blk_free_tag(q, tag);
			return -ENOMEM;
		}
		if (io->write)
			memcpy(q->bounce[tag], io->buf, io->len);
		data = q->bounce[tag];
	}

	access = io->write ? IBV_ACCESS_REMOTE_READ
			   : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	q->data_mr[tag] = ibv_reg_mr(q->pd, data, io->len, access);
	if (!q->data_mr[tag]) {
		blk_err(q, "reg_mr tag %d failed: %s", tag, strerror(errno));
		free(q->bounce[tag]); // OK: rdma-invalidation-leak -- the registration failed, there is no key
		q->bounce[tag] = NULL;
		blk_free_tag(q, tag);
		return -ENOMEM;
	}

	cmd->sgl.addr = (uintptr_t)data;
	cmd->sgl.len  = (uint32_t)io->len;
	cmd->sgl.key  = q->data_mr[tag]->rkey;

	ret = blk_post_capsule(q, tag, hdr);
	if (ret) {
		blk_err(q, "post tag %d failed: %d", tag, ret);
		ibv_dereg_mr(q->data_mr[tag]);
		q->data_mr[tag] = NULL;
		blk_io_finish(q, tag, -EIO); // OK: rdma-invalidation-leak -- deregistered before the slot is recycled
		return 0;
	}
	return 0;
}

static int blk_handle_rsp(struct blk_queue *q, const struct ibv_wc *wc)
{
	const struct blk_rsp *rsp = &q->rsps[wc->wr_id];
	unsigned tag = rsp->tag;
	int err;

	if (wc->wc_flags & IBV_WC_WITH_INV) { // OK: rdma-remote-invalidate-unchecked -- refused, this initiator never offers remote invalidation
		blk_err(q, "target sent SEND_WITH_INV for tag %u", tag);
		return -EPROTO;
	}
	if (tag >= q->depth || !q->slot_busy[tag]) {
		blk_err(q, "response for idle tag %u", tag);
		return -EPROTO;
	}

	if (!q->io[tag]) {
		/* answer to one of our ABORT capsules */
		blk_free_tag(q, tag); // OK: rdma-invalidation-leak -- an ABORT capsule owns no data registration
		return 0;
	}
	if (q->io[tag]->write && !q->data_mr[tag]) {
		/* in-capsule write */
		blk_io_finish(q, tag, rsp->status ? -EIO : 0); // OK: rdma-invalidation-leak -- in-capsule data, nothing was registered
		return 0;
	}

	if (rsp->status == BLK_SC_INVALID_FIELD) {
		/* rejected while parsing: the target never touched our buffer */
		blk_io_finish(q, tag, -EINVAL); // BUG: rdma-invalidation-leak -- data_mr[tag] stays registered with its rkey in the target's hands
		return 0;
	}

	ibv_dereg_mr(q->data_mr[tag]);
	q->data_mr[tag] = NULL;
	switch (rsp->status) {
	case BLK_SC_SUCCESS:  err = 0;          break;
	case BLK_SC_ABORTED:  err = -ECANCELED; break;
	default:              err = -EIO;       break;
	}
	blk_io_finish(q, tag, err); // OK: rdma-invalidation-leak -- deregistered just above
	return 0;
}

int blk_process_completions(struct blk_queue *q)
{
	struct ibv_wc wc[16];
	int n, i, ret = 0;

	n = ibv_poll_cq(q->cq, 16, wc);
	if (n < 0)
		return -EIO;
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			blk_err(q, "wc %s", ibv_wc_status_str(wc[i].status));
			ret = -EIO;
			continue;
		}
		if (BLK_WRID_IS_CMD(wc[i].wr_id))
			continue;
		ret = blk_handle_rsp(q, &wc[i]);
		if (blk_post_rsp_recv(q, (unsigned)wc[i].wr_id))
			ret = -EIO;
	}
	return ret;
}

static int blk_send_abort(struct blk_queue *q, unsigned tag)
{
	int atag = blk_alloc_tag(q);
	struct blk_capsule *cmd;

	if (atag < 0)
		return -EAGAIN;
	cmd = &q->cmds[atag];
	memset(cmd, 0, offsetof(struct blk_capsule, data));
	cmd->opcode = BLK_OPC_ABORT;
	cmd->tag    = (uint16_t)atag;
	cmd->slba   = tag;
	if (blk_post_capsule(q, (unsigned)atag, offsetof(struct blk_capsule, data))) {
		blk_free_tag(q, (unsigned)atag);
		return -EIO;
	}
	return 0;
}

void blk_check_timeouts(struct blk_queue *q)
{
	time_t now = time(NULL);
	unsigned tag;

	for (tag = 0; tag < q->depth; tag++) {
		if (!q->slot_busy[tag] || !q->io[tag] || now < q->deadline[tag])
			continue;

		if (!q->aborting[tag]) {
			blk_err(q, "tag %u timed out, aborting", tag);
			if (blk_send_abort(q, tag) == 0) {
				q->aborting[tag] = true;
				q->deadline[tag] = now + BLK_ABORT_TIMEOUT_SEC;
				continue;
			}
		}

		/* no answer to the abort either: fail it, reconnect will clean up */
		blk_err(q, "tag %u: abort timed out", tag);
		blk_io_finish(q, tag, -ETIMEDOUT); // BUG: rdma-invalidation-leak -- slot and bounce copy recycled while the target still holds data_mr[tag]'s rkey
	}
}
