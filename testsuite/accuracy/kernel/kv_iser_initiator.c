// SPDX-License-Identifier: GPL-2.0-only
/*
 * kv_iser_initiator.c - iSCSI Extensions for RDMA, initiator task path
 * (iSER style).
 *
 * Each connection owns a pool of fast-registration descriptors allocated
 * at login.  A SCSI command with data takes a descriptor from the pool,
 * registers the task's scatterlist with IB_WR_REG_MR (chained in front of
 * the command SEND, with a LOCAL_INV ahead of it if the descriptor still
 * carries a live key) and places the stag in the iSER header.  The target
 * normally invalidates the stag with SEND_WITH_INV; the response handler
 * checks the invalidated rkey against the task's and otherwise posts a
 * signaled LOCAL_INV, finalizing the task from its completion.
 *
 * Known problems kept in this file:
 *  - a failing integrity-MR allocation frees the descriptor without
 *    deregistering its data MR;
 *  - the task-management response trusts any remote invalidation for the
 *    aborted task;
 *  - cleanup_task on a live connection returns the descriptor and unmaps
 *    the buffer while the target still holds the stag.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-unsignaled-send-starvation -- not the subject of this module; the descriptor pool is manual FRWR management by design
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define ISER_RSV		0x04
#define ISER_WSV		0x08
#define ISER_RX_PAYLOAD		128
#define ISCSI_TMF_RSP_COMPLETE	0x00

enum iser_data_dir {
	ISER_DIR_IN = 0,
	ISER_DIR_OUT = 1,
};

enum iser_conn_state {
	ISER_CONN_INIT,
	ISER_CONN_UP,
	ISER_CONN_TERMINATING,
	ISER_CONN_DOWN,
};

struct iser_ctrl {
	u8	flags;
	u8	rsvd[3];
	__be32	write_stag;
	__be64	write_va;
	__be32	read_stag;
	__be64	read_va;
} __attribute__((packed));

struct iscsi_rsp_hdr {
	u8	opcode;
	u8	flags;
	u8	response;
	u8	status;
	u32	itt;
	u32	ref_itt;
};

struct iser_reg_resources {
	struct ib_mr	*mr;
	struct ib_mr	*sig_mr;
	u8		mr_valid:1;
};

struct iser_fr_desc {
	struct list_head		list;
	struct iser_reg_resources	rsc;
	bool				pi_ctx;
};

struct iser_fr_pool {
	struct list_head	list;
	spinlock_t		lock;
	int			size;
};

struct iser_data_buf {
	struct scatterlist	*sg;
	int			size;
	unsigned long		data_len;
	int			dma_nents;
};

struct iser_mem_reg {
	struct ib_sge		sge;
	u32			rkey;
	struct iser_fr_desc	*desc;
};

struct iser_tx_desc {
	struct iser_ctrl	iser_header;
	u8			iscsi_header[48];
	u64			dma_addr;
	struct ib_sge		tx_sg[2];
	int			num_sge;
	struct ib_cqe		cqe;
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
	struct ib_send_wr	*first_wr;
};

struct iser_conn;

struct iser_rx_desc {
	struct iscsi_rsp_hdr	hdr;
	u8			data[ISER_RX_PAYLOAD];
	u64			dma_addr;
	struct ib_sge		rx_sg;
	struct ib_cqe		cqe;
	struct iser_conn	*conn;
};

struct iscsi_iser_task {
	struct iser_conn	*conn;
	u32			itt;
	bool			has_data;
	enum iser_data_dir	dir;
	struct iser_data_buf	data;
	struct iser_mem_reg	rdma_reg;
	struct iser_tx_desc	desc;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	inv_wr;
	u8			status;
};

struct iser_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct iser_fr_pool	fr_pool;
	struct ib_cqe		reg_cqe;
	struct iscsi_iser_task	**tasks;
	unsigned int		cmds_max;
	bool			pi_support;
	enum iser_conn_state	state;
	struct work_struct	fail_work;
};

static void iser_conn_error(struct iser_conn *conn)
{
	if (conn->state == ISER_CONN_UP) {
		conn->state = ISER_CONN_TERMINATING;
		schedule_work(&conn->fail_work);
	}
}

static void iser_err_comp(struct iser_conn *conn, struct ib_wc *wc,
			  const char *type)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("%s failure: %s (%d) vend_err %#x\n", type,
		       ib_wc_status_msg(wc->status), wc->status,
		       wc->vendor_err);
	iser_conn_error(conn);
}

static struct iscsi_iser_task *iser_itt_to_task(struct iser_conn *conn, u32 itt)
{
	if (unlikely(itt >= conn->cmds_max))
		return NULL;
	return conn->tasks[itt];
}

/* ---------------- descriptor pool ---------------- */

