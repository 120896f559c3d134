// SPDX-License-Identifier: GPL-2.0
/*
 * sd_smc_link.c - SMC-R-style link layer: one RC QP per link, fixed tx slots.
 *
 * A link owns wr_tx_cnt send slots.  A slot carries one CDC message (SEND,
 * signaled) and, for copy sends, up to two RDMA WRITEs of payload into the
 * peer's RMB ahead of it (two when the write wraps the peer's ring).  Large
 * sends may go zero-copy: the slot's REG_MR registers the sender's pages
 * for REMOTE_READ, the CDC message hands the rkey to the peer, the peer
 * pulls the data and acks, and the slot posts a signaled LOCAL_INV; the MR
 * returns to the QP's MR pool when the LOCAL_INV completes, and only then is
 * the slot free again.
 *
 * RMBs (receive buffers the peer writes into) get their own MR, registered
 * once on the link with a link-level REG_MR; they stay registered until the
 * buffer is freed.
 *
 * Known problems: the send queue is exactly three WRs per slot and the link
 * drains its QP on teardown; the factor is hand-made although zero-copy
 * posts REG_MR/LOCAL_INV per send; zero-copy re-registers pooled MRs
 * without a new key; an RMB whose MR cannot be mapped, and a zero-copy send
 * that finds no free slot, leak their MRs.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad -- not the subject of this file
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not the subject of this file
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath -- not the subject of this file
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/string.h>
#include <linux/spinlock.h>
#include <linux/mutex.h>
#include <linux/wait.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define SMCSD_WR_BUF_CNT	16
#define SMCSD_ZC_MAX_PAGES	64
#define SMCSD_REG_TIMEOUT_MS	5000
#define SMCSD_CDC_MSG_TYPE	0xfe
#define SMCSD_CDC_F_ZC		0x01	/* message offers a zero-copy region */
#define SMCSD_CDC_F_ZC_ACK	0x02	/* peer finished pulling slot 'token' */

enum smcsd_reg_state { SMCSD_REG_FREE, SMCSD_REG_POSTED, SMCSD_REG_DONE, SMCSD_REG_FAILED };

struct smcsd_cdc_msg {
	u8	type;
	u8	flags;
	__be16	seqno;
	__be32	token;
	__be32	prod;
	__be32	cons;
	__be64	zc_addr;
	__be32	zc_rkey;
	__be32	zc_len;
	u8	rsvd[8];
};

struct smcsd_link;

struct smcsd_tx_slot {
	u32			idx;
	bool			busy;
	struct smcsd_link	*lnk;
	struct ib_sge		send_sge;
	struct ib_send_wr	send_wr;
	struct ib_sge		rdma_sge[2];
	struct ib_rdma_wr	rdma_wr[2];
	struct ib_reg_wr	reg_wr;		/* zero-copy: ahead of the CDC message */
	struct ib_send_wr	inv_wr;		/* zero-copy: after the peer's ack */
	struct ib_cqe		tx_cqe;
	struct ib_cqe		inv_cqe;
	struct ib_mr		*zc_mr;
};

struct smcsd_rx_slot {
	struct ib_cqe		cqe;
	struct smcsd_link	*lnk;
	u32			idx;
	struct ib_sge		sge;
	struct ib_recv_wr	wr;
};

struct smcsd_buf_desc {
	struct list_head	list;
	void			*cpu_addr;
	u32			len;
	struct sg_table		sgt;
	struct ib_mr		*mr;
	bool			is_reg;
};

struct smcsd_link {
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_qp		*roce_qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	bool			active;

	u32			wr_tx_cnt;
	struct smcsd_tx_slot	*wr_tx;
	struct smcsd_cdc_msg	*wr_tx_bufs;
	u64			wr_tx_dma;
	spinlock_t		tx_lock;
	wait_queue_head_t	wr_tx_wait;

