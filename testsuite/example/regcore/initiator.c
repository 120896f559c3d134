/* blkrdma initiator on regcore: a remote-registration context per I/O. */
#include "blkrdma.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

/* The target writes into READ buffers and reads from WRITE buffers. */
static unsigned int blk_remote_access_for(enum blk_opcode op)
{
	return op == BLK_CMD_READ ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
}

static int blk_build_cmd(struct blk_request *req, enum blk_opcode op,
			 uint64_t lba)
{
	struct blk_cmd *cmd = blk_msg_slot(req->conn, req->tag);
	uint64_t addr;
	int ret;

	ret = regcore_reg_ctx_rkey(req->reg, &req->rkey, &addr);
	if (ret)
		return ret;
	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = op;
	/* Window keys may be invalidated by the target's response. */
	cmd->flags = regcore_reg_ctx_remote_inv_ok(req->reg) ? BLK_F_INVALIDATE : 0;
	cmd->tag = htobe32(req->tag);
	cmd->lba = htobe64(lba);
	cmd->addr = htobe64(addr);
	cmd->rkey = htobe32(req->rkey);
	cmd->length = htobe32((uint32_t)req->len);

	req->send_sge.addr = (uintptr_t)cmd;
	req->send_sge.length = sizeof(*cmd);
	req->send_sge.lkey = req->conn->msg_mr->lkey;
	memset(&req->send_wr, 0, sizeof(req->send_wr));
	req->send_wr.wr_id = (uintptr_t)req;
	req->send_wr.opcode = IBV_WR_SEND;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.send_flags = IBV_SEND_SIGNALED;
	return 0;
}

static void blk_released(struct regcore_reg_ctx *reg, int status, void *arg)
{
	struct blk_request *req = arg;

	(void)reg;
	(void)status;
	req->reg = NULL;
	req->done = 1;
}

/* Ends the target's access; the request is done once the key is dead. */
static void blk_release(struct blk_request *req, uint32_t invalidated_rkey)
{
	if (regcore_reg_ctx_release(req->reg, invalidated_rkey, blk_released,
				    req) == 0)
		blk_released(req->reg, 0, req);
}

int blk_submit(struct blk_request *req, enum blk_opcode op, uint64_t lba)
{
	struct blk_conn *conn = req->conn;
	int ret;

	req->done = 0;
	ret = regcore_reg_ctx_init(&req->reg, conn->core, conn->qp, req->buf,
				   req->len, blk_remote_access_for(op));
	if (ret)
		return ret;
	ret = blk_build_cmd(req, op, lba);
	if (!ret)
		ret = regcore_reg_ctx_post(req->reg, &req->send_wr);
	if (ret)
		blk_release(req, 0);
	return ret;
}

/* A response arrived: regcore checks that a remote invalidation named this
 * request's key, or invalidates it itself. */
static void blk_complete(struct blk_conn *conn, struct ibv_wc *wc,
			 struct blk_request *reqs)
{
	const struct blk_rsp *rsp = blk_msg_slot(conn, conn->depth + (unsigned int)wc->wr_id);
	struct blk_request *req = &reqs[be32toh(rsp->tag) % conn->depth];

	req->status = (int32_t)be32toh(rsp->status);
	blk_release(req, (wc->wc_flags & IBV_WC_WITH_INV) ? wc->invalidated_rkey : 0);
}

int blk_initiator_handle(struct blk_conn *conn, struct ibv_wc *wc,
			 struct blk_request *reqs)
{
	if (wc->status != IBV_WC_SUCCESS)
		return -EIO;
	if (wc->opcode != IBV_WC_RECV)
		return 0; /* our SEND completed */
	blk_complete(conn, wc, reqs);
	return blk_conn_post_recv(conn, (unsigned int)wc->wr_id);
}
