// SPDX-License-Identifier: GPL-2.0
/*
 * kwt -- block target for a small capsule protocol over RDMA (nvmet-rdma
 * shaped).
 *
 * One queue per host connection.  Commands arrive in receive buffers that
 * are mapped once at queue setup: the capsule plus KWT_INLINE_PAGES pages of
 * in-capsule data.  Command data moves with the core's rdma_rw API: the QP
 * declares cap.max_rdma_ctxs = depth * rdma_rw_mr_factor() and the core grows
 * (and clamps) the send queue for its REG_MR/LOCAL_INV work requests; the
 * target's own max_send_wr only covers response SENDs and event notices.
 * Host writes of one page or less skip rdma_rw and are pulled with a plain
 * RDMA READ into the command's in-capsule page.
 *
 * Correct here: the rdma_rw sizing and READ sinks, SQ credits taken from the
 * granted max_send_wr, every response SEND signaled.  Not correct: the
 * one-page pull uses the PD's local_dma_lkey as its READ sink (an iWARP
 * device cannot place the READ response there), the receive SGE count is
 * never compared with the device, and the notice batching counter is reset
 * but never advanced, so notices never ask for a completion.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed in this module
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

#define KWT_MAX_QD		1024
#define KWT_SQ_PER_CMD		2	/* response SEND, plus room for a notice */
#define KWT_INLINE_PAGES	8
#define KWT_MAX_IO_PAGES	256
#define KWT_IWARP_MAX_PAGES	64
#define KWT_NR_NOTICES		16
#define KWT_NOTICE_SIG_EVERY	8

#define KWT_SC_SUCCESS		0x0000
#define KWT_SC_INTERNAL		0x0006
#define KWT_SC_BUSY		0x0082
#define KWT_SC_XFER_ERR		0x0004

enum kwt_opcode {
	KWT_OP_FLUSH	= 0x00,
	KWT_OP_WRITE	= 0x01,
	KWT_OP_READ	= 0x02,
};

#define KWT_F_INCAPSULE		0x01

struct kwt_capsule {
	u8	opcode;
	u8	flags;
	__le16	cid;
	__le32	nsid;
	__le64	slba;
	__le64	raddr;
	__le32	length;
	__le32	rkey;
	u8	rsvd[32];
};

struct kwt_rsp {
	__le16	cid;
	__le16	sqhd;
	__le32	status;
	__le64	result;
};

struct kwt_notice_msg {
	__le32	event;
	__le32	info;
};

struct kwt_queue;

struct kwt_cmd {
	struct kwt_queue	*queue;
	struct list_head	wait_entry;

	struct kwt_capsule	*capsule;
	u64			capsule_dma;
	void			*inline_buf;
	u64			inline_dma;
	struct ib_cqe		recv_cqe;
	struct ib_recv_wr	recv_wr;
	struct ib_sge		recv_sge[1 + KWT_INLINE_PAGES];

	struct kwt_rsp		*rsp;
	u64			rsp_dma;
	struct ib_cqe		send_cqe;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;

	/* one-page host writes */
	struct ib_cqe		pull_cqe;
	struct ib_rdma_wr	pull_wr;
	struct ib_sge		pull_sge;

	struct ib_cqe		rw_cqe;
	struct rdma_rw_ctx	rw;
	struct scatterlist	*sgl;
	u32			sg_cnt;
	enum dma_data_direction	dir;
	int			n_rdma;
	bool			rw_active;
	u16			status;
};

struct kwt_notice {
	struct kwt_notice_msg	*msg;
	u64			dma;
	struct ib_sge		sge;
	struct ib_send_wr	wr;
	struct ib_cqe		cqe;
};

struct kwt_queue {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	u32			port;
	u32			recv_depth;
	u32			max_pages;

	struct kwt_cmd		*cmds;
	atomic_t		sq_wr_avail;
	spinlock_t		wait_lock;
	struct list_head	wait_list;

	spinlock_t		notice_lock;
	struct kwt_notice	notices[KWT_NR_NOTICES];
	unsigned int		notice_head;
	unsigned int		notices_unsignaled;
};

