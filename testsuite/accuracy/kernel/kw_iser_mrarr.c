// SPDX-License-Identifier: GPL-2.0
/*
 * kws -- iSCSI-style initiator datamover over RDMA (iser shaped).
 *
 * Every connection owns a table of fast-registration descriptors, one per
 * outstanding command, allocated when the connection is set up, plus one
 * reserve descriptor for task management so that error handling never waits
 * for the pool.  A command registers its buffer with REG_MR chained in front
 * of the command PDU SEND; a descriptor whose rkey is still valid is
 * invalidated lazily with a LOCAL_INV in front of its next REG_MR, unless the
 * target already invalidated it with SEND_WITH_INV.
 *
 * Correct: the reserve descriptor's goto ladder, the pool teardown, and the
 * access rights of the registrations.  Not correct: the descriptor loop
 * leaks the MR of the iteration that fails on its scatterlist copy; the send
 * queue is exactly three WRs per command with nothing left for ib_drain_qp();
 * the requested inline size is never checked against what the device
 * grants; and no send work request is ever signaled (the author relied on
 * the response PDU), so send-queue entries are never reclaimed.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed in this datamover
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/unaligned.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KWS_WR_PER_CMD		3	/* LOCAL_INV + REG_MR + SEND */
#define KWS_MAX_INLINE		256	/* BHS + AHS ride inline */
#define KWS_HDR_LEN		96
#define KWS_RX_PAYLOAD		8192
#define KWS_SG_TABLESIZE	128

#define KWS_REG_ACCESS	(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | \
			 IB_ACCESS_REMOTE_WRITE)

struct kws_fr_desc {
	struct list_head	list;
	struct ib_mr		*mr;
	struct scatterlist	*sg_copy;	/* bounce list for unaligned I/O */
	bool			mr_valid;
	struct ib_cqe		reg_cqe;
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
};

struct kws_tx_desc {
	u8			hdr[KWS_HDR_LEN];
	u64			dma;
	struct ib_sge		sge;
	struct ib_send_wr	send_wr;
	struct ib_cqe		cqe;
	struct kws_fr_desc	*fr;
};

struct kws_rx_desc {
	struct kws_conn		*conn;
	u8			*buf;
	u64			dma;
	struct ib_sge		sge;
	struct ib_recv_wr	wr;
	struct ib_cqe		cqe;
};

struct kws_task {
	struct kws_conn		*conn;
	struct kws_tx_desc	tx;
	struct scatterlist	*sgl;		/* DMA-mapped by the iSCSI layer */
	int			nents;
	bool			is_tmf;
	u32			itt;
};

struct kws_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	unsigned int		cmds_max;
	unsigned int		max_pages;

	struct kws_fr_desc	*fr_descs;
	unsigned int		nr_descs;
	struct kws_fr_desc	reserve;
	spinlock_t		fr_lock;
	struct list_head	fr_free;

	struct kws_rx_desc	*rx_descs;
	unsigned int		nr_rx;
};

static void kws_reg_err_done(struct ib_cq *cq, struct ib_wc *wc);
static void kws_send_err_done(struct ib_cq *cq, struct ib_wc *wc);
static void kws_rx_done(struct ib_cq *cq, struct ib_wc *wc);

/* Implemented by the iSCSI layer. */
void kws_iscsi_task_rsp(struct kws_conn *conn, u32 itt, void *pdu, u32 len);
void kws_iscsi_conn_failure(struct kws_conn *conn, int err);
struct kws_task *kws_iscsi_find_task(struct kws_conn *conn, u32 itt);

static int kws_create_qp(struct kws_conn *conn)
{
	struct ib_qp_init_attr init_attr;
	int ret;

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.qp_context = conn;
	init_attr.send_cq = conn->cq;
	init_attr.recv_cq = conn->cq;
	init_attr.qp_type = IB_QPT_RC;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR;	// BUG(file): rdma-unsignaled-send-starvation -- only requested WRs complete, and no post on this QP ever sets IB_SEND_SIGNALED
	init_attr.cap.max_send_wr = KWS_WR_PER_CMD * conn->cmds_max;	// BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- three WRs per command and no entry left for ib_drain_qp(); the per-command factor is hand-made
	init_attr.cap.max_recv_wr = conn->cmds_max;
	init_attr.cap.max_send_sge = 2;
	init_attr.cap.max_recv_sge = 1;
	init_attr.cap.max_inline_data = KWS_MAX_INLINE;	// BUG: rdma-queue-cap-unchecked -- 256 inline bytes requested, never compared with what the device grants

	ret = rdma_create_qp(conn->cm_id, conn->pd, &init_attr);
	if (ret) {
		pr_err("kws: rdma_create_qp failed %d\n", ret);
		return ret;
	}
	conn->qp = conn->cm_id->qp;
	return 0;
}

