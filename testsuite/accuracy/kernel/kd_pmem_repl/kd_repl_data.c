// SPDX-License-Identifier: GPL-2.0
/*
 * kd_repl_data.c - pmem replication target: granting windows, reclaiming
 * them, ACKs.  Correct: the grant (rotated key, rights the primary needs,
 * a failed post releases nothing exposed).  Not correct: an expired grant
 * goes back to the free list with its key valid; failover unmaps every
 * window right after posting the LOCAL_INVs; the ACK signaling counter is
 * never advanced.
 */
#include <linux/string.h>
#include "kd_repl.h"

void kd_repl_put_window(struct kd_repl_win *win)
{
	struct kd_repl_conn *conn = win->conn;

	if (win->nents)
		ib_dma_unmap_sg(conn->dev, win->sg, win->nents, DMA_FROM_DEVICE);
	win->nents = 0;
	win->state = KD_WIN_FREE;
	spin_lock(&conn->lock);
	list_add_tail(&win->list, &conn->free_wins);
	spin_unlock(&conn->lock);
}

int kd_repl_grant_window(struct kd_repl_conn *conn, u64 pmem_off, u32 len)
{
	struct kd_repl_win *win;
	int ret;

	spin_lock(&conn->lock);
	win = list_first_entry_or_null(&conn->free_wins, struct kd_repl_win,
				       list);
	if (win)
		list_del(&win->list);
	spin_unlock(&conn->lock);
	if (!win)
		return -EBUSY;

	win->nents = ib_dma_map_sg(conn->dev, win->sg,
			kd_repl_pmem_to_sg(conn, pmem_off, len, win->sg),
			DMA_FROM_DEVICE);
	if (!win->nents) {
		ret = -EIO;
		goto out_put;
	}
	if (ib_map_mr_sg(win->mr, win->sg, win->nents, NULL, PAGE_SIZE) !=
	    win->nents) {
		ret = -EINVAL;
		goto out_put;
	}

	ib_update_fast_reg_key(win->mr, ib_inc_rkey(win->mr->rkey));
	win->reg_wr.wr.opcode = IB_WR_REG_MR;
	win->reg_wr.wr.send_flags = 0;
	win->reg_wr.wr.next = &win->grant_wr;
	win->reg_wr.mr = win->mr;	/* OK: rdma-rkey-reuse -- the key byte is incremented before every grant */
	win->reg_wr.key = win->mr->rkey;
	win->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is set and the rkey goes to the primary in the GRANT */

	win->grant_msg.op = cpu_to_le32(KD_REPL_OP_GRANT);
	win->grant_msg.win = cpu_to_le32(win->idx);
	win->grant_msg.rkey = cpu_to_le32(win->mr->rkey);
	win->grant_msg.addr = cpu_to_le64(win->mr->iova);
	win->grant_msg.len = cpu_to_le64(len);
	win->grant_sge.addr = (uintptr_t)&win->grant_msg;
	win->grant_sge.length = sizeof(win->grant_msg);
	win->grant_wr.opcode = IB_WR_SEND;
	win->grant_wr.send_flags = IB_SEND_SIGNALED | IB_SEND_INLINE;
	win->grant_wr.wr_cqe = &conn->ctl_cqe;
	win->grant_wr.sg_list = &win->grant_sge;
	win->grant_wr.num_sge = 1;
	win->grant_wr.next = NULL;

	win->state = KD_WIN_GRANTED;
	ret = ib_post_send(conn->qp, &win->reg_wr.wr, NULL);
	if (ret)
		goto out_put;	/* OK: rdma-invalidation-leak -- the post failed: the REG_MR never ran and the GRANT never left */
	queue_delayed_work(system_wq, &win->expire,
			   msecs_to_jiffies(KD_REPL_GRANT_TMO_MS));
	return 0;

out_put:
	kd_repl_put_window(win);
	return ret;
}

/* COMMIT without SEND_WITH_INV: invalidate ourselves; inv_done recycles. */
int kd_repl_reclaim_window(struct kd_repl_win *win)
{
	win->inv_cqe.done = kd_repl_inv_done;
	win->inv_wr.wr_cqe = &win->inv_cqe;
	win->inv_wr.opcode = IB_WR_LOCAL_INV;
	win->inv_wr.ex.invalidate_rkey = win->mr->rkey;
	win->inv_wr.send_flags = IB_SEND_SIGNALED;
	win->inv_wr.next = NULL;
	win->state = KD_WIN_INV_PENDING;
	return ib_post_send(win->conn->qp, &win->inv_wr, NULL);
}

/* The primary never committed: take the window back. */
void kd_repl_window_expire(struct work_struct *work)
{
	struct kd_repl_win *win = container_of(to_delayed_work(work),
					       struct kd_repl_win, expire);

	if (win->state != KD_WIN_GRANTED)
		return;
	pr_warn("repl: window %u expired\n", win->idx);
	kd_repl_put_window(win);	// BUG: rdma-invalidation-leak -- the granted rkey is still valid (no LOCAL_INV) when the window's pages are unmapped and the window goes back on the free list
}

/* Primary failover: revoke every outstanding grant. */
void kd_repl_abort_windows(struct kd_repl_conn *conn)
{
	struct kd_repl_win *win;
	unsigned int i;

	for (i = 0; i < conn->nr_windows; i++) {
		win = &conn->win[i];
		if (win->state == KD_WIN_GRANTED)
			kd_repl_reclaim_window(win);
	}
	/* hand the DAX pages back to the filesystem right away */
	for (i = 0; i < conn->nr_windows; i++) {
		win = &conn->win[i];
		if (win->state != KD_WIN_INV_PENDING || !win->nents)
			continue;
		ib_dma_unmap_sg(conn->dev, win->sg, win->nents, DMA_FROM_DEVICE);	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INVs were only posted; the windows are unmapped before they completed, while the old primary can still write
		win->nents = 0;
	}
}

/* HELLO and ACK share the inline control send. */
void kd_repl_prep_ctl(struct kd_repl_conn *conn, u32 op, u32 win, int flags)
{
	memset(&conn->ctl_msg, 0, sizeof(conn->ctl_msg));
	conn->ctl_msg.op = cpu_to_le32(op);
	conn->ctl_msg.win = cpu_to_le32(win);
	conn->ctl_sge.addr = (uintptr_t)&conn->ctl_msg;
	conn->ctl_sge.length = sizeof(conn->ctl_msg);
	conn->ctl_cqe.done = kd_repl_ctl_done;
	conn->ctl_wr.wr_cqe = &conn->ctl_cqe;
	conn->ctl_wr.opcode = IB_WR_SEND;
	conn->ctl_wr.send_flags = IB_SEND_INLINE | flags;
	conn->ctl_wr.sg_list = &conn->ctl_sge;
	conn->ctl_wr.num_sge = 1;
	conn->ctl_wr.next = NULL;
}

int kd_repl_send_ack(struct kd_repl_conn *conn, struct kd_repl_win *win)
{
	kd_repl_prep_ctl(conn, KD_REPL_OP_ACK, win->idx, 0);
	if (conn->acks_since_signal >= KD_REPL_ACK_EVERY) {	// BUG(program): rdma-unsignaled-send-starvation -- acks_since_signal is reset but never incremented, so ACKs are never signaled
		conn->ctl_wr.send_flags |= IB_SEND_SIGNALED;
		conn->acks_since_signal = 0;
	}
	return ib_post_send(conn->qp, &conn->ctl_wr, NULL);
}