/* Backend, kwt_io.c */
int kwt_backend_alloc_sgl(struct kwt_cmd *cmd, u32 len);
void kwt_backend_free_sgl(struct kwt_cmd *cmd);
void kwt_backend_copy_in(struct kwt_cmd *cmd, const void *buf, u32 len);
void kwt_backend_submit(struct kwt_cmd *cmd);

static void kwt_recv_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwt_send_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwt_read_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwt_pull_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwt_notice_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwt_queue_response(struct kwt_cmd *cmd);

static void kwt_qp_event(struct ib_event *ev, void *ctx)
{
	pr_debug("kwt: qp event on queue %p\n", ctx);
}

static int kwt_create_qp(struct kwt_queue *q)
{
	struct ib_device *dev = q->dev;
	struct ib_qp_init_attr attr;
	unsigned int max_pages = KWT_MAX_IO_PAGES;
	unsigned int factor;
	int ret;

	/* some RNICs have short fast-reg lists; keep the MRs per I/O bounded */
	if (rdma_protocol_iwarp(dev, q->port))	// OK: rdma-access-flags-transport -- the test bounds the I/O size; it decides no access rights
		max_pages = min_t(u32, max_pages, KWT_IWARP_MAX_PAGES);
	q->max_pages = max_pages;
	factor = rdma_rw_mr_factor(dev, q->port, max_pages);

	memset(&attr, 0, sizeof(attr));
	attr.event_handler = kwt_qp_event;
	attr.qp_context = q;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.port_num = q->port;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-queue-cap-unchecked -- counts only the SENDs the target posts itself; the QP declares max_rdma_ctxs, so the core adds the rdma_rw share and clamps to max_qp_wr */
	attr.cap.max_send_wr = KWT_MAX_QD * KWT_SQ_PER_CMD + 1;
	attr.cap.max_rdma_ctxs = KWT_MAX_QD * factor;
	attr.cap.max_send_sge = 1;
	/* BUG: rdma-send-queue-undersized -- every command keeps a receive posted (recv_depth of them): the receive ib_drain_qp() posts finds no free entry */
	attr.cap.max_recv_wr = q->recv_depth;
	attr.cap.max_recv_sge = 1 + KWT_INLINE_PAGES;	// BUG: rdma-queue-cap-unchecked -- nine receive SGEs, never compared with dev->attrs.max_recv_sge

	ret = rdma_create_qp(q->cm_id, q->pd, &attr);
	if (ret) {
		pr_err("kwt: rdma_create_qp failed: %d\n", ret);
		return ret;
	}
	q->qp = q->cm_id->qp;
	/* the core has grown cap.max_send_wr by its own share */
	atomic_set(&q->sq_wr_avail, attr.cap.max_send_wr);
	return 0;
}

static int kwt_post_recv(struct kwt_queue *q, struct kwt_cmd *cmd)
{
	cmd->recv_cqe.done = kwt_recv_done;
	cmd->recv_wr.next = NULL;
	cmd->recv_wr.wr_cqe = &cmd->recv_cqe;
	cmd->recv_wr.sg_list = cmd->recv_sge;
	cmd->recv_wr.num_sge = 1 + KWT_INLINE_PAGES;
	ib_dma_sync_single_for_device(q->dev, cmd->capsule_dma,
				      sizeof(*cmd->capsule), DMA_FROM_DEVICE);
	return ib_post_recv(q->qp, &cmd->recv_wr, NULL);
}

static void kwt_release_rw(struct kwt_cmd *cmd)
{
	struct kwt_queue *q = cmd->queue;

	if (!cmd->rw_active)
		return;
	rdma_rw_ctx_destroy(&cmd->rw, q->qp, q->port, cmd->sgl, cmd->sg_cnt,
			    cmd->dir);
	cmd->rw_active = false;
	cmd->n_rdma = 0;
}

