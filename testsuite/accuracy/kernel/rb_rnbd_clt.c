// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * rb_rnbd_clt.c - network block device client over an RTRS-style session.
 *
 * A session is one RC QP to the storage server (and a service QP that only
 * carries heartbeats) plus a fixed array of permits, one per blk-mq tag.
 * Every permit owns a fast-registration MR allocated when the session comes
 * up.  To submit an I/O the request's pages
 * are DMA-mapped, registered with the permit's MR (REG_MR chained in front of
 * the I/O message) and the rkey travels in the message.  The server moves the
 * data with RDMA READ/WRITE and answers either with SEND_WITH_INV naming the
 * rkey (when remote invalidation was negotiated) or with a plain SEND, in
 * which case the client posts LOCAL_INV itself and finishes the request from
 * that completion.  The PD lives as long as the session object, across
 * reconnects, so a key that was never killed stays usable on the next QP.
 *
 * Problems still open in this version: the timeout reaper ends requests and
 * recycles their permits while the server may still hold the rkey, the
 * permit setup loop loses one MR when a message buffer cannot be allocated,
 * and the heartbeats on the service QP are never signaled.
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
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/blk-mq.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#ifndef cpu_to_le16
#define cpu_to_le16(x)		((__le16)(u16)(x))
#endif

#define RB_MAX_SEGS		128
#define RB_IO_TIMEOUT		(30 * HZ)
#define RB_MSG_SIZE		64
#define RB_HB_IMM		0xffffffffU

enum rb_msg_type {
	RB_MSG_READ	= 1,
	RB_MSG_WRITE	= 2,
};

#define RB_MSG_F_REMOTE_INV	0x1

struct rb_io_msg {
	__le16	type;
	__le16	flags;
	__le32	tag;
	__le64	addr;
	__le32	rkey;
	__le32	len;
};

struct rb_rsp_msg {
	__le32	tag;
	__le32	status;
};

struct rb_sess;

struct rb_permit {
	struct list_head	free_entry;
	struct rb_sess		*sess;
	unsigned int		tag;
	bool			busy;
	struct ib_mr		*mr;
	struct request		*rq;
	blk_status_t		rsp_sts;
	unsigned long		deadline;

	struct scatterlist	sgl[RB_MAX_SEGS];
	int			sg_cnt;
	int			nents;
	enum dma_data_direction	dir;

	struct rb_io_msg	*msg;
	u64			msg_dma;
	struct ib_sge		msg_sge;

	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	msg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		msg_cqe;
	struct ib_cqe		inv_cqe;
};

struct rb_recv_ctx {
	struct rb_sess		*sess;
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	struct rb_rsp_msg	*rsp;
	u64			dma;
};

struct rb_sess {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	struct ib_qp		*svc_qp;	/* heartbeats */
	struct ib_cqe		hb_cqe;
	struct request_queue	*queue;

	spinlock_t		lock;
	struct list_head	free_permits;
	struct rb_permit	*permits;
	unsigned int		queue_depth;
	struct rb_recv_ctx	*rx;

	bool			remote_inv;
	bool			dead;
	struct workqueue_struct	*wq;
	struct delayed_work	reaper;
	struct work_struct	err_work;
};

static struct rb_permit *rb_get_permit(struct rb_sess *sess)
{
	struct rb_permit *p;

	spin_lock(&sess->lock);
	p = list_first_entry_or_null(&sess->free_permits, struct rb_permit,
				     free_entry);
	if (p) {
		list_del_init(&p->free_entry);
		p->busy = true;
	}
	spin_unlock(&sess->lock);
	return p;
}

static void rb_put_permit(struct rb_sess *sess, struct rb_permit *p)
{
	spin_lock(&sess->lock);
	p->busy = false;
	p->rq = NULL;
	list_add(&p->free_entry, &sess->free_permits);
	spin_unlock(&sess->lock);
}

/* Unmap the data, hand the permit back and complete the block request. */
static void rb_end_io(struct rb_permit *p, blk_status_t sts)
{
	struct rb_sess *sess = p->sess;
	struct request *rq = p->rq;

	if (p->nents)
		ib_dma_unmap_sg(sess->dev, p->sgl, p->sg_cnt, p->dir);
	p->nents = 0;
	rb_put_permit(sess, p);
	blk_mq_end_request(rq, sts);
}

static void rb_msg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rb_permit *p = container_of(wc->wr_cqe, struct rb_permit, msg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("rb: I/O message for tag %u failed: %s\n",
			       p->tag, ib_wc_status_msg(wc->status));
		queue_work(p->sess->wq, &p->sess->err_work);
	}
}