static int kws_alloc_fr_pool(struct kws_conn *conn)
{
	struct kws_fr_desc *desc;
	int i, ret;

	conn->fr_descs = kcalloc(conn->cmds_max, sizeof(*desc), GFP_KERNEL);
	if (!conn->fr_descs)
		return -ENOMEM;

	for (i = 0; i < conn->cmds_max; i++) {
		desc = &conn->fr_descs[i];
		desc->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_pages);	// OK: rdma-registration-in-datapath -- the whole table is filled once at connection setup
		if (IS_ERR(desc->mr)) {
			ret = PTR_ERR(desc->mr);
			goto err_unwind;
		}
		desc->sg_copy = kcalloc(conn->max_pages, sizeof(*desc->sg_copy),
					GFP_KERNEL);
		if (!desc->sg_copy) {
			ret = -ENOMEM;
			goto err_unwind;	// BUG: rdma-mr-leak -- desc->mr of this iteration is allocated, the unwinding below stops at i - 1
		}
		desc->mr_valid = false;
		list_add_tail(&desc->list, &conn->fr_free);
	}
	conn->nr_descs = conn->cmds_max;
	return 0;

err_unwind:
	while (i--) {
		ib_dereg_mr(conn->fr_descs[i].mr);
		kfree(conn->fr_descs[i].sg_copy);
	}
	INIT_LIST_HEAD(&conn->fr_free);
	kfree(conn->fr_descs);
	conn->fr_descs = NULL;
	return ret;
}

static void kws_free_fr_pool(struct kws_conn *conn)
{
	unsigned int i;

	for (i = 0; i < conn->nr_descs; i++) {
		ib_dereg_mr(conn->fr_descs[i].mr);
		kfree(conn->fr_descs[i].sg_copy);
	}
	kfree(conn->fr_descs);
	conn->fr_descs = NULL;
	conn->nr_descs = 0;
	INIT_LIST_HEAD(&conn->fr_free);
}

static int kws_alloc_descs(struct kws_conn *conn)
{
	int ret;

	ret = kws_alloc_fr_pool(conn);
	if (ret)
		return ret;

	conn->reserve.mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->max_pages);
	if (IS_ERR(conn->reserve.mr)) {
		ret = PTR_ERR(conn->reserve.mr);
		goto err_pool;
	}
	conn->reserve.sg_copy = kcalloc(conn->max_pages,
					sizeof(*conn->reserve.sg_copy), GFP_KERNEL);
	if (!conn->reserve.sg_copy) {
		ret = -ENOMEM;
		goto err_reserve_mr;
	}
	conn->reserve.mr_valid = false;
	INIT_LIST_HEAD(&conn->reserve.list);
	return 0;

err_reserve_mr:
	ib_dereg_mr(conn->reserve.mr);
err_pool:
	kws_free_fr_pool(conn);
	return ret;	// OK: rdma-mr-leak -- the reserve MR is deregistered at err_reserve_mr and the table by kws_free_fr_pool()
}

static void kws_free_descs(struct kws_conn *conn)
{
	kfree(conn->reserve.sg_copy);
	ib_dereg_mr(conn->reserve.mr);
	kws_free_fr_pool(conn);
}

static struct kws_fr_desc *kws_get_desc(struct kws_conn *conn, bool tmf)
{
	struct kws_fr_desc *desc = NULL;
	unsigned long flags;

	spin_lock_irqsave(&conn->fr_lock, flags);
	if (!list_empty(&conn->fr_free)) {
		desc = list_first_entry(&conn->fr_free, struct kws_fr_desc, list);
		list_del_init(&desc->list);
	} else if (tmf) {
		desc = &conn->reserve;
	}
	spin_unlock_irqrestore(&conn->fr_lock, flags);
	return desc;
}

static void kws_put_desc(struct kws_conn *conn, struct kws_fr_desc *desc)
{
	unsigned long flags;

	if (desc == &conn->reserve)
		return;
	spin_lock_irqsave(&conn->fr_lock, flags);
	list_add_tail(&desc->list, &conn->fr_free);
	spin_unlock_irqrestore(&conn->fr_lock, flags);
}

/*
 * Register the task's buffer.  Returns the first WR of the registration
 * chain and leaves *last pointing at the REG_MR so that the caller can hang
 * the command SEND behind it.
 */
static struct ib_send_wr *kws_fast_reg(struct kws_task *task,
				       struct kws_fr_desc *desc,
				       struct ib_send_wr **last)
{
	struct ib_send_wr *first;
	int n;

