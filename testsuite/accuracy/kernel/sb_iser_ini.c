// SPDX-License-Identifier: GPL-2.0
/*
 * sb_iser_ini.c - iSER style initiator: command submission and completion.
 *
 * A SCSI task may move data in both directions.  Each direction gets its
 * own fast-registration descriptor from the connection's pool, and the
 * rkeys travel to the target in the iSER header (read stag, write stag).
 * The target may invalidate one of them with SEND_WITH_INV on the SCSI
 * response; the initiator checks which key that was, posts a signaled
 * LOCAL_INV for every descriptor that is still valid and finishes the
 * task when the last of them completes.
 *
 * Problems in this version:
 *  - the per-task send queue budget counts the command and one
 *    registration only; a task also posts a second registration, an
 *    unsolicited Data-Out and one LOCAL_INV per direction;
 *  - when the unsolicited Data-Out cannot be posted, the descriptors of a
 *    command that already went out are recycled with their stags live;
 *  - the abort cleanup posts unsignaled LOCAL_INVs and recycles the
 *    descriptors without waiting for them.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SBI_DIR_IN		0
#define SBI_DIR_OUT		1
#define SBI_DIRS		2

#define SBI_MAX_TX_MISC_PDUS	6	/* NOOP_OUT(2), TEXT(1), TMF(2), LOGOUT(1) */
#define SBI_WRS_PER_TASK	2	/* command PDU + its registration */
#define SBI_HDRS_LEN		76	/* iSER + iSCSI BHS */
#define SBI_RSV			0x04
#define SBI_WSV			0x08
#define SBI_OP_SCSI_RSP		0x21

struct sbi_hdr {
	u8	flags;
	u8	rsvd[3];
	__be32	write_stag;
	__be64	write_va;
	__be32	read_stag;
	__be64	read_va;
} __attribute__((packed));

struct sbi_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	bool			mr_valid;
};

struct sbi_conn;
struct sbi_task;

struct sbi_mem_reg {
	struct sbi_task		*task;
	int			dir;
	struct sbi_fr_desc	*desc;
	struct scatterlist	*sg;
	int			nents;
	int			dma_nents;
	u32			rkey;
	u64			va;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
};

struct sbi_task {
	struct sbi_conn		*conn;
	u32			itt;
	struct sbi_mem_reg	rdma_reg[SBI_DIRS];
	struct sbi_hdr		*hdr;
	u64			hdr_dma;
	struct ib_sge		tx_sge;
	struct ib_send_wr	send_wr;
	struct ib_sge		dout_sge;
	struct ib_send_wr	dout_wr;
	struct ib_cqe		tx_cqe;
	u32			imm_len;
	u64			imm_dma;
	atomic_t		inv_pending;
	int			status;
	void			(*done)(struct sbi_task *task, int status);
};

struct sbi_rx_desc {
	u8			opcode;
	u8			status;
	__be32			itt;
	u64			dma;
	struct ib_cqe		cqe;
	struct sbi_conn		*conn;
};

struct sbi_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	spinlock_t		lock;
	struct list_head	fr_pool;
	unsigned int		cmds_max;
	unsigned int		pages_per_mr;
	struct sbi_task		*tasks;
	struct work_struct	err_work;
};

static void sbi_conn_error(struct sbi_conn *conn)
{
	queue_work(system_wq, &conn->err_work);
}

