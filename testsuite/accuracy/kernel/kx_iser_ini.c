// SPDX-License-Identifier: GPL-2.0
/*
 * kx_iser_ini.c - iSER-style initiator: fast registration descriptor pool.
 *
 * A connection owns a pool of fast-registration descriptors kept on a
 * list_head free list.  Each descriptor carries a data MR and, when T10-PI
 * is enabled, a protection MR.  A SCSI task takes one descriptor per data
 * direction, chains the REG_MR work requests in front of the iSER header
 * SEND and advertises the stags in the header.  When the response comes in
 * the target may have invalidated one stag with SEND_WITH_INV; every stag
 * still valid is invalidated with a LOCAL_INV chain whose last request is
 * signaled, and the descriptors go back to the pool from that completion.
 *
 * Correct here: the data MR registration, the remote invalidation check,
 * the response completion path and its LOCAL_INV completion, the
 * registration error path and the failed-post path.
 * Wrong here: descriptor allocation with PI (leaks the data MR), the
 * protection MR registration (reuses the previous stag), the SCSI abort path
 * (descriptors back on the free list with their stags live) and the logout
 * drain (recycles descriptors right behind unsignaled LOCAL_INVs).
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define isx_err(fmt, ...) pr_err("isx: %s: " fmt, __func__, ##__VA_ARGS__)

#define ISX_RSV		0x04
#define ISX_WSV		0x08

enum isx_data_dir {
	ISX_DIR_IN = 0,		/* to initiator */
	ISX_DIR_OUT,		/* from initiator */
	ISX_DIRS,
};

struct isx_hdr {
	u8	flags;
	u8	rsvd[3];
	__be32	write_stag;
	__be64	write_va;
	__be32	read_stag;
	__be64	read_va;
	u32	itt;
};

struct isx_reg_resources {
	struct ib_mr	*mr;
	struct ib_mr	*prot_mr;
	u8		mr_valid:1;
	u8		prot_valid:1;
};

struct isx_fr_desc {
	struct list_head		list;
	struct list_head		all_list;
	struct isx_reg_resources	rsc;
	bool				pi_enabled;
};

struct isx_fr_pool {
	struct list_head	list;
	struct list_head	all_list;
	spinlock_t		lock;
	int			size;
};

struct isx_data_buf {
	struct scatterlist	*sg;
	int			size;
	int			dma_nents;
};

struct isx_mem_reg {
	u64			sge_addr;
	u32			sge_len;
	u32			rkey;
	struct isx_fr_desc	*desc;
};

struct isx_conn {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct isx_fr_pool	fr_pool;
	struct isx_task		**tasks;
	int			max_tasks;
	bool			pi_support;
	struct work_struct	err_work;
};

struct isx_task {
	struct isx_conn		*conn;
	struct isx_hdr		*hdr;
	struct ib_sge		tx_sge;
	struct ib_cqe		tx_cqe;
	struct ib_send_wr	send_wr;
	struct ib_reg_wr	reg_wr[4];
	int			nr_reg;
	struct ib_cqe		reg_cqe;
	struct ib_send_wr	inv_wr[4];
	struct ib_cqe		inv_cqe;
	bool			dir[ISX_DIRS];
	struct isx_data_buf	data[ISX_DIRS];
	struct isx_data_buf	prot[ISX_DIRS];
	struct isx_mem_reg	rdma_reg[ISX_DIRS];
	struct isx_mem_reg	prot_reg[ISX_DIRS];
};

struct isx_rx_desc {
	struct isx_hdr		hdr;
	struct isx_conn		*conn;
	struct ib_cqe		cqe;
};

void isx_scsi_done(struct isx_task *task, int status);

static void isx_conn_error(struct isx_conn *conn)
{
	schedule_work(&conn->err_work);
}

