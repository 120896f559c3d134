/* blkrdma target on regcore: rw contexts move the data. */
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
	struct regcore_mr *bounce_mr;
	struct regcore_rw_ctx *rw;
	struct blk_cmd cmd;       /* host byte order */
	struct ibv_send_wr rsp_wr;
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
	/* Source of RDMA WRITEs, sink of RDMA READs: regcore picks the flags
	 * the transport needs. */
	if (regcore_mr_get(conn->core, io->bounce, BLK_MAX_IO,
			   regcore_access_flags(conn->core,
						REGCORE_ROLE_SEND_SOURCE |
						REGCORE_ROLE_READ_SINK),
			   &io->bounce_mr))
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
	regcore_mr_put(io->conn->core, io->bounce_mr);
	regcore_mr_invalidate_range(io->conn->core, io->bounce, BLK_MAX_IO);
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
	io->rsp_wr.sg_list = &io->rsp_sge;
	io->rsp_wr.num_sge = 1;
	io->rsp_wr.send_flags = IBV_SEND_SIGNALED;
	if (io->cmd.flags & BLK_F_INVALIDATE) {
		io->rsp_wr.opcode = IBV_WR_SEND_WITH_INV;
		io->rsp_wr.invalidate_rkey = io->cmd.rkey;
	} else {
		io->rsp_wr.opcode = IBV_WR_SEND;
	}
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

/* A READ command is served by an RDMA WRITE context chained to the
 * response; a WRITE command by an RDMA READ context whose completion writes
 * the disk and sends the response. */
static int blk_execute(struct blk_target_io *io)
{
	struct blk_cmd *cmd = &io->cmd;
	struct ibv_sge sge;
	int is_read = cmd->opcode == BLK_CMD_READ;
	int ret;

	if (!blk_cmd_valid(cmd))
		return blk_respond(io, -EINVAL);
	sge.addr = (uintptr_t)io->bounce;
	sge.length = cmd->length;
	sge.lkey = io->bounce_mr->lkey;
	ret = regcore_rw_ctx_init(&io->rw, io->conn->core, io->conn->qp, &sge, 1,
				  cmd->addr, cmd->rkey,
				  is_read ? REGCORE_DIR_WRITE : REGCORE_DIR_READ);
	if (ret < 0)
		return blk_respond(io, ret);
	if (!is_read)
		return regcore_rw_ctx_post(io->rw, io->conn->qp, 2, NULL);
	memcpy(io->bounce, io->disk + cmd->lba * BLK_SECTOR, cmd->length);
	blk_prep_response(io, 0);
	return regcore_rw_ctx_post(io->rw, io->conn->qp, 2, &io->rsp_wr);
}

static void blk_finish_rw(struct blk_target_io *io)
{
	if (io->rw)
		regcore_rw_ctx_destroy(io->rw);
	io->rw = NULL;
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
	if (wc->wr_id == 2) { /* the READ context's one completion */
		blk_finish_rw(io);
		memcpy(io->disk + io->cmd.lba * BLK_SECTOR, io->bounce, io->cmd.length);
		return blk_respond(io, 0);
	}
	blk_finish_rw(io); /* the response (for READ commands, the context's) */
	return 0;
}
