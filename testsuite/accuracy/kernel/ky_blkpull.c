// SPDX-License-Identifier: GPL-2.0
/*
 * kyp: block resync over RDMA, secondary side.
 *
 * The secondary pulls dirty blocks from the primary with RDMA READ into its
 * own pages and pushes blocks back with RDMA WRITE on a data QP; dirty-block
 * notices and acks travel as small inline SENDs on a separate control QP.
 * Works on InfiniBand, RoCE and iWARP adapters: a pull that fits in the
 * device's READ scatter limit goes straight into the pages on IB/RoCE,
 * everything else (and every pull on iWARP) is fast-registered first.
 * Queue sizes are derived from the device attributes where they can be.
 *
 * Wrong: the fast-registered sink's access rights are picked with an inline
 * iWARP test; the superblock and the resync bitmap are read into memory
 * with no remote-write rights, which an iWARP READ needs; pooled sink MRs
 * are re-registered under their old key; the data QP's send queue is sized
 * with a hand-made per-pull factor; the control QP's notice ring is a
 * constant nobody compares with max_qp_wr, and nothing on the control QP
 * is ever signaled.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- lifetime checks are not the subject of this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/mr_pool.h>

#define KYP_WRS_PER_PULL	3	/* LOCAL_INV + REG_MR + RDMA READ */
#define KYP_MAX_READ_SGES	16
#define KYP_MAX_PULL_PAGES	64
#define KYP_CTL_MSGS		16
#define KYP_NOTICE_RING		4096
#define KYP_BITMAP_PAGES	8
#define KYP_SB_SIZE		4096

static unsigned int kyp_queue_depth = 128;
module_param(kyp_queue_depth, uint, 0444);
MODULE_PARM_DESC(kyp_queue_depth, "pulls in flight per resync queue");

enum kyp_msg_op { KYP_NOTICE = 1, KYP_PULL_ACK, KYP_PUSH_DONE };

struct kyp_ctl_msg {
	__le32	opcode;
	__le32	len;
	__le64	sector;
	__le64	seq;
	__le64	remote_addr;
	__le32	rkey;
	__le32	rsvd;
};

struct kyp_ctl_slot {
	struct ib_cqe		cqe;
	struct ib_send_wr	wr;
	struct ib_sge		sge;
	struct kyp_ctl_msg	msg;
};

struct kyp_queue;

struct kyp_xfer {
	struct list_head	entry;
	struct kyp_queue	*q;
	struct ib_cqe		cqe;
	struct ib_cqe		reg_cqe;
	enum dma_data_direction	dir;
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	rdma_wr;
	struct ib_sge		sge[KYP_MAX_READ_SGES];
	struct ib_mr		*mr;
	struct scatterlist	sgl[KYP_MAX_PULL_PAGES];
	int			nents;
	int			dma_nents;
	u64			sector;
	u64			remote_addr;
	u32			rkey;
};

struct kyp_queue {
	struct ib_device	*dev;
	u32			port;
	struct ib_pd		*pd;
	struct rdma_cm_id	*data_id;
	struct rdma_cm_id	*ctl_id;
	struct ib_qp		*data_qp;
	struct ib_qp		*ctl_qp;
	struct ib_cq		*data_cq;
	struct ib_cq		*ctl_cq;
	unsigned int		depth;
	u32			max_read_sge;

	spinlock_t		lock;
	struct list_head	free_xfers;
	struct kyp_xfer		*xfers;
	struct kyp_ctl_slot	ctl[KYP_CTL_MSGS];
	unsigned int		ctl_next;
	u64			seq;

	struct ib_mr		*bitmap_mr;
	struct scatterlist	bitmap_sg[KYP_BITMAP_PAGES];
	struct ib_reg_wr	bitmap_reg;
	struct ib_cqe		sync_cqe;
	struct completion	sync_done;
	int			sync_status;
	void			*sb_buf;
};