static struct sbi_fr_desc *sbi_fr_desc_get(struct sbi_conn *conn)
{
	struct sbi_fr_desc *desc;
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	desc = list_first_entry_or_null(&conn->fr_pool, struct sbi_fr_desc, list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_irqrestore(&conn->lock, flags);
	return desc;
}

static void sbi_fr_desc_put(struct sbi_conn *conn, struct sbi_fr_desc *desc)
{
	unsigned long flags;

	spin_lock_irqsave(&conn->lock, flags);
	list_add(&desc->list, &conn->fr_pool);
	spin_unlock_irqrestore(&conn->lock, flags);
}

static void sbi_unreg_mem(struct sbi_task *task, int dir)
{
	struct sbi_mem_reg *reg = &task->rdma_reg[dir];

	if (!reg->desc)
		return;
	ib_dma_unmap_sg(task->conn->ibdev, reg->sg, reg->nents,
			dir == SBI_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	sbi_fr_desc_put(task->conn, reg->desc);
	reg->desc = NULL;
}

static void sbi_unreg_task(struct sbi_task *task)
{
	sbi_unreg_mem(task, SBI_DIR_IN);
	sbi_unreg_mem(task, SBI_DIR_OUT);
}

static int sbi_reg_rdma_mem(struct sbi_task *task, int dir)
{
	struct sbi_conn *conn = task->conn;
	struct sbi_mem_reg *reg = &task->rdma_reg[dir];
	struct ib_reg_wr *wr = &reg->reg_wr;
	struct sbi_fr_desc *desc;
	int n;

	reg->dma_nents = ib_dma_map_sg(conn->ibdev, reg->sg, reg->nents,
			dir == SBI_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
	if (!reg->dma_nents)
		return -EIO;

	desc = sbi_fr_desc_get(conn);
	if (!desc) {
		ib_dma_unmap_sg(conn->ibdev, reg->sg, reg->nents,
			dir == SBI_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
		return -EAGAIN;
	}
	reg->desc = desc;

	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));
	n = ib_map_mr_sg(desc->mr, reg->sg, reg->dma_nents, NULL, SZ_4K);
	if (unlikely(n != reg->dma_nents)) {
		pr_err("itt %u: failed to map %d entries (%d)\n", task->itt,
		       reg->dma_nents, n);
		sbi_unreg_mem(task, dir);	/* OK: rdma-invalidation-leak -- the descriptor was never registered for this task */
		return n < 0 ? n : -EINVAL;
	}

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR;
	wr->wr.wr_cqe = &task->tx_cqe;
	wr->wr.num_sge = 0;
	wr->mr = desc->mr;
	wr->key = desc->mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE |
		     (dir == SBI_DIR_IN ? IB_ACCESS_REMOTE_WRITE :
					  IB_ACCESS_REMOTE_READ);

	desc->mr_valid = true;
	reg->rkey = desc->mr->rkey;
	reg->va = desc->mr->iova;
	return 0;
}

static int sbi_send_unsol_data(struct sbi_task *task)
{
	struct sbi_conn *conn = task->conn;

	task->dout_sge.addr = task->imm_dma;
	task->dout_sge.length = task->imm_len;
	task->dout_sge.lkey = conn->pd->local_dma_lkey;

	memset(&task->dout_wr, 0, sizeof(task->dout_wr));
	task->dout_wr.opcode = IB_WR_SEND;
	task->dout_wr.wr_cqe = &task->tx_cqe;
	task->dout_wr.sg_list = &task->dout_sge;
	task->dout_wr.num_sge = 1;
	task->dout_wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(conn->qp, &task->dout_wr, NULL);
}

static int sbi_send_command(struct sbi_task *task)
{
	struct sbi_conn *conn = task->conn;
	struct sbi_hdr *hdr = task->hdr;
	struct ib_send_wr *first = NULL, **tail = &first;
	int dir, err;

	memset(hdr, 0, sizeof(*hdr));
	for (dir = 0; dir < SBI_DIRS; dir++) {
		struct sbi_mem_reg *reg = &task->rdma_reg[dir];

		if (!reg->sg)
			continue;
		err = sbi_reg_rdma_mem(task, dir);
		if (err)
			goto out_unreg;

		*tail = &reg->reg_wr.wr;
		tail = &reg->reg_wr.wr.next;
		if (dir == SBI_DIR_IN) {
			hdr->flags |= SBI_RSV;
			hdr->read_stag = cpu_to_be32(reg->rkey);
			hdr->read_va = cpu_to_be64(reg->va);
		} else {
			hdr->flags |= SBI_WSV;
			hdr->write_stag = cpu_to_be32(reg->rkey);
			hdr->write_va = cpu_to_be64(reg->va + task->imm_len);
		}
	}

	task->tx_sge.addr = task->hdr_dma;
	task->tx_sge.length = SBI_HDRS_LEN;
	task->tx_sge.lkey = conn->pd->local_dma_lkey;

	memset(&task->send_wr, 0, sizeof(task->send_wr));
	task->send_wr.opcode = IB_WR_SEND;
	task->send_wr.wr_cqe = &task->tx_cqe;
	task->send_wr.sg_list = &task->tx_sge;
	task->send_wr.num_sge = 1;
	task->send_wr.send_flags = IB_SEND_SIGNALED;
	*tail = &task->send_wr;

	err = ib_post_send(conn->qp, first, NULL);
	if (err)
		goto out_unreg;

	if (task->imm_len) {
		err = sbi_send_unsol_data(task);
		if (err)
			goto out_abort;
	}
	return 0;

out_abort:
	pr_err("itt %u: unsolicited Data-Out not posted (%d)\n", task->itt, err);
	sbi_unreg_task(task);	/* BUG: rdma-invalidation-leak -- the command and its REG_MRs are on the wire, the target holds the stags, and the descriptors go back to the pool */
	return err;

out_unreg:
	sbi_unreg_task(task);	/* OK: rdma-invalidation-leak -- registration failed or the post failed: no stag reached the target */
	return err;
}

static void sbi_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbi_mem_reg *reg =
		container_of(wc->wr_cqe, struct sbi_mem_reg, inv_cqe);
	struct sbi_task *task = reg->task;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("itt %u: LOCAL_INV failed: %s\n", task->itt,
		       ib_wc_status_msg(wc->status));
		sbi_conn_error(task->conn);
		return;
	}