static struct isx_fr_desc *isx_create_fastreg_desc(struct isx_conn *conn,
						   u32 size, bool pi)
{
	struct isx_fr_desc *desc;
	int ret;

	desc = kzalloc(sizeof(*desc), GFP_KERNEL);
	if (!desc)
		return ERR_PTR(-ENOMEM);

	desc->rsc.mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, size);
	if (IS_ERR(desc->rsc.mr)) {
		ret = PTR_ERR(desc->rsc.mr);
		goto err_free_desc; /* OK: rdma-mr-leak -- allocation failed, nothing to release */
	}

	if (pi) {
		desc->rsc.prot_mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG,
						size);
		if (IS_ERR(desc->rsc.prot_mr)) {
			ret = PTR_ERR(desc->rsc.prot_mr);
			goto err_free_desc; /* BUG: rdma-mr-leak -- desc->rsc.mr is freed with the descriptor, never deregistered */
		}
		desc->pi_enabled = true;
	}
	return desc;

err_free_desc:
	kfree(desc);
	return ERR_PTR(ret);
}

static void isx_free_fastreg_pool(struct isx_conn *conn)
{
	struct isx_fr_pool *fr_pool = &conn->fr_pool;
	struct isx_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &fr_pool->all_list, all_list) {
		list_del(&desc->all_list);
		ib_dereg_mr(desc->rsc.mr);
		if (desc->pi_enabled)
			ib_dereg_mr(desc->rsc.prot_mr);
		kfree(desc); /* OK: rdma-mr-leak -- both MRs deregistered above */
		fr_pool->size--;
	}
}

static int isx_alloc_fastreg_pool(struct isx_conn *conn, int cmds_max,
				  u32 size)
{
	struct isx_fr_pool *fr_pool = &conn->fr_pool;
	struct isx_fr_desc *desc;
	int i, ret;

	INIT_LIST_HEAD(&fr_pool->list);
	INIT_LIST_HEAD(&fr_pool->all_list);
	spin_lock_init(&fr_pool->lock);
	fr_pool->size = 0;
	for (i = 0; i < cmds_max; i++) {
		desc = isx_create_fastreg_desc(conn, size, conn->pi_support);
		if (IS_ERR(desc)) {
			ret = PTR_ERR(desc);
			goto err;
		}
		list_add_tail(&desc->list, &fr_pool->list);
		list_add_tail(&desc->all_list, &fr_pool->all_list);
		fr_pool->size++;
	}
	return 0;

err:
	isx_free_fastreg_pool(conn);
	return ret;
}

static struct isx_fr_desc *isx_reg_desc_get(struct isx_conn *conn)
{
	struct isx_fr_pool *fr_pool = &conn->fr_pool;
	struct isx_fr_desc *desc;
	unsigned long flags;

	spin_lock_irqsave(&fr_pool->lock, flags);
	desc = list_first_entry_or_null(&fr_pool->list, struct isx_fr_desc,
					list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_irqrestore(&fr_pool->lock, flags);
	return desc;
}

static void isx_reg_desc_put(struct isx_conn *conn, struct isx_fr_desc *desc)
{
	struct isx_fr_pool *fr_pool = &conn->fr_pool;
	unsigned long flags;

	spin_lock_irqsave(&fr_pool->lock, flags);
	list_add(&desc->list, &fr_pool->list);
	spin_unlock_irqrestore(&fr_pool->lock, flags);
}

static void isx_reg_comp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_task *task = container_of(wc->wr_cqe, struct isx_task,
					     reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		isx_conn_error(task->conn);
}

static struct ib_reg_wr *isx_next_reg_wr(struct isx_task *task)
{
	struct ib_reg_wr *wr = &task->reg_wr[task->nr_reg++];

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR;
	wr->wr.wr_cqe = &task->reg_cqe;
	wr->wr.send_flags = 0;
	return wr;
}

static int isx_fast_reg_mr(struct isx_task *task, struct isx_data_buf *mem,
			   struct isx_reg_resources *rsc,
			   struct isx_mem_reg *reg)
{
	struct ib_mr *mr = rsc->mr;
	struct ib_reg_wr *wr;
	int n;

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));

	n = ib_map_mr_sg(mr, mem->sg, mem->dma_nents, NULL, SZ_4K);
	if (unlikely(n != mem->dma_nents)) {
		isx_err("failed to map sg (%d/%d)\n", n, mem->dma_nents);
		return n < 0 ? n : -EINVAL;
	}

	wr = isx_next_reg_wr(task);
	wr->mr = mr; /* OK: rdma-rkey-reuse -- key rotated before the mapping */
	wr->key = mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE |
		     IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE;
	rsc->mr_valid = 1;

	reg->sge_addr = mr->iova;
	reg->sge_len = mr->length;
	reg->rkey = mr->rkey;
	return 0;
}