/* Host write larger than a page: pull it with rdma_rw. */
static int kwt_rdma_read(struct kwt_cmd *cmd)
{
	struct kwt_queue *q = cmd->queue;
	int ret;

	cmd->dir = DMA_FROM_DEVICE;
	/* OK: rdma-access-flags-transport -- rdma_rw registers the sink itself and gives it remote write where the transport needs it */
	ret = rdma_rw_ctx_init(&cmd->rw, q->qp, q->port, cmd->sgl, cmd->sg_cnt, 0,
			       le64_to_cpu(cmd->capsule->raddr),
			       le32_to_cpu(cmd->capsule->rkey), DMA_FROM_DEVICE);
	if (ret < 0)
		return ret;
	cmd->n_rdma = ret;
	cmd->rw_active = true;

	if (atomic_sub_return(cmd->n_rdma, &q->sq_wr_avail) < 0) {
		atomic_add(cmd->n_rdma, &q->sq_wr_avail);
		kwt_release_rw(cmd);
		return -EAGAIN;
	}

	cmd->rw_cqe.done = kwt_read_done;
	ret = rdma_rw_ctx_post(&cmd->rw, q->qp, q->port, &cmd->rw_cqe, NULL);
	if (ret) {
		atomic_add(cmd->n_rdma, &q->sq_wr_avail);
		kwt_release_rw(cmd);
	}
	return ret;
}

/* Host write of at most one page: one READ straight into the inline page. */
static int kwt_pull_one_page(struct kwt_cmd *cmd, u32 len)
{
	struct kwt_queue *q = cmd->queue;

	if (atomic_dec_return(&q->sq_wr_avail) < 0) {
		atomic_inc(&q->sq_wr_avail);
		return -EAGAIN;
	}

	cmd->pull_sge.addr = cmd->inline_dma;
	cmd->pull_sge.length = len;
	cmd->pull_sge.lkey = q->pd->local_dma_lkey;

	memset(&cmd->pull_wr, 0, sizeof(cmd->pull_wr));
	cmd->pull_cqe.done = kwt_pull_done;
	cmd->pull_wr.wr.opcode = IB_WR_RDMA_READ;	// BUG: rdma-access-flags-transport -- READ sink addressed with the PD's local_dma_lkey, which never has remote write; fails on iWARP
	cmd->pull_wr.wr.wr_cqe = &cmd->pull_cqe;
	cmd->pull_wr.wr.sg_list = &cmd->pull_sge;
	cmd->pull_wr.wr.num_sge = 1;
	cmd->pull_wr.wr.send_flags = IB_SEND_SIGNALED;
	cmd->pull_wr.remote_addr = le64_to_cpu(cmd->capsule->raddr);
	cmd->pull_wr.rkey = le32_to_cpu(cmd->capsule->rkey);

	return ib_post_send(q->qp, &cmd->pull_wr.wr, NULL);
}

static void kwt_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwt_cmd *cmd = container_of(wc->wr_cqe, struct kwt_cmd, recv_cqe);
	struct kwt_queue *q = cmd->queue;
	u32 len;
	int ret = 0;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("kwt: recv failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}

	ib_dma_sync_single_for_cpu(q->dev, cmd->capsule_dma,
				   sizeof(*cmd->capsule), DMA_FROM_DEVICE);
	len = le32_to_cpu(cmd->capsule->length);
	cmd->status = KWT_SC_SUCCESS;
	cmd->n_rdma = 0;
	cmd->rw_active = false;
	cmd->sgl = NULL;

	switch (cmd->capsule->opcode) {
	case KWT_OP_WRITE:
		if (cmd->capsule->flags & KWT_F_INCAPSULE) {
			kwt_backend_copy_in(cmd, cmd->inline_buf, len);
			kwt_backend_submit(cmd);
			return;
		}
		if (len <= PAGE_SIZE) {
			ret = kwt_pull_one_page(cmd, len);
		} else {
			ret = kwt_backend_alloc_sgl(cmd, len);
			if (!ret)
				ret = kwt_rdma_read(cmd);
		}
		break;
	case KWT_OP_READ:
		ret = kwt_backend_alloc_sgl(cmd, len);
		if (!ret)
			kwt_backend_submit(cmd);
		break;
	default:
		kwt_backend_submit(cmd);
		return;
	}

	if (ret) {
		cmd->status = ret == -EAGAIN ? KWT_SC_BUSY : KWT_SC_INTERNAL;
		kwt_queue_response(cmd);
	}
}

