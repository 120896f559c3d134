// SPDX-License-Identifier: GPL-2.0
/*
 * kd_repl_conn.c - replication target over RDMA: the primary writes its log
 * into pmem windows we grant it (REG_MR + GRANT carrying the rkey; COMMIT
 * normally arrives as SEND_WITH_INV).  This file: setup/teardown, the window
 * MR array, the "tail" record the primary reads (hidden with LOCAL_INV while
 * it resynchronises, exposed again afterwards).
 * Correct: window teardown; the receive depth is checked.  Not correct: the
 * window unwinding, the tail MR on a failed receive post, the tail's rights
 * and key reuse, freeing the tail before deregistering it, the SQ size.
 */
#include "kd_repl.h"

static struct ib_mr *kd_repl_get_mr(struct kd_repl_conn *conn,
				    struct scatterlist *sg, int nents)
{
	struct ib_mr *mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, nents);

	if (IS_ERR(mr))
		return mr;
	if (ib_map_mr_sg(mr, sg, nents, NULL, PAGE_SIZE) != nents) {
		ib_dereg_mr(mr);
		return ERR_PTR(-EINVAL);
	}
	return mr;
}

static void kd_repl_put_mr(struct ib_mr *mr)
{
	if (mr)
		ib_dereg_mr(mr);
}

void kd_repl_conn_error(struct kd_repl_conn *conn)
{
	rdma_disconnect(conn->cm_id);
}

static void kd_repl_free_windows(struct kd_repl_conn *conn)
{
	unsigned int i;

	for (i = 0; i < conn->nr_windows; i++) {
		cancel_delayed_work_sync(&conn->win[i].expire);
		ib_dereg_mr(conn->win[i].mr);	/* OK: rdma-mr-leak, rdma-invalidation-leak -- every window MR is deregistered (killing its key) before its pages are unmapped */
		if (conn->win[i].nents)
			ib_dma_unmap_sg(conn->dev, conn->win[i].sg,
					conn->win[i].nents, DMA_FROM_DEVICE);
		kfree(conn->win[i].sg);
	}
	kfree(conn->win);
}

static int kd_repl_alloc_windows(struct kd_repl_conn *conn)
{
	struct kd_repl_win *win;
	int i, ret;

	conn->win = kcalloc(conn->nr_windows, sizeof(*conn->win), GFP_KERNEL);
	if (!conn->win)
		return -ENOMEM;
	for (i = 0; i < conn->nr_windows; i++) {
		win = &conn->win[i];
		win->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				      KD_REPL_WIN_PAGES);
		if (IS_ERR(win->mr)) {
			ret = PTR_ERR(win->mr);
			goto out_unwind;
		}
		win->sg = kcalloc(KD_REPL_WIN_PAGES, sizeof(*win->sg),
				  GFP_KERNEL);
		if (!win->sg) {
			ret = -ENOMEM;
			goto out_unwind;	// BUG: rdma-mr-leak -- the unwinding loop stops below i; win[i].mr, allocated just above, is never deregistered
		}
		win->conn = conn;
		win->idx = i;
		INIT_DELAYED_WORK(&win->expire, kd_repl_window_expire);
		INIT_WORK(&win->commit_work, kd_repl_commit_work);
		list_add_tail(&win->list, &conn->free_wins);
	}
	return 0;

out_unwind:
	while (i--) {
		ib_dereg_mr(conn->win[i].mr);
		kfree(conn->win[i].sg);
	}
	kfree(conn->win);
	return ret;
}

/* At connect and after every resync: REG_MR the tail, tell the primary. */
int kd_repl_expose_tail(struct kd_repl_conn *conn)
{
	memset(&conn->tail_reg_wr, 0, sizeof(conn->tail_reg_wr));
	conn->tail_reg_wr.wr.opcode = IB_WR_REG_MR;
	conn->tail_reg_wr.wr.next = &conn->ctl_wr;
	conn->tail_reg_wr.mr = conn->tail_mr;	// BUG: rdma-rkey-reuse -- after kd_repl_hide_tail() invalidated it, the tail is registered again with the key the primary already had; nothing rotates it
	conn->tail_reg_wr.key = conn->tail_mr->rkey;
	/* the primary reads our tail and stores its epoch next to it */
	conn->tail_reg_wr.access = IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE: the REG_MR completes in error

	kd_repl_prep_ctl(conn, KD_REPL_OP_HELLO, 0, IB_SEND_SIGNALED);
	conn->ctl_msg.rkey = cpu_to_le32(conn->tail_mr->rkey);
	conn->ctl_msg.addr = cpu_to_le64(conn->tail_mr->iova);
	conn->tail_exposed = true;
	return ib_post_send(conn->qp, &conn->tail_reg_wr.wr, NULL);
}