static struct iser_fr_desc *
iser_create_fastreg_desc(struct iser_conn *conn, unsigned int size)
{
	struct iser_fr_desc *desc;
	int ret;

	desc = kzalloc(sizeof(*desc), GFP_KERNEL);
	if (!desc)
		return ERR_PTR(-ENOMEM);

	desc->rsc.mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, size);
	if (IS_ERR(desc->rsc.mr)) {
		ret = PTR_ERR(desc->rsc.mr);
		pr_err("Failed to allocate ib_fast_reg_mr err=%d\n", ret);
		goto err_alloc_mr;	/* OK: rdma-mr-leak -- the allocation failed, there is nothing to deregister */
	}

	if (conn->pi_support) {
		desc->rsc.sig_mr = ib_alloc_mr_integrity(conn->pd, size, size);
		if (IS_ERR(desc->rsc.sig_mr)) {
			ret = PTR_ERR(desc->rsc.sig_mr);
			pr_err("Failed to allocate sig_mr err=%d\n", ret);
			goto err_alloc_mr;
		}
		desc->pi_ctx = true;
	}
	desc->rsc.mr_valid = 0;

	return desc;

err_alloc_mr:
	kfree(desc);	/* BUG: rdma-mr-leak -- on the sig_mr failure desc->rsc.mr is freed along with its holder, never deregistered */
	return ERR_PTR(ret);
}

static void iser_free_fastreg_pool(struct iser_conn *conn)
{
	struct iser_fr_pool *fr_pool = &conn->fr_pool;
	struct iser_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &fr_pool->list, list) {
		list_del(&desc->list);
		ib_dereg_mr(desc->rsc.mr);	/* OK: rdma-invalidation-leak -- deregistration kills whatever key is still out */
		if (desc->pi_ctx)
			ib_dereg_mr(desc->rsc.sig_mr);
		kfree(desc);
		fr_pool->size--;
	}
}

static int iser_alloc_fastreg_pool(struct iser_conn *conn,
				   unsigned int cmds_max, unsigned int size)
{
	struct iser_fr_pool *fr_pool = &conn->fr_pool;
	struct iser_fr_desc *desc;
	unsigned int i;
	int ret;

	INIT_LIST_HEAD(&fr_pool->list);
	spin_lock_init(&fr_pool->lock);
	fr_pool->size = 0;

	for (i = 0; i < cmds_max; i++) {
		desc = iser_create_fastreg_desc(conn, size);
		if (IS_ERR(desc)) {
			ret = PTR_ERR(desc);
			goto err;
		}
		list_add_tail(&desc->list, &fr_pool->list);
		fr_pool->size++;
	}
	return 0;

err:
	iser_free_fastreg_pool(conn);	/* OK: rdma-mr-leak -- every descriptor created so far is on the pool list */
	return ret;
}

static struct iser_fr_desc *iser_reg_desc_get(struct iser_conn *conn)
{
	struct iser_fr_pool *fr_pool = &conn->fr_pool;
	struct iser_fr_desc *desc;
	unsigned long flags;

	spin_lock_irqsave(&fr_pool->lock, flags);
	desc = list_first_entry_or_null(&fr_pool->list, struct iser_fr_desc,
					list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_irqrestore(&fr_pool->lock, flags);

	return desc;
}

static void iser_reg_desc_put(struct iser_conn *conn, struct iser_fr_desc *desc)
{
	struct iser_fr_pool *fr_pool = &conn->fr_pool;
	unsigned long flags;

	spin_lock_irqsave(&fr_pool->lock, flags);
	list_add(&desc->list, &fr_pool->list);
	spin_unlock_irqrestore(&fr_pool->lock, flags);
}

/* ---------------- registration ---------------- */

static void iser_reg_comp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iser_conn *conn = container_of(wc->wr_cqe, struct iser_conn,
					      reg_cqe);

	iser_err_comp(conn, wc, "REG/INV");
}

static void iser_inv_rkey(struct ib_send_wr *inv_wr, struct ib_mr *mr,
			  struct ib_cqe *cqe, struct ib_send_wr *next_wr)
{
	memset(inv_wr, 0, sizeof(*inv_wr));
	inv_wr->opcode = IB_WR_LOCAL_INV;
	inv_wr->wr_cqe = cqe;
	inv_wr->ex.invalidate_rkey = mr->rkey;
	inv_wr->send_flags = 0;
	inv_wr->num_sge = 0;
	inv_wr->next = next_wr;
}