static void kwt_pull_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwt_cmd *cmd = container_of(wc->wr_cqe, struct kwt_cmd, pull_cqe);
	struct kwt_queue *q = cmd->queue;

	atomic_inc(&q->sq_wr_avail);
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		cmd->status = KWT_SC_XFER_ERR;
		kwt_queue_response(cmd);
		return;
	}
	kwt_backend_copy_in(cmd, cmd->inline_buf, wc->byte_len);
	kwt_backend_submit(cmd);
}

static void kwt_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwt_cmd *cmd = container_of(wc->wr_cqe, struct kwt_cmd, rw_cqe);
	struct kwt_queue *q = cmd->queue;

	atomic_add(cmd->n_rdma, &q->sq_wr_avail);
	kwt_release_rw(cmd);
	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		cmd->status = KWT_SC_XFER_ERR;
		kwt_queue_response(cmd);
		return;
	}
	kwt_backend_submit(cmd);
}

/* Called by the backend when a command has executed. */
void kwt_complete_cmd(struct kwt_cmd *cmd, u16 status)
{
	struct kwt_queue *q = cmd->queue;
	int ret;

	cmd->status = status;
	if (!status && cmd->capsule->opcode == KWT_OP_READ) {
		cmd->dir = DMA_TO_DEVICE;
		ret = rdma_rw_ctx_init(&cmd->rw, q->qp, q->port, cmd->sgl,
				       cmd->sg_cnt, 0,
				       le64_to_cpu(cmd->capsule->raddr),
				       le32_to_cpu(cmd->capsule->rkey),
				       DMA_TO_DEVICE);
		if (ret < 0) {
			cmd->status = KWT_SC_INTERNAL;
		} else {
			cmd->n_rdma = ret;
			cmd->rw_active = true;
		}
	}
	kwt_queue_response(cmd);
}

static void kwt_queue_response(struct kwt_cmd *cmd)
{
	struct kwt_queue *q = cmd->queue;
	int ret;

	cmd->rsp->cid = cmd->capsule->cid;
	cmd->rsp->status = cpu_to_le32(cmd->status);
	ib_dma_sync_single_for_device(q->dev, cmd->rsp_dma, sizeof(*cmd->rsp),
				      DMA_TO_DEVICE);

	cmd->send_cqe.done = kwt_send_done;
	cmd->send_wr.next = NULL;
	cmd->send_wr.wr_cqe = &cmd->send_cqe;
	cmd->send_wr.sg_list = &cmd->send_sge;
	cmd->send_wr.num_sge = 1;
	cmd->send_wr.opcode = IB_WR_SEND;
	cmd->send_wr.send_flags = IB_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- every response asks for its completion, which also retires the unsignaled WRs ahead of it

	if (atomic_sub_return(1 + cmd->n_rdma, &q->sq_wr_avail) < 0) {
		atomic_add(1 + cmd->n_rdma, &q->sq_wr_avail);
		spin_lock(&q->wait_lock);
		list_add_tail(&cmd->wait_entry, &q->wait_list);
		spin_unlock(&q->wait_lock);
		return;
	}

	if (cmd->rw_active && cmd->dir == DMA_TO_DEVICE)
		/* OK: rdma-unsignaled-send-starvation -- no cqe here, but the chained response SEND is signaled */
		ret = rdma_rw_ctx_post(&cmd->rw, q->qp, q->port, NULL,
				       &cmd->send_wr);
	else
		ret = ib_post_send(q->qp, &cmd->send_wr, NULL);
	if (ret) {
		pr_err("kwt: response post failed: %d\n", ret);
		atomic_add(1 + cmd->n_rdma, &q->sq_wr_avail);
		kwt_release_rw(cmd);
	}
}

static void kwt_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwt_cmd *cmd = container_of(wc->wr_cqe, struct kwt_cmd, send_cqe);
	struct kwt_queue *q = cmd->queue;
	struct kwt_cmd *next = NULL;

	atomic_add(1 + cmd->n_rdma, &q->sq_wr_avail);
	kwt_release_rw(cmd);
	if (cmd->sgl)
		kwt_backend_free_sgl(cmd);
	if (wc->status == IB_WC_SUCCESS && kwt_post_recv(q, cmd))
		pr_err("kwt: failed to repost receive\n");

	spin_lock(&q->wait_lock);
	if (!list_empty(&q->wait_list)) {
		next = list_first_entry(&q->wait_list, struct kwt_cmd, wait_entry);
		list_del_init(&next->wait_entry);
	}
	spin_unlock(&q->wait_lock);
	if (next)
		kwt_queue_response(next);
}