	reg->desc->mr_valid = false;
	sbi_unreg_mem(task, reg->dir);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the successful completion of its own signaled LOCAL_INV */
	if (atomic_dec_and_test(&task->inv_pending))
		task->done(task, task->status);
}

static void sbi_inv_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbi_mem_reg *reg =
		container_of(wc->wr_cqe, struct sbi_mem_reg, inv_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		sbi_conn_error(reg->task->conn);
}

static int sbi_check_remote_inv(struct sbi_task *task, struct ib_wc *wc)
{
	u32 rkey;
	int dir;

	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE))
		return 0;

	rkey = wc->ex.invalidate_rkey;
	for (dir = 0; dir < SBI_DIRS; dir++) {
		struct sbi_mem_reg *reg = &task->rdma_reg[dir];

		if (reg->desc && reg->desc->mr_valid && reg->rkey == rkey) {
			reg->desc->mr_valid = false;	/* OK: rdma-remote-invalidate-unchecked -- only the descriptor whose rkey matches is taken as invalidated */
			return 0;
		}
	}

	pr_err("itt %u: target invalidated unknown rkey %#x\n", task->itt, rkey);
	return -EINVAL;
}

static void sbi_task_rdma_finalize(struct sbi_task *task)
{
	struct sbi_conn *conn = task->conn;
	struct ib_send_wr *first = NULL, **tail = &first;
	int dir, err;

	atomic_set(&task->inv_pending, 0);
	for (dir = 0; dir < SBI_DIRS; dir++) {
		struct sbi_mem_reg *reg = &task->rdma_reg[dir];

		if (!reg->desc)
			continue;
		if (!reg->desc->mr_valid) {
			sbi_unreg_mem(task, dir);	/* OK: rdma-invalidation-leak -- the target invalidated exactly this stag (matched in sbi_check_remote_inv) */
			continue;
		}

		memset(&reg->inv_wr, 0, sizeof(reg->inv_wr));
		reg->inv_wr.opcode = IB_WR_LOCAL_INV;
		reg->inv_wr.ex.invalidate_rkey = reg->rkey;
		reg->inv_wr.send_flags = IB_SEND_SIGNALED;
		reg->inv_cqe.done = sbi_inv_done;
		reg->inv_wr.wr_cqe = &reg->inv_cqe;
		atomic_inc(&task->inv_pending);
		*tail = &reg->inv_wr;
		tail = &reg->inv_wr.next;
	}

	if (!first) {
		task->done(task, task->status);
		return;
	}

	err = ib_post_send(conn->qp, first, NULL);
	if (unlikely(err)) {
		pr_err("itt %u: LOCAL_INV post failed (%d)\n", task->itt, err);
		sbi_conn_error(conn);	/* descriptors stay with the task */
	}
}

/*
 * Session layer callback for a task that was aborted (TMF ABORT TASK) or
 * failed before its response arrived: kill the stags and give the
 * descriptors back.
 */
static void sbi_cleanup_task(struct sbi_task *task)
{
	struct sbi_conn *conn = task->conn;
	int dir;

	for (dir = 0; dir < SBI_DIRS; dir++) {
		struct sbi_mem_reg *reg = &task->rdma_reg[dir];

		if (!reg->desc)
			continue;
		if (reg->desc->mr_valid) {
			memset(&reg->inv_wr, 0, sizeof(reg->inv_wr));
			reg->inv_wr.opcode = IB_WR_LOCAL_INV;
			reg->inv_wr.ex.invalidate_rkey = reg->rkey;
			reg->inv_cqe.done = sbi_inv_err_done;
			reg->inv_wr.wr_cqe = &reg->inv_cqe;
			if (ib_post_send(conn->qp, &reg->inv_wr, NULL)) {
				sbi_conn_error(conn);
				continue;	/* reclaimed at connection teardown */
			}
			reg->desc->mr_valid = false;
		}
		sbi_unreg_mem(task, dir);	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV was just posted; buffer unmapped and descriptor reused before it executed */
	}
}