/* kyp_notice.c: receive ring of dirty-block notices on the control QP */
int kyp_notice_ring_init(struct kyp_queue *q, struct ib_qp *qp,
			 unsigned int nr);

static void kyp_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyp_queue *q = container_of(wc->wr_cqe, struct kyp_queue,
					   sync_cqe);

	q->sync_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&q->sync_done);
}

static void kyp_ctl_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyp: control send failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

static int kyp_create_data_qp(struct kyp_queue *q)
{
	struct ib_device *dev = q->dev;
	struct ib_qp_init_attr attr = { };
	int ret;

	/* iWARP adapters take a single SGE in an RDMA READ */
	if (rdma_protocol_iwarp(dev, q->port))	// OK: rdma-access-flags-transport -- the transport test sizes READ scatter lists, it decides no access rights
		q->max_read_sge = 1;
	else
		q->max_read_sge = min_t(u32, dev->attrs.max_sge_rd,
					KYP_MAX_READ_SGES);

	q->depth = min_t(u32, kyp_queue_depth, (dev->attrs.max_qp_wr - 1) / KYP_WRS_PER_PULL);	// OK: rdma-queue-cap-unchecked -- the depth is clamped so that the queue fits in max_qp_wr

	attr.qp_context = q;
	attr.send_cq = q->data_cq;
	attr.recv_cq = q->data_cq;
	// OK: rdma-send-queue-undersized -- three entries per pull (LOCAL_INV, REG_MR, READ) and one for the drain
	attr.cap.max_send_wr = KYP_WRS_PER_PULL * q->depth + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor for the LOCAL_INV/REG_MR of each pull
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = min_t(u32, dev->attrs.max_send_sge, KYP_MAX_READ_SGES);	// OK: rdma-queue-cap-unchecked -- clamped to the device's max_send_sge
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(q->data_id, q->pd, &attr);
	if (ret)
		return ret;
	q->data_qp = q->data_id->qp;

	ret = ib_mr_pool_init(q->data_qp, &q->data_qp->rdma_mrs, q->depth,
			      IB_MR_TYPE_MEM_REG, KYP_MAX_PULL_PAGES, 0);
	if (ret)
		rdma_destroy_qp(q->data_id);
	return ret;
}

static int kyp_create_ctl_qp(struct kyp_queue *q)
{
	struct ib_qp_init_attr attr = { };
	int ret, i;

	attr.qp_context = q;
	attr.send_cq = q->ctl_cq;
	attr.recv_cq = q->ctl_cq;
	attr.cap.max_send_wr = KYP_CTL_MSGS + 1;
	/* the primary may stream notices well ahead of our acks */
	attr.cap.max_recv_wr = KYP_NOTICE_RING;	// BUG: rdma-queue-cap-unchecked -- 4096 receives requested without comparing with max_qp_wr
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct kyp_ctl_msg);	// OK: rdma-queue-cap-unchecked -- 40 bytes, and the granted size is checked after creation
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;

	ret = rdma_create_qp(q->ctl_id, q->pd, &attr);
	if (ret)
		return ret;
	q->ctl_qp = q->ctl_id->qp;
	if (attr.cap.max_inline_data < sizeof(struct kyp_ctl_msg)) {
		rdma_destroy_qp(q->ctl_id);
		return -EOPNOTSUPP;
	}

	for (i = 0; i < KYP_CTL_MSGS; i++)
		q->ctl[i].cqe.done = kyp_ctl_send_done;

	ret = kyp_notice_ring_init(q, q->ctl_qp, KYP_NOTICE_RING);
	if (ret)
		rdma_destroy_qp(q->ctl_id);
	return ret;
}

