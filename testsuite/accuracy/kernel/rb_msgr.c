// SPDX-License-Identifier: GPL-2.0
/*
 * rb_msgr.c - cluster filesystem messenger over RDMA (ceph/ocfs2 style).
 *
 * A message is a header, a small front section (copied into the send ring)
 * and an optional data payload of pages.  The pages are not copied: each
 * message registers them with an MR from the QP's pool and the peer pulls
 * them with RDMA READ using the (addr, rkey, len) of the header.  Sent
 * messages stay on con->out_sent until the peer acknowledges their sequence
 * number.  An ACK may come as SEND_WITH_INV carrying the data rkey of one
 * acknowledged message; every other data MR gets a signaled LOCAL_INV and the
 * message is released from that completion.  A session reset from the peer
 * invalidates everything in flight and waits for it.
 *
 * Open issues: the LOCAL_INV completion releases the pages without looking
 * at the status, revoking a message that was already sent leaves its rkey
 * valid, closing the connection unmaps right after posting unsignaled
 * LOCAL_INVs, a short ib_map_mr_sg() loses the pool MR, and standalone ACKs
 * are never signaled.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-rkey-reuse,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad -- not reviewed in this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define RBM_MAX_PAGES		64
#define RBM_SIGNAL_EVERY	16
#define RBM_FRONT_MAX		4096
#define RBM_ACK_BUDGET		8

enum { RBM_MSG_DATA = 1, RBM_MSG_ACK = 2, RBM_MSG_RESET = 3 };

struct rbm_hdr {
	__le64	seq;
	__le64	ack_seq;
	__le32	type;
	__le32	front_len;
	__le64	data_addr;
	__le32	data_rkey;
	__le32	data_len;
};

struct rbm_con;

struct rbm_msg {
	struct list_head	list_head;
	struct rbm_con		*con;
	atomic_t		ref;
	u64			seq;
	void			*front;
	u32			front_len;
	struct page		**pages;
	int			nr_pages;

	struct scatterlist	sgl[RBM_MAX_PAGES];
	int			nents;
	struct ib_mr		*mr;
	bool			remote_inv;
	bool			inv_failed;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
};

struct rbm_tx {
	struct ib_cqe		cqe;
	struct ib_sge		sge;
	struct ib_send_wr	wr;
	void			*buf;
	u64			dma;
};

struct rbm_con {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;

	spinlock_t		lock;
	struct list_head	out_sent;
	struct list_head	stale;		/* key state unknown, freed with the QP */
	u64			out_seq;

	struct rbm_tx		*tx_ring;
	unsigned int		tx_depth;
	unsigned int		tx_head;
	unsigned int		sends_since_signal;
	unsigned int		ack_budget;

	atomic_t		inv_pending;
	wait_queue_head_t	inv_wq;
	bool			closing;
};

void rbm_msg_free(struct rbm_msg *msg);		/* pages, front, struct */
void rbm_con_fault(struct rbm_con *con);	/* schedules a reconnect */

static void rbm_msg_put(struct rbm_msg *msg)
{
	if (atomic_dec_and_test(&msg->ref))
		rbm_msg_free(msg);
}

static void rbm_msg_release_data(struct rbm_con *con, struct rbm_msg *msg)
{
	if (msg->mr) {
		ib_mr_pool_put(con->qp, &con->qp->rdma_mrs, msg->mr);
		msg->mr = NULL;
	}
	if (msg->nents) {
		ib_dma_unmap_sg(con->dev, msg->sgl, msg->nr_pages, DMA_TO_DEVICE);
		msg->nents = 0;
	}
}

static int rbm_prepare_data(struct rbm_con *con, struct rbm_msg *msg,
			    struct rbm_hdr *hdr)
{
	struct ib_mr *mr;
	int i, count, n;

	if (!msg->nr_pages)
		return 0;

	sg_init_table(msg->sgl, msg->nr_pages);
	for (i = 0; i < msg->nr_pages; i++)
		sg_set_page(&msg->sgl[i], msg->pages[i], PAGE_SIZE, 0);
	count = ib_dma_map_sg(con->dev, msg->sgl, msg->nr_pages, DMA_TO_DEVICE);
	if (!count)
		return -ENOMEM;