static void rb_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rb_permit *p = container_of(wc->wr_cqe, struct rb_permit, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("rb: LOCAL_INV for tag %u failed: %s\n",
			       p->tag, ib_wc_status_msg(wc->status));
		/* key state unknown: keep the permit, recovery replaces the MR */
		queue_work(p->sess->wq, &p->sess->err_work);
		return;
	}
	rb_end_io(p, p->rsp_sts); /* OK: rdma-invalidation-leak -- runs only after the LOCAL_INV completed successfully */
}

static int rb_post_inv(struct rb_sess *sess, struct rb_permit *p)
{
	struct ib_send_wr *wr = &p->inv_wr;

	memset(wr, 0, sizeof(*wr));
	wr->opcode = IB_WR_LOCAL_INV;
	wr->send_flags = IB_SEND_SIGNALED;
	wr->ex.invalidate_rkey = p->mr->rkey;
	p->inv_cqe.done = rb_inv_done;
	wr->wr_cqe = &p->inv_cqe;

	return ib_post_send(sess->qp, wr, NULL);
}

static void rb_recv_done(struct ib_cq *cq, struct ib_wc *wc);

int rb_post_recv(struct rb_sess *sess, struct rb_recv_ctx *rx)
{
	rx->cqe.done = rb_recv_done;
	rx->sge.addr = rx->dma;
	rx->sge.length = sizeof(struct rb_rsp_msg);
	rx->sge.lkey = sess->pd->local_dma_lkey;
	rx->wr.next = NULL;
	rx->wr.wr_cqe = &rx->cqe;
	rx->wr.sg_list = &rx->sge;
	rx->wr.num_sge = 1;

	return ib_post_recv(sess->qp, &rx->wr, NULL);
}

static void rb_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rb_recv_ctx *rx = container_of(wc->wr_cqe, struct rb_recv_ctx, cqe);
	struct rb_sess *sess = rx->sess;
	struct rb_permit *p;
	unsigned int tag;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			queue_work(sess->wq, &sess->err_work);
		return;
	}

	ib_dma_sync_single_for_cpu(sess->dev, rx->dma, sizeof(*rx->rsp),
				   DMA_FROM_DEVICE);
	tag = le32_to_cpu(rx->rsp->tag);
	if (unlikely(tag >= sess->queue_depth)) {
		pr_err("rb: response with bad tag %u\n", tag);
		goto repost;
	}
	p = &sess->permits[tag];
	if (unlikely(!p->busy || !p->rq))
		goto repost;
	p->rsp_sts = rx->rsp->status ? BLK_STS_IOERR : BLK_STS_OK;

	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) { /* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the permit's below */
		if (unlikely(wc->ex.invalidate_rkey != p->mr->rkey)) {
			pr_err("rb: server invalidated rkey %#x, tag %u holds %#x\n",
			       wc->ex.invalidate_rkey, tag, p->mr->rkey);
			queue_work(sess->wq, &sess->err_work);
			goto repost;
		}
		rb_end_io(p, p->rsp_sts); /* OK: rdma-invalidation-leak -- the server invalidated exactly this permit's key */
	} else if (rb_post_inv(sess, p)) {
		pr_err("rb: cannot post LOCAL_INV for tag %u\n", tag);
		/* the permit stays busy; recovery deregisters its MR */
		queue_work(sess->wq, &sess->err_work);
	}

repost:
	if (rb_post_recv(sess, rx))
		queue_work(sess->wq, &sess->err_work);
}