	u32			wr_rx_cnt;
	struct smcsd_cdc_msg	*wr_rx_bufs;
	u64			wr_rx_dma;
	struct smcsd_rx_slot	*wr_rx;

	struct ib_reg_wr	wr_reg;
	struct ib_cqe		reg_cqe;
	int			wr_reg_state;
	wait_queue_head_t	wr_reg_wait;
	struct mutex		reg_mutex;

	struct list_head	rmbs;
	u64			peer_rmb_addr;
	u32			peer_rmb_rkey;
	u32			peer_rmb_len;
	u32			peer_prod;
};

static void smcsd_qp_event(struct ib_event *ev, void *priv)
{
	struct smcsd_link *lnk = priv;

	lnk->active = false;
}

static int smcsd_link_create_qp(struct smcsd_link *lnk)
{
	struct ib_qp_init_attr qp_attr = {
		.event_handler = smcsd_qp_event,
		.qp_context = lnk,
		.send_cq = lnk->send_cq,
		.recv_cq = lnk->recv_cq,
		.srq = NULL,
		.cap = {
			/* a CDC message goes with at most two RDMA writes,
			 * a zero-copy one with its REG_MR and LOCAL_INV
			 */
			/* BUG: rdma-send-queue-manual-factor -- hand-made factor 3 (REG_MR, SEND, LOCAL_INV) over the slot count */
			.max_send_wr = 3 * lnk->wr_tx_cnt,	/* BUG(file): rdma-send-queue-undersized -- every slot may hold three WRs and smcsd_link_clear() drains the QP: no entry is left for the drain */
			.max_recv_wr = 3 * lnk->wr_rx_cnt,	/* OK: rdma-send-queue-undersized -- only wr_rx_cnt receives are kept posted, the drain's receive fits */
			.max_send_sge = 2,
			.max_recv_sge = 1,
			.max_inline_data = 0,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
	};
	struct ib_qp *qp;

	qp = ib_create_qp(lnk->pd, &qp_attr);
	if (IS_ERR(qp))
		return PTR_ERR(qp);
	lnk->roce_qp = qp;
	return 0;
}

static int smcsd_wr_tx_get_free_slot(struct smcsd_link *lnk, struct smcsd_tx_slot **slot)
{
	u32 i;

	spin_lock_bh(&lnk->tx_lock);
	for (i = 0; i < lnk->wr_tx_cnt; i++) {
		if (!lnk->wr_tx[i].busy) {
			lnk->wr_tx[i].busy = true;
			*slot = &lnk->wr_tx[i];
			spin_unlock_bh(&lnk->tx_lock);
			return 0;
		}
	}
	spin_unlock_bh(&lnk->tx_lock);
	return -EBUSY;
}

static void smcsd_wr_tx_put_slot(struct smcsd_tx_slot *slot)
{
	struct smcsd_link *lnk = slot->lnk;

	spin_lock_bh(&lnk->tx_lock);
	slot->busy = false;
	spin_unlock_bh(&lnk->tx_lock);
	wake_up(&lnk->wr_tx_wait);
}

static struct smcsd_cdc_msg *smcsd_slot_msg(struct smcsd_tx_slot *slot, u8 flags)
{
	struct smcsd_link *lnk = slot->lnk;
	struct smcsd_cdc_msg *msg = &lnk->wr_tx_bufs[slot->idx];

	memset(msg, 0, sizeof(*msg));
	msg->type = SMCSD_CDC_MSG_TYPE;
	msg->flags = flags;
	msg->token = cpu_to_be32(slot->idx);
	msg->prod = cpu_to_be32(lnk->peer_prod);
	slot->send_wr.opcode = IB_WR_SEND;
	slot->send_wr.send_flags = IB_SEND_SIGNALED;
	slot->send_wr.next = NULL;
	return msg;
}

/* Copy send: the payload is already staged in a DMA-mapped send buffer. */
int smcsd_tx_data(struct smcsd_link *lnk, u64 src_dma, u32 len)
{
	struct smcsd_tx_slot *slot;
	u32 off, chunk, nwr = 1;
	int rc;

	if (!lnk->active || len > lnk->peer_rmb_len)
		return -EINVAL;
	rc = smcsd_wr_tx_get_free_slot(lnk, &slot);
	if (rc)
		return rc;

	off = lnk->peer_prod % lnk->peer_rmb_len;
	chunk = min_t(u32, len, lnk->peer_rmb_len - off);
	slot->rdma_sge[0].addr = src_dma;
	slot->rdma_sge[0].length = chunk;
	slot->rdma_sge[0].lkey = lnk->pd->local_dma_lkey;
	slot->rdma_wr[0].wr.opcode = IB_WR_RDMA_WRITE;
	slot->rdma_wr[0].wr.send_flags = 0;	/* OK: rdma-unsignaled-send-starvation -- retired by the signaled CDC message posted behind it */
	slot->rdma_wr[0].wr.sg_list = &slot->rdma_sge[0];
	slot->rdma_wr[0].wr.num_sge = 1;
	slot->rdma_wr[0].remote_addr = lnk->peer_rmb_addr + off;
	slot->rdma_wr[0].rkey = lnk->peer_rmb_rkey;
	if (chunk < len) {
		slot->rdma_sge[1].addr = src_dma + chunk;
		slot->rdma_sge[1].length = len - chunk;
		slot->rdma_sge[1].lkey = lnk->pd->local_dma_lkey;
		slot->rdma_wr[1].wr.opcode = IB_WR_RDMA_WRITE;
		slot->rdma_wr[1].wr.send_flags = 0;
		slot->rdma_wr[1].wr.sg_list = &slot->rdma_sge[1];
		slot->rdma_wr[1].wr.num_sge = 1;
		slot->rdma_wr[1].remote_addr = lnk->peer_rmb_addr;
		slot->rdma_wr[1].rkey = lnk->peer_rmb_rkey;
		slot->rdma_wr[0].wr.next = &slot->rdma_wr[1].wr;
		nwr = 2;
	}
	slot->rdma_wr[nwr - 1].wr.next = &slot->send_wr;
	lnk->peer_prod += len;
	smcsd_slot_msg(slot, 0);

	rc = ib_post_send(lnk->roce_qp, &slot->rdma_wr[0].wr, NULL);
	if (rc) {
		lnk->peer_prod -= len;
		smcsd_wr_tx_put_slot(slot);
	}
	return rc;
}

/* Zero-copy send: the peer pulls @sgl with RDMA READ and acks. */
int smcsd_tx_zcopy(struct smcsd_link *lnk, struct scatterlist *sgl, int nents, u32 len)
{
	struct smcsd_tx_slot *slot;
	struct smcsd_cdc_msg *msg;
	struct ib_mr *mr;
	int n, rc;

	if (!lnk->active)
		return -ENOTCONN;
	mr = ib_mr_pool_get(lnk->roce_qp, &lnk->roce_qp->rdma_mrs);
	if (!mr)
		return -EAGAIN;

	rc = smcsd_wr_tx_get_free_slot(lnk, &slot);
	if (rc)
		return rc;		/* BUG: rdma-mr-leak -- the MR taken from the pool above is not put back */

	n = ib_map_mr_sg(mr, sgl, nents, NULL, PAGE_SIZE);
	if (n < nents) {
		ib_mr_pool_put(lnk->roce_qp, &lnk->roce_qp->rdma_mrs, mr);	/* OK: rdma-mr-leak -- back to the pool on a short map */
		smcsd_wr_tx_put_slot(slot);
		return n < 0 ? n : -EINVAL;
	}

	slot->zc_mr = mr;
	slot->reg_wr.wr.opcode = IB_WR_REG_MR;
	slot->reg_wr.wr.wr_cqe = &slot->tx_cqe;
	slot->reg_wr.wr.num_sge = 0;
	slot->reg_wr.wr.send_flags = 0;	/* OK: rdma-unsignaled-send-starvation -- completes with the signaled CDC message behind it */
	slot->reg_wr.mr = mr;		/* BUG: rdma-rkey-reuse -- a pooled MR whose key an earlier zero-copy send already gave the peer is registered again under the same rkey */
	slot->reg_wr.key = mr->rkey;
	slot->reg_wr.access = IB_ACCESS_REMOTE_READ;
	slot->reg_wr.wr.next = &slot->send_wr;

	msg = smcsd_slot_msg(slot, SMCSD_CDC_F_ZC);
	msg->zc_addr = cpu_to_be64(mr->iova);
	msg->zc_rkey = cpu_to_be32(mr->rkey);
	msg->zc_len = cpu_to_be32(len);

	rc = ib_post_send(lnk->roce_qp, &slot->reg_wr.wr, NULL);
	if (rc) {
		slot->zc_mr = NULL;
		ib_mr_pool_put(lnk->roce_qp, &lnk->roce_qp->rdma_mrs, mr);	/* OK: rdma-mr-leak -- nothing was posted, the MR goes straight back */
		smcsd_wr_tx_put_slot(slot);
	}
	return rc;
}

static void smcsd_zc_ack(struct smcsd_link *lnk, u32 idx)
{
	struct smcsd_tx_slot *slot;

	if (idx >= lnk->wr_tx_cnt)
		return;
	slot = &lnk->wr_tx[idx];
	if (!slot->zc_mr)
		return;
	memset(&slot->inv_wr, 0, sizeof(slot->inv_wr));
	slot->inv_wr.opcode = IB_WR_LOCAL_INV;
	slot->inv_wr.wr_cqe = &slot->inv_cqe;
	slot->inv_wr.send_flags = IB_SEND_SIGNALED;
	slot->inv_wr.ex.invalidate_rkey = slot->zc_mr->rkey;
	if (ib_post_send(lnk->roce_qp, &slot->inv_wr, NULL)) {
		/* the MR stays with the slot; link teardown returns it */
		pr_warn("smcsd: LOCAL_INV post failed, link goes down\n");
		lnk->active = false;
	}
}

static void smcsd_zc_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcsd_tx_slot *slot = container_of(wc->wr_cqe, struct smcsd_tx_slot, inv_cqe);
	struct smcsd_link *lnk = slot->lnk;

	if (wc->status != IB_WC_SUCCESS) {
		lnk->active = false;
		return;
	}
	ib_mr_pool_put(lnk->roce_qp, &lnk->roce_qp->rdma_mrs, slot->zc_mr);
	slot->zc_mr = NULL;
	smcsd_wr_tx_put_slot(slot);
}

