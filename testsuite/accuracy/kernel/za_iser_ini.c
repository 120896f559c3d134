// SPDX-License-Identifier: GPL-2.0
/*
 * za_iser_ini.c - iSER-style initiator data path: fast-registration
 * descriptors, command send, response and task teardown.
 *
 * A connection keeps a free list of fast-registration descriptors.  A
 * SCSI task registers its Data-In and/or Data-Out buffer with one
 * descriptor per direction; the REG_MRs are chained in front of the
 * command PDU.  ZI_TASK_DIR_IN / ZI_TASK_DIR_OUT in task->flags say which
 * directions were mapped and registered, and finalization unmaps only
 * those.  The response either carries a remote invalidation, matched
 * against the task's keys by zi_check_remote_inv(), or the task posts
 * its own LOCAL_INVs and completes from their completion.  Descriptors
 * get a new key when they go back to the free list.
 *
 * Correct: descriptor allocation of the data MR, the free-list rotation,
 * the response handler's remote-invalidation check, the LOCAL_INV
 * completion, unwinding a command that never went out.
 * Not correct: a failing integrity MR leaks the data MR; a response whose
 * LOCAL_INV could not be posted still finalizes the task; task cleanup
 * after an abort unmaps right after posting unsignaled LOCAL_INVs; the
 * task-management response trusts whatever key the target invalidated.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>

#define ZI_DIR_IN		0
#define ZI_DIR_OUT		1
#define ZI_DIRS			2

#define ZI_TASK_DIR_IN		(1U << 0)
#define ZI_TASK_DIR_OUT		(1U << 1)

#define ZI_OP_SCSI_RSP		0x21
#define ZI_OP_TMF_RSP		0x22
#define ZI_TMF_FUNC_COMPLETE	0

#define zi_dbg(fmt, ...)	pr_debug("iser: " fmt, ##__VA_ARGS__)
#define zi_err(fmt, ...)	pr_err("iser: " fmt, ##__VA_ARGS__)

struct zi_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	struct ib_mr		*sig_mr;
	bool			mr_valid;
};

struct zi_mem_reg {
	struct zi_fr_desc	*mem_h;
	u64			va;
	u32			len;
	u32			rkey;
};

struct zi_data_buf {
	struct scatterlist	*sg;
	int			size;
	int			dma_nents;
	unsigned int		data_len;
};

struct zi_hdr {
	u8	opcode;
	u8	status;
	u16	rsvd;
	u32	itt;
	u32	rtt;		/* referenced task (TMF) */
	u32	read_stag;
	u64	read_va;
	u32	write_stag;
	u64	write_va;
};

struct zi_conn;

struct zi_task {
	struct zi_conn		*conn;
	u32			itt;
	unsigned int		flags;
	bool			in_use;
	int			status;
	struct zi_data_buf	data[ZI_DIRS];
	struct zi_mem_reg	rdma_reg[ZI_DIRS];
	struct ib_reg_wr	reg_wr[ZI_DIRS];
	struct ib_send_wr	inv_wr[ZI_DIRS];
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct zi_hdr		*hdr;
	struct ib_sge		tx_sge;
	struct ib_send_wr	send_wr;
	struct ib_cqe		send_cqe;
	void			(*done)(struct zi_task *task, int status);
};

struct zi_rx_desc {
	struct zi_conn		*conn;
	struct zi_hdr		hdr;
	struct ib_cqe		cqe;
};

struct zi_conn {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	spinlock_t		pool_lock;
	struct list_head	fr_pool;
	int			fr_pool_size;
	unsigned int		max_pages;
	bool			pi_support;
	struct zi_task		*tasks;
	unsigned int		cmds_max;
	struct work_struct	fail_work;
	struct completion	tmf_done;
};

int zi_post_recv(struct zi_conn *conn, struct zi_rx_desc *rx);

static void zi_conn_failure(struct zi_conn *conn)
{
	schedule_work(&conn->fail_work);
}

static struct zi_fr_desc *zi_create_fr_desc(struct zi_conn *conn)
{
	struct zi_fr_desc *desc;
	int ret;

	desc = kzalloc(sizeof(*desc), GFP_KERNEL);
	if (!desc)
		return ERR_PTR(-ENOMEM);

	desc->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_pages);
	if (IS_ERR(desc->mr)) {
		ret = PTR_ERR(desc->mr);
		zi_err("Failed to allocate ib_fast_reg_mr err=%d\n", ret);
		goto err_free;		/* OK: rdma-mr-leak -- no MR was allocated */
	}

	if (conn->pi_support) {
		desc->sig_mr = ib_alloc_mr_integrity(conn->pd, conn->max_pages,
						     conn->max_pages);
		if (IS_ERR(desc->sig_mr)) {
			ret = PTR_ERR(desc->sig_mr);
			zi_err("Failed to allocate sig_mr err=%d\n", ret);
			goto err_free;	/* BUG: rdma-mr-leak -- desc->mr is freed along with desc, never deregistered */
		}
	}
	desc->mr_valid = false;
	return desc;