	mr = ib_mr_pool_get(con->qp, &con->qp->rdma_mrs);
	if (!mr) {
		ib_dma_unmap_sg(con->dev, msg->sgl, msg->nr_pages, DMA_TO_DEVICE);
		return -EAGAIN; /* OK: rdma-mr-leak -- the pool was empty */
	}
	n = ib_map_mr_sg(mr, msg->sgl, count, NULL, PAGE_SIZE);
	if (n < count) {
		pr_err("rbm: mapped %d of %d data segments\n", n, count);
		ib_dma_unmap_sg(con->dev, msg->sgl, msg->nr_pages, DMA_TO_DEVICE);
		return -EIO; /* BUG: rdma-mr-leak -- mr from ib_mr_pool_get() is never put back */
	}
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	msg->mr = mr;
	msg->nents = count;

	memset(&msg->reg_wr, 0, sizeof(msg->reg_wr));
	msg->reg_wr.wr.opcode = IB_WR_REG_MR;
	msg->reg_wr.mr = mr;
	msg->reg_wr.key = mr->rkey;
	msg->reg_wr.access = IB_ACCESS_REMOTE_READ;

	hdr->data_addr = cpu_to_le64(mr->iova);
	hdr->data_rkey = cpu_to_le32(mr->rkey);
	hdr->data_len = cpu_to_le32((u32)mr->length);
	return 1;
}

static void rbm_tx_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rbm: send failed: %s\n", ib_wc_status_msg(wc->status));
}

int rbm_write_msg(struct rbm_con *con, struct rbm_msg *msg)
{
	struct rbm_tx *tx = &con->tx_ring[con->tx_head % con->tx_depth];
	struct rbm_hdr *hdr = tx->buf;
	struct ib_send_wr *first;
	int ret;

	memset(hdr, 0, sizeof(*hdr));
	msg->con = con;
	msg->seq = ++con->out_seq;
	hdr->seq = cpu_to_le64(msg->seq);
	hdr->type = cpu_to_le32(RBM_MSG_DATA);
	hdr->front_len = cpu_to_le32(msg->front_len);
	memcpy(hdr + 1, msg->front, msg->front_len);

	ret = rbm_prepare_data(con, msg, hdr);
	if (ret < 0)
		return ret;

	tx->cqe.done = rbm_tx_done;
	tx->sge.addr = tx->dma;
	tx->sge.length = sizeof(*hdr) + msg->front_len;
	tx->sge.lkey = con->pd->local_dma_lkey;
	memset(&tx->wr, 0, sizeof(tx->wr));
	tx->wr.wr_cqe = &tx->cqe;
	tx->wr.opcode = IB_WR_SEND;
	tx->wr.sg_list = &tx->sge;
	tx->wr.num_sge = 1;
	if (++con->sends_since_signal >= RBM_SIGNAL_EVERY) {
		tx->wr.send_flags = IB_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- the counter goes up on every send and is reset here */
		con->sends_since_signal = 0;
	}

	first = &tx->wr;
	if (msg->mr) {
		msg->reg_wr.wr.wr_cqe = &tx->cqe;
		msg->reg_wr.wr.next = &tx->wr;
		first = &msg->reg_wr.wr;
	}
	ret = ib_post_send(con->qp, first, NULL);
	if (ret) {
		rbm_msg_release_data(con, msg); /* OK: rdma-invalidation-leak -- the post failed, the rkey never reached the peer */
		return ret;
	}
	con->tx_head++;

	atomic_inc(&msg->ref);
	spin_lock(&con->lock);
	list_add_tail(&msg->list_head, &con->out_sent);
	spin_unlock(&con->lock);
	return 0;
}

/* Standalone ACK, sent when no outgoing message can piggyback it. */
int rbm_send_ack(struct rbm_con *con, u64 seq)
{
	struct rbm_tx *tx = &con->tx_ring[con->tx_head++ % con->tx_depth];
	struct rbm_hdr *hdr = tx->buf;

	memset(hdr, 0, sizeof(*hdr));
	hdr->type = cpu_to_le32(RBM_MSG_ACK);
	hdr->ack_seq = cpu_to_le64(seq);

	tx->cqe.done = rbm_tx_done;
	tx->sge.addr = tx->dma;
	tx->sge.length = sizeof(*hdr);
	tx->sge.lkey = con->pd->local_dma_lkey;
	memset(&tx->wr, 0, sizeof(tx->wr));
	tx->wr.wr_cqe = &tx->cqe;
	tx->wr.opcode = IB_WR_SEND;
	tx->wr.sg_list = &tx->sge;
	tx->wr.num_sge = 1;
	if (!con->ack_budget) { /* BUG(file): rdma-unsignaled-send-starvation -- ack_budget is loaded at setup and reloaded here but never counted down, so standalone ACKs are never signaled */
		tx->wr.send_flags = IB_SEND_SIGNALED;
		con->ack_budget = RBM_ACK_BUDGET;
	}
	return ib_post_send(con->qp, &tx->wr, NULL);
}