static void smcsd_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcsd_tx_slot *slot = container_of(wc->wr_cqe, struct smcsd_tx_slot, tx_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		slot->lnk->active = false;
		return;
	}
	if (!slot->zc_mr)		/* zero-copy slots wait for the peer's ack */
		smcsd_wr_tx_put_slot(slot);
}

static void smcsd_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcsd_link *lnk = container_of(wc->wr_cqe, struct smcsd_link, reg_cqe);

	lnk->wr_reg_state = wc->status == IB_WC_SUCCESS ? SMCSD_REG_DONE : SMCSD_REG_FAILED;
	wake_up(&lnk->wr_reg_wait);
}

static int smcsd_buf_alloc_mr(struct smcsd_link *lnk, struct smcsd_buf_desc *buf)
{
	int nents;

	buf->mr = ib_alloc_mr(lnk->pd, IB_MR_TYPE_MEM_REG, buf->sgt.orig_nents);
	if (IS_ERR(buf->mr)) {
		int rc = PTR_ERR(buf->mr);

		buf->mr = NULL;
		return rc;		/* OK: rdma-mr-leak -- the allocation failed, nothing is held */
	}
	nents = ib_map_mr_sg(buf->mr, buf->sgt.sgl, buf->sgt.orig_nents, NULL, PAGE_SIZE);
	if (nents != buf->sgt.orig_nents)
		return -EINVAL;		/* BUG: rdma-mr-leak -- buf->mr stays allocated and smcsd_new_rmb() frees the descriptor on this error */
	return 0;
}

