/*
 * ta_blk_target.c - block storage target, RDMA transport (write path)
 *
 * tgtd-style target for a small SCSI-like protocol over RC.  A WRITE is
 * received in bursts: for every burst the target binds the task's type 2
 * window over a slice of its staging buffer with remote write rights, sends
 * an R2T carrying the window's rkey, and the initiator RDMA-WRITEs the burst
 * and sends DATA_DONE as SEND_WITH_INV for that rkey.  After the last burst
 * the data is written to the backing file and the task goes back to the
 * connection's task pool (a singly linked free list).
 *
 * Each connection owns its tasks, so every window is bound on the QP of the
 * initiator it was offered to.  The staging area is one registration
 * (LOCAL_WRITE | MW_BIND) made at login.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed here
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define eprintf(fmt, args...) fprintf(stderr, "tgtd: %s(%d) " fmt, __func__, __LINE__, ##args)
#define dprintf(fmt, args...) do { if (tgt_debug) eprintf(fmt, ##args); } while (0)

static int tgt_debug;

#define MAX_TASKS	32
#define RX_DEPTH	(2 * MAX_TASKS)
#define MAX_XFER	(1024 * 1024)
#define BURST_LEN	(256 * 1024)
#define TASK_TMO	10

enum { OP_WRITE_CMD = 1, OP_DATA_DONE, OP_TMF_ABORT, OP_R2T, OP_RSP };
enum { WR_RECV = 1, WR_SEND, WR_BIND, WR_INV };

#define TGT_WRID(op, idx)	(((uint64_t)(op) << 16) | (idx))
#define TGT_WRID_OP(id)		((unsigned)((id) >> 16))
#define TGT_WRID_IDX(id)	((unsigned)((id) & 0xffff))

struct tgt_pdu {
	uint8_t		op;
	uint8_t		status;
	uint16_t	itt;
	uint32_t	rkey;
	uint64_t	lba;
	uint64_t	addr;
	uint32_t	offset;
	uint32_t	len;
};

struct tgt_task {
	struct tgt_task	*next;
	uint16_t	itt;
	int		active;
	struct ibv_mw	*mw;
	uint32_t	rkey;
	char		*buf;		/* MAX_XFER slice of conn->staging */
	uint64_t	lba;
	uint32_t	len;
	uint32_t	done;		/* bytes received */
	time_t		start;
	struct tgt_pdu	tx;
};

struct tgt_conn {
	struct rdma_cm_id	*cm_id;
	struct ibv_qp		*qp;
	struct ibv_cq		*cq;
	struct ibv_pd		*pd;
	int			backing_fd;
	char			*staging;
	struct ibv_mr		*staging_mr;
	struct tgt_pdu		rx[RX_DEPTH];
	struct tgt_task		tasks[MAX_TASKS];
	struct ibv_mr		*pdu_mr;	/* covers this struct's rx[] and tasks[].tx */
	struct tgt_task		*free_tasks;
	uint64_t		journal_free;
};

static struct tgt_task *tgt_task_get(struct tgt_conn *conn)
{
	struct tgt_task *task = conn->free_tasks;

	if (task) {
		conn->free_tasks = task->next;
		task->active = 1;
		task->done = 0;
		task->start = time(NULL);
	}
	return task;
}

static void tgt_task_put(struct tgt_conn *conn, struct tgt_task *task)
{
	task->active = 0;
	task->next = conn->free_tasks;
	conn->free_tasks = task;
}

static int tgt_send_pdu(struct tgt_conn *conn, struct tgt_task *task, struct ibv_send_wr *first)
{
	struct ibv_sge sge = { (uintptr_t)&task->tx, sizeof(task->tx), conn->pdu_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = TGT_WRID(WR_SEND, task->itt), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad = NULL;
	int ret;

	if (first)
		first->next = &wr;
	ret = ibv_post_send(conn->qp, first ? first : &wr, &bad);
	if (ret && first && bad != first)
		return -EINPROGRESS;	/* the bind went out */
	return ret;
}

static int tgt_send_rsp(struct tgt_conn *conn, struct tgt_task *task, int status)
{
	task->tx = (struct tgt_pdu){ .op = OP_RSP, .itt = task->itt, .status = status };
	return tgt_send_pdu(conn, task, NULL);
}

static void tgt_conn_fail(struct tgt_conn *conn)
{
	eprintf("connection %p failed, disconnecting\n", (void *)conn);
	rdma_disconnect(conn->cm_id);
}

/* first burst of a WRITE: fresh key for the task's window */
static int tgt_send_r2t(struct tgt_conn *conn, struct tgt_task *task)
{
	uint32_t len = task->len < BURST_LEN ? task->len : BURST_LEN;
	struct ibv_send_wr bind = { 0 };

	task->rkey = ibv_inc_rkey(task->rkey);
	bind.wr_id = TGT_WRID(WR_BIND, task->itt);
	bind.opcode = IBV_WR_BIND_MW;
	bind.bind_mw.mw = task->mw;
	bind.bind_mw.rkey = task->rkey; /* OK: rdma-rkey-reuse -- rotated just above */
	bind.bind_mw.bind_info.mr = conn->staging_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)task->buf;
	bind.bind_mw.bind_info.length = len;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	task->tx = (struct tgt_pdu){ .op = OP_R2T, .itt = task->itt, .rkey = task->rkey,
				     .addr = (uintptr_t)task->buf, .offset = 0, .len = len };
	return tgt_send_pdu(conn, task, &bind);
}

