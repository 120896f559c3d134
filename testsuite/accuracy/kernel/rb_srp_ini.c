// SPDX-License-Identifier: GPL-2.0
/*
 * rb_srp_ini.c - SCSI RDMA Protocol initiator, one RC channel per hw queue.
 *
 * Every channel keeps a ring of request descriptors (one per tag), a ring of
 * transmit IUs and the QP's own MR pool, filled by ib_mr_pool_init() when the
 * channel is created.  A command's data buffer is registered with up to
 * mr_per_cmd MRs from that pool; the REG_MR work requests are posted unsignaled
 * ahead of the SRP_CMD, which carries one (va, key, len) descriptor per MR.
 * The target never sends with invalidate; when the SRP_RSP arrives the
 * initiator posts a LOCAL_INV per descriptor.  Error recovery drains the QP
 * and destroys the pool, which deregisters every MR at once.
 *
 * The response path returns the MRs and unmaps the buffer right after posting
 * the unsignaled LOCAL_INVs, also when one of those posts failed; the abort
 * path does it properly (waits for its invalidations).  The mapping loop loses
 * an MR when ib_map_mr_sg() maps nothing.
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
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>
#include <rdma/rdma_cm.h>

#define RBS_MAX_MR_PER_CMD	4
#define RBS_TSK_MGMT_TMO_MS	10000

enum { SRP_CMD = 0x02, SRP_TSK_MGMT = 0x01, SRP_RSP = 0xc1 };
enum { SRP_TSK_ABORT_TASK = 0x01 };

struct srp_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srp_cmd {
	u8			opcode;
	u8			buf_fmt;
	u8			data_out_desc_cnt;
	u8			data_in_desc_cnt;
	u32			reserved;
	u64			tag;
	u8			cdb[16];
	struct srp_direct_buf	desc[RBS_MAX_MR_PER_CMD];
};

struct srp_rsp {
	u8	opcode;
	u8	flags;
	u8	reserved;
	u8	status;
	__be32	req_lim_delta;
	u64	tag;
};

struct rbs_ch;

struct rbs_iu {
	struct list_head	list;
	struct rbs_ch		*ch;
	void			*buf;
	u64			dma;
	size_t			size;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	struct ib_recv_wr	recv_wr;
};

struct rbs_req {
	struct rbs_ch		*ch;
	void			*scmnd;		/* NULL while the slot is free */
	struct scatterlist	*sg;
	int			sg_cnt;
	int			nents;
	enum dma_data_direction	dir;

	struct ib_mr		*mr_list[RBS_MAX_MR_PER_CMD];
	int			nmr;
	struct ib_reg_wr	reg_wr[RBS_MAX_MR_PER_CMD];
	struct ib_send_wr	inv_wr[RBS_MAX_MR_PER_CMD];
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	bool			inv_failed;
};

struct rbs_target {
	struct ib_device	*dev;
	struct ib_pd		*pd;	/* per device, survives reconnects */
	unsigned int		queue_size;
	unsigned int		mr_per_cmd;
	unsigned int		max_pages_per_mr;
};

struct rbs_ch {
	struct rbs_target	*target;
	struct rdma_cm_id	*cm_id;
	struct ib_cq		*cq;
	struct ib_qp		*qp;
	spinlock_t		lock;
	struct list_head	free_tx;
	struct rbs_req		*req_ring;
	struct completion	tsk_mgmt_done;
	u8			tsk_mgmt_status;
	struct work_struct	tl_err_work;
};

void rbs_scsi_done(void *scmnd, int result);
int rbs_reconnect(struct rbs_ch *ch);
int rbs_post_recv(struct rbs_ch *ch, struct rbs_iu *iu);

static void rbs_reg_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbs_req *req = container_of(wc->wr_cqe, struct rbs_req, reg_cqe);

	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rbs: FAST_REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
	queue_work(system_wq, &req->ch->tl_err_work);
}

static void rbs_inv_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbs_req *req = container_of(wc->wr_cqe, struct rbs_req, inv_cqe);

	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("rbs: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
	queue_work(system_wq, &req->ch->tl_err_work);
}

static void rbs_inv_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbs_req *req = container_of(wc->wr_cqe, struct rbs_req, inv_cqe);

	req->inv_failed = wc->status != IB_WC_SUCCESS;
	complete(&req->inv_done);
}

static void rbs_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbs_iu *iu = container_of(wc->wr_cqe, struct rbs_iu, cqe);
	struct rbs_ch *ch = iu->ch;

	if (unlikely(wc->status != IB_WC_SUCCESS))
		queue_work(system_wq, &ch->tl_err_work);
	spin_lock(&ch->lock);
	list_add(&iu->list, &ch->free_tx);
	spin_unlock(&ch->lock);
}