static int smcsd_link_reg_buf(struct smcsd_link *lnk, struct smcsd_buf_desc *buf)
{
	long left;
	int rc;

	if (buf->is_reg)
		return 0;

	mutex_lock(&lnk->reg_mutex);
	memset(&lnk->wr_reg, 0, sizeof(lnk->wr_reg));
	lnk->wr_reg.wr.opcode = IB_WR_REG_MR;
	lnk->wr_reg.wr.wr_cqe = &lnk->reg_cqe;
	lnk->wr_reg.wr.send_flags = IB_SEND_SIGNALED;
	lnk->wr_reg.mr = buf->mr;	/* OK: rdma-rkey-reuse -- an RMB is registered once (is_reg) with the key of its freshly allocated MR and stays registered until it is freed */
	lnk->wr_reg.key = buf->mr->rkey;
	lnk->wr_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	lnk->wr_reg_state = SMCSD_REG_POSTED;
	rc = ib_post_send(lnk->roce_qp, &lnk->wr_reg.wr, NULL);
	if (rc) {
		lnk->wr_reg_state = SMCSD_REG_FREE;
		goto out;
	}
	left = wait_event_timeout(lnk->wr_reg_wait, lnk->wr_reg_state != SMCSD_REG_POSTED,
				  msecs_to_jiffies(SMCSD_REG_TIMEOUT_MS));
	if (!left || lnk->wr_reg_state != SMCSD_REG_DONE) {
		rc = -EIO;
		goto out;
	}
	buf->is_reg = true;
out:
	mutex_unlock(&lnk->reg_mutex);
	return rc;
}

