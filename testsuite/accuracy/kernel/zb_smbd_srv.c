// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * zb_smbd_srv.c - SMB Direct (MS-SMBD) transport of an in-kernel SMB3 server.
 *
 * One RC QP per client. Messages are SENDs from a pool of send messages
 * limited by the send credits the client grants; bulk data of SMB2 READ and
 * WRITE requests with an RDMA channel moves with the rdma_rw API against the
 * buffer descriptors the client put in the request. The QP declares
 * cap.max_rdma_ctxs for the rw contexts; max_send_wr additionally budgets
 * the R/W work requests by hand (a belt-and-braces habit inherited from the
 * pre-rw code), which over-provisions but is harmless.
 *
 * Data transfer messages are posted in batches with only the last SEND
 * signaled. Idle-time credit-update messages come from a small control ring
 * and were meant to be signaled every SMBD_CTRL_SIGNAL_BATCH posts, but the
 * counter is never advanced. Single small descriptors (<= 256 bytes) skip
 * the rw context and are read straight into a bounce buffer addressed with
 * the PD's local DMA lkey, which cannot work as an RDMA READ sink on iWARP.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed for this file
 */

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define SMBD_MAX_SEND_SGES	6	/* smbd hdr, smb2 transform, smb2 hdr, 3 payload */
#define SMBD_MAX_RECV_SGES	1
#define SMBD_CTRL_RING		16
#define SMBD_CTRL_SIGNAL_BATCH	8
#define SMBD_WRS_PER_RW_CREDIT	4	/* REG_MR, READ/WRITE, LOCAL_INV, slack */
#define SMBD_SMALL_READ_MAX	256

#ifndef cpu_to_le16
#define cpu_to_le16(x)	((__le16)(u16)(x))
#endif

static int smbd_send_credit_target = 255;
static int smbd_recv_credit_max = 255;
static int smbd_max_rw_size = 8 * 1024 * 1024;
static int smbd_max_recv_size = 8192;

struct smbd_data_transfer {
	__le16 credits_requested;
	__le16 credits_granted;
	__le16 flags;
	__le16 reserved;
	__le32 remaining_data_length;
	__le32 data_offset;
	__le32 data_length;
	__le32 padding;
};

struct smbd_buffer_desc_v1 {
	__le64 offset;
	__le32 token;
	__le32 length;
};

struct smbd_t;

struct smbd_sendmsg {
	struct smbd_t		*t;
	struct list_head	list;
	int			num_sge;
	struct ib_sge		sge[SMBD_MAX_SEND_SGES];
	struct ib_send_wr	wr;
	struct ib_cqe		cqe;
	u8			packet[sizeof(struct smbd_data_transfer)];
};

struct smbd_rw_msg {
	struct smbd_t		*t;
	struct ib_cqe		cqe;
	struct completion	*done;
	int			status;
	enum dma_data_direction	dir;
	struct rdma_rw_ctx	rw_ctx;
	struct sg_table		sgt;
};

struct smbd_t {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	u32			port;

	int			max_rw_credits;
	int			pages_per_rw_credit;
	int			max_rdma_rw_size;
	atomic_t		send_credits;
	atomic_t		rw_credits;
	atomic_t		send_pending;
	wait_queue_head_t	wait_send_credits;
	wait_queue_head_t	wait_rw_credits;
	wait_queue_head_t	wait_send_pending;
	u16			new_credits;

	struct smbd_sendmsg	*ctrl[SMBD_CTRL_RING];
	unsigned int		ctrl_next;
	unsigned int		ctrl_unsignaled;

	void			*small_buf;
	u64			small_dma;
	struct ib_rdma_wr	small_rd;
	struct ib_sge		small_sge;
	struct ib_cqe		small_cqe;
	struct completion	small_done;
	int			small_status;
};

static void smbd_send_done(struct ib_cq *cq, struct ib_wc *wc);