err_free:
	kfree(desc);
	return ERR_PTR(ret);
}

static void zi_destroy_fr_desc(struct zi_fr_desc *desc)
{
	if (desc->sig_mr)
		ib_dereg_mr(desc->sig_mr);
	ib_dereg_mr(desc->mr);	/* OK: rdma-invalidation-leak -- deregistration kills the key */
	kfree(desc);
}

void zi_free_fr_pool(struct zi_conn *conn)
{
	struct zi_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &conn->fr_pool, list) {
		list_del(&desc->list);
		zi_destroy_fr_desc(desc);
		conn->fr_pool_size--;
	}
}

int zi_alloc_fr_pool(struct zi_conn *conn, unsigned int cmds_max)
{
	struct zi_fr_desc *desc;
	unsigned int i;
	int ret;

	INIT_LIST_HEAD(&conn->fr_pool);
	conn->fr_pool_size = 0;
	for (i = 0; i < cmds_max * ZI_DIRS; i++) {
		desc = zi_create_fr_desc(conn);
		if (IS_ERR(desc)) {
			ret = PTR_ERR(desc);
			goto err;	/* OK: rdma-mr-leak -- descriptors already on the pool are released by zi_free_fr_pool() */
		}
		list_add_tail(&desc->list, &conn->fr_pool);
		conn->fr_pool_size++;
	}
	return 0;

err:
	zi_free_fr_pool(conn);
	return ret;
}

static struct zi_fr_desc *zi_reg_desc_get(struct zi_conn *conn)
{
	struct zi_fr_desc *desc;

	spin_lock_bh(&conn->pool_lock);
	desc = list_first_entry_or_null(&conn->fr_pool, struct zi_fr_desc,
					list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_bh(&conn->pool_lock);
	return desc;
}

static void zi_reg_desc_put(struct zi_conn *conn, struct zi_fr_desc *desc)
{
	/* the next registration of this descriptor goes out under a new key */
	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));

	spin_lock_bh(&conn->pool_lock);
	list_add(&desc->list, &conn->fr_pool);
	spin_unlock_bh(&conn->pool_lock);
}

