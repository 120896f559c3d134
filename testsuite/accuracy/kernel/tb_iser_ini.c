// SPDX-License-Identifier: GPL-2.0-only
/*
 * tb_iser_ini.c - iSCSI Extensions for RDMA: initiator memory registration,
 * task finalization and connection resources (iser style).
 *
 * Each connection keeps a free list of fast-registration descriptors. A
 * task with data takes one, maps its scatterlist and chains a REG_MR in
 * front of the command SEND; the stag travels in the iSER header. The
 * target may invalidate it with SEND_WITH_INV; otherwise a signaled
 * LOCAL_INV is posted and its completion unmaps the data and returns the
 * descriptor.
 *
 * Known problems: two WRs per command are reserved (the LOCAL_INV is
 * forgotten); a failed signature MR allocation frees the descriptor with
 * its data MR; any remote invalidation is taken as the task's; a failed
 * LOCAL_INV post releases the memory anyway; connection cleanup unmaps
 * right after an unsignaled LOCAL_INV.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define iser_err(fmt, ...)  pr_err("iser: %s: " fmt, __func__, ##__VA_ARGS__)
#define iser_warn(fmt, ...) pr_warn("iser: %s: " fmt, __func__, ##__VA_ARGS__)

#define ISER_MAX_TX_MISC_PDUS	6	/* NOOP_OUT(2), TEXT(1), TMF(2), LOGOUT(1) */
#define ISER_MAX_RX_MISC_PDUS	4	/* NOOP_IN(2), ASYNC_EVENT(2) */
#define ISER_WRS_PER_CMD	2	/* REG_MR + command SEND */
#define ISER_RSV		0x04
#define ISER_WSV		0x08
#define ISCSI_OP_SCSI_CMD_RSP	0x21

enum iser_data_dir {
	ISER_DIR_IN = 0,
	ISER_DIR_OUT,
	ISER_DIRS_NUM
};

struct iser_hdr {
	u8	flags;
	u8	rsvd[3];
	__be32	write_stag;
	__be64	write_va;
	__be32	read_stag;
	__be64	read_va;
} __attribute__((packed));

struct iscsi_iser_task;

struct iser_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	struct ib_mr		*sig_mr;
	bool			mr_valid;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct iscsi_iser_task	*task;
	enum iser_data_dir	dir;
};

struct iser_data_buf {
	struct scatterlist	*sg;
	int			size;
	int			dma_nents;
};

struct iser_mem_reg {
	struct ib_sge		sge;
	u32			rkey;
	struct iser_fr_desc	*desc;
};

struct iser_tx_desc {
	struct iser_hdr		iser_header;
	u8			iscsi_header[48];
	u64			dma_addr;
	struct ib_sge		tx_sg[2];
	int			num_sge;
	struct ib_cqe		cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	send_wr;
};

struct iser_device {
	struct ib_device	*ib_device;
	struct ib_pd		*pd;
};

struct ib_conn {
	struct rdma_cm_id	*cma_id;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			cq_size;
	struct iser_device	*device;
	spinlock_t		lock;
	struct list_head	fr_list;
	int			fr_size;
	bool			pi_support;
};

struct iser_conn {
	struct ib_conn		ib_conn;
	u32			max_cmds;
	bool			failed;
};

struct iscsi_iser_task {
	struct iser_tx_desc	desc;
	struct iser_conn	*iser_conn;
	u32			itt;
	int			dir[ISER_DIRS_NUM];
	struct iser_data_buf	data[ISER_DIRS_NUM];
	struct iser_mem_reg	rdma_reg[ISER_DIRS_NUM];
};

/* libiscsi glue */
struct iscsi_iser_task *iser_itt_to_task(struct iser_conn *conn, u32 itt);
void iser_task_done(struct iscsi_iser_task *task, int status);