static int smbd_init_params(struct smbd_t *t, struct ib_qp_cap *cap)
{
	struct ib_device *device = t->cm_id->device;
	int max_send_wrs, max_rw_wrs;

	t->max_rdma_rw_size = smbd_max_rw_size;
	t->pages_per_rw_credit = min_t(int, device->attrs.max_fast_reg_page_list_len, 256);
	t->max_rw_credits = DIV_ROUND_UP(t->max_rdma_rw_size,
					 (t->pages_per_rw_credit - 1) * PAGE_SIZE);

	if (device->attrs.max_send_sge < SMBD_MAX_SEND_SGES) {
		pr_err("smbd: %s supports %d send sges, need %d\n", device->name,
		       device->attrs.max_send_sge, SMBD_MAX_SEND_SGES);
		return -EOPNOTSUPP;
	}

	max_rw_wrs = t->max_rw_credits * SMBD_WRS_PER_RW_CREDIT;
	max_send_wrs = smbd_send_credit_target + max_rw_wrs;
	if (max_send_wrs > device->attrs.max_cqe ||
	    max_send_wrs > device->attrs.max_qp_wr) {
		pr_err("smbd: send queue of %d exceeds device limits (cqe %d, qp_wr %d)\n",
		       max_send_wrs, device->attrs.max_cqe, device->attrs.max_qp_wr);
		return -EINVAL;
	}

	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- cap.max_rdma_ctxs is declared below, the core grows this for the rw contexts */
	cap->max_send_wr = max_send_wrs;
	cap->max_recv_wr = smbd_recv_credit_max;
	cap->max_send_sge = SMBD_MAX_SEND_SGES;	/* OK: rdma-queue-cap-unchecked -- compared with attrs.max_send_sge above */
	cap->max_recv_sge = SMBD_MAX_RECV_SGES;
	cap->max_inline_data = 0;
	cap->max_rdma_ctxs = t->max_rw_credits;
	return 0;
}

