/*
 * iser_initiator.c - iSER transport of a user-space iSCSI initiator.
 *
 * SCSI data buffers come from an application data pool that is
 * registered once for window binding.  Each task owns two type-2 memory
 * windows, one per direction; a command with data binds the window(s) over
 * its buffer(s) and sends the iSER header with the read/write STags in one
 * chain built in the task: [LOCAL_INV] -> BIND_MW -> ... -> SEND.  Windows
 * are invalidated lazily: a window that the target did not invalidate
 * with the SCSI response (SEND_WITH_INV) is invalidated by the LOCAL_INV
 * at the head of the task's next chain.
 */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define ISER_DIR_IN             0
#define ISER_DIR_OUT            1
#define ISER_RX_DESCS           256
#define ISER_RX_SIZE            (48 + 28 + 256)
#define ISER_MAX_TX_MISC_PDUS   6
#define ISER_SIGNAL_CMD_COUNT   32
#define ISER_RSV                0x04
#define ISER_WSV                0x08

struct iser_hdr {
	uint8_t      flags;
	uint8_t      rsvd[3];
	uint32_t     write_stag;
	uint64_t     write_va;
	uint32_t     read_stag;
	uint64_t     read_va;
} __attribute__((packed));

struct iser_mem_reg {
	struct ibv_mw       *mw;
	uint32_t             rkey;
	bool                 bound;
	bool                 need_inv;
	struct ibv_send_wr   inv_wr;
	struct ibv_send_wr   bind_wr;
};

struct iser_task {
	struct iser_task    *next;
	uint32_t             itt;
	void                *buf[2];
	uint32_t             len[2];
	struct iser_mem_reg  rdma_regd[2];
	struct iser_hdr      hdr;		/* + BHS, sent from here */
	struct ibv_sge       tx_sge;
	struct ibv_send_wr   send_wr;
	struct iser_task    *inv_next;		/* on ic->inv_pending */
};

struct iser_conn {
	struct rdma_cm_id   *cm_id;
	struct ibv_pd       *pd;
	struct ibv_qp       *qp;
	unsigned int         cmds_max;
	uint8_t              sig_count;
	char                *data_pool;
	size_t               data_pool_len;
	struct ibv_mr       *data_mr;
	char                *rx_descs;
	struct ibv_mr       *rx_mr;
	struct ibv_mr       *tx_mr;
	struct iser_task    *tasks;
	struct iser_task    *free_tasks;
	struct iser_task    *inv_pending;
};

void iser_scsi_done(struct iser_task *task, int status);
struct iser_task *iser_task_by_itt(struct iser_conn *ic, uint32_t itt);

static void iser_task_put(struct iser_conn *ic, struct iser_task *task)
{
	task->next = ic->free_tasks;
	ic->free_tasks = task;
}

int iser_create_ib_conn_res(struct iser_conn *ic)
{
	struct ibv_qp_init_attr init_attr;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_type = IBV_QPT_RC;
	init_attr.sq_sig_all = 0;
	// BUG(file): rdma-send-queue-undersized -- a bidirectional command chains two LOCAL_INVs, two BIND_MWs and the SEND: five entries per task, not three
	init_attr.cap.max_send_wr = 3 * ic->cmds_max + ISER_MAX_TX_MISC_PDUS + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor 3 over cmds_max in a file that binds and invalidates per task
	init_attr.cap.max_recv_wr = ISER_RX_DESCS;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(ic->cm_id, ic->pd, &init_attr))
		return -errno;
	ic->qp = ic->cm_id->qp;
	return 0;
}