/* Small control message; inline, so the slot is free once posted. */
static int kyp_send_ctl(struct kyp_queue *q, enum kyp_msg_op op, u64 sector,
			u32 len)
{
	struct kyp_ctl_slot *slot;
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	slot = &q->ctl[q->ctl_next++ % KYP_CTL_MSGS];
	slot->msg.opcode = cpu_to_le32(op);
	slot->msg.len = cpu_to_le32(len);
	slot->msg.sector = cpu_to_le64(sector);
	slot->msg.seq = cpu_to_le64(q->seq++);
	spin_unlock_irqrestore(&q->lock, flags);

	slot->sge.addr = (uintptr_t)&slot->msg;
	slot->sge.length = sizeof(slot->msg);
	slot->sge.lkey = q->pd->local_dma_lkey;
	slot->wr.next = NULL;
	slot->wr.wr_cqe = &slot->cqe;
	slot->wr.sg_list = &slot->sge;
	slot->wr.num_sge = 1;
	slot->wr.opcode = IB_WR_SEND;
	slot->wr.send_flags = IB_SEND_INLINE;	// BUG(file): rdma-unsignaled-send-starvation -- no post on the control QP ever asks for a completion, so its send queue fills after KYP_CTL_MSGS+1 messages

	return ib_post_send(q->ctl_qp, &slot->wr, NULL);
}

static enum ib_wr_opcode kyp_read_opcode(struct kyp_queue *q)
{
	/* iWARP kills the sink STag with the READ itself */
	return rdma_cap_read_inv(q->dev, q->port) ? IB_WR_RDMA_READ_WITH_INV : IB_WR_RDMA_READ;	// OK: rdma-access-flags-transport -- chooses the opcode, not access rights
}

/* LOCAL_INV and REG_MR of a pull are unsignaled: only errors get here */
static void kyp_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyp: sink registration failed: %s\n",
		       ib_wc_status_msg(wc->status));
}

static void kyp_xfer_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kyp_xfer *x = container_of(wc->wr_cqe, struct kyp_xfer, cqe);
	struct kyp_queue *q = x->q;
	unsigned long flags;

	ib_dma_unmap_sg(q->dev, x->sgl, x->nents, x->dir);
	if (x->mr) {
		ib_mr_pool_put(q->data_qp, &q->data_qp->rdma_mrs, x->mr);
		x->mr = NULL;
	}
	if (wc->status == IB_WC_SUCCESS)
		kyp_send_ctl(q, x->dir == DMA_TO_DEVICE ? KYP_PUSH_DONE :
				KYP_PULL_ACK, x->sector, 0);
	else if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kyp: transfer of sector %llu failed: %s\n", x->sector,
		       ib_wc_status_msg(wc->status));

	spin_lock_irqsave(&q->lock, flags);
	list_add_tail(&x->entry, &q->free_xfers);
	spin_unlock_irqrestore(&q->lock, flags);
}

static void kyp_build_rdma(struct kyp_xfer *x, enum ib_wr_opcode op)
{
	x->cqe.done = kyp_xfer_done;
	x->rdma_wr.wr.next = NULL;
	x->rdma_wr.wr.wr_cqe = &x->cqe;
	x->rdma_wr.wr.sg_list = x->sge;
	x->rdma_wr.wr.opcode = op;
	x->rdma_wr.wr.send_flags = IB_SEND_SIGNALED;
	x->rdma_wr.remote_addr = x->remote_addr;
	x->rdma_wr.rkey = x->rkey;
}

/* IB/RoCE only: READ straight into the pages. */
static int kyp_pull_direct(struct kyp_queue *q, struct kyp_xfer *x)
{
	struct scatterlist *sg;
	int i;

	for_each_sg(x->sgl, sg, x->dma_nents, i) {
		x->sge[i].addr = sg_dma_address(sg);
		x->sge[i].length = sg_dma_len(sg);
		x->sge[i].lkey = q->pd->local_dma_lkey;
	}
	x->rdma_wr.wr.num_sge = x->dma_nents;
	kyp_build_rdma(x, IB_WR_RDMA_READ);	// OK: rdma-access-flags-transport -- kyp_pull() sends iWARP pulls to kyp_pull_fastreg(); this path never runs on iWARP
	return ib_post_send(q->data_qp, &x->rdma_wr.wr, NULL);
}