static int smbd_create_qpair(struct smbd_t *t)
{
	struct ib_qp_init_attr qp_attr;
	struct ib_qp_cap cap;
	int ret, scqe;

	ret = smbd_init_params(t, &cap);
	if (ret)
		return ret;

	t->pd = ib_alloc_pd(t->cm_id->device, 0);
	if (IS_ERR(t->pd)) {
		ret = PTR_ERR(t->pd);
		t->pd = NULL;
		return ret;
	}

	scqe = cap.max_send_wr +
	       rdma_rw_max_send_wr(t->cm_id->device, t->cm_id->port_num,
				   cap.max_rdma_ctxs, 0);
	t->send_cq = ib_alloc_cq(t->cm_id->device, t, scqe, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(t->send_cq)) {
		ret = PTR_ERR(t->send_cq);
		goto err_pd;
	}
	t->recv_cq = ib_alloc_cq(t->cm_id->device, t, cap.max_recv_wr, 0,
				 IB_POLL_WORKQUEUE);
	if (IS_ERR(t->recv_cq)) {
		ret = PTR_ERR(t->recv_cq);
		goto err_scq;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = t;
	qp_attr.cap = cap;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.send_cq = t->send_cq;
	qp_attr.recv_cq = t->recv_cq;
	qp_attr.port_num = t->cm_id->port_num;

	ret = rdma_create_qp(t->cm_id, t->pd, &qp_attr);
	if (ret) {
		pr_err("smbd: rdma_create_qp failed %d\n", ret);
		goto err_rcq;
	}
	t->qp = t->cm_id->qp;
	t->port = t->cm_id->port_num;
	return 0;

err_rcq:
	ib_free_cq(t->recv_cq);
err_scq:
	ib_free_cq(t->send_cq);
err_pd:
	ib_dealloc_pd(t->pd);
	t->pd = NULL;
	return ret;
}

static void smbd_fill_hdr(struct smbd_t *t, struct smbd_sendmsg *msg, u32 len,
			  u32 remaining)
{
	struct smbd_data_transfer *hdr = (void *)msg->packet;

	hdr->credits_requested = cpu_to_le16(smbd_send_credit_target);
	hdr->credits_granted = cpu_to_le16(t->new_credits);
	t->new_credits = 0;
	hdr->flags = 0;
	hdr->remaining_data_length = cpu_to_le32(remaining);
	hdr->data_offset = cpu_to_le32(len ? 24 : 0);
	hdr->data_length = cpu_to_le32(len);

	ib_dma_sync_single_for_device(t->cm_id->device, msg->sge[0].addr,
				      sizeof(*hdr), DMA_TO_DEVICE);
	msg->num_sge = 1;
}

/*
 * Post a list of data transfer messages as one chain. Only the last SEND
 * asks for a completion; smbd_send_done() retires the whole batch, which
 * hangs off the last message.
 */
int smbd_post_send_batch(struct smbd_t *t, struct list_head *batch,
				int count)
{
	struct smbd_sendmsg *msg, *first = NULL, *last = NULL;
	int ret;

	if (!count)
		return 0;

	wait_event(t->wait_send_credits, atomic_read(&t->send_credits) >= count);
	atomic_sub(count, &t->send_credits);

	list_for_each_entry(msg, batch, list) {
		msg->cqe.done = smbd_send_done;
		msg->wr.wr_cqe = &msg->cqe;
		msg->wr.opcode = IB_WR_SEND;
		msg->wr.sg_list = msg->sge;
		msg->wr.num_sge = msg->num_sge;
		msg->wr.send_flags = 0;
		msg->wr.next = NULL;
		if (last)
			last->wr.next = &msg->wr;
		else
			first = msg;
		last = msg;
	}
	last->wr.send_flags = IB_SEND_SIGNALED;	/* OK: rdma-unsignaled-send-starvation -- every batch ends with a signaled SEND */

	atomic_inc(&t->send_pending);
	ret = ib_post_send(t->qp, &first->wr, NULL);
	if (ret) {
		pr_err("smbd: post send batch failed %d\n", ret);
		atomic_add(count, &t->send_credits);
		if (atomic_dec_and_test(&t->send_pending))
			wake_up(&t->wait_send_pending);
		rdma_disconnect(t->cm_id);
	}
	return ret;
}

/*
 * Grant new receive credits when the server has nothing else to send. The
 * control messages are recycled round robin from t->ctrl[].
 */
static int smbd_post_credit_update(struct smbd_t *t)
{
	struct smbd_sendmsg *msg;
	int ret;

	msg = t->ctrl[t->ctrl_next++ % SMBD_CTRL_RING];
	smbd_fill_hdr(t, msg, 0, 0);

	msg->wr.next = NULL;
	msg->wr.wr_cqe = &msg->cqe;
	msg->wr.opcode = IB_WR_SEND;
	msg->wr.sg_list = msg->sge;
	msg->wr.num_sge = msg->num_sge;
	msg->wr.send_flags = 0;
	/* BUG: rdma-unsignaled-send-starvation -- ctrl_unsignaled is only ever reset, nothing counts the unsignaled posts, so this branch never runs */
	if (t->ctrl_unsignaled >= SMBD_CTRL_SIGNAL_BATCH) {
		msg->wr.send_flags = IB_SEND_SIGNALED;
		t->ctrl_unsignaled = 0;
	}

	ret = ib_post_send(t->qp, &msg->wr, NULL);
	if (ret)
		pr_err("smbd: credit update failed %d\n", ret);
	return ret;
}

static void smbd_rw_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_rw_msg *msg = container_of(wc->wr_cqe, struct smbd_rw_msg, cqe);

	msg->status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("smbd: rdma rw failed: %s\n", ib_wc_status_msg(wc->status));
	complete(msg->done);
}

static void smbd_small_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_t *t = container_of(wc->wr_cqe, struct smbd_t, small_cqe);

	t->small_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&t->small_done);
}

/* READ a single short client buffer without setting up an rw context. */
static int smbd_small_read(struct smbd_t *t, void *buf,
			   struct smbd_buffer_desc_v1 *desc)
{
	u32 len = le32_to_cpu(desc->length);
	int ret;

	t->small_sge.addr = t->small_dma;
	t->small_sge.length = len;
	t->small_sge.lkey = t->pd->local_dma_lkey;