static struct sbi_task *sbi_task_by_itt(struct sbi_conn *conn, u32 itt)
{
	return itt < conn->cmds_max ? &conn->tasks[itt] : NULL;
}

static int sbi_post_recv(struct sbi_conn *conn, struct sbi_rx_desc *rx)
{
	struct ib_sge sge = {
		.addr = rx->dma, .length = SBI_HDRS_LEN + 128,
		.lkey = conn->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &rx->cqe, .sg_list = &sge, .num_sge = 1,
	};

	return ib_post_recv(conn->qp, &wr, NULL);
}

static void sbi_rcv_completion(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbi_rx_desc *rx = container_of(wc->wr_cqe, struct sbi_rx_desc, cqe);
	struct sbi_conn *conn = rx->conn;
	struct sbi_task *task;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			sbi_conn_error(conn);
		return;
	}

	if (rx->opcode == SBI_OP_SCSI_RSP) {
		task = sbi_task_by_itt(conn, be32_to_cpu(rx->itt));
		if (!task || sbi_check_remote_inv(task, wc)) {
			sbi_conn_error(conn);
			return;
		}
		task->status = rx->status;
		sbi_task_rdma_finalize(task);
	}

	sbi_post_recv(conn, rx);
}

static int sbi_create_qp(struct sbi_conn *conn)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = conn;
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	/* BUG: rdma-send-queue-manual-factor -- per-task factor chosen by hand for the registration WRs */
	init_attr.cap.max_send_wr = SBI_WRS_PER_TASK * conn->cmds_max + SBI_MAX_TX_MISC_PDUS + 1; /* BUG: rdma-send-queue-undersized -- a task posts up to 2 REG_MRs, the command, a Data-Out and 2 LOCAL_INVs, but only 2 entries per task are reserved */
	init_attr.cap.max_recv_wr = conn->cmds_max + 4;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &init_attr);
	if (ret)
		return ret;
	conn->qp = conn->cm_id->qp;
	return 0;
}

static int sbi_alloc_fr_pool(struct sbi_conn *conn, unsigned int size)
{
	struct sbi_fr_desc *desc;
	unsigned int i;

	INIT_LIST_HEAD(&conn->fr_pool);
	for (i = 0; i < size; i++) {
		desc = kzalloc(sizeof(*desc), GFP_KERNEL);
		if (!desc)
			return -ENOMEM;
		desc->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
				       conn->pages_per_mr);
		if (IS_ERR(desc->mr)) {
			kfree(desc);
			return -ENOMEM;
		}
		list_add_tail(&desc->list, &conn->fr_pool);
	}
	return 0;
}

static void sbi_free_fr_pool(struct sbi_conn *conn)
{
	struct sbi_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &conn->fr_pool, list) {
		list_del(&desc->list);
		ib_dereg_mr(desc->mr);	/* OK: rdma-invalidation-leak -- deregistration kills any key the MR still had */
		kfree(desc);
	}
}

static void sbi_conn_release(struct sbi_conn *conn)
{
	ib_drain_qp(conn->qp);
	sbi_free_fr_pool(conn);
	rdma_destroy_qp(conn->cm_id);
}

struct sbi_transport_ops {
	int (*create_qp)(struct sbi_conn *conn);
	int (*alloc_pool)(struct sbi_conn *conn, unsigned int size);
	void (*release)(struct sbi_conn *conn);
	int (*send_command)(struct sbi_task *task);
	void (*cleanup_task)(struct sbi_task *task);
	void (*rx_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct sbi_transport_ops sbi_rdma_ops = {
	.create_qp	= sbi_create_qp,
	.alloc_pool	= sbi_alloc_fr_pool,
	.release	= sbi_conn_release,
	.send_command	= sbi_send_command,
	.cleanup_task	= sbi_cleanup_task,
	.rx_done	= sbi_rcv_completion,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb iSER style initiator data path");