static int isx_reg_prot_mr(struct isx_task *task, struct isx_data_buf *mem,
			   struct isx_reg_resources *rsc,
			   struct isx_mem_reg *reg)
{
	struct ib_mr *mr = rsc->prot_mr;
	struct ib_reg_wr *wr;
	int n;

	/*
	 * A protection MR whose previous key is still live (the task before
	 * us was torn down without its LOCAL_INV) must not hand that key out
	 * again.
	 */
	if (rsc->prot_valid)
		ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));

	n = ib_map_mr_sg(mr, mem->sg, mem->dma_nents, NULL, SZ_4K);
	if (unlikely(n != mem->dma_nents))
		return n < 0 ? n : -EINVAL;

	wr = isx_next_reg_wr(task);
	wr->mr = mr; /* BUG: rdma-rkey-reuse -- key only rotated when it was still valid; a stag already invalidated is handed out again */
	wr->key = mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE;
	rsc->prot_valid = 1;

	reg->sge_addr = mr->iova;
	reg->sge_len = mr->length;
	reg->rkey = mr->rkey;
	return 0;
}

static int isx_reg_rdma_mem(struct isx_task *task, enum isx_data_dir dir)
{
	struct isx_conn *conn = task->conn;
	struct isx_fr_desc *desc;
	int err;

	desc = isx_reg_desc_get(conn);
	if (!desc)
		return -EAGAIN;

	err = isx_fast_reg_mr(task, &task->data[dir], &desc->rsc,
			      &task->rdma_reg[dir]);
	if (err)
		goto err_reg;

	if (desc->pi_enabled && task->prot[dir].dma_nents) {
		err = isx_reg_prot_mr(task, &task->prot[dir], &desc->rsc,
				      &task->prot_reg[dir]);
		if (err)
			goto err_reg;
	}
	task->rdma_reg[dir].desc = desc;
	return 0;

err_reg:
	desc->rsc.mr_valid = 0;
	isx_reg_desc_put(conn, desc); /* OK: rdma-invalidation-leak -- the REG_MR work requests were built, not posted */
	return err;
}

