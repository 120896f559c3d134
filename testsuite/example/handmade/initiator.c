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
	req->rkey = req->mr->rkey;

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

	req->done = 0;
	req->mr = ibv_reg_mr(conn->pd, req->buf, req->len, access);
	if (!req->mr)
		return -errno;
	blk_build_cmd(req, op, lba);
	ret = ibv_post_send(conn->qp, &req->send_wr, &bad);
	if (ret)
		return -ret; /* the registration stays behind */
	return 0;
}

/* A response arrived: the target is done with the buffer. */
static void blk_complete(struct blk_conn *conn, unsigned int slot,
			 struct blk_request *reqs)
{
	const struct blk_rsp *rsp = blk_msg_slot(conn, conn->depth + slot);
	struct blk_request *req = &reqs[be32toh(rsp->tag) % conn->depth];

	req->status = (int32_t)be32toh(rsp->status);
	ibv_dereg_mr(req->mr);
	req->mr = NULL;
	req->done = 1;
}

int blk_initiator_handle(struct blk_conn *conn, struct ibv_wc *wc,
			 struct blk_request *reqs)
{
	if (wc->status != IBV_WC_SUCCESS)
		return -EIO;
	if (wc->opcode != IBV_WC_RECV)
		return 0; /* our SEND completed */
	blk_complete(conn, (unsigned int)wc->wr_id, reqs);
	return blk_conn_post_recv(conn, (unsigned int)wc->wr_id);
}