	memset(&t->small_rd, 0, sizeof(t->small_rd));
	t->small_cqe.done = smbd_small_done;
	t->small_rd.wr.wr_cqe = &t->small_cqe;
	t->small_rd.wr.opcode = IB_WR_RDMA_READ;
	t->small_rd.wr.sg_list = &t->small_sge;
	t->small_rd.wr.num_sge = 1;
	t->small_rd.wr.send_flags = IB_SEND_SIGNALED;
	t->small_rd.remote_addr = le64_to_cpu(desc->offset);
	t->small_rd.rkey = le32_to_cpu(desc->token);

	reinit_completion(&t->small_done);
	/* BUG: rdma-access-flags-transport -- the READ sink is addressed with pd->local_dma_lkey, which carries no remote write on iWARP */
	ret = ib_post_send(t->qp, &t->small_rd.wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&t->small_done);
	if (t->small_status)
		return t->small_status;

	ib_dma_sync_single_for_cpu(t->cm_id->device, t->small_dma, len,
				   DMA_FROM_DEVICE);
	memcpy(buf, t->small_buf, len);
	return 0;
}

/*
 * Move data between a server buffer (already described by an sg_table) and
 * the client buffers named by desc[]. is_read: RDMA READ from the client
 * (SMB2 WRITE), else RDMA WRITE to it (SMB2 READ response).
 */
int smbd_rdma_xmit(struct smbd_t *t, void *buf, struct sg_table *sgt,
			  struct smbd_buffer_desc_v1 *desc, int ndesc,
			  bool is_read)
{
	struct completion done;
	struct smbd_rw_msg *msgs;
	struct ib_send_wr *first_wr = NULL;
	enum dma_data_direction dir = is_read ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	int credits = 0, i, ret;

	if (ndesc == 1 && is_read &&
	    le32_to_cpu(desc[0].length) <= SMBD_SMALL_READ_MAX)
		return smbd_small_read(t, buf, &desc[0]);

	for (i = 0; i < ndesc; i++)
		credits += DIV_ROUND_UP(le32_to_cpu(desc[i].length),
					t->max_rdma_rw_size / t->max_rw_credits);

	wait_event(t->wait_rw_credits, atomic_read(&t->rw_credits) >= credits);
	atomic_sub(credits, &t->rw_credits);

	msgs = kcalloc(ndesc, sizeof(*msgs), GFP_KERNEL);
	if (!msgs) {
		ret = -ENOMEM;
		goto out_credits;
	}

	init_completion(&done);
	for (i = ndesc - 1; i >= 0; i--) {
		struct smbd_rw_msg *m = &msgs[i];

		m->t = t;
		m->dir = dir;
		m->done = &done;
		m->cqe.done = smbd_rw_done;
		m->sgt = *sgt;
		/* OK: rdma-local-mr-management, rdma-access-flags-transport -- rdma_rw registers (and on iWARP grants the READ sink remote write) itself */
		ret = rdma_rw_ctx_init(&m->rw_ctx, t->qp, t->port, m->sgt.sgl,
				       m->sgt.nents, 0,
				       le64_to_cpu(desc[i].offset),
				       le32_to_cpu(desc[i].token), dir);
		if (ret < 0) {
			pr_err("smbd: rdma_rw_ctx_init failed %d\n", ret);
			goto out_destroy;
		}
		first_wr = rdma_rw_ctx_wrs(&m->rw_ctx, t->qp, t->port,
					   i == ndesc - 1 ? &m->cqe : NULL,
					   first_wr);
	}

	/* OK: rdma-unsignaled-send-starvation -- rdma_rw_ctx_wrs() signals the last WR of the chain (the cqe was passed for it) */
	ret = ib_post_send(t->qp, first_wr, NULL);
	if (ret) {
		pr_err("smbd: post rdma rw failed %d\n", ret);
		i = -1;
		goto out_destroy;
	}
	wait_for_completion(&done);
	ret = msgs[ndesc - 1].status;
	i = -1;

out_destroy:
	for (i = i + 1; i < ndesc; i++)
		rdma_rw_ctx_destroy(&msgs[i].rw_ctx, t->qp, t->port,
				    msgs[i].sgt.sgl, msgs[i].sgt.nents, dir);
	kfree(msgs);
out_credits:
	atomic_add(credits, &t->rw_credits);
	wake_up(&t->wait_rw_credits);
	return ret;
}