	n = ib_map_mr_sg(desc->mr, task->sgl, task->nents, NULL, PAGE_SIZE);
	if (unlikely(n != task->nents))
		return NULL;

	if (desc->mr_valid) {
		memset(&desc->inv_wr, 0, sizeof(desc->inv_wr));
		desc->inv_wr.opcode = IB_WR_LOCAL_INV;
		desc->inv_wr.wr_cqe = &desc->reg_cqe;
		desc->inv_wr.ex.invalidate_rkey = desc->mr->rkey;
		desc->inv_wr.next = &desc->reg_wr.wr;
		first = &desc->inv_wr;
	} else {
		first = &desc->reg_wr.wr;
	}
	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));

	memset(&desc->reg_wr, 0, sizeof(desc->reg_wr));
	desc->reg_cqe.done = kws_reg_err_done;
	desc->reg_wr.wr.opcode = IB_WR_REG_MR;
	desc->reg_wr.wr.wr_cqe = &desc->reg_cqe;
	desc->reg_wr.wr.send_flags = 0;
	desc->reg_wr.mr = desc->mr;
	desc->reg_wr.key = desc->mr->rkey;
	desc->reg_wr.access = KWS_REG_ACCESS;	// OK: rdma-access-flags-invalid -- KWS_REG_ACCESS includes local write next to remote write
	desc->mr_valid = true;

	*last = &desc->reg_wr.wr;
	return first;
}

int kws_send_command(struct kws_conn *conn, struct kws_task *task)
{
	struct kws_tx_desc *tx = &task->tx;
	struct ib_send_wr *first, *last = NULL;
	struct kws_fr_desc *desc = NULL;
	int ret;

	tx->sge.addr = tx->dma;
	tx->sge.length = KWS_HDR_LEN;
	tx->sge.lkey = conn->pd->local_dma_lkey;
	tx->cqe.done = kws_send_err_done;
	memset(&tx->send_wr, 0, sizeof(tx->send_wr));
	tx->send_wr.wr_cqe = &tx->cqe;
	tx->send_wr.sg_list = &tx->sge;
	tx->send_wr.num_sge = 1;
	tx->send_wr.opcode = IB_WR_SEND;
	/* the response PDU tells us the command went out */
	tx->send_wr.send_flags = 0;
	first = &tx->send_wr;

	if (task->nents) {
		desc = kws_get_desc(conn, task->is_tmf);
		if (!desc)
			return -EAGAIN;
		first = kws_fast_reg(task, desc, &last);
		if (!first) {
			kws_put_desc(conn, desc);
			return -EINVAL;	// OK: rdma-mr-leak -- the descriptor and its MR go back to the free list
		}
		last->next = &tx->send_wr;
	}
	tx->fr = desc;
	ib_dma_sync_single_for_device(conn->dev, tx->dma, KWS_HDR_LEN, DMA_TO_DEVICE);

	ret = ib_post_send(conn->qp, first, NULL);
	if (ret) {
		pr_err("kws: post_send failed %d\n", ret);
		if (desc)
			kws_put_desc(conn, desc);
	}
	return ret;
}

int kws_send_control(struct kws_conn *conn, struct kws_tx_desc *tx, u32 len)
{
	tx->sge.addr = tx->dma;
	tx->sge.length = len;
	tx->sge.lkey = conn->pd->local_dma_lkey;
	tx->cqe.done = kws_send_err_done;
	memset(&tx->send_wr, 0, sizeof(tx->send_wr));
	tx->send_wr.wr_cqe = &tx->cqe;
	tx->send_wr.sg_list = &tx->sge;
	tx->send_wr.num_sge = 1;
	tx->send_wr.opcode = IB_WR_SEND;
	tx->send_wr.send_flags = IB_SEND_SOLICITED;
	tx->fr = NULL;
	return ib_post_send(conn->qp, &tx->send_wr, NULL);
}

static int kws_post_rx(struct kws_conn *conn, struct kws_rx_desc *rx)
{
	rx->cqe.done = kws_rx_done;
	rx->wr.next = NULL;
	rx->wr.wr_cqe = &rx->cqe;
	rx->wr.sg_list = &rx->sge;
	rx->wr.num_sge = 1;
	return ib_post_recv(conn->qp, &rx->wr, NULL);
}