blk_status_t rb_queue_rq(struct rb_sess *sess, struct request *rq)
{
	bool write = rq_data_dir(rq) == WRITE;
	struct rb_io_msg *msg;
	struct rb_permit *p;
	int count, n, ret;

	if (unlikely(sess->dead))
		return BLK_STS_TRANSPORT;

	p = rb_get_permit(sess);
	if (!p)
		return BLK_STS_RESOURCE;
	p->rq = rq;
	p->dir = write ? DMA_TO_DEVICE : DMA_FROM_DEVICE;

	sg_init_table(p->sgl, RB_MAX_SEGS);
	p->sg_cnt = blk_rq_map_sg(sess->queue, rq, p->sgl);
	count = ib_dma_map_sg(sess->dev, p->sgl, p->sg_cnt, p->dir);
	if (unlikely(!count)) {
		rb_put_permit(sess, p);
		return BLK_STS_RESOURCE;
	}
	p->nents = count;

	n = ib_map_mr_sg(p->mr, p->sgl, count, NULL, PAGE_SIZE);
	if (unlikely(n != count)) {
		ib_dma_unmap_sg(sess->dev, p->sgl, p->sg_cnt, p->dir);
		p->nents = 0;
		rb_put_permit(sess, p); /* OK: rdma-invalidation-leak -- nothing was registered or sent yet */
		return BLK_STS_IOERR;
	}
	ib_update_fast_reg_key(p->mr, ib_inc_rkey(p->mr->rkey));

	memset(&p->reg_wr, 0, sizeof(p->reg_wr));
	p->reg_wr.wr.opcode = IB_WR_REG_MR;
	p->reg_wr.wr.wr_cqe = &p->msg_cqe;	/* only reports errors */
	p->reg_wr.wr.next = &p->msg_wr;
	p->reg_wr.mr = p->mr;
	p->reg_wr.key = p->mr->rkey;
	p->reg_wr.access = write ? IB_ACCESS_REMOTE_READ :
			   IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;

	msg = p->msg;
	msg->type = cpu_to_le16(write ? RB_MSG_WRITE : RB_MSG_READ);
	msg->flags = cpu_to_le16(sess->remote_inv ? RB_MSG_F_REMOTE_INV : 0);
	msg->tag = cpu_to_le32(p->tag);
	msg->addr = cpu_to_le64(p->mr->iova);
	msg->rkey = cpu_to_le32(p->mr->rkey);
	msg->len = cpu_to_le32((u32)p->mr->length);
	ib_dma_sync_single_for_device(sess->dev, p->msg_dma, sizeof(*msg),
				      DMA_TO_DEVICE);

	p->msg_sge.addr = p->msg_dma;
	p->msg_sge.length = sizeof(*msg);
	p->msg_sge.lkey = sess->pd->local_dma_lkey;

	memset(&p->msg_wr, 0, sizeof(p->msg_wr));
	p->msg_cqe.done = rb_msg_done;
	p->msg_wr.wr_cqe = &p->msg_cqe;
	p->msg_wr.opcode = IB_WR_SEND;
	p->msg_wr.sg_list = &p->msg_sge;
	p->msg_wr.num_sge = 1;
	p->msg_wr.send_flags = IB_SEND_SIGNALED;

	p->deadline = jiffies + RB_IO_TIMEOUT;
	blk_mq_start_request(rq);

	ret = ib_post_send(sess->qp, &p->reg_wr.wr, NULL);
	if (unlikely(ret)) {
		pr_err("rb: post of tag %u failed: %d\n", p->tag, ret);
		ib_dma_unmap_sg(sess->dev, p->sgl, p->sg_cnt, p->dir);
		p->nents = 0;
		rb_put_permit(sess, p); /* OK: rdma-invalidation-leak -- the post failed: neither the registration nor the rkey went out */
		return BLK_STS_IOERR;
	}
	return BLK_STS_OK;
}

static void rb_reap_timeouts(struct work_struct *work)
{
	struct rb_sess *sess = container_of(to_delayed_work(work),
					    struct rb_sess, reaper);
	unsigned int i;

	for (i = 0; i < sess->queue_depth; i++) {
		struct rb_permit *p = &sess->permits[i];

		if (!p->busy || !p->rq)
			continue;
		if ((long)(jiffies - p->deadline) < 0)
			continue;

		pr_warn("rb: tag %u timed out, failing the request\n", p->tag);
		rb_end_io(p, BLK_STS_TIMEOUT); /* BUG: rdma-invalidation-leak -- the server may still hold this rkey; the pages and the permit are reused while it is valid */
	}

	if (!sess->dead)
		queue_delayed_work(sess->wq, &sess->reaper, HZ);
}

static void rb_err_work(struct work_struct *work)
{
	struct rb_sess *sess = container_of(work, struct rb_sess, err_work);
	unsigned int i;

	/* the CM handler reconnects and clears ->dead */
	sess->dead = true;
	rdma_disconnect(sess->cm_id);
	ib_drain_qp(sess->qp);

	for (i = 0; i < sess->queue_depth; i++) {
		struct rb_permit *p = &sess->permits[i];
		struct request *rq = p->rq;
		struct ib_mr *mr;

		if (!p->busy || !p->mr)
			continue;

		/* The PD survives the reconnect: kill the old key for good. */
		ib_dereg_mr(p->mr);
		p->mr = NULL; /* OK: rdma-mr-leak -- deregistered on the line above */
		if (p->nents)
			ib_dma_unmap_sg(sess->dev, p->sgl, p->sg_cnt, p->dir); /* OK: rdma-invalidation-leak -- the MR was deregistered first */
		p->nents = 0;

		mr = ib_alloc_mr(sess->pd, IB_MR_TYPE_MEM_REG, RB_MAX_SEGS);
		if (!IS_ERR(mr)) {
			p->mr = mr;
			rb_put_permit(sess, p);
		} else {
			pr_warn("rb: tag %u retired, no MR\n", i);
			p->rq = NULL;
		}
		if (rq)
			blk_mq_end_request(rq, BLK_STS_TRANSPORT);
	}
}

