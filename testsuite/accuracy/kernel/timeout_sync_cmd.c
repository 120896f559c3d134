// SPDX-License-Identifier: GPL-2.0
/*
 * fwm: synchronous management commands of an invented fabric-attached
 * firmware manager ("fwm"): the host registers a buffer, sends a command
 * naming it, and waits for the device's response, which RDMA-writes the
 * result into the buffer (e.g. a log page) or RDMA-reads an image from it.
 *
 * fwm_get_log() handles the response and the local invalidation correctly:
 * a signaled LOCAL_INV that it waits for before putting the MR back. When
 * the response times out, though, it jumps straight to out_put and returns
 * the MR to the pool while the device still holds a working rkey to the
 * buffer that is about to be freed. fwm_push_image() on timeout resets the
 * controller (QP in error, pool destroyed) instead of recycling the MR.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/unaligned.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define FWM_CMD_TIMEOUT_MS	3000

struct fwm_ctrl {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
};

struct fwm_cmd {
	struct fwm_ctrl		*ctrl;
	struct ib_mr		*mr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	inv_wr;
	struct ib_sge		sge;
	struct ib_cqe		inv_cqe;
	struct completion	rsp_done;
	struct completion	inv_done;
	struct scatterlist	*sgl;
	int			nents;
	u8			desc[12];
	u64			cmd_dma;
};

void fwm_reset_ctrl(struct fwm_ctrl *ctrl);

static void fwm_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct fwm_cmd *cmd = container_of(wc->wr_cqe, struct fwm_cmd, inv_cqe);

	complete(&cmd->inv_done);
}

static int fwm_map(struct fwm_cmd *cmd, int access)
{
	struct fwm_ctrl *ctrl = cmd->ctrl;

	/* BUG: rdma-local-mr-management -- per-command MR from the host's own pool */
	cmd->mr = ib_mr_pool_get(ctrl->qp, &ctrl->qp->rdma_mrs);
	if (!cmd->mr)
		return -EAGAIN;
	/* BUG: rdma-local-mr-management -- the host maps the buffer into its MR */
	if (ib_map_mr_sg(cmd->mr, cmd->sgl, cmd->nents, NULL, SZ_4K) != cmd->nents) {
		/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
		ib_mr_pool_put(ctrl->qp, &ctrl->qp->rdma_mrs, cmd->mr);
		cmd->mr = NULL;
		return -EINVAL;
	}
	ib_update_fast_reg_key(cmd->mr, ib_inc_rkey(cmd->mr->rkey));
	memset(&cmd->reg_wr, 0, sizeof(cmd->reg_wr));
	cmd->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the host */
	cmd->reg_wr.wr.next = &cmd->send_wr;
	cmd->reg_wr.mr = cmd->mr;
	cmd->reg_wr.key = cmd->mr->rkey;
	cmd->reg_wr.access = access;
	put_unaligned_le64(cmd->mr->iova, cmd->desc);
	put_unaligned_le32(cmd->mr->rkey, cmd->desc + 8);

	cmd->sge.addr = cmd->cmd_dma;
	cmd->sge.length = 64;
	cmd->sge.lkey = ctrl->pd->local_dma_lkey;
	cmd->send_wr.next = NULL;
	cmd->send_wr.opcode = IB_WR_SEND;
	cmd->send_wr.sg_list = &cmd->sge;
	cmd->send_wr.num_sge = 1;
	cmd->send_wr.send_flags = IB_SEND_SIGNALED;
	init_completion(&cmd->rsp_done);
	return 0;
}

static int fwm_inv_sync(struct fwm_cmd *cmd)
{
	cmd->inv_wr.opcode = IB_WR_LOCAL_INV;
	cmd->inv_wr.next = NULL;
	cmd->inv_wr.num_sge = 0;
	cmd->inv_wr.send_flags = IB_SEND_SIGNALED;
	cmd->inv_wr.ex.invalidate_rkey = cmd->mr->rkey;
	cmd->inv_cqe.done = fwm_inv_done;
	cmd->inv_wr.wr_cqe = &cmd->inv_cqe;
	init_completion(&cmd->inv_done);
	if (ib_post_send(cmd->ctrl->qp, &cmd->inv_wr, NULL))
		return -EIO;
	wait_for_completion(&cmd->inv_done);
	return 0;
}

int fwm_get_log(struct fwm_cmd *cmd)
{
	struct fwm_ctrl *ctrl = cmd->ctrl;
	int ret;

	ret = fwm_map(cmd, IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE);
	if (ret)
		return ret;

	ret = ib_post_send(ctrl->qp, &cmd->reg_wr.wr, NULL);
	if (ret)
		goto out_put;

	if (!wait_for_completion_timeout(&cmd->rsp_done,
					 msecs_to_jiffies(FWM_CMD_TIMEOUT_MS))) {
		ret = -ETIMEDOUT;
		goto out_put;
	}

	ret = fwm_inv_sync(cmd);
	if (ret) {
		fwm_reset_ctrl(ctrl);
		return ret;
	}

out_put:
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(ctrl->qp, &ctrl->qp->rdma_mrs, cmd->mr); /* BUG: rdma-invalidation-leak -- on the timeout path the device still holds a valid rkey when the MR is recycled */
	cmd->mr = NULL;
	ib_dma_unmap_sg(ctrl->ibdev, cmd->sgl, cmd->nents, DMA_FROM_DEVICE);
	return ret;
}

int fwm_push_image(struct fwm_cmd *cmd)
{
	struct fwm_ctrl *ctrl = cmd->ctrl;
	int ret;

	ret = fwm_map(cmd, IB_ACCESS_REMOTE_READ);
	if (ret)
		return ret;

	ret = ib_post_send(ctrl->qp, &cmd->reg_wr.wr, NULL);
	if (ret)
		goto out_put;

	if (!wait_for_completion_timeout(&cmd->rsp_done,
					 msecs_to_jiffies(FWM_CMD_TIMEOUT_MS))) {
		/* QP to error and pool destroyed: the key dies with the reset */
		fwm_reset_ctrl(ctrl);
		return -ETIMEDOUT;
	}

	ret = fwm_inv_sync(cmd);
	if (ret) {
		fwm_reset_ctrl(ctrl);
		return ret;
	}
out_put:
	/* BUG: rdma-local-mr-management -- the MR goes back to the pool */
	ib_mr_pool_put(ctrl->qp, &ctrl->qp->rdma_mrs, cmd->mr); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- reached after the waited-for LOCAL_INV, or when the post failed and nothing went out */
	cmd->mr = NULL;
	ib_dma_unmap_sg(ctrl->ibdev, cmd->sgl, cmd->nents, DMA_TO_DEVICE);
	return ret;
}