struct smcsd_buf_desc *smcsd_new_rmb(struct smcsd_link *lnk, u32 len)
{
	struct smcsd_buf_desc *buf;
	int rc;

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return ERR_PTR(-ENOMEM);
	buf->len = len;
	buf->cpu_addr = kzalloc(len, GFP_KERNEL);
	if (!buf->cpu_addr) {
		rc = -ENOMEM;
		goto free_buf;
	}
	rc = sg_alloc_table(&buf->sgt, 1, GFP_KERNEL);
	if (rc)
		goto free_mem;
	sg_set_buf(buf->sgt.sgl, buf->cpu_addr, len);
	if (!ib_dma_map_sg(lnk->ibdev, buf->sgt.sgl, buf->sgt.orig_nents, DMA_BIDIRECTIONAL)) {
		rc = -EIO;
		goto free_table;
	}
	rc = smcsd_buf_alloc_mr(lnk, buf);
	if (rc)
		goto unmap;
	rc = smcsd_link_reg_buf(lnk, buf);
	if (rc)
		goto dereg;
	list_add_tail(&buf->list, &lnk->rmbs);
	return buf;

dereg:
	ib_dereg_mr(buf->mr);		/* OK: rdma-mr-leak -- released when the registration fails */
unmap:
	ib_dma_unmap_sg(lnk->ibdev, buf->sgt.sgl, buf->sgt.orig_nents, DMA_BIDIRECTIONAL);
free_table:
	sg_free_table(&buf->sgt);
free_mem:
	kfree(buf->cpu_addr);
free_buf:
	kfree(buf);
	return ERR_PTR(rc);
}

static void smcsd_free_rmb(struct smcsd_link *lnk, struct smcsd_buf_desc *buf)
{
	list_del(&buf->list);
	ib_dereg_mr(buf->mr);
	ib_dma_unmap_sg(lnk->ibdev, buf->sgt.sgl, buf->sgt.orig_nents, DMA_BIDIRECTIONAL);
	sg_free_table(&buf->sgt);
	kfree(buf->cpu_addr);
	kfree(buf);
}