static int rbs_post_send(struct rbs_ch *ch, struct rbs_iu *iu, int len)
{
	struct ib_send_wr wr;

	iu->sge.addr = iu->dma;
	iu->sge.length = len;
	iu->sge.lkey = ch->target->pd->local_dma_lkey;
	iu->cqe.done = rbs_send_done;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &iu->cqe;
	wr.sg_list = &iu->sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(ch->qp, &wr, NULL);
}

/* Return the MRs to the QP's pool and unmap the data buffer. */
static void rbs_release_io(struct rbs_ch *ch, struct rbs_req *req)
{
	int i;

	for (i = 0; i < req->nmr; i++)
		ib_mr_pool_put(ch->qp, &ch->qp->rdma_mrs, req->mr_list[i]);
	req->nmr = 0;
	if (req->nents)
		ib_dma_unmap_sg(ch->target->dev, req->sg, req->sg_cnt, req->dir);
	req->nents = 0;
}

static int rbs_map_data(struct rbs_ch *ch, struct rbs_req *req,
			struct srp_cmd *cmd)
{
	struct rbs_target *target = ch->target;
	struct ib_send_wr *first = NULL, *prev = NULL;
	struct scatterlist *sg;
	unsigned int sg_offset = 0;
	int count, left, n, ret;

	count = ib_dma_map_sg(target->dev, req->sg, req->sg_cnt, req->dir);
	if (unlikely(!count))
		return -EIO;
	req->nents = count;

	sg = req->sg;
	left = count;
	while (left > 0) {
		struct ib_reg_wr *reg;
		struct ib_mr *mr;

		if (req->nmr >= target->mr_per_cmd) {
			ret = -ENOMEM;
			goto unwind;
		}
		mr = ib_mr_pool_get(ch->qp, &ch->qp->rdma_mrs);
		if (!mr) {
			ret = -EAGAIN;
			goto unwind; /* OK: rdma-mr-leak -- the pool was empty, nothing taken */
		}
		n = ib_map_mr_sg(mr, sg, left, &sg_offset, PAGE_SIZE);
		if (unlikely(n <= 0)) {
			ret = n < 0 ? n : -EINVAL;
			goto unwind; /* BUG: rdma-mr-leak -- mr is not in req->mr_list yet, the unwind never returns it */
		}
		ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
		req->mr_list[req->nmr] = mr;

		reg = &req->reg_wr[req->nmr];
		memset(reg, 0, sizeof(*reg));
		req->reg_cqe.done = rbs_reg_err_done;
		reg->wr.wr_cqe = &req->reg_cqe;
		reg->wr.opcode = IB_WR_REG_MR;
		reg->mr = mr;
		reg->key = mr->rkey;
		reg->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			      IB_ACCESS_REMOTE_WRITE;
		if (prev)
			prev->next = &reg->wr;
		else
			first = &reg->wr;
		prev = &reg->wr;

		cmd->desc[req->nmr].va = cpu_to_be64(mr->iova);
		cmd->desc[req->nmr].key = cpu_to_be32(mr->rkey);
		cmd->desc[req->nmr].len = cpu_to_be32((u32)mr->length);
		req->nmr++;

		left -= n;
		while (n--)
			sg = sg_next(sg);
	}

	ret = ib_post_send(ch->qp, first, NULL);
	if (unlikely(ret))
		goto unwind;
	return req->nmr;

unwind:
	while (req->nmr) {
		req->nmr--;
		ib_mr_pool_put(ch->qp, &ch->qp->rdma_mrs, req->mr_list[req->nmr]); /* OK: rdma-invalidation-leak -- no REG_MR was posted (or the post failed) and the command never went out */
	}
	ib_dma_unmap_sg(target->dev, req->sg, req->sg_cnt, req->dir);
	req->nents = 0;
	return ret;
}

static int rbs_inv_rkey(struct rbs_req *req, struct rbs_ch *ch, u32 rkey)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	req->inv_cqe.done = rbs_inv_err_done;
	wr.wr_cqe = &req->inv_cqe;
	return ib_post_send(ch->qp, &wr, NULL);
}

static void rbs_unmap_data(struct rbs_ch *ch, struct rbs_req *req)
{
	int i, res;

	for (i = 0; i < req->nmr; i++) {
		res = rbs_inv_rkey(req, ch, req->mr_list[i]->rkey);
		if (res < 0) {
			pr_err("rbs: queueing LOCAL_INV for rkey %#x failed (%d)\n",
			       req->mr_list[i]->rkey, res);
			queue_work(system_wq, &ch->tl_err_work);
		}
	}
	rbs_release_io(ch, req); /* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- unsignaled LOCAL_INVs not yet executed (or never posted) while the MRs and pages are handed back */
}

