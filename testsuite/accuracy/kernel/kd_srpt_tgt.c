// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0
/*
 * kd_srpt_tgt.c - SCSI RDMA Protocol target, modelled on ib_srpt before its
 * rdma_rw conversion: every command has a send I/O context with its own
 * hand-built registration (an FRMR from a per-channel ib_mr_pool, REG_MR
 * chained to the RDMA READ that pulls the initiator's write data, LOCAL_INV
 * when the data has arrived).  Immediate data arrives inside the SRP_CMD IU,
 * so the receive ring is covered by one MR registered at channel setup.
 * Task management (ABORT_TASK) may hit a command in any state.
 *
 * Correct: the READ sink is registered with REMOTE_WRITE on every transport
 * (iWARP places READ responses with the sink's STag); a failed post releases
 * nothing the peer could use; the LOCAL_INV completion returns the MR to the
 * pool; channel close waits for its invalidations.
 * Not correct: the ring MR (wrong and needless rights, leaked on a failed
 * post), the per-command MR (key never rotated, leaked on a short map,
 * allocated and deregistered per I/O when the pool runs dry), a failed READ
 * and ABORT_TASK that release a registered MR without LOCAL_INV, a READ
 * completion that unmaps before its LOCAL_INV completed, a send queue sized
 * by hand for two WRs per command, and an unchecked SGE count.
 */
#include <linux/types.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <linux/printk.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define KD_SRPT_RQ_SIZE		2048
#define KD_SRPT_IU_SIZE		8192
#define KD_SRPT_MAX_SGE		16
#define KD_SRPT_FR_PAGES	256

enum kd_ioctx_state {
	KD_IOCTX_NEW,
	KD_IOCTX_NEED_DATA,	/* REG_MR + RDMA READ posted */
	KD_IOCTX_DATA_IN,	/* data arrived, command executing */
	KD_IOCTX_ABORTED,
};

struct kd_srpt_rdma_ch {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			 sq_depth;	/* initiator's req_lim */
	u32			 rq_size;
	struct list_head	 fr_pool;
	struct kd_srpt_send_ioctx **ioctx_ring;
	void			*ring_buf;
	struct scatterlist	 ring_sg;
	struct ib_mr		*ring_mr;
	struct ib_reg_wr	 ring_reg_wr;
	struct ib_cqe		 ring_reg_cqe;
	struct completion	 ring_reg_done;
};

struct kd_srpt_send_ioctx {
	struct kd_srpt_rdma_ch	*ch;
	enum kd_ioctx_state	 state;
	struct scatterlist	*sg;
	int			 sg_cnt;
	int			 dma_nents;
	struct ib_mr		*mr;
	bool			 mr_from_alloc;
	u64			 remote_addr;
	u32			 remote_rkey;
	struct ib_reg_wr	 reg_wr;
	struct ib_rdma_wr	 rdma_wr;
	struct ib_sge		 rdma_sge;
	struct ib_send_wr	 inv_wr;
	struct ib_send_wr	 rsp_wr;
	struct ib_sge		 rsp_sge;
	struct ib_cqe		 rdma_cqe;
	struct ib_cqe		 inv_cqe;
	struct ib_cqe		 rsp_cqe;
	struct completion	 inv_done;
};

/* target core glue (srpt_target.c) */
void kd_srpt_execute_cmd(struct kd_srpt_send_ioctx *ioctx);
void kd_srpt_queue_status(struct kd_srpt_send_ioctx *ioctx, int status);
void kd_srpt_rsp_done(struct ib_cq *cq, struct ib_wc *wc);
struct kd_srpt_send_ioctx *kd_srpt_find_tag(struct kd_srpt_rdma_ch *ch, u64 tag);
static void kd_srpt_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc);

static void kd_srpt_put_mr(struct kd_srpt_rdma_ch *ch,
			   struct kd_srpt_send_ioctx *ioctx)
{
	if (ioctx->mr_from_alloc)
		ib_dereg_mr(ioctx->mr);	// BUG: rdma-registration-in-datapath -- the overflow MR is deregistered from the completion path, once per command
	else
		ib_mr_pool_put(ch->qp, &ch->fr_pool, ioctx->mr);
	ioctx->mr = NULL;
}

static void kd_srpt_release_data(struct kd_srpt_rdma_ch *ch,
				 struct kd_srpt_send_ioctx *ioctx)
{
	kd_srpt_put_mr(ch, ioctx);
	ib_dma_unmap_sg(ch->dev, ioctx->sg, ioctx->sg_cnt, DMA_FROM_DEVICE);
}

static int kd_srpt_map_data(struct kd_srpt_rdma_ch *ch,
			    struct kd_srpt_send_ioctx *ioctx)
{
	struct ib_mr *mr;
	int n, ret;