static int kyp_pull_fastreg(struct kyp_queue *q, struct kyp_xfer *x)
{
	struct ib_send_wr *first;
	struct ib_mr *mr;
	int n;

	mr = ib_mr_pool_get(q->data_qp, &q->data_qp->rdma_mrs);
	if (!mr)
		return -EAGAIN;
	n = ib_map_mr_sg(mr, x->sgl, x->dma_nents, NULL, PAGE_SIZE);
	if (n < x->dma_nents) {
		ib_mr_pool_put(q->data_qp, &q->data_qp->rdma_mrs, mr);
		return -EINVAL;
	}
	x->mr = mr;

	x->reg_cqe.done = kyp_reg_done;
	first = &x->reg_wr.wr;
	if (mr->need_inval) {
		x->inv_wr.next = &x->reg_wr.wr;
		x->inv_wr.opcode = IB_WR_LOCAL_INV;
		x->inv_wr.ex.invalidate_rkey = mr->rkey;
		x->inv_wr.num_sge = 0;
		x->inv_wr.send_flags = 0;
		x->inv_wr.wr_cqe = &x->reg_cqe;
		first = &x->inv_wr;
	}

	x->reg_wr.wr.next = &x->rdma_wr.wr;
	x->reg_wr.wr.opcode = IB_WR_REG_MR;
	x->reg_wr.wr.num_sge = 0;
	x->reg_wr.wr.send_flags = 0;
	x->reg_wr.wr.wr_cqe = &x->reg_cqe;
	x->reg_wr.mr = mr;	// BUG: rdma-rkey-reuse -- an MR from ib_mr_pool_get() is registered again under the key of its previous pull
	x->reg_wr.key = mr->rkey;
	x->reg_wr.access = IB_ACCESS_LOCAL_WRITE;	// OK: rdma-access-flags-invalid -- REMOTE_WRITE below is always added together with LOCAL_WRITE
	// OK: rdma-remote-access-overbroad -- REMOTE_WRITE is what an iWARP READ sink needs; the key is killed by the READ_WITH_INV
	if (rdma_protocol_iwarp(q->dev, q->port))
		x->reg_wr.access |= IB_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-transport -- sink rights chosen by an inline iWARP test instead of letting rdma_rw register the sink

	x->sge[0].addr = mr->iova;
	x->sge[0].length = mr->length;
	x->sge[0].lkey = mr->lkey;
	x->rdma_wr.wr.num_sge = 1;
	// OK: rdma-unsignaled-send-starvation -- LOCAL_INV and REG_MR are unsignaled, the READ that ends the chain is signaled
	kyp_build_rdma(x, kyp_read_opcode(q));
	if (x->rdma_wr.wr.opcode == IB_WR_RDMA_READ_WITH_INV)
		x->rdma_wr.wr.ex.invalidate_rkey = mr->lkey;
	mr->need_inval = x->rdma_wr.wr.opcode != IB_WR_RDMA_READ_WITH_INV;

	return ib_post_send(q->data_qp, first, NULL);
}

int kyp_pull(struct kyp_queue *q, struct kyp_xfer *x)
{
	x->q = q;
	x->mr = NULL;
	x->dir = DMA_FROM_DEVICE;
	x->dma_nents = ib_dma_map_sg(q->dev, x->sgl, x->nents, x->dir);
	if (!x->dma_nents)
		return -EIO;

	if (!rdma_protocol_iwarp(q->dev, q->port) &&
	    x->dma_nents <= q->max_read_sge)
		return kyp_pull_direct(q, x);
	return kyp_pull_fastreg(q, x);
}