static int smcsd_link_post_rx(struct smcsd_link *lnk, u32 i)
{
	return ib_post_recv(lnk->roce_qp, &lnk->wr_rx[i].wr, NULL);
}

static void smcsd_rx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smcsd_rx_slot *rx = container_of(wc->wr_cqe, struct smcsd_rx_slot, cqe);
	struct smcsd_link *lnk = rx->lnk;
	struct smcsd_cdc_msg *msg = &lnk->wr_rx_bufs[rx->idx];

	if (wc->status != IB_WC_SUCCESS)
		return;
	ib_dma_sync_single_for_cpu(lnk->ibdev, rx->sge.addr, sizeof(*msg), DMA_FROM_DEVICE);
	if (msg->type == SMCSD_CDC_MSG_TYPE && (msg->flags & SMCSD_CDC_F_ZC_ACK))
		smcsd_zc_ack(lnk, be32_to_cpu(msg->token));
	smcsd_link_post_rx(lnk, rx->idx);
}

int smcsd_link_init(struct smcsd_link *lnk)
{
	u32 i;
	int rc = -ENOMEM;

	lnk->wr_tx_cnt = SMCSD_WR_BUF_CNT;
	lnk->wr_rx_cnt = SMCSD_WR_BUF_CNT;
	spin_lock_init(&lnk->tx_lock);
	init_waitqueue_head(&lnk->wr_tx_wait);
	init_waitqueue_head(&lnk->wr_reg_wait);
	mutex_init(&lnk->reg_mutex);
	INIT_LIST_HEAD(&lnk->rmbs);
	lnk->reg_cqe.done = smcsd_reg_done;

	lnk->wr_tx = kcalloc(lnk->wr_tx_cnt, sizeof(*lnk->wr_tx), GFP_KERNEL);
	lnk->wr_tx_bufs = kcalloc(lnk->wr_tx_cnt, sizeof(*lnk->wr_tx_bufs), GFP_KERNEL);
	lnk->wr_rx_bufs = kcalloc(lnk->wr_rx_cnt, sizeof(*lnk->wr_rx_bufs), GFP_KERNEL);
	lnk->wr_rx = kcalloc(lnk->wr_rx_cnt, sizeof(*lnk->wr_rx), GFP_KERNEL);
	if (!lnk->wr_tx || !lnk->wr_tx_bufs || !lnk->wr_rx_bufs || !lnk->wr_rx)
		goto free_arrays;
	lnk->wr_tx_dma = ib_dma_map_single(lnk->ibdev, lnk->wr_tx_bufs,
					   lnk->wr_tx_cnt * sizeof(*lnk->wr_tx_bufs), DMA_TO_DEVICE);
	lnk->wr_rx_dma = ib_dma_map_single(lnk->ibdev, lnk->wr_rx_bufs,
					   lnk->wr_rx_cnt * sizeof(*lnk->wr_rx_bufs), DMA_FROM_DEVICE);
	for (i = 0; i < lnk->wr_tx_cnt; i++) {
		struct smcsd_tx_slot *slot = &lnk->wr_tx[i];

		slot->idx = i;
		slot->lnk = lnk;
		slot->tx_cqe.done = smcsd_tx_done;
		slot->inv_cqe.done = smcsd_zc_inv_done;
		slot->send_sge.addr = lnk->wr_tx_dma + i * sizeof(struct smcsd_cdc_msg);
		slot->send_sge.length = sizeof(struct smcsd_cdc_msg);
		slot->send_sge.lkey = lnk->pd->local_dma_lkey;
		slot->send_wr.wr_cqe = &slot->tx_cqe;
		slot->send_wr.sg_list = &slot->send_sge;
		slot->send_wr.num_sge = 1;
	}
	for (i = 0; i < lnk->wr_rx_cnt; i++) {
		struct smcsd_rx_slot *rx = &lnk->wr_rx[i];

		rx->idx = i;
		rx->lnk = lnk;
		rx->cqe.done = smcsd_rx_done;
		rx->sge.addr = lnk->wr_rx_dma + i * sizeof(struct smcsd_cdc_msg);
		rx->sge.length = sizeof(struct smcsd_cdc_msg);
		rx->sge.lkey = lnk->pd->local_dma_lkey;
		rx->wr.wr_cqe = &rx->cqe;
		rx->wr.sg_list = &rx->sge;
		rx->wr.num_sge = 1;
	}

	lnk->send_cq = ib_alloc_cq(lnk->ibdev, lnk, 3 * lnk->wr_tx_cnt, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(lnk->send_cq))
		goto free_arrays;
	lnk->recv_cq = ib_alloc_cq(lnk->ibdev, lnk, 3 * lnk->wr_rx_cnt, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(lnk->recv_cq))
		goto free_send_cq;
	rc = smcsd_link_create_qp(lnk);
	if (rc)
		goto free_recv_cq;
	rc = ib_mr_pool_init(lnk->roce_qp, &lnk->roce_qp->rdma_mrs, lnk->wr_tx_cnt,
			     IB_MR_TYPE_MEM_REG, SMCSD_ZC_MAX_PAGES, 0);
	if (rc)
		goto destroy_qp;
	for (i = 0; i < lnk->wr_rx_cnt; i++) {
		rc = smcsd_link_post_rx(lnk, i);
		if (rc)
			goto destroy_pool;
	}
	lnk->active = true;
	return 0;

destroy_pool:
	ib_mr_pool_destroy(lnk->roce_qp, &lnk->roce_qp->rdma_mrs);
destroy_qp:
	ib_destroy_qp(lnk->roce_qp);
free_recv_cq:
	ib_free_cq(lnk->recv_cq);
free_send_cq:
	ib_free_cq(lnk->send_cq);
free_arrays:
	kfree(lnk->wr_rx);
	kfree(lnk->wr_rx_bufs);
	kfree(lnk->wr_tx_bufs);
	kfree(lnk->wr_tx);
	return rc;
}