int rb_alloc_permits(struct rb_sess *sess)
{
	struct rb_permit *p;
	struct ib_mr *mr;
	int i, ret;

	sess->permits = kcalloc(sess->queue_depth, sizeof(*sess->permits),
				GFP_KERNEL);
	if (!sess->permits)
		return -ENOMEM;
	INIT_LIST_HEAD(&sess->free_permits);

	for (i = 0; i < sess->queue_depth; i++) {
		p = &sess->permits[i];
		p->sess = sess;
		p->tag = i;

		mr = ib_alloc_mr(sess->pd, IB_MR_TYPE_MEM_REG, RB_MAX_SEGS);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto err_unwind; /* OK: rdma-mr-leak -- nothing was allocated for this permit yet */
		}
		p->mr = mr;

		p->msg = kzalloc(RB_MSG_SIZE, GFP_KERNEL);
		if (!p->msg) {
			ret = -ENOMEM;
			goto err_unwind; /* BUG: rdma-mr-leak -- the unwind loop stops below i and never deregisters permits[i].mr */
		}
		p->msg_dma = ib_dma_map_single(sess->dev, p->msg, RB_MSG_SIZE,
					       DMA_TO_DEVICE);
		if (ib_dma_mapping_error(sess->dev, p->msg_dma)) {
			kfree(p->msg);
			ib_dereg_mr(p->mr);
			ret = -ENOMEM;
			goto err_unwind; /* OK: rdma-mr-leak -- this permit's MR was deregistered just above */
		}
		list_add_tail(&p->free_entry, &sess->free_permits);
	}
	return 0;

err_unwind:
	while (i--) {
		p = &sess->permits[i];
		ib_dma_unmap_single(sess->dev, p->msg_dma, RB_MSG_SIZE,
				    DMA_TO_DEVICE);
		kfree(p->msg);
		ib_dereg_mr(p->mr);
	}
	kfree(sess->permits);
	sess->permits = NULL;
	return ret;
}

/* Called from the CM handler once the route is resolved. */
int rb_create_qp(struct rb_sess *sess)
{
	struct ib_qp_init_attr attr;
	int ret;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = sess;
	attr.send_cq = sess->cq;
	attr.recv_cq = sess->cq;
	/* REG_MR + SEND + LOCAL_INV per permit, one for the drain */
	attr.cap.max_send_wr = 3 * sess->queue_depth + 1;
	attr.cap.max_recv_wr = sess->queue_depth + 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every I/O message and every LOCAL_INV is posted signaled */
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(sess->cm_id, sess->pd, &attr);
	if (ret)
		return ret;
	sess->qp = sess->cm_id->qp;
	return 0;
}

static void rb_hb_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rb: heartbeat failed: %s\n", ib_wc_status_msg(wc->status));
}

/* Service connection: heartbeats only, as empty RDMA WRITE with immediate. */
int rb_create_svc_qp(struct rb_sess *sess)
{
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_context = sess;
	attr.send_cq = sess->cq;
	attr.recv_cq = sess->cq;
	attr.cap.max_send_wr = 16;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	sess->svc_qp = ib_create_qp(sess->pd, &attr);
	if (IS_ERR(sess->svc_qp))
		return PTR_ERR(sess->svc_qp);
	sess->hb_cqe.done = rb_hb_done;
	return 0;
}

int rb_send_heartbeat(struct rb_sess *sess)
{
	struct ib_rdma_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr.wr_cqe = &sess->hb_cqe;
	wr.wr.opcode = IB_WR_RDMA_WRITE_WITH_IMM;
	wr.wr.ex.imm_data = cpu_to_be32(RB_HB_IMM);
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0; /* BUG(file): rdma-unsignaled-send-starvation -- nothing on the service QP is ever signaled; after max_send_wr heartbeats every post fails */
	return ib_post_send(sess->svc_qp, &wr.wr, NULL);
}

void rb_sess_init(struct rb_sess *sess)
{
	spin_lock_init(&sess->lock);
	INIT_LIST_HEAD(&sess->free_permits);
	INIT_WORK(&sess->err_work, rb_err_work);
	INIT_DELAYED_WORK(&sess->reaper, rb_reap_timeouts);
}

MODULE_DESCRIPTION("RDMA block device client (permit MRs)");
MODULE_LICENSE("GPL");