static struct iser_fr_desc *
iser_create_fastreg_desc(struct ib_conn *ib_conn, unsigned int size)
{
	struct iser_device *device = ib_conn->device;
	struct iser_fr_desc *desc;
	int ret;

	desc = kzalloc(sizeof(*desc), GFP_KERNEL);
	if (!desc)
		return ERR_PTR(-ENOMEM);

	desc->mr = ib_alloc_mr(device->pd, IB_MR_TYPE_MEM_REG, size);
	if (IS_ERR(desc->mr)) {
		ret = PTR_ERR(desc->mr);
		iser_err("failed to allocate data MR err=%d\n", ret);
		goto err_free; /* OK: rdma-mr-leak -- the allocation failed, there is nothing to deregister */
	}

	if (ib_conn->pi_support) {
		desc->sig_mr = ib_alloc_mr_integrity(device->pd, size, size);
		if (IS_ERR(desc->sig_mr)) {
			ret = PTR_ERR(desc->sig_mr);
			iser_err("failed to allocate signature MR err=%d\n", ret);
			goto err_free; /* BUG: rdma-mr-leak -- desc->mr from ib_alloc_mr() is freed with desc, never deregistered */
		}
	}
	desc->mr_valid = false;
	return desc;

err_free:
	kfree(desc);
	return ERR_PTR(ret);
}

static void iser_free_fastreg_pool(struct ib_conn *ib_conn)
{
	struct iser_fr_desc *desc, *tmp;

	list_for_each_entry_safe(desc, tmp, &ib_conn->fr_list, list) {
		list_del(&desc->list);
		/* OK: rdma-invalidation-leak -- deregistration kills the key */
		ib_dereg_mr(desc->mr);
		if (desc->sig_mr)
			ib_dereg_mr(desc->sig_mr);
		kfree(desc);
	}
	ib_conn->fr_size = 0;
}

static int iser_alloc_fastreg_pool(struct ib_conn *ib_conn,
				   unsigned int cmds_max, unsigned int size)
{
	struct iser_fr_desc *desc;
	unsigned int i;
	int ret;

	INIT_LIST_HEAD(&ib_conn->fr_list);
	ib_conn->fr_size = 0;
	for (i = 0; i < cmds_max; i++) {
		desc = iser_create_fastreg_desc(ib_conn, size);
		if (IS_ERR(desc)) {
			ret = PTR_ERR(desc);
			goto err;
		}
		list_add_tail(&desc->list, &ib_conn->fr_list);
		ib_conn->fr_size++;
	}
	return 0;

err:
	iser_free_fastreg_pool(ib_conn); /* OK: rdma-mr-leak -- every descriptor already on the list is deregistered */
	return ret;
}

static struct iser_fr_desc *iser_reg_desc_get_fr(struct ib_conn *ib_conn)
{
	struct iser_fr_desc *desc;

	spin_lock_bh(&ib_conn->lock);
	desc = list_first_entry_or_null(&ib_conn->fr_list, struct iser_fr_desc, list);
	if (desc)
		list_del(&desc->list);
	spin_unlock_bh(&ib_conn->lock);
	return desc;
}

static void iser_reg_desc_put_fr(struct ib_conn *ib_conn,
				 struct iser_fr_desc *desc)
{
	spin_lock_bh(&ib_conn->lock);
	list_add(&desc->list, &ib_conn->fr_list);
	spin_unlock_bh(&ib_conn->lock);
}

static void iser_dma_unmap_task_data(struct iscsi_iser_task *task,
				     enum iser_data_dir dir)
{
	struct ib_device *dev = task->iser_conn->ib_conn.device->ib_device;
	struct iser_data_buf *data = &task->data[dir];

	ib_dma_unmap_sg(dev, data->sg, data->size,
			dir == ISER_DIR_IN ? DMA_FROM_DEVICE : DMA_TO_DEVICE);
}

static void iser_release_desc(struct iscsi_iser_task *task,
			      enum iser_data_dir dir)
{
	struct ib_conn *ib_conn = &task->iser_conn->ib_conn;