static int iser_fast_reg_mr(struct iscsi_iser_task *task,
			    struct iser_data_buf *mem,
			    struct iser_reg_resources *rsc,
			    struct iser_mem_reg *reg)
{
	struct iser_tx_desc *tx_desc = &task->desc;
	struct ib_cqe *cqe = &task->conn->reg_cqe;
	struct ib_mr *mr = rsc->mr;
	struct ib_reg_wr *wr = &tx_desc->reg_wr;
	int n;

	tx_desc->first_wr = &wr->wr;
	if (rsc->mr_valid) {
		iser_inv_rkey(&tx_desc->inv_wr, mr, cqe, &wr->wr);
		tx_desc->first_wr = &tx_desc->inv_wr;
	}

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));

	n = ib_map_mr_sg(mr, mem->sg, mem->dma_nents, NULL, SZ_4K);
	if (unlikely(n != mem->dma_nents)) {
		pr_err("failed to map sg (%d/%d)\n", n, mem->dma_nents);
		return n < 0 ? n : -EINVAL;
	}

	wr->wr.next = &tx_desc->send_wr;
	wr->wr.opcode = IB_WR_REG_MR;
	wr->wr.wr_cqe = cqe;
	wr->wr.send_flags = 0;
	wr->wr.num_sge = 0;
	wr->mr = mr;	/* OK: rdma-rkey-reuse -- fresh key from ib_inc_rkey() above */
	wr->key = mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE |
		     IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE;

	rsc->mr_valid = 1;

	reg->sge.lkey = mr->lkey;
	reg->rkey = mr->rkey;
	reg->sge.addr = mr->iova;
	reg->sge.length = mr->length;

	return 0;
}

static int iser_dma_map_task_data(struct iscsi_iser_task *task)
{
	struct iser_data_buf *data = &task->data;

	data->dma_nents = ib_dma_map_sg(task->conn->ibdev, data->sg, data->size,
					task->dir == ISER_DIR_IN ?
					DMA_FROM_DEVICE : DMA_TO_DEVICE);
	if (unlikely(data->dma_nents == 0)) {
		pr_err("dma_map_sg failed\n");
		return -EINVAL;
	}
	return 0;
}

static void iser_dma_unmap_task_data(struct iscsi_iser_task *task)
{
	struct iser_data_buf *data = &task->data;

	ib_dma_unmap_sg(task->conn->ibdev, data->sg, data->size,
			task->dir == ISER_DIR_IN ?
			DMA_FROM_DEVICE : DMA_TO_DEVICE);
}

static int iser_reg_rdma_mem(struct iscsi_iser_task *task)
{
	struct iser_conn *conn = task->conn;
	struct iser_mem_reg *mem_reg = &task->rdma_reg;
	struct iser_fr_desc *desc;
	int err;

	desc = iser_reg_desc_get(conn);
	if (!desc)
		return -EAGAIN;
	mem_reg->desc = desc;

	err = iser_fast_reg_mr(task, &task->data, &desc->rsc, mem_reg);
	if (unlikely(err))
		goto err_reg;

	return 0;

err_reg:
	mem_reg->desc = NULL;
	iser_reg_desc_put(conn, desc);	/* OK: rdma-invalidation-leak -- nothing was posted for this task */
	return err;
}

/* Runs once the stag is dead (or was never handed out). */
static void iser_task_finalize(struct iscsi_iser_task *task)
{
	struct iser_mem_reg *reg = &task->rdma_reg;

	if (!task->has_data)
		return;

	if (reg->desc) {
		iser_reg_desc_put(task->conn, reg->desc);
		reg->desc = NULL;
	}
	iser_dma_unmap_task_data(task);
}

static void iser_task_complete(struct iscsi_iser_task *task)
{
	pr_debug("itt %u done, status %u\n", task->itt, task->status);
}

/* ---------------- command submission ---------------- */

static void iser_cmd_comp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iser_tx_desc *tx_desc = container_of(wc->wr_cqe,
						    struct iser_tx_desc, cqe);
	struct iscsi_iser_task *task = container_of(tx_desc,
						    struct iscsi_iser_task,
						    desc);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		iser_err_comp(task->conn, wc, "command");
}

static int iser_send_command(struct iser_conn *conn,
			     struct iscsi_iser_task *task)
{
	struct iser_tx_desc *tx_desc = &task->desc;
	struct iser_ctrl *hdr = &tx_desc->iser_header;
	struct ib_send_wr *first = &tx_desc->send_wr;
	int err;