static void isx_task_release(struct isx_task *task)
{
	struct isx_conn *conn = task->conn;
	int dir;

	for (dir = 0; dir < ISX_DIRS; dir++) {
		struct isx_fr_desc *desc = task->rdma_reg[dir].desc;

		if (!task->dir[dir])
			continue;
		ib_dma_unmap_sg(conn->ibdev, task->data[dir].sg,
				task->data[dir].size,
				dir == ISX_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
		if (desc) {
			task->rdma_reg[dir].desc = NULL;
			isx_reg_desc_put(conn, desc);
		}
		task->dir[dir] = false;
	}
}

static int isx_send_command(struct isx_task *task)
{
	struct isx_conn *conn = task->conn;
	struct ib_send_wr *first = &task->send_wr;
	int i, dir, err;

	task->nr_reg = 0;
	for (dir = 0; dir < ISX_DIRS; dir++) {
		if (!task->dir[dir])
			continue;
		err = isx_reg_rdma_mem(task, dir);
		if (err)
			goto err_release;
	}

	task->hdr->flags = 0;
	if (task->dir[ISX_DIR_IN]) {
		task->hdr->flags |= ISX_RSV;
		task->hdr->read_stag = cpu_to_be32(task->rdma_reg[ISX_DIR_IN].rkey);
		task->hdr->read_va = cpu_to_be64(task->rdma_reg[ISX_DIR_IN].sge_addr);
	}
	if (task->dir[ISX_DIR_OUT]) {
		task->hdr->flags |= ISX_WSV;
		task->hdr->write_stag = cpu_to_be32(task->rdma_reg[ISX_DIR_OUT].rkey);
		task->hdr->write_va = cpu_to_be64(task->rdma_reg[ISX_DIR_OUT].sge_addr);
	}

	task->send_wr.next = NULL;
	task->send_wr.wr_cqe = &task->tx_cqe;
	task->send_wr.sg_list = &task->tx_sge;
	task->send_wr.num_sge = 1;
	task->send_wr.opcode = IB_WR_SEND;
	task->send_wr.send_flags = IB_SEND_SIGNALED;
	for (i = task->nr_reg - 1; i >= 0; i--) {
		task->reg_wr[i].wr.next = first;
		first = &task->reg_wr[i].wr;
	}

	err = ib_post_send(conn->qp, first, NULL);
	if (unlikely(err)) {
		isx_err("post failed %d\n", err);
		goto err_release;
	}
	return 0;

err_release:
	isx_task_release(task); /* OK: rdma-invalidation-leak -- failed registration or failed post: no REG_MR reached the wire */
	return err;
}

static int isx_check_remote_inv(struct isx_conn *conn, struct ib_wc *wc,
				struct isx_hdr *hdr)
{
	struct isx_task *task;
	u32 rkey;
	int dir;

	/* OK: rdma-remote-invalidate-unchecked -- the stag is matched against the task's descriptors */
	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE))
		return 0;

	rkey = wc->ex.invalidate_rkey;
	if (hdr->itt >= conn->max_tasks)
		return -EINVAL;
	task = conn->tasks[hdr->itt];

	for (dir = 0; dir < ISX_DIRS; dir++) {
		struct isx_fr_desc *desc = task->rdma_reg[dir].desc;

		if (desc && desc->rsc.mr->rkey == rkey) {
			desc->rsc.mr_valid = 0;
			return 0;
		}
	}
	isx_err("target invalidated unknown stag %#x\n", rkey);
	return -EINVAL;
}

static void isx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_task *task = container_of(wc->wr_cqe, struct isx_task,
					     inv_cqe);
	int dir;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		isx_err("LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		isx_conn_error(task->conn);
		return;
	}
	for (dir = 0; dir < ISX_DIRS; dir++) {
		if (task->rdma_reg[dir].desc) {
			task->rdma_reg[dir].desc->rsc.mr_valid = 0;
			task->rdma_reg[dir].desc->rsc.prot_valid = 0;
		}
	}
	isx_task_release(task); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the signaled LOCAL_INV chain completed */
	isx_scsi_done(task, 0);
}

static void isx_task_complete(struct isx_task *task)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	int dir, n = 0;

	for (dir = 0; dir < ISX_DIRS; dir++) {
		struct isx_fr_desc *desc = task->rdma_reg[dir].desc;

		if (!desc)
			continue;
		if (desc->rsc.mr_valid) {
			last = &task->inv_wr[n++];
			memset(last, 0, sizeof(*last));
			last->opcode = IB_WR_LOCAL_INV;
			last->wr_cqe = &task->reg_cqe;
			last->ex.invalidate_rkey = desc->rsc.mr->rkey;
			*prev = last;
			prev = &last->next;
		}
		if (desc->rsc.prot_valid) {
			last = &task->inv_wr[n++];
			memset(last, 0, sizeof(*last));
			last->opcode = IB_WR_LOCAL_INV;
			last->wr_cqe = &task->reg_cqe;
			last->ex.invalidate_rkey = desc->rsc.prot_mr->rkey;
			*prev = last;
			prev = &last->next;
		}
	}

	if (!last) {
		isx_task_release(task); /* OK: rdma-invalidation-leak -- no stag of this task is still valid (none registered, or invalidated by the target and checked) */
		isx_scsi_done(task, 0);
		return;
	}

	task->inv_cqe.done = isx_inv_done;
	last->wr_cqe = &task->inv_cqe;
	last->send_flags = IB_SEND_SIGNALED;
	/* OK: rdma-unmap-before-invalidate -- descriptors go back from isx_inv_done() */
	if (ib_post_send(task->conn->qp, first, NULL))
		isx_conn_error(task->conn);
}