static void zi_reg_comp(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zi_task *task = container_of(wc->wr_cqe, struct zi_task, reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zi_err("REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
		zi_conn_failure(task->conn);
	}
}

static int zi_fast_reg_mr(struct zi_task *task, int dir, int access,
			  struct ib_send_wr *next)
{
	struct zi_data_buf *data = &task->data[dir];
	struct zi_mem_reg *reg = &task->rdma_reg[dir];
	struct ib_reg_wr *wr = &task->reg_wr[dir];
	struct zi_fr_desc *desc;
	int n;

	desc = zi_reg_desc_get(task->conn);
	if (!desc)
		return -EAGAIN;

	n = ib_map_mr_sg(desc->mr, data->sg, data->dma_nents, NULL, SZ_4K);
	if (unlikely(n != data->dma_nents)) {
		zi_err("failed to map sg (%d/%d)\n", n, data->dma_nents);
		zi_reg_desc_put(task->conn, desc);
		return n < 0 ? n : -EINVAL;
	}

	task->reg_cqe.done = zi_reg_comp;
	memset(wr, 0, sizeof(*wr));
	wr->wr.next = next;
	wr->wr.opcode = IB_WR_REG_MR;
	wr->wr.wr_cqe = &task->reg_cqe;
	wr->wr.send_flags = 0;
	wr->wr.num_sge = 0;
	wr->mr = desc->mr;	/* OK: rdma-rkey-reuse -- zi_reg_desc_put() gives every recycled descriptor a new key */
	wr->key = desc->mr->rkey;
	wr->access = access;

	desc->mr_valid = true;
	reg->mem_h = desc;
	reg->rkey = desc->mr->rkey;
	reg->va = desc->mr->iova;
	reg->len = desc->mr->length;
	return 0;
}

static void zi_unreg_mem(struct zi_task *task, int dir)
{
	struct zi_mem_reg *reg = &task->rdma_reg[dir];

	if (!reg->mem_h)
		return;
	zi_reg_desc_put(task->conn, reg->mem_h);
	reg->mem_h = NULL;
}

static void zi_task_rdma_finalize(struct zi_task *task)
{
	struct ib_device *dev = task->conn->dev;

	if (task->flags & ZI_TASK_DIR_IN) {
		zi_unreg_mem(task, ZI_DIR_IN);	/* OK: rdma-invalidation-leak -- callers finalize once the keys are dead or were never posted */
		ib_dma_unmap_sg(dev, task->data[ZI_DIR_IN].sg,
				task->data[ZI_DIR_IN].size, DMA_FROM_DEVICE);
	}
	if (task->flags & ZI_TASK_DIR_OUT) {
		zi_unreg_mem(task, ZI_DIR_OUT);
		ib_dma_unmap_sg(dev, task->data[ZI_DIR_OUT].sg,
				task->data[ZI_DIR_OUT].size, DMA_TO_DEVICE);
	}
	task->flags &= ~(ZI_TASK_DIR_IN | ZI_TASK_DIR_OUT);
}

static void zi_task_complete(struct zi_task *task, int status)
{
	zi_task_rdma_finalize(task);
	task->in_use = false;
	task->done(task, status);
}

static int zi_map_dir(struct zi_task *task, int dir,
		      enum dma_data_direction dma_dir, int access,
		      struct ib_send_wr *next)
{
	struct zi_data_buf *data = &task->data[dir];
	int ret;

	data->dma_nents = ib_dma_map_sg(task->conn->dev, data->sg, data->size,
					dma_dir);
	if (unlikely(data->dma_nents == 0))
		return -EINVAL;
	task->flags |= (dir == ZI_DIR_IN) ? ZI_TASK_DIR_IN : ZI_TASK_DIR_OUT;

	ret = zi_fast_reg_mr(task, dir, access, next);
	if (ret)
		return ret;
	return 0;
}

int zi_send_command(struct zi_task *task)
{
	struct zi_conn *conn = task->conn;
	struct ib_send_wr *first = &task->send_wr;
	int err;

	task->tx_sge.addr = (uintptr_t)task->hdr;
	task->tx_sge.length = sizeof(struct zi_hdr);
	task->tx_sge.lkey = conn->pd->local_dma_lkey;
	task->send_wr.next = NULL;
	task->send_wr.wr_cqe = &task->send_cqe;
	task->send_wr.sg_list = &task->tx_sge;
	task->send_wr.num_sge = 1;
	task->send_wr.opcode = IB_WR_SEND;
	task->send_wr.send_flags = IB_SEND_SIGNALED;

	if (task->data[ZI_DIR_IN].data_len) {
		err = zi_map_dir(task, ZI_DIR_IN, DMA_FROM_DEVICE,
				 IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE,
				 first);
		if (err)
			goto send_err;
		first = &task->reg_wr[ZI_DIR_IN].wr;
		task->hdr->read_stag = task->rdma_reg[ZI_DIR_IN].rkey;
		task->hdr->read_va = task->rdma_reg[ZI_DIR_IN].va;
	}
	if (task->data[ZI_DIR_OUT].data_len) {
		err = zi_map_dir(task, ZI_DIR_OUT, DMA_TO_DEVICE,
				 IB_ACCESS_REMOTE_READ, first);
		if (err)
			goto send_err;
		first = &task->reg_wr[ZI_DIR_OUT].wr;
		task->hdr->write_stag = task->rdma_reg[ZI_DIR_OUT].rkey;
		task->hdr->write_va = task->rdma_reg[ZI_DIR_OUT].va;
	}

	task->in_use = true;
	err = ib_post_send(conn->qp, first, NULL);
	if (!err)
		return 0;
	task->in_use = false;

send_err:
	zi_err("conn %p failed task->itt %u err %d\n", conn, task->itt, err);
	zi_task_rdma_finalize(task);	/* OK: rdma-invalidation-leak -- none of the REG_MRs was posted */
	return err;
}

/* Post LOCAL_INV for every key of @task still valid, optionally signaling the last. */
static int zi_post_task_inv(struct zi_task *task, struct ib_cqe *cqe,
			    bool signal)
{
	struct ib_send_wr *first = NULL, *last = NULL;
	int dir, n = 0;

	for (dir = ZI_DIR_IN; dir < ZI_DIRS; dir++) {
		struct zi_fr_desc *desc = task->rdma_reg[dir].mem_h;
		struct ib_send_wr *wr = &task->inv_wr[dir];

		if (!desc || !desc->mr_valid)
			continue;
		memset(wr, 0, sizeof(*wr));
		wr->opcode = IB_WR_LOCAL_INV;
		wr->ex.invalidate_rkey = desc->mr->rkey;
		wr->wr_cqe = cqe;
		if (last)
			last->next = wr;
		else
			first = wr;
		last = wr;
		n++;
	}
	if (!n)
		return 0;
	if (signal)
		last->send_flags = IB_SEND_SIGNALED;
	return ib_post_send(task->conn->qp, first, NULL) ? -EIO : n;
}

static int zi_check_remote_inv(struct zi_task *task, u32 rkey)
{
	int dir;

	for (dir = ZI_DIR_IN; dir < ZI_DIRS; dir++) {
		struct zi_fr_desc *desc = task->rdma_reg[dir].mem_h;

		if (desc && desc->mr_valid && desc->mr->rkey == rkey) {
			desc->mr_valid = false;
			return 0;
		}
	}
	zi_err("bogus remote invalidation of rkey %#x for itt %u\n", rkey,
	       task->itt);
	return -EINVAL;
}

static void zi_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zi_task *task = container_of(wc->wr_cqe, struct zi_task, inv_cqe);
	int dir;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		zi_err("LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		/* descriptors are destroyed with the connection */
		zi_conn_failure(task->conn);
		return;
	}
	for (dir = ZI_DIR_IN; dir < ZI_DIRS; dir++)
		if (task->rdma_reg[dir].mem_h)
			task->rdma_reg[dir].mem_h->mr_valid = false;

	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the signaled LOCAL_INV, last of the chain, completed */
	zi_task_complete(task, task->status);
}