	memset(hdr, 0, sizeof(*hdr));
	tx_desc->tx_sg[0].addr = tx_desc->dma_addr;
	tx_desc->tx_sg[0].length = sizeof(*hdr) + sizeof(tx_desc->iscsi_header);
	tx_desc->tx_sg[0].lkey = conn->pd->local_dma_lkey;
	tx_desc->num_sge = 1;
	tx_desc->cqe.done = iser_cmd_comp;

	memset(&tx_desc->send_wr, 0, sizeof(tx_desc->send_wr));
	tx_desc->send_wr.wr_cqe = &tx_desc->cqe;
	tx_desc->send_wr.sg_list = tx_desc->tx_sg;
	tx_desc->send_wr.num_sge = tx_desc->num_sge;
	tx_desc->send_wr.opcode = IB_WR_SEND;
	tx_desc->send_wr.send_flags = IB_SEND_SIGNALED;

	if (task->has_data) {
		err = iser_dma_map_task_data(task);
		if (err)
			return err;
		err = iser_reg_rdma_mem(task);
		if (err) {
			iser_dma_unmap_task_data(task);	/* OK: rdma-invalidation-leak -- registration failed before anything was posted */
			return err;
		}
		if (task->dir == ISER_DIR_IN) {
			hdr->flags |= ISER_RSV;
			hdr->read_stag = cpu_to_be32(task->rdma_reg.rkey);
			hdr->read_va = cpu_to_be64(task->rdma_reg.sge.addr);
		} else {
			hdr->flags |= ISER_WSV;
			hdr->write_stag = cpu_to_be32(task->rdma_reg.rkey);
			hdr->write_va = cpu_to_be64(task->rdma_reg.sge.addr);
		}
		first = tx_desc->first_wr;
	}

	err = ib_post_send(conn->qp, first, NULL);
	if (unlikely(err)) {
		pr_err("post_send failed itt %u err %d\n", task->itt, err);
		iser_task_finalize(task);	/* OK: rdma-invalidation-leak -- the post failed: the header carrying the stag never went out */
		return err;
	}
	return 0;
}

/* ---------------- completion of a task ---------------- */

static int iser_check_remote_inv(struct iser_conn *conn,
				 struct iscsi_iser_task *task, u32 rkey)
{
	struct iser_fr_desc *desc = task->rdma_reg.desc;

	if (unlikely(!desc || !desc->rsc.mr_valid || desc->rsc.mr->rkey != rkey)) {
		pr_err("Bogus remote invalidation for rkey %#x\n", rkey);
		iser_conn_error(conn);
		return -EINVAL;
	}
	desc->rsc.mr_valid = 0;
	return 0;
}

static bool iser_task_needs_local_inv(struct iscsi_iser_task *task)
{
	return task->has_data && task->rdma_reg.desc &&
	       task->rdma_reg.desc->rsc.mr_valid;
}

static void iser_task_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iscsi_iser_task *task = container_of(wc->wr_cqe,
						    struct iscsi_iser_task,
						    inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		/* the descriptor stays out of the pool until teardown */
		iser_err_comp(task->conn, wc, "LOCAL_INV");
		return;
	}
	task->rdma_reg.desc->rsc.mr_valid = 0;
	iser_task_finalize(task);	/* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
	iser_task_complete(task);
}

static int iser_post_task_inv(struct iscsi_iser_task *task)
{
	struct iser_fr_desc *desc = task->rdma_reg.desc;

	task->inv_cqe.done = iser_task_inv_done;
	iser_inv_rkey(&task->inv_wr, desc->rsc.mr, &task->inv_cqe, NULL);
	task->inv_wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(task->conn->qp, &task->inv_wr, NULL);
}

static void iser_post_recv(struct iser_conn *conn, struct iser_rx_desc *rx)
{
	struct ib_recv_wr wr = {};

	rx->rx_sg.addr = rx->dma_addr;
	rx->rx_sg.length = sizeof(rx->hdr) + sizeof(rx->data);
	rx->rx_sg.lkey = conn->pd->local_dma_lkey;
	wr.wr_cqe = &rx->cqe;
	wr.sg_list = &rx->rx_sg;
	wr.num_sge = 1;

	if (ib_post_recv(conn->qp, &wr, NULL))
		iser_conn_error(conn);
}

static void iser_task_rsp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iser_rx_desc *rx = container_of(wc->wr_cqe,
					       struct iser_rx_desc, cqe);
	struct iser_conn *conn = rx->conn;
	struct iscsi_iser_task *task;
	int err;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		iser_err_comp(conn, wc, "task_rsp");
		return;
	}

	task = iser_itt_to_task(conn, rx->hdr.itt);
	if (unlikely(!task)) {
		pr_err("response for unknown itt %u\n", rx->hdr.itt);
		goto out_repost;
	}
	task->status = rx->hdr.status;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		err = iser_check_remote_inv(conn, task, wc->ex.invalidate_rkey);	/* OK: rdma-remote-invalidate-unchecked -- the helper matches the key against the task's stag */
		if (err)
			goto out_repost;
	}

	if (iser_task_needs_local_inv(task)) {
		err = iser_post_task_inv(task);	/* OK: rdma-unmap-before-invalidate -- signaled; the task is finalized from iser_task_inv_done() */
		if (err) {
			pr_err("LOCAL_INV post failed itt %u err %d\n",
			       task->itt, err);
			iser_conn_error(conn);
		}
		goto out_repost;
	}

	iser_task_finalize(task);	/* OK: rdma-invalidation-leak -- no stag, or the target invalidated exactly this one */
	iser_task_complete(task);
