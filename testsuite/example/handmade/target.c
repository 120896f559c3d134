/* blkrdma target: moves data with RDMA READ/WRITE through a bounce buffer. */
#include "blkrdma.h"

#include <endian.h>
#include <stdlib.h>
#include <string.h>

/* One in-flight target I/O. */
struct blk_target_io {
	struct blk_conn *conn;
	void *bounce;
	struct ibv_mr *bounce_mr;
	struct ibv_send_wr data_wr;
	struct ibv_send_wr rsp_wr;
	struct ibv_sge data_sge;
	struct ibv_sge rsp_sge;
};

int blk_target_setup(struct blk_target_io *io, struct blk_conn *conn)
{
	io->conn = conn;
	io->bounce = malloc(BLK_MAX_IO);
	if (!io->bounce)
		return -1;
	/* The bounce buffer is the source of RDMA WRITEs and the sink of RDMA
	 * READs; its rkey is never given to anyone. */
	io->bounce_mr = ibv_reg_mr(conn->pd, io->bounce, BLK_MAX_IO,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!io->bounce_mr) {
		free(io->bounce);
		return -1;
	}
	return 0;
}

void blk_target_teardown(struct blk_target_io *io)
{
	ibv_dereg_mr(io->bounce_mr);
	free(io->bounce);
}

static void blk_prep_response(struct blk_target_io *io, const struct blk_cmd *cmd,
			      int status)
{
	struct blk_rsp *rsp = blk_msg_slot(io->conn, io->conn->depth);

	rsp->tag = cmd->tag;
	rsp->status = htobe32(status);
	io->rsp_sge.addr = (uintptr_t)rsp;
	io->rsp_sge.length = sizeof(*rsp);
	io->rsp_sge.lkey = io->conn->msg_mr->lkey;
	memset(&io->rsp_wr, 0, sizeof(io->rsp_wr));
	io->rsp_wr.opcode = IBV_WR_SEND_WITH_INV;
	io->rsp_wr.invalidate_rkey = be32toh(cmd->rkey);
	io->rsp_wr.sg_list = &io->rsp_sge;
	io->rsp_wr.num_sge = 1;
	io->rsp_wr.send_flags = IBV_SEND_SIGNALED;
}

int blk_target_execute(struct blk_target_io *io, const struct blk_cmd *cmd)
{
	struct ibv_send_wr *bad;

	io->data_sge.addr = (uintptr_t)io->bounce;
	io->data_sge.length = be32toh(cmd->length);
	io->data_sge.lkey = io->bounce_mr->lkey;
	memset(&io->data_wr, 0, sizeof(io->data_wr));
	/* A READ command is served by writing into the initiator's buffer; a
	 * WRITE command by reading from it into the bounce buffer. */
	io->data_wr.opcode = cmd->opcode == BLK_CMD_READ ? IBV_WR_RDMA_WRITE
							  : IBV_WR_RDMA_READ;
	io->data_wr.sg_list = &io->data_sge;
	io->data_wr.num_sge = 1;
	io->data_wr.wr.rdma.remote_addr = be64toh(cmd->addr);
	io->data_wr.wr.rdma.rkey = be32toh(cmd->rkey);
	io->data_wr.next = &io->rsp_wr;
	blk_prep_response(io, cmd, 0);
	return ibv_post_send(io->conn->qp, &io->data_wr, &bad);
}
