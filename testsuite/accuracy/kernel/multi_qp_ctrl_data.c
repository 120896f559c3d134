// SPDX-License-Identifier: GPL-2.0
/*
 * dfs: the connection of an invented distributed-filesystem client ("dfs")
 * with two QPs: a control QP for heartbeats and lease messages and a data QP
 * for fast-registered I/O.
 *
 * Control QP: created with IB_SIGNAL_REQ_WR, and no control post ever asks
 * for a completion, so the heartbeats fill its send queue after max_send_wr
 * messages and the lease traffic stops (the data QP's signaled posts do not
 * retire anything on another QP).
 *
 * Data QP: each I/O posts REG_MR, the command SEND and, when the server did
 * not invalidate remotely, a LOCAL_INV: three WRs, but the queue reserves
 * two per I/O (and by a hand-made factor). The capacities are within every
 * device's limits.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define DFS_CTRL_DEPTH	64
#define DFS_MAX_PAGES	64

struct dfs_conn {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*ctrl_qp;
	struct ib_qp		*data_qp;
	u32			io_depth;
	u64			hb_dma;
};

struct dfs_io {
	struct dfs_conn		*conn;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	cmd_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		cmd_sge;
	struct ib_cqe		cqe;
	struct scatterlist	*sgl;
	int			nents;
	u8			*cmd;
	u64			cmd_dma;
};

int dfs_create_qps(struct dfs_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = c;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.cap.max_send_wr = DFS_CTRL_DEPTH;
	attr.cap.max_recv_wr = DFS_CTRL_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* BUG(file): rdma-unsignaled-send-starvation -- nothing posted on the control QP is ever signaled */
	c->ctrl_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->ctrl_qp))
		return PTR_ERR(c->ctrl_qp);

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = c;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- REG_MR, SEND and LOCAL_INV per I/O against a hand-made factor of 2 */
	attr.cap.max_send_wr = 2 * c->io_depth + 1;
	attr.cap.max_recv_wr = c->io_depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	c->data_qp = ib_create_qp(c->pd, &attr);
	if (IS_ERR(c->data_qp)) {
		ib_destroy_qp(c->ctrl_qp);
		return PTR_ERR(c->data_qp);
	}

	/* BUG: rdma-local-mr-management -- the client keeps its own MR pool */
	if (ib_mr_pool_init(c->data_qp, &c->data_qp->rdma_mrs, c->io_depth,
			    IB_MR_TYPE_MEM_REG, DFS_MAX_PAGES, 0)) {
		ib_destroy_qp(c->data_qp);
		ib_destroy_qp(c->ctrl_qp);
		return -ENOMEM;
	}
	return 0;
}

int dfs_heartbeat(struct dfs_conn *c)
{
	struct ib_sge sge = {
		.addr = c->hb_dma,
		.length = 16,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.opcode = IB_WR_SEND,
		.sg_list = &sge,
		.num_sge = 1,
		.send_flags = IB_SEND_INLINE,
	};

	return ib_post_send(c->ctrl_qp, &wr, NULL);
}

int dfs_submit_io(struct dfs_io *io)
{
	struct dfs_conn *c = io->conn;

	/* BUG: rdma-local-mr-management -- per-I/O MR from the client's own pool */
	io->mr = ib_mr_pool_get(c->data_qp, &c->data_qp->rdma_mrs);
	if (!io->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the client maps pages into its MR */
	if (ib_map_mr_sg(io->mr, io->sgl, io->nents, NULL, SZ_4K) != io->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(c->data_qp, &c->data_qp->rdma_mrs, io->mr);
		io->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(io->mr, ib_inc_rkey(io->mr->rkey));
	memset(&io->reg_wr, 0, sizeof(io->reg_wr));
	io->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the client */
	io->reg_wr.wr.next = &io->cmd_wr;
	io->reg_wr.mr = io->mr;
	io->reg_wr.key = io->mr->rkey;
	io->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			    IB_ACCESS_REMOTE_READ;
	put_unaligned_le32(io->mr->rkey, io->cmd);

	io->cmd_sge.addr = io->cmd_dma;
	io->cmd_sge.length = 64;
	io->cmd_sge.lkey = c->pd->local_dma_lkey;
	io->cmd_wr.next = NULL;
	io->cmd_wr.wr_cqe = &io->cqe;
	io->cmd_wr.opcode = IB_WR_SEND;
	io->cmd_wr.sg_list = &io->cmd_sge;
	io->cmd_wr.num_sge = 1;
	io->cmd_wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(c->data_qp, &io->reg_wr.wr, NULL);
}

int dfs_io_local_inv(struct dfs_io *io)
{
	io->inv_wr.opcode = IB_WR_LOCAL_INV;
	io->inv_wr.next = NULL;
	io->inv_wr.num_sge = 0;
	io->inv_wr.send_flags = IB_SEND_SIGNALED;
	io->inv_wr.ex.invalidate_rkey = io->mr->rkey;
	io->inv_wr.wr_cqe = &io->cqe;
	return ib_post_send(io->conn->data_qp, &io->inv_wr, NULL);
}