int kyp_push(struct kyp_queue *q, struct kyp_xfer *x)
{
	struct scatterlist *sg;
	int i;

	x->q = q;
	x->mr = NULL;
	x->dir = DMA_TO_DEVICE;
	x->dma_nents = ib_dma_map_sg(q->dev, x->sgl, x->nents, x->dir);
	if (!x->dma_nents || x->dma_nents > KYP_MAX_READ_SGES)
		return -EIO;

	for_each_sg(x->sgl, sg, x->dma_nents, i) {
		x->sge[i].addr = sg_dma_address(sg);
		x->sge[i].length = sg_dma_len(sg);
		x->sge[i].lkey = q->pd->local_dma_lkey;
	}
	x->rdma_wr.wr.num_sge = x->dma_nents;
	kyp_build_rdma(x, IB_WR_RDMA_WRITE);	// OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights
	return ib_post_send(q->data_qp, &x->rdma_wr.wr, NULL);
}

/* Read the primary's superblock before the bitmap. */
static int kyp_fetch_sb(struct kyp_queue *q, u64 raddr, u32 rkey)
{
	struct ib_rdma_wr wr = { };
	struct ib_sge sge;
	u64 dma;
	int ret;

	dma = ib_dma_map_single(q->dev, q->sb_buf, KYP_SB_SIZE, DMA_FROM_DEVICE);
	if (ib_dma_mapping_error(q->dev, dma))
		return -ENOMEM;

	sge.addr = dma;
	sge.length = KYP_SB_SIZE;
	sge.lkey = q->pd->local_dma_lkey;

	q->sync_cqe.done = kyp_sync_done;
	reinit_completion(&q->sync_done);
	wr.wr.wr_cqe = &q->sync_cqe;
	wr.wr.sg_list = &sge;
	wr.wr.num_sge = 1;
	wr.wr.opcode = IB_WR_RDMA_READ;	// BUG: rdma-access-flags-transport -- READ into memory addressed with local_dma_lkey, which has no remote-write rights; fails on iWARP
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.remote_addr = raddr;
	wr.rkey = rkey;

	ret = ib_post_send(q->data_qp, &wr.wr, NULL);
	if (!ret) {
		wait_for_completion(&q->sync_done);
		ret = q->sync_status;
	}
	ib_dma_unmap_single(q->dev, dma, KYP_SB_SIZE, DMA_FROM_DEVICE);
	return ret;
}

/* The bitmap MR is registered once and kept for every later resync. */
static int kyp_bitmap_setup(struct kyp_queue *q)
{
	int nents, ret;

	// OK: rdma-registration-in-datapath -- allocated on the first resync only and kept in the queue
	q->bitmap_mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG, KYP_BITMAP_PAGES);
	if (IS_ERR(q->bitmap_mr))
		return PTR_ERR(q->bitmap_mr);

	nents = ib_dma_map_sg(q->dev, q->bitmap_sg, KYP_BITMAP_PAGES,
			      DMA_FROM_DEVICE);
	if (ib_map_mr_sg(q->bitmap_mr, q->bitmap_sg, nents, NULL,
			 PAGE_SIZE) != nents) {
		ret = -EINVAL;
		goto out_dereg;
	}

	q->sync_cqe.done = kyp_sync_done;
	reinit_completion(&q->sync_done);
	q->bitmap_reg.wr.opcode = IB_WR_REG_MR;
	q->bitmap_reg.wr.wr_cqe = &q->sync_cqe;
	q->bitmap_reg.wr.send_flags = IB_SEND_SIGNALED;
	q->bitmap_reg.mr = q->bitmap_mr;	// OK: rdma-rkey-reuse -- the MR is registered once, right after ib_alloc_mr()
	q->bitmap_reg.key = q->bitmap_mr->rkey;
	q->bitmap_reg.access = IB_ACCESS_LOCAL_WRITE;

	ret = ib_post_send(q->data_qp, &q->bitmap_reg.wr, NULL);
	if (ret)
		goto out_dereg;
	wait_for_completion(&q->sync_done);
	if (!q->sync_status)
		return 0;
	ret = q->sync_status;