	ioctx->dma_nents = ib_dma_map_sg(ch->dev, ioctx->sg, ioctx->sg_cnt,
					 DMA_FROM_DEVICE);
	if (!ioctx->dma_nents)
		return -EIO;

	ioctx->mr_from_alloc = false;
	mr = ib_mr_pool_get(ch->qp, &ch->fr_pool);
	if (!mr) {
		/* pool exhausted under load: fall back to a private MR */
		mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, KD_SRPT_FR_PAGES);	// BUG: rdma-registration-in-datapath -- an MR is allocated for a single command on the submit path
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto out_unmap;
		}
		ioctx->mr_from_alloc = true;
	}
	ioctx->mr = mr;

	n = ib_map_mr_sg(mr, ioctx->sg, ioctx->dma_nents, NULL, PAGE_SIZE);
	if (unlikely(n < ioctx->dma_nents))
		return -EINVAL;	// BUG: rdma-mr-leak -- the MR stored in ioctx->mr is neither put back nor deregistered on this error return

	ioctx->reg_wr.wr.opcode = IB_WR_REG_MR;
	ioctx->reg_wr.wr.send_flags = 0;
	ioctx->reg_wr.wr.next = &ioctx->rdma_wr.wr;
	ioctx->reg_wr.mr = mr;	// BUG: rdma-rkey-reuse -- a pooled MR is registered again under the rkey of its previous command; nothing calls ib_update_fast_reg_key()
	ioctx->reg_wr.key = mr->rkey;
	/* iWARP places the READ response with the sink's STag */
	ioctx->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;	/* OK: rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-access-flags-invalid -- the READ sink gets REMOTE_WRITE on every transport, without a transport test, and LOCAL_WRITE is there */

	ioctx->rdma_sge.addr = mr->iova;
	ioctx->rdma_sge.length = mr->length;
	ioctx->rdma_sge.lkey = mr->lkey;
	ioctx->rdma_wr.wr.opcode = IB_WR_RDMA_READ;
	ioctx->rdma_wr.wr.sg_list = &ioctx->rdma_sge;
	ioctx->rdma_wr.wr.num_sge = 1;
	ioctx->rdma_cqe.done = kd_srpt_rdma_read_done;
	ioctx->rdma_wr.wr.wr_cqe = &ioctx->rdma_cqe;
	ioctx->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	ioctx->rdma_wr.wr.next = NULL;
	ioctx->rdma_wr.remote_addr = ioctx->remote_addr;
	ioctx->rdma_wr.rkey = ioctx->remote_rkey;
	return 0;

out_unmap:
	ib_dma_unmap_sg(ch->dev, ioctx->sg, ioctx->sg_cnt, DMA_FROM_DEVICE);
	return ret;
}

int kd_srpt_get_write_data(struct kd_srpt_rdma_ch *ch,
			   struct kd_srpt_send_ioctx *ioctx)
{
	int ret;

	ret = kd_srpt_map_data(ch, ioctx);
	if (ret)
		return ret;

	ioctx->state = KD_IOCTX_NEED_DATA;
	ret = ib_post_send(ch->qp, &ioctx->reg_wr.wr, NULL);
	if (unlikely(ret)) {
		ioctx->state = KD_IOCTX_NEW;
		kd_srpt_release_data(ch, ioctx);	/* OK: rdma-invalidation-leak -- the post failed, the REG_MR never ran */
	}
	return ret;
}

static void kd_srpt_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_srpt_send_ioctx *ioctx =
		container_of(wc->wr_cqe, struct kd_srpt_send_ioctx, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		/* key state unknown: leave the MR to channel teardown */
		pr_err("srpt: LOCAL_INV failed: %s\n",
		       ib_wc_status_msg(wc->status));
		complete(&ioctx->inv_done);
		return;
	}
	kd_srpt_put_mr(ioctx->ch, ioctx);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the MR goes back to the pool from the LOCAL_INV completion */
	complete(&ioctx->inv_done);
}