/* later bursts rebind the same window further into the staging buffer */
static int tgt_next_burst(struct tgt_conn *conn, struct tgt_task *task)
{
	uint32_t left = task->len - task->done;
	uint32_t len = left < BURST_LEN ? left : BURST_LEN;
	struct ibv_send_wr bind = { 0 };

	bind.wr_id = TGT_WRID(WR_BIND, task->itt);
	bind.opcode = IBV_WR_BIND_MW;
	bind.bind_mw.mw = task->mw;
	bind.bind_mw.rkey = task->rkey; /* BUG: rdma-rkey-reuse -- the previous burst's key (just invalidated by the initiator) is bound again over new memory */
	bind.bind_mw.bind_info.mr = conn->staging_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)task->buf + task->done;
	bind.bind_mw.bind_info.length = len;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	task->tx = (struct tgt_pdu){ .op = OP_R2T, .itt = task->itt, .rkey = task->rkey,
				     .addr = (uintptr_t)task->buf + task->done,
				     .offset = task->done, .len = len };
	return tgt_send_pdu(conn, task, &bind);
}

static int tgt_journal_reserve(struct tgt_conn *conn, uint32_t len)
{
	if (conn->journal_free < len)
		return -ENOSPC;
	conn->journal_free -= len;
	return 0;
}

static void tgt_handle_write_cmd(struct tgt_conn *conn, struct tgt_pdu *cmd)
{
	struct tgt_task *task;
	int ret;

	if (cmd->len == 0 || cmd->len > MAX_XFER) {
		eprintf("bad transfer length %u\n", cmd->len);
		return;
	}
	task = tgt_task_get(conn);
	if (!task) {
		eprintf("no free task for itt %u\n", cmd->itt);
		return;
	}
	task->lba = cmd->lba;
	task->len = cmd->len;

	ret = tgt_send_r2t(conn, task);
	if (ret == -EINPROGRESS) {
		tgt_conn_fail(conn);	/* window bound, task stays active */
		return;
	}
	if (ret) {
		tgt_task_put(conn, task); /* OK: rdma-invalidation-leak -- the bind was the WR that failed, nothing was bound */
		return;
	}

	if (tgt_journal_reserve(conn, task->len)) {
		eprintf("journal full, failing itt %u\n", cmd->itt);
		goto out_put;
	}
	return;

out_put:
	tgt_send_rsp(conn, task, 0x28 /* task set full */);
	tgt_task_put(conn, task); /* BUG: rdma-invalidation-leak -- the R2T already gave the initiator a writable key over task->buf */
}

static void tgt_handle_data_done(struct tgt_conn *conn, struct tgt_task *task, struct ibv_wc *wc)
{
	struct ibv_send_wr inv = { 0 }, *bad;

	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == task->rkey) {
		task->done += task->tx.len;
		if (task->done < task->len) {
			if (tgt_next_burst(conn, task))
				tgt_conn_fail(conn);
			return;
		}
		if (pwrite(conn->backing_fd, task->buf, task->len, task->lba * 512) != (ssize_t)task->len)
			eprintf("write error itt %u: %s\n", task->itt, strerror(errno));
		tgt_send_rsp(conn, task, 0);
		tgt_task_put(conn, task); /* OK: rdma-remote-invalidate-unchecked, rdma-invalidation-leak -- the initiator invalidated exactly this task's rkey */
		return;
	}

	/* no (or wrong) remote invalidation: kill the window ourselves, the
	 * task continues from the LOCAL_INV completion */
	dprintf("itt %u: local invalidation of rkey 0x%x\n", task->itt, task->rkey);
	inv.wr_id = TGT_WRID(WR_INV, task->itt);
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = task->rkey;
	inv.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(conn->qp, &inv, &bad))
		tgt_conn_fail(conn);
}

