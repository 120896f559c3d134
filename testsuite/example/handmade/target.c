/* blkrdma target: moves data with RDMA READ/WRITE through a bounce buffer. */
#include "blkrdma.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The one in-flight target I/O. */
struct blk_target_io {
	struct blk_conn *conn;
	char *disk;
	void *bounce;
	struct ibv_mr *bounce_mr;
	struct blk_cmd cmd;       /* host byte order */
	struct ibv_send_wr data_wr;
	struct ibv_send_wr rsp_wr;
	struct ibv_sge data_sge;
	struct ibv_sge rsp_sge;
};

struct blk_target_io *blk_target_create(struct blk_conn *conn)
{
	struct blk_target_io *io = calloc(1, sizeof(*io));

	if (!io)
		return NULL;
	io->conn = conn;
	io->disk = calloc(1, BLK_DISK_SIZE);
	io->bounce = malloc(BLK_MAX_IO);
	if (!io->disk || !io->bounce)
		goto err_free;
	/* The bounce buffer is the source of RDMA WRITEs and the sink of RDMA
	 * READs; its rkey is never given to anyone. */
	io->bounce_mr = ibv_reg_mr(conn->pd, io->bounce, BLK_MAX_IO,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!io->bounce_mr)
		goto err_free;
	return io;

err_free:
	free(io->bounce);
	free(io->disk);
	free(io);
	return NULL;
}

void blk_target_destroy(struct blk_target_io *io)
{
	ibv_dereg_mr(io->bounce_mr);
	free(io->bounce);
	free(io->disk);
	free(io);
}

static void blk_prep_response(struct blk_target_io *io, int status)
{
	struct blk_rsp *rsp = blk_msg_slot(io->conn, io->cmd.tag % io->conn->depth);

	rsp->tag = htobe32(io->cmd.tag);
	rsp->status = htobe32((uint32_t)status);
	io->rsp_sge.addr = (uintptr_t)rsp;
	io->rsp_sge.length = sizeof(*rsp);
	io->rsp_sge.lkey = io->conn->msg_mr->lkey;
	memset(&io->rsp_wr, 0, sizeof(io->rsp_wr));
	io->rsp_wr.wr_id = 1;
	io->rsp_wr.opcode = IBV_WR_SEND;
	io->rsp_wr.sg_list = &io->rsp_sge;
	io->rsp_wr.num_sge = 1;
	io->rsp_wr.send_flags = IBV_SEND_SIGNALED;
}

static int blk_respond(struct blk_target_io *io, int status)
{
	struct ibv_send_wr *bad;

	blk_prep_response(io, status);
	return ibv_post_send(io->conn->qp, &io->rsp_wr, &bad);
}

static int blk_cmd_valid(const struct blk_cmd *cmd)
{
	return cmd->length <= BLK_MAX_IO &&
	       cmd->lba * BLK_SECTOR + cmd->length <= BLK_DISK_SIZE;
}

/* A READ command is served by an RDMA WRITE into the initiator's buffer
 * chained to the response; a WRITE command by an RDMA READ into the bounce
 * buffer whose completion writes the disk and sends the response. */
static int blk_execute(struct blk_target_io *io)
{
	struct blk_cmd *cmd = &io->cmd;
	struct ibv_send_wr *bad;

	if (!blk_cmd_valid(cmd))
		return blk_respond(io, -EINVAL);
	io->data_sge.addr = (uintptr_t)io->bounce;
	io->data_sge.length = cmd->length;
	io->data_sge.lkey = io->bounce_mr->lkey;
	memset(&io->data_wr, 0, sizeof(io->data_wr));
	io->data_wr.wr_id = 2;
	io->data_wr.sg_list = &io->data_sge;
	io->data_wr.num_sge = 1;
	io->data_wr.wr.rdma.remote_addr = cmd->addr;
	io->data_wr.wr.rdma.rkey = cmd->rkey;
	if (cmd->opcode == BLK_CMD_READ) {
		memcpy(io->bounce, io->disk + cmd->lba * BLK_SECTOR, cmd->length);
		io->data_wr.opcode = IBV_WR_RDMA_WRITE;
		io->data_wr.next = &io->rsp_wr;
		blk_prep_response(io, 0);
	} else {
		io->data_wr.opcode = IBV_WR_RDMA_READ;
		io->data_wr.send_flags = IBV_SEND_SIGNALED;
	}
	return ibv_post_send(io->conn->qp, &io->data_wr, &bad);
}

/* A command arrived in receive slot wc->wr_id. */
static int blk_take_cmd(struct blk_target_io *io, struct ibv_wc *wc)
{
	const struct blk_cmd *wire;

	wire = blk_msg_slot(io->conn, io->conn->depth + (unsigned int)wc->wr_id);
	io->cmd.opcode = wire->opcode;
	io->cmd.flags = wire->flags;
	io->cmd.tag = be32toh(wire->tag);
	io->cmd.lba = be64toh(wire->lba);
	io->cmd.addr = be64toh(wire->addr);
	io->cmd.rkey = be32toh(wire->rkey);
	io->cmd.length = be32toh(wire->length);
	if (blk_conn_post_recv(io->conn, (unsigned int)wc->wr_id))
		return -EIO;
	return blk_execute(io);
}

int blk_target_handle(struct blk_target_io *io, struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		return -EIO;
	if (wc->opcode == IBV_WC_RECV)
		return blk_take_cmd(io, wc);
	if (wc->wr_id == 2) { /* the RDMA READ of a WRITE command */
		memcpy(io->disk + io->cmd.lba * BLK_SECTOR, io->bounce, io->cmd.length);
		return blk_respond(io, 0);
	}
	return 0;
}
