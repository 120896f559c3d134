// RUN: %check_ulplint --kernel %s rdma-unmap-before-invalidate %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unmap-before-invalidate %t.plugin

// A messenger's session reset invalidates every sent message's MR with
// signaled LOCAL_INVs and waits for them with a counter: it starts at one,
// each post adds one, each completion drops one and wakes the waiter. The
// final `if (!atomic_dec_and_test(&pending)) wait_event(..)` skips the wait
// only when the counter says every invalidation already completed, so the
// release after it is safe on both branches. A wait skipped on some other
// condition is not.

#include <linux/atomic.h>
#include <linux/list.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>

struct ms_msg {
	struct list_head list;
	struct ib_mr *mr;
	struct ib_send_wr inv_wr;
	struct ib_cqe inv_cqe;
	struct scatterlist sg;
	struct ms_con *con;
};

struct ms_con {
	struct ib_qp *qp;
	struct ib_device *dev;
	struct list_head sent;
	atomic_t inv_pending;
	wait_queue_head_t inv_wq;
	bool slow_path;
};

void ms_msg_put(struct ms_msg *msg);

static void ms_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct ms_msg *msg = container_of(wc->wr_cqe, struct ms_msg, inv_cqe);

	if (atomic_dec_and_test(&msg->con->inv_pending))
		wake_up(&msg->con->inv_wq);
}

static void ms_post_inv(struct ms_con *con, struct ms_msg *msg)
{
	msg->inv_cqe.done = ms_inv_done;
	msg->inv_wr.wr_cqe = &msg->inv_cqe;
	msg->inv_wr.opcode = IB_WR_LOCAL_INV;
	msg->inv_wr.send_flags = IB_SEND_SIGNALED;
	msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
	atomic_inc(&con->inv_pending);
	ib_post_send(con->qp, &msg->inv_wr, NULL);
}

static void ms_release(struct ms_con *con, struct ms_msg *msg)
{
	ib_dma_unmap_sg(con->dev, &msg->sg, 1, DMA_TO_DEVICE);
	ms_msg_put(msg);
}

/* Near miss: skipped only when the counter already reached zero. */
void ms_reset_session(struct ms_con *con, struct ms_msg *msgs, int n)
{
	int i;

	atomic_set(&con->inv_pending, 1);
	for (i = 0; i < n; i++)
		ms_post_inv(con, &msgs[i]);
	if (!atomic_dec_and_test(&con->inv_pending))
		wait_event(con->inv_wq, atomic_read(&con->inv_pending) == 0);
	for (i = 0; i < n; i++)
		ms_release(con, &msgs[i]);
}

/* Skipped on a condition that says nothing about the invalidations. */
void ms_close_session(struct ms_con *con, struct ms_msg *msgs, int n)
{
	int i;

	atomic_set(&con->inv_pending, 1);
	for (i = 0; i < n; i++)
		ms_post_inv(con, &msgs[i]);
	if (con->slow_path)
		wait_event(con->inv_wq, atomic_read(&con->inv_pending) <= 1);
	for (i = 0; i < n; i++)
		ms_release(con, &msgs[i]);
	// CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ms_release' runs right after posting a LOCAL_INV that nothing waits for
	// CHECK-MESSAGES: :58:2: note: released here, by 'ib_dma_unmap_sg' in 'ms_release'
	// CHECK-MESSAGES: :53:2: note: LOCAL_INV posted here
}