static void rbm_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbm_msg *msg = container_of(wc->wr_cqe, struct rbm_msg, inv_cqe);
	struct rbm_con *con = msg->con;

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rbm: LOCAL_INV of seq %llu failed: %s\n", msg->seq,
		       ib_wc_status_msg(wc->status));
	rbm_msg_release_data(con, msg); /* BUG: rdma-invalidation-leak -- released whatever the status: a failed or flushed LOCAL_INV leaves the rkey valid */
	rbm_msg_put(msg);
}

static int rbm_post_inv(struct rbm_con *con, struct rbm_msg *msg)
{
	memset(&msg->inv_wr, 0, sizeof(msg->inv_wr));
	msg->inv_cqe.done = rbm_inv_done;
	msg->inv_wr.wr_cqe = &msg->inv_cqe;
	msg->inv_wr.opcode = IB_WR_LOCAL_INV;
	msg->inv_wr.send_flags = IB_SEND_SIGNALED;
	msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
	return ib_post_send(con->qp, &msg->inv_wr, NULL);
}

static struct rbm_msg *rbm_find_sent_by_rkey(struct rbm_con *con, u32 rkey)
{
	struct rbm_msg *msg;

	list_for_each_entry(msg, &con->out_sent, list_head)
		if (msg->mr && msg->mr->rkey == rkey)
			return msg;
	return NULL;
}

static void rbm_handle_ack(struct rbm_con *con, u64 ack_seq)
{
	struct rbm_msg *msg, *tmp;
	LIST_HEAD(acked);

	spin_lock(&con->lock);
	list_for_each_entry_safe(msg, tmp, &con->out_sent, list_head) {
		if (msg->seq > ack_seq)
			break;
		list_move_tail(&msg->list_head, &acked);
	}
	spin_unlock(&con->lock);

	list_for_each_entry_safe(msg, tmp, &acked, list_head) {
		list_del_init(&msg->list_head);
		if (!msg->mr) {
			rbm_msg_put(msg);
			continue;
		}
		if (msg->remote_inv) {
			rbm_msg_release_data(con, msg); /* OK: rdma-invalidation-leak -- the peer invalidated this very rkey (matched in rbm_recv_ack) */
			rbm_msg_put(msg);
			continue;
		}
		if (rbm_post_inv(con, msg)) {
			pr_err("rbm: cannot post LOCAL_INV for seq %llu\n", msg->seq);
			spin_lock(&con->lock);
			list_add_tail(&msg->list_head, &con->stale);
			spin_unlock(&con->lock);
			rbm_con_fault(con);
		}
	}
}

void rbm_recv_ack(struct rbm_con *con, struct ib_wc *wc, struct rbm_hdr *hdr)
{
	struct rbm_msg *msg;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is looked up among the sent messages' keys */
		spin_lock(&con->lock);
		msg = rbm_find_sent_by_rkey(con, wc->ex.invalidate_rkey);
		if (msg)
			msg->remote_inv = true;
		spin_unlock(&con->lock);
		if (!msg) {
			pr_err("rbm: peer invalidated unknown rkey %#x\n",
			       wc->ex.invalidate_rkey);
			rbm_con_fault(con);
			return;
		}
	}
	rbm_handle_ack(con, le64_to_cpu(hdr->ack_seq));
}

/* The upper layer cancels a message it no longer needs (request timeout). */
void rbm_msg_revoke(struct rbm_con *con, struct rbm_msg *msg)
{
	spin_lock(&con->lock);
	if (list_empty(&msg->list_head)) {
		spin_unlock(&con->lock);
		return;
	}
	list_del_init(&msg->list_head);
	spin_unlock(&con->lock);

	rbm_msg_release_data(con, msg); /* BUG: rdma-invalidation-leak -- a sent message's rkey is still valid; the peer can keep reading pages the caller reuses */
	rbm_msg_put(msg);
}