	iser_dma_unmap_task_data(task, dir);
	iser_reg_desc_put_fr(ib_conn, task->rdma_reg[dir].desc);
	task->rdma_reg[dir].desc = NULL;
}

static int iser_fast_reg_mr(struct iscsi_iser_task *task,
			    struct iser_data_buf *mem,
			    struct iser_fr_desc *desc,
			    struct iser_mem_reg *reg)
{
	struct iser_tx_desc *tx_desc = &task->desc;
	struct ib_reg_wr *wr = &tx_desc->reg_wr;
	struct ib_mr *mr = desc->mr;
	int n;

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));

	n = ib_map_mr_sg(mr, mem->sg, mem->dma_nents, NULL, SZ_4K);
	if (unlikely(n != mem->dma_nents)) {
		iser_err("failed to map sg (%d/%d)\n", n, mem->dma_nents);
		return n < 0 ? n : -EINVAL;
	}

	memset(wr, 0, sizeof(*wr));
	wr->wr.opcode = IB_WR_REG_MR;
	wr->wr.next = &tx_desc->send_wr;
	wr->wr.send_flags = 0;
	wr->wr.num_sge = 0;
	wr->mr = mr;
	wr->key = mr->rkey;
	wr->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE;
	desc->mr_valid = true;

	reg->sge.lkey = mr->lkey;
	reg->rkey = mr->rkey;
	reg->sge.addr = mr->iova;
	reg->sge.length = mr->length;
	return 0;
}

static int iser_reg_rdma_mem(struct iscsi_iser_task *task,
			     enum iser_data_dir dir)
{
	struct ib_conn *ib_conn = &task->iser_conn->ib_conn;
	struct ib_device *dev = ib_conn->device->ib_device;
	struct iser_data_buf *mem = &task->data[dir];
	struct iser_mem_reg *reg = &task->rdma_reg[dir];
	struct iser_fr_desc *desc;
	int ret;

	mem->dma_nents = ib_dma_map_sg(dev, mem->sg, mem->size,
				       dir == ISER_DIR_IN ? DMA_FROM_DEVICE :
							    DMA_TO_DEVICE);
	if (unlikely(!mem->dma_nents))
		return -EINVAL;

	desc = iser_reg_desc_get_fr(ib_conn);
	if (!desc) {
		ret = -EAGAIN;
		goto err_unmap;
	}

	ret = iser_fast_reg_mr(task, mem, desc, reg);
	if (ret)
		goto err_put;

	desc->task = task;
	desc->dir = dir;
	reg->desc = desc;
	return 0;

err_put:
	/* OK: rdma-invalidation-leak -- the REG_MR was only built, it is posted with the command SEND later */
	iser_reg_desc_put_fr(ib_conn, desc);
err_unmap:
	iser_dma_unmap_task_data(task, dir);
	return ret;
}

static int iser_post_send(struct ib_conn *ib_conn, struct iser_tx_desc *tx_desc)
{
	struct ib_send_wr *wr = &tx_desc->send_wr;
	struct ib_send_wr *first_wr;

	wr->next = NULL;
	wr->wr_cqe = &tx_desc->cqe;
	wr->sg_list = tx_desc->tx_sg;
	wr->num_sge = tx_desc->num_sge;
	wr->opcode = IB_WR_SEND;
	wr->send_flags = IB_SEND_SIGNALED;

	first_wr = tx_desc->reg_wr.wr.next ? &tx_desc->reg_wr.wr : wr;
	return ib_post_send(ib_conn->qp, first_wr, NULL);
}

