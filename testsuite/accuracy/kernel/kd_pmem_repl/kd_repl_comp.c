// SPDX-License-Identifier: GPL-2.0
/*
 * kd_repl_comp.c - pmem replication target: completion handlers (wr_cqe->done).
 * Correct: COMMIT and TRUNCATE check the invalidated rkey against the
 * window's; the LOCAL_INV completion recycles the window.  Not correct:
 * DISCARD, v1 COMMIT and CLOSE trust IB_WC_WITH_INVALIDATE blindly; a COMMIT
 * whose LOCAL_INV could not be posted recycles the window anyway.
 */
#include "kd_repl.h"

void kd_repl_ctl_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("repl: control send failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

void kd_repl_tail_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_repl_conn *conn = container_of(wc->wr_cqe,
						 struct kd_repl_conn,
						 tail_inv_cqe);

	complete(&conn->tail_inv_done);
}

void kd_repl_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_repl_win *win = container_of(wc->wr_cqe, struct kd_repl_win,
					       inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kd_repl_conn_error(win->conn);	/* key state unknown */
		return;
	}
	kd_repl_put_window(win);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the LOCAL_INV completion */
}

void kd_repl_commit_work(struct work_struct *work)
{
	struct kd_repl_win *win = container_of(work, struct kd_repl_win,
					       commit_work);

	cancel_delayed_work_sync(&win->expire);
	kd_repl_persist(win);
	kd_repl_send_ack(win->conn, win);

	if (win->wc_flags & IB_WC_WITH_INVALIDATE) {	/* OK: rdma-remote-invalidate-unchecked -- the copied invalidated rkey is compared with the window's below */
		if (unlikely(win->inv_rkey != win->mr->rkey)) {
			pr_err("repl: window %u: peer invalidated 0x%x\n",
			       win->idx, win->inv_rkey);
			kd_repl_conn_error(win->conn);
			return;
		}
		kd_repl_put_window(win);
		return;
	}
	if (kd_repl_reclaim_window(win))
		kd_repl_put_window(win);	// BUG: rdma-invalidation-leak -- the LOCAL_INV post failed; the window is recycled with its rkey still valid
}

static bool kd_repl_remote_inv_ok(struct kd_repl_win *win, struct ib_wc *wc)
{
	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE))	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the window's on the accepting path */
		return false;
	return wc->ex.invalidate_rkey == win->mr->rkey;
}

void kd_repl_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_repl_recv *rcv = container_of(wc->wr_cqe, struct kd_repl_recv,
						cqe);
	struct kd_repl_conn *conn = rcv->conn;
	struct kd_repl_win *win;
	bool invalidated;
	u32 op, idx;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		kd_repl_conn_error(conn);
		return;
	}
	op = le32_to_cpu(rcv->msg.op);
	idx = le32_to_cpu(rcv->msg.win);

	if (op == KD_REPL_OP_CLOSE) {
		/* the primary invalidates our tail record on its way out */
		if (wc->wc_flags & IB_WC_WITH_INVALIDATE)	// BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey makes kd_repl_hide_tail() skip the tail's LOCAL_INV; ex.invalidate_rkey is never compared with tail_mr->rkey
			conn->tail_exposed = false;
		goto repost;
	}
	if (idx >= conn->nr_windows)
		goto repost;
	win = &conn->win[idx];

	switch (op) {
	case KD_REPL_OP_COMMIT:
		win->wc_flags = wc->wc_flags;
		win->inv_rkey = wc->ex.invalidate_rkey;
		queue_work(system_wq, &win->commit_work);
		break;
	case KD_REPL_OP_COMMIT_V1:	/* small v1 commits are handled inline */
		invalidated = wc->wc_flags & IB_WC_WITH_INVALIDATE;
		kd_repl_persist(win);
		kd_repl_send_ack(conn, win);
		if (invalidated)	// BUG: rdma-remote-invalidate-unchecked -- the copied flag alone releases the window; wc->ex.invalidate_rkey is never compared with win->mr->rkey
			kd_repl_put_window(win);
		else
			kd_repl_reclaim_window(win);
		break;
	case KD_REPL_OP_TRUNCATE:
		if (kd_repl_remote_inv_ok(win, wc))
			kd_repl_put_window(win);
		else
			kd_repl_reclaim_window(win);
		break;
	case KD_REPL_OP_DISCARD:
		if (wc->wc_flags & IB_WC_WITH_INVALIDATE)	// BUG: rdma-remote-invalidate-unchecked -- the window is recycled on the flag alone; a primary that invalidated another key keeps write access to it
			kd_repl_put_window(win);
		else
			kd_repl_reclaim_window(win);
		break;
	}
repost:
	ib_post_recv(conn->qp, &rcv->wr, NULL);
}