int iser_alloc_task_pool(struct iser_conn *ic)
{
	unsigned int i, j;

	ic->tasks = calloc(ic->cmds_max, sizeof(*ic->tasks));
	if (!ic->tasks)
		return -ENOMEM;
	/* OK: rdma-local-mr-management -- headers are only sent; registered once with local access */
	ic->tx_mr = ibv_reg_mr(ic->pd, ic->tasks, ic->cmds_max * sizeof(*ic->tasks), IBV_ACCESS_LOCAL_WRITE);
	if (!ic->tx_mr)
		goto err_tasks;

	for (i = 0; i < ic->cmds_max; i++) {
		struct iser_task *task = &ic->tasks[i];

		task->itt = i;
		task->rdma_regd[ISER_DIR_IN].mw = ibv_alloc_mw(ic->pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- window that hands the read buffer to the target
		if (!task->rdma_regd[ISER_DIR_IN].mw)
			goto err_mws;
		task->rdma_regd[ISER_DIR_OUT].mw = ibv_alloc_mw(ic->pd, IBV_MW_TYPE_2);	// BUG: rdma-local-mr-management -- window that hands the write buffer to the target
		if (!task->rdma_regd[ISER_DIR_OUT].mw)
			goto err_mws;	// BUG: rdma-mr-leak -- the unwind stops below i: this task's DIR_IN window is never deallocated
		task->rdma_regd[ISER_DIR_IN].rkey = task->rdma_regd[ISER_DIR_IN].mw->rkey;
		task->rdma_regd[ISER_DIR_OUT].rkey = task->rdma_regd[ISER_DIR_OUT].mw->rkey;
		iser_task_put(ic, task);
	}
	return 0;

err_mws:
	for (j = 0; j < i; j++) {
		ibv_dealloc_mw(ic->tasks[j].rdma_regd[ISER_DIR_IN].mw);
		ibv_dealloc_mw(ic->tasks[j].rdma_regd[ISER_DIR_OUT].mw);
	}
	ibv_dereg_mr(ic->tx_mr);
err_tasks:
	free(ic->tasks);
	return -ENOMEM;
}

int iser_alloc_buffers(struct iser_conn *ic, size_t len)
{
	ic->data_pool = aligned_alloc(4096, len);
	ic->rx_descs = calloc(ISER_RX_DESCS, ISER_RX_SIZE);
	if (!ic->data_pool || !ic->rx_descs) {
		free(ic->data_pool);
		free(ic->rx_descs);
		return -ENOMEM;
	}
	ic->data_pool_len = len;
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE and MW_BIND allow windows with remote write */
	ic->data_mr = ibv_reg_mr(ic->pd, ic->data_pool, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);	// BUG: rdma-local-mr-management -- SCSI buffers exposed to the target through windows over this MR
	if (!ic->data_mr)
		goto err_free;
	/* OK: rdma-local-mr-management -- receive descriptors, registered once for local access */
	ic->rx_mr = rdma_reg_msgs(ic->cm_id, ic->rx_descs, ISER_RX_DESCS * ISER_RX_SIZE);
	if (!ic->rx_mr) {
		ibv_dereg_mr(ic->data_mr);
		goto err_free;
	}
	return 0;

err_free:
	free(ic->rx_descs);
	free(ic->data_pool);
	return -ENOMEM;
}

/* append [LOCAL_INV ->] BIND_MW for one direction; returns the new tail */
static struct ibv_send_wr *iser_build_reg(struct iser_conn *ic, struct iser_task *task,
					  int dir, struct ibv_send_wr *prev)
{
	struct iser_mem_reg *reg = &task->rdma_regd[dir];

	if (reg->need_inv) {
		memset(&reg->inv_wr, 0, sizeof(reg->inv_wr));
		reg->inv_wr.opcode = IBV_WR_LOCAL_INV;
		reg->inv_wr.invalidate_rkey = reg->rkey;
		prev->next = &reg->inv_wr;
		prev = &reg->inv_wr;
		reg->need_inv = false;
	}
	memset(&reg->bind_wr, 0, sizeof(reg->bind_wr));
	reg->bind_wr.opcode = IBV_WR_BIND_MW;	// BUG: rdma-local-mr-management -- window bound by hand over the task's buffer
	reg->bind_wr.bind_mw.mw = reg->mw;
	reg->rkey = ibv_inc_rkey(reg->rkey);
	/* OK: rdma-rkey-reuse -- the key is rotated right before every bind */
	reg->bind_wr.bind_mw.rkey = reg->rkey;
	reg->bind_wr.bind_mw.bind_info.mr = ic->data_mr;
	reg->bind_wr.bind_mw.bind_info.addr = (uintptr_t)task->buf[dir];
	reg->bind_wr.bind_mw.bind_info.length = task->len[dir];
	reg->bind_wr.bind_mw.bind_info.mw_access_flags =
		dir == ISER_DIR_IN ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	prev->next = &reg->bind_wr;
	reg->bound = true;
	return &reg->bind_wr;
}

int iser_send_command(struct iser_conn *ic, struct iser_task *task)
{
	struct ibv_send_wr head = { 0 }, *tail = &head, *bad;
	int dir;

	memset(&task->hdr, 0, sizeof(task->hdr));
	for (dir = ISER_DIR_IN; dir <= ISER_DIR_OUT; dir++) {
		if (!task->len[dir])
			continue;
		tail = iser_build_reg(ic, task, dir, tail);
	}
	if (task->len[ISER_DIR_IN]) {
		task->hdr.flags |= ISER_RSV;
		task->hdr.read_stag = htobe32(task->rdma_regd[ISER_DIR_IN].rkey);
		task->hdr.read_va = htobe64((uintptr_t)task->buf[ISER_DIR_IN]);
	}
	if (task->len[ISER_DIR_OUT]) {
		task->hdr.flags |= ISER_WSV;
		task->hdr.write_stag = htobe32(task->rdma_regd[ISER_DIR_OUT].rkey);
		task->hdr.write_va = htobe64((uintptr_t)task->buf[ISER_DIR_OUT]);
	}

	task->tx_sge.addr = (uintptr_t)&task->hdr;
	task->tx_sge.length = sizeof(task->hdr);
	task->tx_sge.lkey = ic->tx_mr->lkey;
	memset(&task->send_wr, 0, sizeof(task->send_wr));
	task->send_wr.wr_id = (uintptr_t)task;
	task->send_wr.opcode = IBV_WR_SEND;
	task->send_wr.sg_list = &task->tx_sge;
	task->send_wr.num_sge = 1;
	/* OK: rdma-unsignaled-send-starvation -- sig_count advances on every command */
	task->send_wr.send_flags = (++ic->sig_count % ISER_SIGNAL_CMD_COUNT) == 0 ? IBV_SEND_SIGNALED : 0;
	tail->next = &task->send_wr;
	return ibv_post_send(ic->qp, head.next, &bad);
}

static bool iser_inv_matches(const struct iser_task *task, uint32_t rkey)
{
	int dir;

	for (dir = ISER_DIR_IN; dir <= ISER_DIR_OUT; dir++)
		if (task->rdma_regd[dir].bound && task->rdma_regd[dir].rkey == rkey)
			return true;
	return false;
}

/* SCSI response received */
void iser_rcv_rsp(struct iser_conn *ic, struct ibv_wc *wc, uint32_t itt, int status)
{
	struct iser_task *task = iser_task_by_itt(ic, itt);
	int dir;

	if (!task)
		return;
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is matched against the task's windows */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && !iser_inv_matches(task, wc->invalidated_rkey)) {
		status = -EIO;		/* target invalidated someone else's STag */
	}
	for (dir = ISER_DIR_IN; dir <= ISER_DIR_OUT; dir++) {
		struct iser_mem_reg *reg = &task->rdma_regd[dir];

		if (!reg->bound)
			continue;
		if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == reg->rkey)
			reg->need_inv = false;
		else
			reg->need_inv = true;	/* invalidated at the head of the next chain */
		reg->bound = false;
	}
	iser_scsi_done(task, status);
	iser_task_put(ic, task);	// BUG: rdma-invalidation-leak -- windows the target did not invalidate go back to the pool still bound; the buffer is back with SCSI
}