int iser_send_command(struct iscsi_iser_task *task)
{
	struct ib_conn *ib_conn = &task->iser_conn->ib_conn;
	struct iser_hdr *hdr = &task->desc.iser_header;
	enum iser_data_dir dir;
	int ret;

	task->desc.reg_wr.wr.next = NULL;
	dir = task->dir[ISER_DIR_IN] ? ISER_DIR_IN : ISER_DIR_OUT;
	if (!task->dir[dir])
		return iser_post_send(ib_conn, &task->desc);

	ret = iser_reg_rdma_mem(task, dir);
	if (ret)
		return ret;
	if (dir == ISER_DIR_IN) {
		hdr->flags |= ISER_RSV;
		hdr->read_stag = cpu_to_be32(task->rdma_reg[dir].rkey);
		hdr->read_va = cpu_to_be64(task->rdma_reg[dir].sge.addr);
	} else {
		hdr->flags |= ISER_WSV;
		hdr->write_stag = cpu_to_be32(task->rdma_reg[dir].rkey);
		hdr->write_va = cpu_to_be64(task->rdma_reg[dir].sge.addr);
	}

	ret = iser_post_send(ib_conn, &task->desc);
	if (ret) {
		iser_err("command post failed: %d\n", ret);
		iser_release_desc(task, dir); /* OK: rdma-invalidation-leak -- the REG_MR and the header carrying the stag failed to post together */
	}
	return ret;
}

static void iser_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct iser_fr_desc *desc =
		container_of(wc->wr_cqe, struct iser_fr_desc, inv_cqe);
	struct iscsi_iser_task *task = desc->task;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		iser_err("LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		task->iser_conn->failed = true;
		return;
	}
	desc->mr_valid = false;
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- runs on the successful LOCAL_INV completion */
	iser_release_desc(task, desc->dir);
	iser_task_done(task, 0);
}

static void iser_unreg_mem_fastreg(struct iscsi_iser_task *task,
				   enum iser_data_dir dir)
{
	struct ib_conn *ib_conn = &task->iser_conn->ib_conn;
	struct iser_fr_desc *desc = task->rdma_reg[dir].desc;
	int ret;

	if (!desc->mr_valid) {
		/* the target invalidated the stag with the response */
		iser_release_desc(task, dir); /* OK: rdma-invalidation-leak -- the remote invalidation was accepted (blindly: see iser_task_rsp) */
		iser_task_done(task, 0);
		return;
	}

	memset(&desc->inv_wr, 0, sizeof(desc->inv_wr));
	desc->inv_cqe.done = iser_inv_done;
	desc->inv_wr.wr_cqe = &desc->inv_cqe;
	desc->inv_wr.opcode = IB_WR_LOCAL_INV;
	desc->inv_wr.send_flags = IB_SEND_SIGNALED;
	desc->inv_wr.ex.invalidate_rkey = desc->mr->rkey;

	ret = ib_post_send(ib_conn->qp, &desc->inv_wr, NULL);
	if (unlikely(ret)) {
		iser_err("LOCAL_INV post failed: %d\n", ret);
		iser_release_desc(task, dir); /* BUG: rdma-invalidation-leak -- the LOCAL_INV never went out; the pages and the descriptor are released with the stag live */
		iser_task_done(task, -EIO);
	}
	/* OK: rdma-unmap-before-invalidate -- on success the release waits for iser_inv_done() */
}

static int iser_rx_check_inv(struct iser_conn *iser_conn, struct ib_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- NOP-In and async PDUs grant nothing; an invalidation is refused */
	if (unlikely(wc->wc_flags & IB_WC_WITH_INVALIDATE)) {
		iser_err("unexpected remote invalidation of %#x\n",
			 wc->ex.invalidate_rkey);
		return -EPROTO;
	}
	return 0;
}

void iser_task_rsp(struct iser_conn *iser_conn, u8 opcode, u32 itt,
		   struct ib_wc *wc)
{
	struct iscsi_iser_task *task;
	int dir;

	if (opcode != ISCSI_OP_SCSI_CMD_RSP) {
		if (iser_rx_check_inv(iser_conn, wc))
			iser_conn->failed = true;
		return;
	}