static void rbs_process_rsp(struct rbs_ch *ch, struct srp_rsp *rsp)
{
	struct rbs_req *req;
	void *scmnd;

	if (rsp->tag >= ch->target->queue_size) {
		pr_err("rbs: response with invalid tag %llu\n", rsp->tag);
		return;
	}
	req = &ch->req_ring[rsp->tag];
	scmnd = req->scmnd;
	if (!scmnd)
		return;		/* aborted meanwhile */
	rbs_unmap_data(ch, req);
	req->scmnd = NULL;
	rbs_scsi_done(scmnd, rsp->status);
}

static void rbs_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbs_iu *iu = container_of(wc->wr_cqe, struct rbs_iu, cqe);
	struct rbs_ch *ch = iu->ch;
	struct srp_rsp *rsp = iu->buf;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		queue_work(system_wq, &ch->tl_err_work);
		return;
	}
	if (unlikely(wc->wc_flags & IB_WC_WITH_INVALIDATE)) { /* OK: rdma-remote-invalidate-unchecked -- SRP never negotiates remote invalidation: the message is refused and the channel reset */
		pr_err("rbs: unexpected SEND_WITH_INV (rkey %#x), resetting channel\n",
		       wc->ex.invalidate_rkey);
		queue_work(system_wq, &ch->tl_err_work);
		return;
	}

	switch (rsp->opcode) {
	case SRP_RSP:
		if (rsp->flags & 0x1) {
			ch->tsk_mgmt_status = rsp->status;
			complete(&ch->tsk_mgmt_done);
		} else {
			rbs_process_rsp(ch, rsp);
		}
		break;
	default:
		pr_warn("rbs: unhandled IU opcode %#x\n", rsp->opcode);
		break;
	}
	if (rbs_post_recv(ch, iu))
		queue_work(system_wq, &ch->tl_err_work);
}

/* eh_abort_handler: the target confirms the abort, then the keys are killed. */
int rbs_abort(struct rbs_ch *ch, struct rbs_req *req, struct rbs_iu *iu, u64 tag)
{
	struct ib_send_wr *last = NULL;
	struct srp_cmd *tsk = iu->buf;
	void *scmnd = req->scmnd;
	int i, ret;

	memset(tsk, 0, sizeof(*tsk));
	tsk->opcode = SRP_TSK_MGMT;
	tsk->cdb[0] = SRP_TSK_ABORT_TASK;
	tsk->tag = tag;
	reinit_completion(&ch->tsk_mgmt_done);
	ret = rbs_post_send(ch, iu, sizeof(*tsk));
	if (ret)
		return ret;
	if (!wait_for_completion_timeout(&ch->tsk_mgmt_done,
					 msecs_to_jiffies(RBS_TSK_MGMT_TMO_MS)))
		return -ETIMEDOUT;	/* escalates to a channel reset */
	if (ch->tsk_mgmt_status)
		return -EIO;

	for (i = 0; i < req->nmr; i++) {
		struct ib_send_wr *wr = &req->inv_wr[i];

		memset(wr, 0, sizeof(*wr));
		wr->wr_cqe = &req->inv_cqe;
		wr->opcode = IB_WR_LOCAL_INV;
		wr->ex.invalidate_rkey = req->mr_list[i]->rkey;
		if (last)
			last->next = wr;
		last = wr;
	}
	if (last) {
		/* in-order completion: the last one retires the whole chain */
		req->inv_cqe.done = rbs_inv_sync_done;
		last->send_flags = IB_SEND_SIGNALED;
		init_completion(&req->inv_done);
		ret = ib_post_send(ch->qp, &req->inv_wr[0], NULL);
		if (ret) {
			queue_work(system_wq, &ch->tl_err_work);
			return ret;
		}
		wait_for_completion(&req->inv_done);
		if (req->inv_failed) {
			queue_work(system_wq, &ch->tl_err_work);
			return -EIO;
		}
	}
	rbs_release_io(ch, req); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV chain completed successfully */
	req->scmnd = NULL;
	rbs_scsi_done(scmnd, -ECANCELED);
	return 0;
}