static void tgt_handle_abort(struct tgt_conn *conn, struct tgt_task *task, struct ibv_wc *wc)
{
	struct ibv_send_wr inv = { 0 }, *bad;

	if (wc->wc_flags & IBV_WC_WITH_INV) {
		/* the initiator already invalidated the window with the abort */
		tgt_send_rsp(conn, task, 0x40 /* task aborted */);
		tgt_task_put(conn, task); /* BUG: rdma-remote-invalidate-unchecked -- invalidated_rkey is never compared with task->rkey */
		return;
	}

	inv.wr_id = TGT_WRID(WR_INV, task->itt);
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = task->rkey;
	if (ibv_post_send(conn->qp, &inv, &bad)) {
		tgt_conn_fail(conn);
		return;
	}
	tgt_send_rsp(conn, task, 0x40);
	tgt_task_put(conn, task); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is unsignaled and not awaited before the task is reused */
}

static void tgt_handle_inv_done(struct tgt_conn *conn, struct tgt_task *task, struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS) {
		eprintf("LOCAL_INV failed for itt %u: %s\n", task->itt, ibv_wc_status_str(wc->status));
		tgt_conn_fail(conn);
		return;
	}
	tgt_send_rsp(conn, task, 0x02 /* check condition: retry */);
	tgt_task_put(conn, task); /* OK: rdma-invalidation-leak -- after the LOCAL_INV completed successfully */
}

static int tgt_post_recv(struct tgt_conn *conn, unsigned idx)
{
	struct ibv_sge sge = { (uintptr_t)&conn->rx[idx], sizeof(conn->rx[idx]), conn->pdu_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = TGT_WRID(WR_RECV, idx), .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(conn->qp, &wr, &bad);
}

void tgt_conn_poll(struct tgt_conn *conn)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(conn->cq, 16, wc);
	for (i = 0; i < n; i++) {
		unsigned idx = TGT_WRID_IDX(wc[i].wr_id);
		struct tgt_pdu *pdu;

		switch (TGT_WRID_OP(wc[i].wr_id)) {
		case WR_RECV:
			if (wc[i].status != IBV_WC_SUCCESS) {
				tgt_conn_fail(conn);
				break;
			}
			pdu = &conn->rx[idx];
			if (pdu->op == OP_WRITE_CMD)
				tgt_handle_write_cmd(conn, pdu);
			else if (pdu->itt < MAX_TASKS && conn->tasks[pdu->itt].active &&
				 pdu->op == OP_DATA_DONE)
				tgt_handle_data_done(conn, &conn->tasks[pdu->itt], &wc[i]);
			else if (pdu->itt < MAX_TASKS && conn->tasks[pdu->itt].active &&
				 pdu->op == OP_TMF_ABORT)
				tgt_handle_abort(conn, &conn->tasks[pdu->itt], &wc[i]);
			tgt_post_recv(conn, idx);
			break;
		case WR_INV:
			if (idx < MAX_TASKS)
				tgt_handle_inv_done(conn, &conn->tasks[idx], &wc[i]);
			break;
		default:
			if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR)
				tgt_conn_fail(conn);
			break;
		}
	}
}

/* post a signaled LOCAL_INV and spin until it completes */
static int tgt_inv_sync(struct tgt_conn *conn, struct tgt_task *task)
{
	struct ibv_send_wr inv = { 0 }, *bad;
	struct ibv_wc wc;
	int n;

	inv.wr_id = TGT_WRID(WR_INV, 0xffff);
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = task->rkey;
	inv.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(conn->qp, &inv, &bad))
		return -EIO;
	do {
		n = ibv_poll_cq(conn->cq, 1, &wc);
	} while (n == 0 || (n == 1 && wc.wr_id != inv.wr_id));
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	return 0;
}

void tgt_conn_expire_tasks(struct tgt_conn *conn)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < MAX_TASKS; i++) {
		struct tgt_task *task = &conn->tasks[i];

		if (!task->active || now - task->start < TASK_TMO)
			continue;
		eprintf("itt %u: no data from initiator after %d s\n", task->itt, TASK_TMO);
		if (tgt_inv_sync(conn, task)) {
			tgt_conn_fail(conn);
			return;
		}
		tgt_task_put(conn, task); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- tgt_inv_sync() waited for the LOCAL_INV to complete */
	}
}

void tgt_conn_destroy(struct tgt_conn *conn)
{
	int i;

	for (i = 0; i < MAX_TASKS; i++)
		if (conn->tasks[i].mw)
			ibv_dealloc_mw(conn->tasks[i].mw);
	rdma_destroy_qp(conn->cm_id);
	ibv_dereg_mr(conn->staging_mr);
	free(conn->staging); /* OK: rdma-invalidation-leak -- every window was deallocated and the staging MR deregistered */
	ibv_dereg_mr(conn->pdu_mr);
	ibv_destroy_cq(conn->cq);
	rdma_destroy_id(conn->cm_id);
	free(conn);
}