/* Resync start or disconnect: the tail must not be read while it moves. */
void kd_repl_hide_tail(struct kd_repl_conn *conn)
{
	if (!conn->tail_exposed)
		return;		/* the primary invalidated it (CLOSE) */
	init_completion(&conn->tail_inv_done);
	conn->tail_inv_cqe.done = kd_repl_tail_inv_done;
	conn->tail_inv_wr.wr_cqe = &conn->tail_inv_cqe;
	conn->tail_inv_wr.opcode = IB_WR_LOCAL_INV;
	conn->tail_inv_wr.ex.invalidate_rkey = conn->tail_mr->rkey;
	conn->tail_inv_wr.send_flags = IB_SEND_SIGNALED;
	if (!ib_post_send(conn->qp, &conn->tail_inv_wr, NULL))
		wait_for_completion(&conn->tail_inv_done);
	conn->tail_exposed = false;
}

int kd_repl_conn_setup(struct kd_repl_conn *conn)
{
	struct ib_qp_init_attr attr = { };
	int i, ret;

	if (KD_REPL_RECV_DEPTH + 1 > conn->dev->attrs.max_qp_wr)
		return -EINVAL;

	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	/* REG_MR + GRANT per window (the primary invalidates by SEND_WITH_INV), +1 for drain */
	attr.cap.max_send_wr = 2 * conn->nr_windows + 1;	// BUG(program): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a window also needs a LOCAL_INV when the COMMIT was not SEND_WITH_INV, plus its ACK; the hand-made factor 2 repeats (and misses) what max_rdma_ctxs would account
	attr.cap.max_recv_wr = KD_REPL_RECV_DEPTH + 1;	/* OK: rdma-queue-cap-unchecked -- compared with attrs.max_qp_wr above */
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct kd_repl_msg);
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (ret)
		return ret;
	conn->qp = conn->cm_id->qp;

	ret = kd_repl_alloc_windows(conn);
	if (ret)
		goto out_qp;
	conn->tail = kzalloc(PAGE_SIZE, GFP_KERNEL);
	if (!conn->tail) {
		ret = -ENOMEM;
		goto out_windows;
	}
	sg_init_one(&conn->tail_sg, conn->tail, PAGE_SIZE);
	if (!ib_dma_map_sg(conn->dev, &conn->tail_sg, 1, DMA_BIDIRECTIONAL)) {
		ret = -EIO;
		goto out_tail;
	}
	conn->tail_mr = kd_repl_get_mr(conn, &conn->tail_sg, 1);
	if (IS_ERR(conn->tail_mr)) {
		ret = PTR_ERR(conn->tail_mr);
		goto out_unmap;
	}
	for (i = 0; i < KD_REPL_RECV_DEPTH; i++) {
		ret = ib_post_recv(conn->qp, &conn->recvs[i].wr, NULL);
		if (ret)
			goto out_unmap;	// BUG: rdma-mr-leak -- jumps past out_mr: the tail MR from kd_repl_get_mr() is never released
	}
	ret = kd_repl_expose_tail(conn);
	if (ret)
		goto out_mr;
	return 0;

out_mr:
	kd_repl_put_mr(conn->tail_mr);
out_unmap:
	ib_dma_unmap_sg(conn->dev, &conn->tail_sg, 1, DMA_BIDIRECTIONAL);
out_tail:
	kfree(conn->tail);
out_windows:
	kd_repl_free_windows(conn);
out_qp:
	rdma_destroy_qp(conn->cm_id);
	return ret;
}

void kd_repl_conn_destroy(struct kd_repl_conn *conn)
{
	ib_drain_qp(conn->qp);
	kd_repl_free_windows(conn);
	ib_dma_unmap_sg(conn->dev, &conn->tail_sg, 1, DMA_BIDIRECTIONAL);	// BUG: rdma-invalidation-leak -- the tail's remote key is still valid (it is deregistered only after the memory is unmapped and freed)
	kfree(conn->tail);
	kd_repl_put_mr(conn->tail_mr);
	rdma_destroy_qp(conn->cm_id);
}