static void kd_srpt_rdma_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_srpt_send_ioctx *ioctx =
		container_of(wc->wr_cqe, struct kd_srpt_send_ioctx, rdma_cqe);
	struct kd_srpt_rdma_ch *ch = ioctx->ch;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_info("srpt: RDMA READ failed: %s\n",
			ib_wc_status_msg(wc->status));
		kd_srpt_release_data(ch, ioctx);	// BUG: rdma-invalidation-leak -- the REG_MR ahead of the failed READ executed; the MR goes back to the pool with its remote-write key still valid, while the success path invalidates
		kd_srpt_queue_status(ioctx, -EIO);
		return;
	}
	if (ioctx->state == KD_IOCTX_ABORTED)
		pr_debug("srpt: data for aborted command arrived\n");

	init_completion(&ioctx->inv_done);
	ioctx->inv_wr.opcode = IB_WR_LOCAL_INV;
	ioctx->inv_wr.ex.invalidate_rkey = ioctx->mr->rkey;
	ioctx->inv_wr.wr_cqe = &ioctx->inv_cqe;
	ioctx->inv_wr.send_flags = IB_SEND_SIGNALED;
	ioctx->inv_wr.next = NULL;
	ioctx->inv_cqe.done = kd_srpt_inv_done;
	if (ib_post_send(ch->qp, &ioctx->inv_wr, NULL)) {
		ioctx->state = KD_IOCTX_ABORTED;
		return;
	}

	/* the backend can have the data right away */
	ib_dma_unmap_sg(ch->dev, ioctx->sg, ioctx->sg_cnt, DMA_FROM_DEVICE);	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV was just posted; the sink pages are unmapped before it completed, while the key still allows remote writes
	ioctx->state = KD_IOCTX_DATA_IN;
	kd_srpt_execute_cmd(ioctx);
}

int kd_srpt_send_rsp(struct kd_srpt_rdma_ch *ch,
		     struct kd_srpt_send_ioctx *ioctx, u32 len)
{
	ioctx->rsp_sge.length = len;
	ioctx->rsp_cqe.done = kd_srpt_rsp_done;
	ioctx->rsp_wr.wr_cqe = &ioctx->rsp_cqe;
	ioctx->rsp_wr.opcode = IB_WR_SEND;
	ioctx->rsp_wr.send_flags = IB_SEND_SIGNALED;
	ioctx->rsp_wr.sg_list = &ioctx->rsp_sge;
	ioctx->rsp_wr.num_sge = 1;
	return ib_post_send(ch->qp, &ioctx->rsp_wr, NULL);
}

/* SRP_TSK_ABORT_TASK */
int kd_srpt_abort_task(struct kd_srpt_rdma_ch *ch, u64 tag)
{
	struct kd_srpt_send_ioctx *ioctx = kd_srpt_find_tag(ch, tag);

	if (!ioctx)
		return -ENOENT;

	switch (ioctx->state) {
	case KD_IOCTX_NEED_DATA:
		/* don't wait for the initiator's data: free the command now */
		ioctx->state = KD_IOCTX_ABORTED;
		kd_srpt_release_data(ch, ioctx);	// BUG: rdma-invalidation-leak -- REG_MR and READ are in flight; the MR returns to the pool with its key valid and no LOCAL_INV
		kd_srpt_queue_status(ioctx, -ECANCELED);
		return 0;
	case KD_IOCTX_DATA_IN:
		ioctx->state = KD_IOCTX_ABORTED;	/* the backend completes it */
		return 0;
	default:
		return -EBUSY;
	}
}

static void kd_srpt_ring_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_srpt_rdma_ch *ch =
		container_of(wc->wr_cqe, struct kd_srpt_rdma_ch, ring_reg_cqe);

	complete(&ch->ring_reg_done);
}

/* One MR over all receive IUs: immediate data lands in them. */
static int kd_srpt_alloc_ring(struct kd_srpt_rdma_ch *ch)
{
	size_t len = (size_t)ch->rq_size * KD_SRPT_IU_SIZE;
	int ret;

	ch->ring_buf = kzalloc(len, GFP_KERNEL);
	if (!ch->ring_buf)
		return -ENOMEM;
	sg_init_one(&ch->ring_sg, ch->ring_buf, len);
	if (!ib_dma_map_sg(ch->dev, &ch->ring_sg, 1, DMA_FROM_DEVICE)) {
		ret = -EIO;
		goto out_free;
	}
	ch->ring_mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG,
				  DIV_ROUND_UP(len, PAGE_SIZE));
	if (IS_ERR(ch->ring_mr)) {
		ret = PTR_ERR(ch->ring_mr);
		goto out_unmap;
	}
	if (ib_map_mr_sg(ch->ring_mr, &ch->ring_sg, 1, NULL, PAGE_SIZE) != 1) {
		ret = -EINVAL;
		goto out_dereg;
	}

	ch->ring_reg_cqe.done = kd_srpt_ring_reg_done;
	ch->ring_reg_wr.wr.wr_cqe = &ch->ring_reg_cqe;
	ch->ring_reg_wr.wr.opcode = IB_WR_REG_MR;
	ch->ring_reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	ch->ring_reg_wr.mr = ch->ring_mr;	/* OK: rdma-rkey-reuse -- a fresh MR, registered once for the channel's lifetime */
	ch->ring_reg_wr.key = ch->ring_mr->rkey;
	/* the initiator writes immediate data into the IUs */
	ch->ring_reg_wr.access = IB_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-invalid, rdma-remote-access-overbroad -- REMOTE_WRITE without LOCAL_WRITE fails the registration (and receives need LOCAL_WRITE); immediate data arrives by SEND and the ring's rkey is never given out
	init_completion(&ch->ring_reg_done);
	ret = ib_post_send(ch->qp, &ch->ring_reg_wr.wr, NULL);
	if (ret)
		goto out_unmap;	// BUG: rdma-mr-leak -- jumps past out_dereg; the ring MR is never released
	wait_for_completion(&ch->ring_reg_done);
	return 0;