out_repost:
	iser_post_recv(conn, rx);
}

/*
 * Task management response.  For ABORT TASK the target invalidates the
 * aborted command's stag with SEND_WITH_INV when it had one.
 */
static void iser_tmf_rsp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iser_rx_desc *rx = container_of(wc->wr_cqe,
					       struct iser_rx_desc, cqe);
	struct iser_conn *conn = rx->conn;
	struct iscsi_iser_task *aborted;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		iser_err_comp(conn, wc, "tmf_rsp");
		return;
	}

	aborted = iser_itt_to_task(conn, rx->hdr.ref_itt);
	if (aborted && rx->hdr.response == ISCSI_TMF_RSP_COMPLETE) {
		if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
		    aborted->rdma_reg.desc)
			aborted->rdma_reg.desc->rsc.mr_valid = 0;	/* BUG: rdma-remote-invalidate-unchecked -- any invalidated rkey is taken as the aborted task's stag */

		if (iser_task_needs_local_inv(aborted)) {
			if (iser_post_task_inv(aborted))
				iser_conn_error(conn);
		} else {
			iser_task_finalize(aborted);
			iser_task_complete(aborted);
		}
	}
	iser_post_recv(conn, rx);
}

/*
 * libiscsi cleanup_task: called when a task is aborted or times out, and
 * for every outstanding task when the session fails.
 */
static void iser_cleanup_task(struct iscsi_iser_task *task)
{
	struct iser_conn *conn = task->conn;

	/* a terminating connection releases everything in iser_conn_release() */
	if (conn->state != ISER_CONN_UP)
		return;

	if (task->has_data && task->rdma_reg.desc)
		iser_task_finalize(task);	/* BUG: rdma-invalidation-leak -- the command and its stag reached the target; the descriptor goes back to the pool and the buffer is unmapped with no LOCAL_INV */
}

static void iser_conn_release(struct iser_conn *conn)
{
	unsigned int i;

	ib_drain_qp(conn->qp);

	for (i = 0; i < conn->cmds_max; i++) {
		struct iscsi_iser_task *task = conn->tasks[i];
		struct iser_fr_desc *desc = task->rdma_reg.desc;

		if (!desc)
			continue;
		task->rdma_reg.desc = NULL;
		ib_dereg_mr(desc->rsc.mr);	/* OK: rdma-invalidation-leak -- deregistered before the buffer is unmapped */
		if (desc->pi_ctx)
			ib_dereg_mr(desc->rsc.sig_mr);
		kfree(desc);
		iser_dma_unmap_task_data(task);
	}

	iser_free_fastreg_pool(conn);
	ib_destroy_qp(conn->qp);
	conn->state = ISER_CONN_DOWN;
}

struct iser_transport_ops {
	int (*alloc_pool)(struct iser_conn *conn, unsigned int cmds_max,
			  unsigned int size);
	int (*send_command)(struct iser_conn *conn, struct iscsi_iser_task *t);
	void (*cleanup_task)(struct iscsi_iser_task *task);
	void (*release)(struct iser_conn *conn);
	void (*task_rsp)(struct ib_cq *cq, struct ib_wc *wc);
	void (*tmf_rsp)(struct ib_cq *cq, struct ib_wc *wc);
	void (*reg_comp)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct iser_transport_ops iser_rdma_ops = {
	.alloc_pool	= iser_alloc_fastreg_pool,
	.send_command	= iser_send_command,
	.cleanup_task	= iser_cleanup_task,
	.release	= iser_conn_release,
	.task_rsp	= iser_task_rsp,
	.tmf_rsp	= iser_tmf_rsp,
	.reg_comp	= iser_reg_comp,
};

MODULE_DESCRIPTION("iSER initiator task path");
MODULE_LICENSE("GPL v2");