	task = iser_itt_to_task(iser_conn, itt);
	if (unlikely(!task)) {
		iser_err("itt %#x not found\n", itt);
		iser_conn->failed = true;
		return;
	}

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		/* BUG: rdma-remote-invalidate-unchecked -- wc->ex.invalidate_rkey is never compared with the task's stag */
		for (dir = 0; dir < ISER_DIRS_NUM; dir++)
			if (task->rdma_reg[dir].desc)
				task->rdma_reg[dir].desc->mr_valid = false;
	}

	for (dir = 0; dir < ISER_DIRS_NUM; dir++)
		if (task->rdma_reg[dir].desc)
			iser_unreg_mem_fastreg(task, dir);
}

/* connection is going down: release whatever the task still holds */
void iser_cleanup_task(struct iscsi_iser_task *task)
{
	struct ib_conn *ib_conn = &task->iser_conn->ib_conn;
	struct iser_fr_desc *desc;
	int dir, ret;

	for (dir = 0; dir < ISER_DIRS_NUM; dir++) {
		desc = task->rdma_reg[dir].desc;
		if (!desc)
			continue;
		if (desc->mr_valid) {
			memset(&desc->inv_wr, 0, sizeof(desc->inv_wr));
			desc->inv_wr.opcode = IB_WR_LOCAL_INV;
			desc->inv_wr.ex.invalidate_rkey = desc->mr->rkey;
			ret = ib_post_send(ib_conn->qp, &desc->inv_wr, NULL);
			if (ret) {
				iser_warn("LOCAL_INV post failed: %d\n", ret);
				continue;	/* leave it to the pool teardown */
			}
			desc->mr_valid = false;
		}
		iser_release_desc(task, dir); /* BUG: rdma-unmap-before-invalidate -- unmapped and recycled right after posting an unsignaled LOCAL_INV */
	}
}

int iser_create_ib_conn_res(struct iser_conn *iser_conn)
{
	struct ib_conn *ib_conn = &iser_conn->ib_conn;
	struct iser_device *device = ib_conn->device;
	struct ib_qp_init_attr init_attr;
	int ret;

	ib_conn->cq_size = (ISER_WRS_PER_CMD + 1) * iser_conn->max_cmds +
			   ISER_MAX_TX_MISC_PDUS + ISER_MAX_RX_MISC_PDUS;
	ib_conn->cq = ib_cq_pool_get(device->ib_device, ib_conn->cq_size, -1,
				     IB_POLL_SOFTIRQ);
	if (IS_ERR(ib_conn->cq))
		return PTR_ERR(ib_conn->cq);

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = (void *)ib_conn;
	init_attr.send_cq = ib_conn->cq;
	init_attr.recv_cq = ib_conn->cq;
	/* BUG(file): rdma-send-queue-undersized -- a command posts REG_MR, SEND and later LOCAL_INV but only two WRs per command are reserved */
	init_attr.cap.max_send_wr = ISER_WRS_PER_CMD * iser_conn->max_cmds + ISER_MAX_TX_MISC_PDUS + 1; /* BUG(file): rdma-send-queue-manual-factor -- hand-made per-command WR factor */
	init_attr.cap.max_recv_wr = iser_conn->max_cmds + ISER_MAX_RX_MISC_PDUS;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(ib_conn->cma_id, device->pd, &init_attr);
	if (ret)
		goto out_cq;
	ib_conn->qp = ib_conn->cma_id->qp;

	ret = iser_alloc_fastreg_pool(ib_conn, iser_conn->max_cmds,
				      device->ib_device->attrs.max_fast_reg_page_list_len);
	if (ret)
		goto out_qp;
	return 0;

out_qp:
	rdma_destroy_qp(ib_conn->cma_id);
out_cq:
	ib_cq_pool_put(ib_conn->cq, ib_conn->cq_size);
	return ret;
}

void iser_free_ib_conn_res(struct iser_conn *iser_conn)
{
	struct ib_conn *ib_conn = &iser_conn->ib_conn;

	ib_drain_qp(ib_conn->qp);
	iser_free_fastreg_pool(ib_conn);
	rdma_destroy_qp(ib_conn->cma_id);
	ib_cq_pool_put(ib_conn->cq, ib_conn->cq_size);
}

MODULE_LICENSE("GPL");