static void rbs_tl_err_work(struct work_struct *work)
{
	struct rbs_ch *ch = container_of(work, struct rbs_ch, tl_err_work);
	struct rbs_target *target = ch->target;
	unsigned int i;
	int j;

	rdma_disconnect(ch->cm_id);
	ib_drain_qp(ch->qp);

	/* Park every MR in the pool, then destroy the pool: dereg kills all keys. */
	for (i = 0; i < target->queue_size; i++) {
		struct rbs_req *req = &ch->req_ring[i];

		for (j = 0; j < req->nmr; j++)
			ib_mr_pool_put(ch->qp, &ch->qp->rdma_mrs, req->mr_list[j]); /* OK: rdma-invalidation-leak -- the whole pool is deregistered below before any buffer is released */
		req->nmr = 0;
	}
	ib_mr_pool_destroy(ch->qp, &ch->qp->rdma_mrs);

	for (i = 0; i < target->queue_size; i++) {
		struct rbs_req *req = &ch->req_ring[i];
		void *scmnd = req->scmnd;

		if (req->nents)
			ib_dma_unmap_sg(target->dev, req->sg, req->sg_cnt, req->dir); /* OK: rdma-invalidation-leak -- every MR was deregistered above */
		req->nents = 0;
		if (scmnd) {
			req->scmnd = NULL;
			rbs_scsi_done(scmnd, -ECONNRESET);
		}
	}
	rbs_reconnect(ch);
}

int rbs_create_ch_ib(struct rbs_ch *ch)
{
	struct rbs_target *target = ch->target;
	struct ib_qp_init_attr init_attr;
	int ret;

	ch->cq = ib_alloc_cq(target->dev, ch, 4 * target->queue_size + 1, 0,
			     IB_POLL_SOFTIRQ);
	if (IS_ERR(ch->cq))
		return PTR_ERR(ch->cq);

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.event_handler = NULL;
	init_attr.qp_context = ch;
	init_attr.send_cq = ch->cq;
	init_attr.recv_cq = ch->cq;
	init_attr.cap.max_send_wr = (target->mr_per_cmd * 2 + 1) * target->queue_size + 1;
	init_attr.cap.max_recv_wr = target->queue_size + 1;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- every IU SEND is signaled and retires the REG_MR/LOCAL_INV ahead of it */
	init_attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(ch->cm_id, target->pd, &init_attr);
	if (ret)
		goto err_cq;
	ch->qp = ch->cm_id->qp;

	ret = ib_mr_pool_init(ch->qp, &ch->qp->rdma_mrs,
			      target->queue_size * target->mr_per_cmd,
			      IB_MR_TYPE_MEM_REG, target->max_pages_per_mr, 0);
	if (ret)
		goto err_qp;

	spin_lock_init(&ch->lock);
	INIT_LIST_HEAD(&ch->free_tx);
	init_completion(&ch->tsk_mgmt_done);
	INIT_WORK(&ch->tl_err_work, rbs_tl_err_work);
	return 0;

err_qp:
	rdma_destroy_qp(ch->cm_id);
err_cq:
	ib_free_cq(ch->cq);
	return ret;
}

/* queuecommand: slot and IU are picked by the caller from the tag. */
int rbs_queuecommand(struct rbs_ch *ch, struct rbs_req *req, struct rbs_iu *iu,
		     void *scmnd, u64 tag)
{
	struct srp_cmd *cmd = iu->buf;
	int nmr, ret;

	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = SRP_CMD;
	cmd->tag = tag;
	req->ch = ch;
	req->scmnd = scmnd;
	req->nmr = 0;

	nmr = rbs_map_data(ch, req, cmd);
	if (nmr < 0) {
		req->scmnd = NULL;
		return nmr;
	}
	cmd->data_out_desc_cnt = req->dir == DMA_TO_DEVICE ? nmr : 0;
	cmd->data_in_desc_cnt = req->dir == DMA_FROM_DEVICE ? nmr : 0;

	ret = rbs_post_send(ch, iu, sizeof(*cmd));
	if (ret) {
		/* the channel is broken; tl_err_work cleans up the slot */
		pr_err("rbs: SRP_CMD post failed (%d)\n", ret);
		queue_work(system_wq, &ch->tl_err_work);
	}
	return ret;
}

int rbs_post_recv(struct rbs_ch *ch, struct rbs_iu *iu)
{
	iu->cqe.done = rbs_recv_done;
	iu->sge.addr = iu->dma;
	iu->sge.length = iu->size;
	iu->sge.lkey = ch->target->pd->local_dma_lkey;
	iu->recv_wr.next = NULL;
	iu->recv_wr.wr_cqe = &iu->cqe;
	iu->recv_wr.sg_list = &iu->sge;
	iu->recv_wr.num_sge = 1;
	return ib_post_recv(ch->qp, &iu->recv_wr, NULL);
}

MODULE_DESCRIPTION("SRP-style initiator with per-channel MR pools");
MODULE_LICENSE("GPL");