static void isx_task_rsp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct isx_rx_desc *rx = container_of(wc->wr_cqe, struct isx_rx_desc,
					      cqe);
	struct isx_conn *conn = rx->conn;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		isx_conn_error(conn);
		return;
	}
	if (isx_check_remote_inv(conn, wc, &rx->hdr)) {
		isx_conn_error(conn);
		return;
	}
	isx_task_complete(conn->tasks[rx->hdr.itt]);
}

/* SCSI EH: the target never answered, fail the command back. */
int isx_task_abort(struct isx_task *task)
{
	isx_err("aborting itt %u\n", task->hdr->itt);
	isx_task_release(task); /* BUG: rdma-invalidation-leak -- descriptors go back to the free list while the target still holds their stags */
	isx_scsi_done(task, -ETIMEDOUT);
	return 0;
}

static void isx_inv_nowait(struct isx_conn *conn, struct ib_mr *mr,
			   struct ib_cqe *cqe)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.wr_cqe		    = cqe,
		.ex.invalidate_rkey = mr->rkey,
	};

	if (ib_post_send(conn->qp, &wr, NULL))
		isx_err("LOCAL_INV of %#x not posted\n", mr->rkey);
}

/* Logout: fail whatever is still outstanding. */
void isx_drain_tasks(struct isx_conn *conn)
{
	int i, dir;

	for (i = 0; i < conn->max_tasks; i++) {
		struct isx_task *task = conn->tasks[i];

		if (!task)
			continue;
		for (dir = 0; dir < ISX_DIRS; dir++) {
			struct isx_fr_desc *desc = task->rdma_reg[dir].desc;

			if (!desc)
				continue;
			if (desc->rsc.mr_valid) {
				isx_inv_nowait(conn, desc->rsc.mr, &task->reg_cqe);
				desc->rsc.mr_valid = 0;
			}
			if (desc->rsc.prot_valid) {
				isx_inv_nowait(conn, desc->rsc.prot_mr,
					       &task->reg_cqe);
				desc->rsc.prot_valid = 0;
			}
		}
		isx_task_release(task); /* BUG: rdma-unmap-before-invalidate -- unsignaled LOCAL_INVs just posted, buffers unmapped and descriptors recycled without waiting */
		isx_scsi_done(task, -ECONNRESET);
	}
}

int isx_conn_setup(struct isx_conn *conn, int cmds_max, u32 pages)
{
	int ret;

	ret = isx_alloc_fastreg_pool(conn, cmds_max, pages);
	if (ret)
		isx_err("fastreg pool of %d failed: %d\n", cmds_max, ret);
	return ret;
}

void isx_conn_teardown(struct isx_conn *conn)
{
	ib_drain_qp(conn->qp);
	isx_free_fastreg_pool(conn);
}

const struct {
	void (*send_comp)(struct ib_cq *cq, struct ib_wc *wc);
	void (*recv_comp)(struct ib_cq *cq, struct ib_wc *wc);
	int (*send_cmd)(struct isx_task *task);
} isx_ops = {
	.send_comp	= isx_reg_comp,
	.recv_comp	= isx_task_rsp,
	.send_cmd	= isx_send_command,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("iSER-style initiator fast registration");