/* Asynchronous event notice to the host. */
void kwt_post_notice(struct kwt_queue *q, u32 event, u32 info)
{
	struct kwt_notice *n;
	unsigned long flags;
	int ret;

	spin_lock_irqsave(&q->notice_lock, flags);
	n = &q->notices[q->notice_head++ % KWT_NR_NOTICES];
	n->msg->event = cpu_to_le32(event);
	n->msg->info = cpu_to_le32(info);
	ib_dma_sync_single_for_device(q->dev, n->dma, sizeof(*n->msg),
				      DMA_TO_DEVICE);

	n->cqe.done = kwt_notice_done;
	n->wr.next = NULL;
	n->wr.wr_cqe = &n->cqe;
	n->wr.sg_list = &n->sge;
	n->wr.num_sge = 1;
	n->wr.opcode = IB_WR_SEND;
	n->wr.send_flags = 0;
	/* notices are fire-and-forget; ask for a completion now and then */
	if (q->notices_unsignaled >= KWT_NOTICE_SIG_EVERY) {	// BUG(file): rdma-unsignaled-send-starvation -- notices_unsignaled is only ever reset, never advanced, so no notice is ever signaled
		n->wr.send_flags = IB_SEND_SIGNALED;
		q->notices_unsignaled = 0;
	}
	ret = ib_post_send(q->qp, &n->wr, NULL);
	spin_unlock_irqrestore(&q->notice_lock, flags);
	if (ret)
		pr_warn("kwt: notice %u dropped: %d\n", event, ret);
}

static void kwt_notice_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("kwt: notice failed: %s\n", ib_wc_status_msg(wc->status));
}

static void kwt_free_cmds(struct kwt_queue *q, u32 nr)
{
	u32 i;

	for (i = 0; i < nr; i++) {
		struct kwt_cmd *cmd = &q->cmds[i];

		ib_dma_unmap_single(q->dev, cmd->rsp_dma, sizeof(*cmd->rsp), DMA_TO_DEVICE);
		ib_dma_unmap_single(q->dev, cmd->inline_dma,
				    KWT_INLINE_PAGES * PAGE_SIZE, DMA_FROM_DEVICE);
		ib_dma_unmap_single(q->dev, cmd->capsule_dma,
				    sizeof(*cmd->capsule), DMA_FROM_DEVICE);
		kfree(cmd->rsp);
		kfree(cmd->inline_buf);
		kfree(cmd->capsule);
	}
	kfree(q->cmds);
	q->cmds = NULL;
}

static int kwt_alloc_cmds(struct kwt_queue *q)
{
	u32 i, j;

	q->cmds = kcalloc(q->recv_depth, sizeof(*q->cmds), GFP_KERNEL);
	if (!q->cmds)
		return -ENOMEM;

	for (i = 0; i < q->recv_depth; i++) {
		struct kwt_cmd *cmd = &q->cmds[i];

		cmd->queue = q;
		INIT_LIST_HEAD(&cmd->wait_entry);
		cmd->capsule = kzalloc(sizeof(*cmd->capsule), GFP_KERNEL);
		cmd->inline_buf = kzalloc(KWT_INLINE_PAGES * PAGE_SIZE, GFP_KERNEL);
		cmd->rsp = kzalloc(sizeof(*cmd->rsp), GFP_KERNEL);
		if (!cmd->capsule || !cmd->inline_buf || !cmd->rsp) {
			kfree(cmd->capsule);
			kfree(cmd->inline_buf);
			kfree(cmd->rsp);
			kwt_free_cmds(q, i);
			return -ENOMEM;
		}
		cmd->capsule_dma = ib_dma_map_single(q->dev, cmd->capsule,
						     sizeof(*cmd->capsule), DMA_FROM_DEVICE);
		cmd->inline_dma = ib_dma_map_single(q->dev, cmd->inline_buf,
						    KWT_INLINE_PAGES * PAGE_SIZE,
						    DMA_FROM_DEVICE);
		cmd->rsp_dma = ib_dma_map_single(q->dev, cmd->rsp, sizeof(*cmd->rsp),
						 DMA_TO_DEVICE);

		cmd->recv_sge[0].addr = cmd->capsule_dma;
		cmd->recv_sge[0].length = sizeof(*cmd->capsule);
		cmd->recv_sge[0].lkey = q->pd->local_dma_lkey;
		for (j = 0; j < KWT_INLINE_PAGES; j++) {
			cmd->recv_sge[1 + j].addr = cmd->inline_dma + j * PAGE_SIZE;
			cmd->recv_sge[1 + j].length = PAGE_SIZE;
			cmd->recv_sge[1 + j].lkey = q->pd->local_dma_lkey;
		}
		cmd->send_sge.addr = cmd->rsp_dma;
		cmd->send_sge.length = sizeof(*cmd->rsp);
		cmd->send_sge.lkey = q->pd->local_dma_lkey;
	}
	return 0;
}