/* task management: the target aborted the task and invalidated its STag */
void iser_rcv_tmf_rsp(struct iser_conn *ic, struct ibv_wc *wc, uint32_t itt)
{
	struct iser_task *task = iser_task_by_itt(ic, itt);

	if (!task)
		return;
	if (wc->wc_flags & IBV_WC_WITH_INV) {	// BUG: rdma-remote-invalidate-unchecked -- clears need_inv for both windows, whichever STag was invalidated
		task->rdma_regd[ISER_DIR_IN].need_inv = false;
		task->rdma_regd[ISER_DIR_OUT].need_inv = false;
	}
}

static int iser_post_inv(struct iser_conn *ic, struct iser_task *task, int dir, unsigned int flags)
{
	struct iser_mem_reg *reg = &task->rdma_regd[dir];
	struct ibv_send_wr *bad;

	memset(&reg->inv_wr, 0, sizeof(reg->inv_wr));
	reg->inv_wr.wr_id = (uintptr_t)task;
	reg->inv_wr.opcode = IBV_WR_LOCAL_INV;
	reg->inv_wr.invalidate_rkey = reg->rkey;
	reg->inv_wr.send_flags = flags;
	return ibv_post_send(ic->qp, &reg->inv_wr, &bad);
}

/* the SCSI layer aborts a task: invalidate, finish from the completion */
void iser_task_abort(struct iser_conn *ic, struct iser_task *task)
{
	bool in = task->rdma_regd[ISER_DIR_IN].bound;
	bool out = task->rdma_regd[ISER_DIR_OUT].bound;

	/* the last LOCAL_INV is signaled; its completion retires the first */
	if (in && iser_post_inv(ic, task, ISER_DIR_IN, out ? 0 : IBV_SEND_SIGNALED))
		return;
	if (out && iser_post_inv(ic, task, ISER_DIR_OUT, IBV_SEND_SIGNALED))
		return;
	task->inv_next = ic->inv_pending;
	/* OK: rdma-unmap-before-invalidate -- parked on inv_pending until the LOCAL_INV completion finishes it */
	ic->inv_pending = task;
}

/* connection error: fail every outstanding task */
void iser_conn_error_flush(struct iser_conn *ic, struct iser_task **outstanding, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		struct iser_task *task = outstanding[i];

		if (task->rdma_regd[ISER_DIR_IN].bound)
			iser_post_inv(ic, task, ISER_DIR_IN, 0);
		if (task->rdma_regd[ISER_DIR_OUT].bound)
			iser_post_inv(ic, task, ISER_DIR_OUT, 0);
		iser_scsi_done(task, -ECONNRESET);
		iser_task_put(ic, task);	// BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INVs may not have executed when the task and its buffers are handed back
	}
}

void iser_free_buffers(struct iser_conn *ic)
{
	rdma_dereg_mr(ic->rx_mr);
	ibv_dereg_mr(ic->data_mr);
	free(ic->rx_descs);
	free(ic->data_pool);	// BUG: rdma-invalidation-leak -- windows left bound by lazy invalidation still cover the data pool freed here
}