static void smbd_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct smbd_sendmsg *msg = container_of(wc->wr_cqe, struct smbd_sendmsg, cqe);
	struct smbd_t *t = msg->t;

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR) {
		pr_err("smbd: send failed: %s\n", ib_wc_status_msg(wc->status));
		rdma_disconnect(t->cm_id);
	}
	if (atomic_dec_and_test(&t->send_pending))
		wake_up(&t->wait_send_pending);
}

static void smbd_free_transport(struct smbd_t *t)
{
	int i;

	if (t->qp) {
		ib_drain_qp(t->qp);
		rdma_destroy_qp(t->cm_id);
		t->qp = NULL;
	}
	for (i = 0; i < SMBD_CTRL_RING; i++) {
		if (!t->ctrl[i])
			continue;
		if (t->ctrl[i]->sge[0].addr)
			ib_dma_unmap_single(t->cm_id->device,
					    t->ctrl[i]->sge[0].addr,
					    sizeof(t->ctrl[i]->packet),
					    DMA_TO_DEVICE);
		kfree(t->ctrl[i]);
	}
	if (t->small_buf) {
		ib_dma_unmap_single(t->cm_id->device, t->small_dma,
				    SMBD_SMALL_READ_MAX, DMA_FROM_DEVICE);
		kfree(t->small_buf);
	}
	if (t->recv_cq)
		ib_free_cq(t->recv_cq);
	if (t->send_cq)
		ib_free_cq(t->send_cq);
	if (t->pd)
		ib_dealloc_pd(t->pd);
	rdma_destroy_id(t->cm_id);
	kfree(t);
}

static struct smbd_t *smbd_alloc_transport(struct rdma_cm_id *cm_id)
{
	struct smbd_t *t;
	int i;

	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return NULL;
	t->cm_id = cm_id;
	cm_id->context = t;
	atomic_set(&t->send_credits, 0);
	atomic_set(&t->send_pending, 0);
	init_waitqueue_head(&t->wait_send_credits);
	init_waitqueue_head(&t->wait_rw_credits);
	init_waitqueue_head(&t->wait_send_pending);
	init_completion(&t->small_done);

	if (smbd_create_qpair(t))
		goto err;
	atomic_set(&t->rw_credits, t->max_rw_credits);

	for (i = 0; i < SMBD_CTRL_RING; i++) {
		t->ctrl[i] = kzalloc(sizeof(*t->ctrl[i]), GFP_KERNEL);
		if (!t->ctrl[i])
			goto err;
		t->ctrl[i]->t = t;
		t->ctrl[i]->cqe.done = smbd_send_done;
		t->ctrl[i]->sge[0].addr =
			ib_dma_map_single(cm_id->device, t->ctrl[i]->packet,
					  sizeof(t->ctrl[i]->packet),
					  DMA_TO_DEVICE);
		t->ctrl[i]->sge[0].length = sizeof(t->ctrl[i]->packet);
		t->ctrl[i]->sge[0].lkey = t->pd->local_dma_lkey;
	}
	t->ctrl_unsignaled = 0;

	t->small_buf = kmalloc(SMBD_SMALL_READ_MAX, GFP_KERNEL);
	if (!t->small_buf)
		goto err;
	t->small_dma = ib_dma_map_single(cm_id->device, t->small_buf,
					 SMBD_SMALL_READ_MAX, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(cm_id->device, t->small_dma)) {
		kfree(t->small_buf);
		t->small_buf = NULL;
		goto err;
	}
	return t;
err:
	smbd_free_transport(t);
	return NULL;
}

int smbd_handle_connect_request(struct rdma_cm_id *cm_id)
{
	struct smbd_t *t;

	if (smbd_max_recv_size < 128)
		return -EINVAL;
	t = smbd_alloc_transport(cm_id);
	if (!t)
		return -ENOMEM;
	return smbd_post_credit_update(t);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("SMB Direct server transport");