static void kwt_free_notices(struct kwt_queue *q)
{
	int i;

	for (i = 0; i < KWT_NR_NOTICES; i++)
		kfree(q->notices[i].msg);
}

static int kwt_alloc_notices(struct kwt_queue *q)
{
	int i;

	for (i = 0; i < KWT_NR_NOTICES; i++) {
		struct kwt_notice *n = &q->notices[i];

		n->msg = kzalloc(sizeof(*n->msg), GFP_KERNEL);
		if (!n->msg) {
			kwt_free_notices(q);
			return -ENOMEM;
		}
		n->dma = ib_dma_map_single(q->dev, n->msg, sizeof(*n->msg), DMA_TO_DEVICE);
		n->sge.addr = n->dma;
		n->sge.length = sizeof(*n->msg);
		n->sge.lkey = q->pd->local_dma_lkey;
	}
	q->notice_head = 0;
	q->notices_unsignaled = 0;
	return 0;
}

struct kwt_queue *kwt_queue_setup(struct rdma_cm_id *cm_id, struct ib_pd *pd,
				  u32 recv_depth)
{
	struct kwt_queue *q;
	u32 i;
	int ret;

	q = kzalloc(sizeof(*q), GFP_KERNEL);
	if (!q)
		return ERR_PTR(-ENOMEM);
	q->cm_id = cm_id;
	q->dev = cm_id->device;
	q->pd = pd;
	q->port = cm_id->port_num;
	q->recv_depth = min_t(u32, recv_depth, KWT_MAX_QD);
	spin_lock_init(&q->wait_lock);
	spin_lock_init(&q->notice_lock);
	INIT_LIST_HEAD(&q->wait_list);

	q->cq = ib_alloc_cq(q->dev, q, 2 * q->recv_depth + KWT_NR_NOTICES, 0,
			    IB_POLL_WORKQUEUE);
	if (IS_ERR(q->cq)) {
		ret = PTR_ERR(q->cq);
		goto out_free_queue;
	}
	ret = kwt_create_qp(q);
	if (ret)
		goto out_free_cq;
	ret = kwt_alloc_cmds(q);
	if (ret)
		goto out_destroy_qp;
	ret = kwt_alloc_notices(q);
	if (ret)
		goto out_free_cmds;

	for (i = 0; i < q->recv_depth; i++) {
		ret = kwt_post_recv(q, &q->cmds[i]);
		if (ret)
			goto out_drain;
	}
	return q;

out_drain:
	ib_drain_qp(q->qp);
	kwt_free_notices(q);
out_free_cmds:
	kwt_free_cmds(q, q->recv_depth);
out_destroy_qp:
	rdma_destroy_qp(cm_id);
out_free_cq:
	ib_free_cq(q->cq);
out_free_queue:
	kfree(q);
	return ERR_PTR(ret);
}

void kwt_queue_destroy(struct kwt_queue *q)
{
	ib_drain_qp(q->qp);
	rdma_destroy_qp(q->cm_id);
	kwt_free_cmds(q, q->recv_depth);
	kwt_free_notices(q);
	ib_free_cq(q->cq);
	kfree(q);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kwt capsule target over RDMA");