static void kws_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kws_rx_desc *rx = container_of(wc->wr_cqe, struct kws_rx_desc, cqe);
	struct kws_conn *conn = rx->conn;
	struct kws_fr_desc *desc;
	struct kws_task *task;
	u32 itt;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			kws_iscsi_conn_failure(conn, -EIO);
		return;
	}
	ib_dma_sync_single_for_cpu(conn->dev, rx->dma, KWS_RX_PAYLOAD, DMA_FROM_DEVICE);
	itt = get_unaligned_le32(rx->buf + 16);
	task = kws_iscsi_find_task(conn, itt);
	if (task && task->tx.fr) {
		desc = task->tx.fr;
		if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
		    wc->ex.invalidate_rkey == desc->mr->rkey)
			desc->mr_valid = false;
		task->tx.fr = NULL;
		kws_put_desc(conn, desc);
	}
	kws_iscsi_task_rsp(conn, itt, rx->buf, wc->byte_len);
	ib_dma_sync_single_for_device(conn->dev, rx->dma, KWS_RX_PAYLOAD, DMA_FROM_DEVICE);
	if (kws_post_rx(conn, rx))
		kws_iscsi_conn_failure(conn, -EIO);
}

static void kws_reg_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kws: registration failed: %s\n", ib_wc_status_msg(wc->status));
}

static void kws_send_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kws: send failed: %s\n", ib_wc_status_msg(wc->status));
}

static void kws_free_rx(struct kws_conn *conn)
{
	unsigned int i;

	for (i = 0; i < conn->nr_rx; i++) {
		ib_dma_unmap_single(conn->dev, conn->rx_descs[i].dma, KWS_RX_PAYLOAD,
				    DMA_FROM_DEVICE);
		kfree(conn->rx_descs[i].buf);
	}
	kfree(conn->rx_descs);
	conn->rx_descs = NULL;
	conn->nr_rx = 0;
}

static int kws_alloc_rx(struct kws_conn *conn)
{
	struct kws_rx_desc *rx;
	unsigned int i;

	conn->rx_descs = kcalloc(conn->cmds_max, sizeof(*rx), GFP_KERNEL);
	if (!conn->rx_descs)
		return -ENOMEM;
	for (i = 0; i < conn->cmds_max; i++) {
		rx = &conn->rx_descs[i];
		rx->conn = conn;
		rx->buf = kmalloc(KWS_RX_PAYLOAD, GFP_KERNEL);
		if (!rx->buf)
			break;
		rx->dma = ib_dma_map_single(conn->dev, rx->buf, KWS_RX_PAYLOAD,
					    DMA_FROM_DEVICE);
		rx->sge.addr = rx->dma;
		rx->sge.length = KWS_RX_PAYLOAD;
		rx->sge.lkey = conn->pd->local_dma_lkey;
		conn->nr_rx++;
	}
	if (conn->nr_rx < conn->cmds_max) {
		kws_free_rx(conn);
		return -ENOMEM;
	}
	return 0;
}

int kws_conn_setup(struct kws_conn *conn, struct rdma_cm_id *cm_id,
		   struct ib_pd *pd, unsigned int cmds_max)
{
	unsigned int i;
	int ret;

	conn->cm_id = cm_id;
	conn->dev = cm_id->device;
	conn->pd = pd;
	conn->cmds_max = cmds_max;
	conn->max_pages = min_t(u32, KWS_SG_TABLESIZE,
				conn->dev->attrs.max_fast_reg_page_list_len);
	spin_lock_init(&conn->fr_lock);
	INIT_LIST_HEAD(&conn->fr_free);

	conn->cq = ib_alloc_cq(conn->dev, conn, KWS_WR_PER_CMD * cmds_max + cmds_max,
			       0, IB_POLL_SOFTIRQ);
	if (IS_ERR(conn->cq))
		return PTR_ERR(conn->cq);
	ret = kws_create_qp(conn);
	if (ret)
		goto out_cq;
	ret = kws_alloc_descs(conn);
	if (ret)
		goto out_qp;
	ret = kws_alloc_rx(conn);
	if (ret)
		goto out_descs;
	for (i = 0; i < conn->nr_rx; i++) {
		ret = kws_post_rx(conn, &conn->rx_descs[i]);
		if (ret)
			goto out_rx;
	}
	return 0;

out_rx:
	ib_drain_qp(conn->qp);
	kws_free_rx(conn);
out_descs:
	kws_free_descs(conn);
out_qp:
	rdma_destroy_qp(cm_id);
out_cq:
	ib_free_cq(conn->cq);
	return ret;
}

void kws_conn_release(struct kws_conn *conn)
{
	ib_drain_qp(conn->qp);
	kws_free_rx(conn);
	kws_free_descs(conn);
	rdma_destroy_qp(conn->cm_id);
	ib_free_cq(conn->cq);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kws iSCSI datamover over RDMA");