void smcsd_link_clear(struct smcsd_link *lnk)
{
	struct smcsd_buf_desc *buf, *tmp;
	u32 i;

	lnk->active = false;
	ib_drain_qp(lnk->roce_qp);
	for (i = 0; i < lnk->wr_tx_cnt; i++) {
		if (lnk->wr_tx[i].zc_mr) {
			ib_mr_pool_put(lnk->roce_qp, &lnk->roce_qp->rdma_mrs, lnk->wr_tx[i].zc_mr);
			lnk->wr_tx[i].zc_mr = NULL;
		}
	}
	ib_mr_pool_destroy(lnk->roce_qp, &lnk->roce_qp->rdma_mrs);
	list_for_each_entry_safe(buf, tmp, &lnk->rmbs, list)
		smcsd_free_rmb(lnk, buf);
	ib_destroy_qp(lnk->roce_qp);
	ib_free_cq(lnk->recv_cq);
	ib_free_cq(lnk->send_cq);
	ib_dma_unmap_single(lnk->ibdev, lnk->wr_rx_dma,
			    lnk->wr_rx_cnt * sizeof(*lnk->wr_rx_bufs), DMA_FROM_DEVICE);
	ib_dma_unmap_single(lnk->ibdev, lnk->wr_tx_dma,
			    lnk->wr_tx_cnt * sizeof(*lnk->wr_tx_bufs), DMA_TO_DEVICE);
	kfree(lnk->wr_rx);
	kfree(lnk->wr_rx_bufs);
	kfree(lnk->wr_tx_bufs);
	kfree(lnk->wr_tx);
}

MODULE_DESCRIPTION("SMC-R style link layer");
MODULE_LICENSE("GPL");