out_dereg:
	ib_dma_unmap_sg(q->dev, q->bitmap_sg, KYP_BITMAP_PAGES, DMA_FROM_DEVICE);
	ib_dereg_mr(q->bitmap_mr);
	q->bitmap_mr = NULL;
	return ret;
}

int kyp_resync_begin(struct kyp_queue *q, u64 sb_addr, u64 bm_addr, u32 rkey)
{
	struct ib_rdma_wr wr = { };
	struct ib_sge sge;
	int ret;

	ret = kyp_fetch_sb(q, sb_addr, rkey);
	if (ret)
		return ret;
	if (!q->bitmap_mr) {
		ret = kyp_bitmap_setup(q);
		if (ret)
			return ret;
	}

	sge.addr = q->bitmap_mr->iova;
	sge.length = q->bitmap_mr->length;
	sge.lkey = q->bitmap_mr->lkey;

	q->sync_cqe.done = kyp_sync_done;
	reinit_completion(&q->sync_done);
	wr.wr.wr_cqe = &q->sync_cqe;
	wr.wr.sg_list = &sge;
	wr.wr.num_sge = 1;
	wr.wr.opcode = IB_WR_RDMA_READ;	// BUG: rdma-access-flags-transport -- the bitmap MR was registered with LOCAL_WRITE only; an iWARP READ into it fails
	wr.wr.send_flags = IB_SEND_SIGNALED;
	wr.remote_addr = bm_addr;
	wr.rkey = rkey;

	ret = ib_post_send(q->data_qp, &wr.wr, NULL);
	if (ret)
		return ret;
	wait_for_completion(&q->sync_done);
	return q->sync_status;
}

int kyp_queue_setup(struct kyp_queue *q)
{
	int i, ret;

	spin_lock_init(&q->lock);
	INIT_LIST_HEAD(&q->free_xfers);
	init_completion(&q->sync_done);

	q->pd = ib_alloc_pd(q->dev, 0);
	if (IS_ERR(q->pd))
		return PTR_ERR(q->pd);
	q->sb_buf = kzalloc(KYP_SB_SIZE, GFP_KERNEL);
	q->data_cq = ib_cq_pool_get(q->dev, KYP_WRS_PER_PULL * kyp_queue_depth + 1,
				    0, IB_POLL_WORKQUEUE);
	q->ctl_cq = ib_cq_pool_get(q->dev, KYP_NOTICE_RING + KYP_CTL_MSGS + 1,
				   0, IB_POLL_WORKQUEUE);
	if (!q->sb_buf || IS_ERR(q->data_cq) || IS_ERR(q->ctl_cq)) {
		ret = -ENOMEM;
		goto out;
	}

	ret = kyp_create_data_qp(q);
	if (ret)
		goto out;
	ret = kyp_create_ctl_qp(q);
	if (ret)
		goto out;

	q->xfers = kcalloc(q->depth, sizeof(*q->xfers), GFP_KERNEL);
	if (!q->xfers) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < q->depth; i++) {
		sg_init_table(q->xfers[i].sgl, KYP_MAX_PULL_PAGES);
		list_add_tail(&q->xfers[i].entry, &q->free_xfers);
	}
	return 0;
out:
	pr_err("kyp: queue setup failed: %d\n", ret);
	return ret;
}

void kyp_queue_teardown(struct kyp_queue *q)
{
	rdma_disconnect(q->data_id);
	rdma_disconnect(q->ctl_id);
	ib_drain_qp(q->data_qp);
	ib_drain_qp(q->ctl_qp);
	ib_mr_pool_destroy(q->data_qp, &q->data_qp->rdma_mrs);
	if (q->bitmap_mr)
		ib_dereg_mr(q->bitmap_mr);
	rdma_destroy_qp(q->ctl_id);
	rdma_destroy_qp(q->data_id);
	kfree(q->xfers);
	kfree(q->sb_buf);
	ib_dealloc_pd(q->pd);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kyp block resync over RDMA");