out_dereg:
	ib_dereg_mr(ch->ring_mr);
out_unmap:
	ib_dma_unmap_sg(ch->dev, &ch->ring_sg, 1, DMA_FROM_DEVICE);
out_free:
	kfree(ch->ring_buf);
	return ret;
}

int kd_srpt_create_ch_ib(struct kd_srpt_rdma_ch *ch)
{
	struct ib_qp_init_attr attr = { };
	int ret;

	ch->rq_size = min_t(u32, KD_SRPT_RQ_SIZE, ch->dev->attrs.max_qp_wr);

	attr.qp_context = ch;
	attr.send_cq = ch->cq;
	attr.recv_cq = ch->cq;
	/* one RDMA READ/WRITE and one response per command, +1 for drain */
	attr.cap.max_send_wr = 2 * ch->sq_depth + 1;	// BUG(file): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- a write command posts REG_MR, READ, LOCAL_INV and the response (4 WRs), and the factor is hand-made for a file that registers per command
	attr.cap.max_recv_wr = ch->rq_size;
	attr.cap.max_send_sge = KD_SRPT_MAX_SGE;	// BUG(file): rdma-queue-cap-unchecked -- 16 SGEs requested without comparing with attrs.max_send_sge
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;	/* OK: rdma-unsignaled-send-starvation -- READs, LOCAL_INVs and responses are all signaled */
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(ch->cm_id, ch->pd, &attr);
	if (ret)
		return ret;
	ch->qp = ch->cm_id->qp;

	ret = ib_mr_pool_init(ch->qp, &ch->fr_pool, ch->sq_depth,
			      IB_MR_TYPE_MEM_REG, KD_SRPT_FR_PAGES, 0);
	if (ret)
		goto out_qp;
	ret = kd_srpt_alloc_ring(ch);
	if (ret)
		goto out_pool;
	return 0;

out_pool:
	ib_mr_pool_destroy(ch->qp, &ch->fr_pool);
out_qp:
	rdma_destroy_qp(ch->cm_id);
	return ret;
}

void kd_srpt_close_ch(struct kd_srpt_rdma_ch *ch)
{
	struct kd_srpt_send_ioctx *ioctx;
	u32 i;

	/* kill every key the initiator may still hold, then disconnect */
	for (i = 0; i < ch->sq_depth; i++) {
		ioctx = ch->ioctx_ring[i];
		if (!ioctx->mr || ioctx->state != KD_IOCTX_NEED_DATA)
			continue;
		init_completion(&ioctx->inv_done);
		ioctx->inv_wr.opcode = IB_WR_LOCAL_INV;
		ioctx->inv_wr.ex.invalidate_rkey = ioctx->mr->rkey;
		ioctx->inv_wr.wr_cqe = &ioctx->inv_cqe;
		ioctx->inv_wr.send_flags = IB_SEND_SIGNALED;
		ioctx->inv_cqe.done = kd_srpt_inv_done;
		if (ib_post_send(ch->qp, &ioctx->inv_wr, NULL)) {
			ib_dereg_mr(ioctx->mr);	/* OK: rdma-registration-in-datapath -- channel teardown walking the whole ioctx table, not a per-command release */
			ioctx->mr = NULL;
			continue;
		}
		wait_for_completion(&ioctx->inv_done);
		ib_dma_unmap_sg(ch->dev, ioctx->sg, ioctx->sg_cnt, /* OK: rdma-unmap-before-invalidate -- unmapped only after the LOCAL_INV completion was waited for */
				DMA_FROM_DEVICE);
	}

	rdma_disconnect(ch->cm_id);
	ib_drain_qp(ch->qp);
	ib_mr_pool_destroy(ch->qp, &ch->fr_pool);
	ib_dereg_mr(ch->ring_mr);	/* OK: rdma-mr-leak, rdma-invalidation-leak -- the ring MR is deregistered before its memory is unmapped and freed */
	ib_dma_unmap_sg(ch->dev, &ch->ring_sg, 1, DMA_FROM_DEVICE);
	kfree(ch->ring_buf);
	rdma_destroy_qp(ch->cm_id);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kd SRP-target-like module");