static void rbm_inv_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbm_msg *msg = container_of(wc->wr_cqe, struct rbm_msg, inv_cqe);
	struct rbm_con *con = msg->con;

	if (wc->status != IB_WC_SUCCESS)
		msg->inv_failed = true;
	if (atomic_dec_and_test(&con->inv_pending))
		wake_up(&con->inv_wq);
}

/* The peer restarted its session: kill every key it may still hold. */
void rbm_reset_session(struct rbm_con *con)
{
	struct rbm_msg *msg, *tmp;
	LIST_HEAD(batch);

	spin_lock(&con->lock);
	list_splice_init(&con->out_sent, &batch);
	spin_unlock(&con->lock);

	atomic_set(&con->inv_pending, 1);
	list_for_each_entry(msg, &batch, list_head) {
		if (!msg->mr)
			continue;
		memset(&msg->inv_wr, 0, sizeof(msg->inv_wr));
		msg->inv_cqe.done = rbm_inv_sync_done;
		msg->inv_wr.wr_cqe = &msg->inv_cqe;
		msg->inv_wr.opcode = IB_WR_LOCAL_INV;
		msg->inv_wr.send_flags = IB_SEND_SIGNALED;
		msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
		atomic_inc(&con->inv_pending);
		if (ib_post_send(con->qp, &msg->inv_wr, NULL)) {
			atomic_dec(&con->inv_pending);
			msg->inv_failed = true;
		}
	}
	if (!atomic_dec_and_test(&con->inv_pending))
		wait_event(con->inv_wq, atomic_read(&con->inv_pending) == 0);

	list_for_each_entry_safe(msg, tmp, &batch, list_head) {
		list_del_init(&msg->list_head);
		if (msg->inv_failed) {
			spin_lock(&con->lock);
			list_add_tail(&msg->list_head, &con->stale);
			spin_unlock(&con->lock);
			continue;
		}
		rbm_msg_release_data(con, msg); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV was signaled and waited for; failed ones were parked above */
		rbm_msg_put(msg);
	}
	con->out_seq = 0;
}

/* Orderly shutdown requested by the local side. */
void rbm_con_close(struct rbm_con *con)
{
	struct rbm_msg *msg, *tmp;

	con->closing = true;
	list_for_each_entry_safe(msg, tmp, &con->out_sent, list_head) {
		list_del_init(&msg->list_head);
		if (msg->mr) {
			/* no completion needed, the connection goes away */
			memset(&msg->inv_wr, 0, sizeof(msg->inv_wr));
			msg->inv_wr.opcode = IB_WR_LOCAL_INV;
			msg->inv_wr.send_flags = 0;
			msg->inv_wr.ex.invalidate_rkey = msg->mr->rkey;
			ib_post_send(con->qp, &msg->inv_wr, NULL);
			rbm_msg_release_data(con, msg); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed; the pages are unmapped and freed below */
		}
		rbm_msg_put(msg);
	}
	rdma_disconnect(con->cm_id);
	ib_drain_qp(con->qp);
}

int rbm_con_create_qp(struct rbm_con *con, unsigned int depth)
{
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = con;
	attr.send_cq = con->cq;
	attr.recv_cq = con->cq;
	attr.cap.max_send_wr = 3 * depth + 1;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(con->cm_id, con->pd, &attr);
	if (ret)
		return ret;
	con->qp = con->cm_id->qp;

	ret = ib_mr_pool_init(con->qp, &con->qp->rdma_mrs, depth,
			      IB_MR_TYPE_MEM_REG, RBM_MAX_PAGES, 0);
	if (ret) {
		rdma_destroy_qp(con->cm_id);
		con->qp = NULL;
		return ret;
	}

	spin_lock_init(&con->lock);
	INIT_LIST_HEAD(&con->out_sent);
	INIT_LIST_HEAD(&con->stale);
	init_waitqueue_head(&con->inv_wq);
	con->sends_since_signal = 0;
	con->ack_budget = RBM_ACK_BUDGET;
	return 0;
}

MODULE_DESCRIPTION("RDMA messenger with per-message page registration");
MODULE_LICENSE("GPL");
