// SPDX-License-Identifier: GPL-2.0
/*
 * mq: the request teardown of an invented message-queue transport ("mq")
 * whose consumers pull messages straight out of producer memory with RDMA
 * READs: a producer registers each message buffer (pool MR, rotated key,
 * REMOTE_READ) and sends the descriptor; when the consumer acknowledges, the
 * producer invalidates the key and recycles the buffer.
 *
 * mq_msg_acked() posts a signaled LOCAL_INV, but its completion handler only
 * logs errors and nothing waits: the MR goes back to the pool and the buffer
 * to the free list in the next lines, while the LOCAL_INV may not have run.
 * mq_msg_retire_batch() chains the LOCAL_INV unsignaled in front of a
 * signaled control SEND and waits for that SEND: completions on a send
 * queue are in order, so the LOCAL_INV has executed when the SEND completes,
 * and the release after the wait is right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/completion.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct mq_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct list_head	free_msgs;
};

struct mq_msg {
	struct mq_conn		*conn;
	struct ib_mr		*mr;
	struct ib_send_wr	inv_wr;
	struct ib_send_wr	ctl_wr;
	struct ib_sge		ctl_sge;
	struct ib_cqe		inv_cqe;
	struct ib_cqe		ctl_cqe;
	struct completion	ctl_done;
	struct scatterlist	sg;
	struct list_head	entry;
	u64			ctl_dma;
};

void mq_conn_error(struct mq_conn *conn);

static void mq_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("mq: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
}

static void mq_ctl_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct mq_msg *msg = container_of(wc->wr_cqe, struct mq_msg, ctl_cqe);

	complete(&msg->ctl_done);
}

void mq_msg_acked(struct mq_msg *msg)
{
	struct mq_conn *conn = msg->conn;

	msg->inv_wr.opcode = IB_WR_LOCAL_INV;
	msg->inv_wr.next = NULL;
	msg->inv_wr.num_sge = 0;
	msg->inv_wr.send_flags = IB_SEND_SIGNALED;
	msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
	msg->inv_cqe.done = mq_inv_done;
	msg->inv_wr.wr_cqe = &msg->inv_cqe;
	if (ib_post_send(conn->qp, &msg->inv_wr, NULL)) {
		mq_conn_error(conn);	/* teardown deregisters everything */
		return;
	}

	/* BUG: rdma-local-mr-management -- the transport returns MRs to its own pool */
	ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, msg->mr); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is signaled but nothing waits for its completion before the MR is recycled */
	msg->mr = NULL;
	ib_dma_unmap_sg(conn->ibdev, &msg->sg, 1, DMA_TO_DEVICE);
	list_add_tail(&msg->entry, &conn->free_msgs);
}

int mq_msg_retire_batch(struct mq_msg *msg)
{
	struct mq_conn *conn = msg->conn;
	int ret;

	msg->inv_wr.opcode = IB_WR_LOCAL_INV;
	msg->inv_wr.num_sge = 0;
	msg->inv_wr.send_flags = 0;
	msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
	msg->inv_wr.wr_cqe = &msg->inv_cqe;
	msg->inv_wr.next = &msg->ctl_wr;

	msg->ctl_sge.addr = msg->ctl_dma;
	msg->ctl_sge.length = 16;
	msg->ctl_sge.lkey = conn->pd->local_dma_lkey;
	msg->ctl_wr.next = NULL;
	msg->ctl_wr.opcode = IB_WR_SEND;
	msg->ctl_wr.sg_list = &msg->ctl_sge;
	msg->ctl_wr.num_sge = 1;
	msg->ctl_wr.send_flags = IB_SEND_SIGNALED;
	msg->ctl_cqe.done = mq_ctl_done;
	msg->ctl_wr.wr_cqe = &msg->ctl_cqe;
	init_completion(&msg->ctl_done);

	ret = ib_post_send(conn->qp, &msg->inv_wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&msg->ctl_done);

	/* BUG: rdma-local-mr-management -- the transport returns MRs to its own pool */
	ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, msg->mr); /* OK: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV precedes the signaled SEND that was waited for; in-order completion means it has executed */
	msg->mr = NULL;
	ib_dma_unmap_sg(conn->ibdev, &msg->sg, 1, DMA_TO_DEVICE);
	list_add_tail(&msg->entry, &conn->free_msgs);
	return 0;
}
