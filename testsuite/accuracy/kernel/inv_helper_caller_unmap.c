// SPDX-License-Identifier: GPL-2.0
/*
 * tapex: unmapping of an invented tape-library initiator over RDMA
 * ("tapex"). Each command keeps one pool MR registered for the target
 * while the command runs; when it ends the MR's key must die before the
 * pages go back to the SCSI layer.
 *
 * Two helpers post the LOCAL_INV: tapex_inv_sync() signals it and waits for
 * the completion; tapex_inv_async() posts it unsignaled "to save a
 * completion" and returns. The normal completion path uses the synchronous
 * one and only then unmaps: right. The abort path uses the asynchronous one
 * and unmaps the pages and recycles the MR immediately: the target may still
 * write through the key until the device executes the LOCAL_INV.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct tapex_ch {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
};

struct tapex_cmd {
	struct tapex_ch		*ch;
	struct ib_mr		*mr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	int			inv_status;
	struct scatterlist	*sgl;
	int			nents;
	enum dma_data_direction	dir;
};

void tapex_reset_channel(struct tapex_ch *ch);

static void tapex_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct tapex_cmd *cmd = container_of(wc->wr_cqe, struct tapex_cmd,
					     inv_cqe);

	cmd->inv_status = wc->status;
	complete(&cmd->inv_done);
}

static void tapex_inv_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("tapex: LOCAL_INV failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

static void tapex_build_inv(struct tapex_cmd *cmd)
{
	cmd->inv_wr.opcode = IB_WR_LOCAL_INV;
	cmd->inv_wr.next = NULL;
	cmd->inv_wr.num_sge = 0;
	cmd->inv_wr.ex.invalidate_rkey = cmd->mr->rkey;
	cmd->inv_wr.wr_cqe = &cmd->inv_cqe;
}

static int tapex_inv_sync(struct tapex_cmd *cmd)
{
	int ret;

	tapex_build_inv(cmd);
	cmd->inv_wr.send_flags = IB_SEND_SIGNALED;
	cmd->inv_cqe.done = tapex_inv_done;
	init_completion(&cmd->inv_done);
	ret = ib_post_send(cmd->ch->qp, &cmd->inv_wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&cmd->inv_done);
	return cmd->inv_status ? -EIO : 0;
}

static int tapex_inv_async(struct tapex_cmd *cmd)
{
	tapex_build_inv(cmd);
	cmd->inv_wr.send_flags = 0;
	cmd->inv_cqe.done = tapex_inv_err_done;
	return ib_post_send(cmd->ch->qp, &cmd->inv_wr, NULL);
}

static void tapex_release(struct tapex_cmd *cmd)
{
	/* BUG: rdma-local-mr-management -- the initiator returns MRs to its own pool */
	ib_mr_pool_put(cmd->ch->qp, &cmd->ch->qp->rdma_mrs, cmd->mr);
	cmd->mr = NULL;
}

int tapex_cmd_done(struct tapex_cmd *cmd)
{
	int ret;

	ret = tapex_inv_sync(cmd);
	if (ret)
		return ret;	/* the channel is reset; teardown frees the pool */
	/* OK: rdma-unmap-before-invalidate -- tapex_inv_sync() signaled the LOCAL_INV and waited for it */
	ib_dma_unmap_sg(cmd->ch->ibdev, cmd->sgl, cmd->nents, cmd->dir);
	tapex_release(cmd);
	return 0;
}

void tapex_abort_cmd(struct tapex_cmd *cmd)
{
	if (tapex_inv_async(cmd)) {
		pr_warn("tapex: abort: LOCAL_INV not posted, resetting\n");
		tapex_reset_channel(cmd->ch);
		return;
	}
	/* BUG: rdma-unmap-before-invalidate -- the pages are unmapped (and the MR recycled) right after an unsignaled LOCAL_INV that nobody waits for */
	ib_dma_unmap_sg(cmd->ch->ibdev, cmd->sgl, cmd->nents, cmd->dir);
	tapex_release(cmd);
}
