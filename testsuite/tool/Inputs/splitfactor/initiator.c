/* blkrdma initiator: registers each I/O buffer and sends its rkey. */
#include "blkrdma.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

/* The target writes into READ buffers and reads from WRITE buffers. */
static int blk_access_for(enum blk_opcode op)
{
	return op == BLK_CMD_READ ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
}

static void blk_build_cmd(struct blk_request *req, enum blk_opcode op,
			  uint64_t lba)
{
	struct blk_cmd *cmd = blk_msg_slot(req->conn, req->tag);

	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = op;
	cmd->tag = htobe32(req->tag);
	cmd->lba = htobe64(lba);
	cmd->addr = htobe64((uintptr_t)req->buf);
	cmd->rkey = htobe32(req->mr->rkey);
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
}

int blk_submit(struct blk_request *req, enum blk_opcode op, uint64_t lba)
{
	struct blk_conn *conn = req->conn;
	struct ibv_send_wr *bad;
	int access = blk_access_for(op);
	int ret;

	req->mr = ibv_reg_mr(conn->pd, req->buf, req->len, access);
	if (!req->mr)
		return -errno;
	blk_build_cmd(req, op, lba);
	ret = ibv_post_send(conn->qp, &req->send_wr, &bad);
	if (ret)
		return -ret; /* the registration stays behind */
	return 0;
}

static int blk_invalidate(struct blk_request *req)
{
	struct ibv_send_wr *bad;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.wr_id = (uintptr_t)req;
	req->inv_wr.opcode = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->mr->rkey;
	req->inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(req->conn->qp, &req->inv_wr, &bad);
}

/* A response arrived for @req. */
int blk_complete(struct blk_conn *conn, struct ibv_wc *wc,
		 struct blk_request *reqs)
{
	const struct blk_rsp *rsp = blk_msg_slot(conn, conn->depth + wc->wr_id);
	struct blk_request *req = &reqs[be32toh(rsp->tag) % conn->depth];

	req->status = be32toh(rsp->status);
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		/* The target invalidated the rkey for us. */
		ibv_dereg_mr(req->mr);
		req->mr = NULL;
		req->done = 1;
		return 0;
	}
	return blk_invalidate(req);
}