static struct zi_task *zi_itt_to_task(struct zi_conn *conn, u32 itt)
{
	if (itt >= conn->cmds_max || !conn->tasks[itt].in_use)
		return NULL;
	return &conn->tasks[itt];
}

static void zi_task_rsp(struct zi_conn *conn, struct zi_rx_desc *rx,
			struct ib_wc *wc)
{
	struct zi_task *task;
	int n;

	task = zi_itt_to_task(conn, rx->hdr.itt);
	if (!task) {
		zi_err("response for unknown itt %u\n", rx->hdr.itt);
		zi_conn_failure(conn);
		return;
	}
	task->status = rx->hdr.status;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {	/* OK: rdma-remote-invalidate-unchecked -- zi_check_remote_inv() matches the key against the task's descriptors */
		if (zi_check_remote_inv(task, wc->ex.invalidate_rkey))
			zi_conn_failure(conn);
	}

	task->inv_cqe.done = zi_inv_done;
	n = zi_post_task_inv(task, &task->inv_cqe, true);
	if (n < 0) {
		zi_err("failed to post LOCAL_INV for itt %u\n", task->itt);
		zi_conn_failure(conn);
		zi_task_complete(task, -EIO);	/* BUG: rdma-invalidation-leak -- the LOCAL_INV never went out, yet the descriptors go back and the buffers are unmapped */
		return;
	}
	if (n > 0)
		return;		/* OK: rdma-unmap-before-invalidate -- zi_inv_done() completes the task */

	zi_task_complete(task, task->status);	/* OK: rdma-invalidation-leak -- every key of the task was invalidated by the target */
}

static void zi_tmf_rsp(struct zi_conn *conn, struct zi_rx_desc *rx,
		       struct ib_wc *wc)
{
	struct zi_task *task = zi_itt_to_task(conn, rx->hdr.rtt);

	if (task && rx->hdr.status == ZI_TMF_FUNC_COMPLETE &&
	    (wc->wc_flags & IB_WC_WITH_INVALIDATE)) {	/* BUG: rdma-remote-invalidate-unchecked -- whichever key the target invalidated, the aborted task's Data-In key is taken as dead */
		/* the target fenced the aborted task's buffer with this response */
		if (task->rdma_reg[ZI_DIR_IN].mem_h)
			task->rdma_reg[ZI_DIR_IN].mem_h->mr_valid = false;
	}
	complete(&conn->tmf_done);
}

void zi_rcv_completion(struct ib_cq *cq, struct ib_wc *wc)
{
	struct zi_rx_desc *rx = container_of(wc->wr_cqe, struct zi_rx_desc, cqe);
	struct zi_conn *conn = rx->conn;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			zi_err("RECV failed: %s\n", ib_wc_status_msg(wc->status));
		zi_conn_failure(conn);
		return;
	}

	switch (rx->hdr.opcode) {
	case ZI_OP_SCSI_RSP:
		zi_task_rsp(conn, rx, wc);
		break;
	case ZI_OP_TMF_RSP:
		zi_tmf_rsp(conn, rx, wc);
		break;
	default:
		zi_dbg("unhandled opcode %#x\n", rx->hdr.opcode);
		break;
	}
	zi_post_recv(conn, rx);
}

/*
 * Called by the iSCSI layer when an aborted task is cleaned up while the
 * connection stays up.
 */
void zi_cleanup_task(struct zi_task *task)
{
	if (!task->in_use)
		return;

	/* the target may still hold the keys of an aborted task */
	task->reg_cqe.done = zi_reg_comp;
	zi_post_task_inv(task, &task->reg_cqe, false);
	zi_task_rdma_finalize(task);	/* BUG: rdma-unmap-before-invalidate -- unsignaled LOCAL_INVs still queued when the descriptors go back and the SG is unmapped */
	task->in_use = false;
}

MODULE_DESCRIPTION("iSER-style initiator data path");
MODULE_LICENSE("GPL");
