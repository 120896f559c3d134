// NOT-ANNOTATED: rdma-local-mr-management -- the author left its sites unannotated (the check is not run by default)
// SPDX-License-Identifier: GPL-2.0
/*
 * kd_rds_frmr.c - RDS over InfiniBand: fast-registration MR pool, modelled
 * on net/rds/ib_frmr.c and ib_rdma.c.  RDS_GET_MR takes a clean FRMR from
 * the free list, registers it for remote access and returns the rkey to
 * the socket layer (it travels to the peer in the RDMA cookie).  Released
 * MRs go to the drop list, which a flush invalidates (LOCAL_INV) before the
 * MRs return to the free list.  REG_MR/LOCAL_INV are gated by i_fastreg_wrs.
 *
 * Correct: key rotation (remap_count++), credit-gated queue sizing, the
 * flush that waits for every LOCAL_INV.  Not correct: MR leaks on the
 * allocation error path and for stale MRs at teardown, a registration
 * timeout and a "no invalidate" free that recycle live keys, the use-once
 * path that unmaps before its LOCAL_INV completed.
 */
#include <linux/types.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/mm.h>
#include <linux/string.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KD_RDS_FR_WRS		256	/* fastreg + local-inv credits */
#define KD_RDS_MAX_SGE		8
#define KD_RDS_REG_TMO_MS	2000
#define KD_RDS_FLUSH_BATCH	32

enum kd_frmr_state { KD_FRMR_FREE, KD_FRMR_INUSE, KD_FRMR_STALE };

struct kd_rds_conn {
	struct rdma_cm_id	*i_cm_id;
	struct ib_device	*i_dev;
	struct ib_pd		*i_pd;
	struct ib_qp		*i_qp;
	struct ib_cq		*i_cq;
	u32			 i_send_ring_nr;
	u32			 i_recv_ring_nr;
	atomic_t		 i_fastreg_wrs;
	struct kd_rds_pool	*i_pool;
};

struct kd_rds_pool {
	struct kd_rds_conn	*ic;
	spinlock_t		 lock;
	struct list_head	 free_list;	/* clean, handed out first */
	struct list_head	 drop_list;	/* released, not yet invalidated */
	struct list_head	 stale_list;	/* reg/inv failed, must be rebuilt */
	atomic_t		 item_count;
	atomic_t		 dirty_count;
	atomic_t		 inv_pending;
	wait_queue_head_t	 inv_wait;
	unsigned int		 max_items;
	unsigned int		 max_pages;
};

struct kd_rds_ibmr {
	struct kd_rds_pool	*pool;
	struct ib_mr		*mr;
	struct list_head	 entry;
	struct scatterlist	*sg;
	int			 sg_len;
	int			 sg_dma_len;
	enum kd_frmr_state	 state;
	bool			 use_once;
	u8			 remap_count;
	struct completion	 reg_done;
	struct ib_cqe		 reg_cqe;
	struct ib_cqe		 inv_cqe;
	struct ib_reg_wr	 reg_wr;
	struct ib_send_wr	 inv_wr;
};

static void kd_rds_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_rds_ibmr *ibmr =
		container_of(wc->wr_cqe, struct kd_rds_ibmr, reg_cqe);

	if (wc->status != IB_WC_SUCCESS)
		ibmr->state = KD_FRMR_STALE;
	atomic_inc(&ibmr->pool->ic->i_fastreg_wrs);
	complete(&ibmr->reg_done);
}

static void kd_rds_park(struct kd_rds_ibmr *ibmr, struct list_head *list)
{
	spin_lock(&ibmr->pool->lock);
	list_add_tail(&ibmr->entry, list);
	spin_unlock(&ibmr->pool->lock);
}

/* Unmap the pages and hand the MR to the next kd_rds_frmr_alloc(). */
static void kd_rds_recycle(struct kd_rds_ibmr *ibmr)
{
	struct kd_rds_pool *pool = ibmr->pool;

	if (ibmr->sg_dma_len)
		ib_dma_unmap_sg(pool->ic->i_dev, ibmr->sg, ibmr->sg_len,
				DMA_BIDIRECTIONAL);
	ibmr->sg_dma_len = 0;
	ibmr->use_once = false;
	spin_lock(&pool->lock);
	list_add(&ibmr->entry, &pool->free_list);
	spin_unlock(&pool->lock);
}

static void kd_rds_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kd_rds_ibmr *ibmr =
		container_of(wc->wr_cqe, struct kd_rds_ibmr, inv_cqe);
	struct kd_rds_pool *pool = ibmr->pool;

	ibmr->state = wc->status == IB_WC_SUCCESS ? KD_FRMR_FREE : KD_FRMR_STALE;
	atomic_inc(&pool->ic->i_fastreg_wrs);
	if (ibmr->use_once && ibmr->state == KD_FRMR_FREE) {
		spin_lock(&pool->lock);
		list_del(&ibmr->entry);
		list_add(&ibmr->entry, &pool->free_list);
		spin_unlock(&pool->lock);
	}
	if (atomic_dec_and_test(&pool->inv_pending))
		wake_up(&pool->inv_wait);
}

static int kd_rds_post_inv(struct kd_rds_ibmr *ibmr)
{
	struct kd_rds_conn *ic = ibmr->pool->ic;
	int ret;

	if (atomic_dec_return(&ic->i_fastreg_wrs) < 0) {
		atomic_inc(&ic->i_fastreg_wrs);
		ibmr->state = KD_FRMR_STALE;
		return -EBUSY;
	}

	memset(&ibmr->inv_wr, 0, sizeof(ibmr->inv_wr));
	ibmr->inv_cqe.done = kd_rds_inv_done;
	ibmr->inv_wr.wr_cqe = &ibmr->inv_cqe;
	ibmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	ibmr->inv_wr.send_flags = IB_SEND_SIGNALED;
	ibmr->inv_wr.ex.invalidate_rkey = ibmr->mr->rkey;

	atomic_inc(&ibmr->pool->inv_pending);
	ret = ib_post_send(ic->i_qp, &ibmr->inv_wr, NULL);
	if (unlikely(ret)) {
		atomic_dec(&ibmr->pool->inv_pending);
		atomic_inc(&ic->i_fastreg_wrs);
		ibmr->state = KD_FRMR_STALE;
	}
	return ret;
}

static int kd_rds_post_reg_frmr(struct kd_rds_ibmr *ibmr)
{
	struct kd_rds_conn *ic = ibmr->pool->ic;
	int n, ret;

	/* fastreg WRs share the SQ with the send ring: take a credit */
	if (atomic_dec_return(&ic->i_fastreg_wrs) < 0) {
		atomic_inc(&ic->i_fastreg_wrs);
		return -EBUSY;
	}

	n = ib_map_mr_sg(ibmr->mr, ibmr->sg, ibmr->sg_dma_len, NULL, PAGE_SIZE);
	if (unlikely(n != ibmr->sg_dma_len)) {
		atomic_inc(&ic->i_fastreg_wrs);
		return n < 0 ? n : -EINVAL;
	}

	ib_update_fast_reg_key(ibmr->mr, ibmr->remap_count++);
	ibmr->state = KD_FRMR_INUSE;
	init_completion(&ibmr->reg_done);

	memset(&ibmr->reg_wr, 0, sizeof(ibmr->reg_wr));
	ibmr->reg_cqe.done = kd_rds_reg_done;
	ibmr->reg_wr.wr.wr_cqe = &ibmr->reg_cqe;
	ibmr->reg_wr.wr.opcode = IB_WR_REG_MR;
	ibmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	ibmr->reg_wr.mr = ibmr->mr;	/* OK: rdma-rkey-reuse -- remap_count++ gives every registration a new key byte */
	ibmr->reg_wr.key = ibmr->mr->rkey;
	ibmr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | /* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is there, and the rkey goes to the socket layer for the peer */
			      IB_ACCESS_REMOTE_WRITE;

	ret = ib_post_send(ic->i_qp, &ibmr->reg_wr.wr, NULL);
	if (unlikely(ret)) {
		atomic_inc(&ic->i_fastreg_wrs);
		ibmr->state = KD_FRMR_STALE;
	}
	return ret;
}

/* Invalidate everything on the drop list and wait for it. */
static void kd_rds_flush_dirty(struct kd_rds_pool *pool)
{
	struct kd_rds_ibmr *ibmr, *next;
	LIST_HEAD(batch);

	spin_lock(&pool->lock);
	list_splice_init(&pool->drop_list, &batch);
	spin_unlock(&pool->lock);

	list_for_each_entry(ibmr, &batch, entry)
		kd_rds_post_inv(ibmr);
	wait_event(pool->inv_wait, atomic_read(&pool->inv_pending) == 0);

	list_for_each_entry_safe(ibmr, next, &batch, entry) {
		list_del(&ibmr->entry);
		atomic_dec(&pool->dirty_count);
		if (ibmr->state == KD_FRMR_STALE) {
			kd_rds_park(ibmr, &pool->stale_list);
			continue;
		}
		kd_rds_recycle(ibmr);	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV of the batch completed before the wait returned */
	}
}

static struct kd_rds_ibmr *kd_rds_frmr_alloc(struct kd_rds_pool *pool)
{
	struct kd_rds_ibmr *ibmr;
	int err;

	spin_lock(&pool->lock);
	ibmr = list_first_entry_or_null(&pool->free_list, struct kd_rds_ibmr,
					entry);
	if (ibmr)
		list_del_init(&ibmr->entry);
	spin_unlock(&pool->lock);
	if (ibmr)
		return ibmr;

	if (atomic_read(&pool->item_count) >= pool->max_items) {
		kd_rds_flush_dirty(pool);	/* pool pressure */
		return ERR_PTR(-EAGAIN);
	}

	ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
	if (!ibmr)
		return ERR_PTR(-ENOMEM);
	ibmr->pool = pool;
	ibmr->mr = ib_alloc_mr(pool->ic->i_pd, IB_MR_TYPE_MEM_REG,
			       pool->max_pages);
	if (IS_ERR(ibmr->mr)) {
		err = PTR_ERR(ibmr->mr);
		goto out_free;
	}
	ibmr->sg = kcalloc(pool->max_pages, sizeof(*ibmr->sg), GFP_KERNEL);
	if (!ibmr->sg) {
		err = -ENOMEM;
		goto out_free;	// BUG: rdma-mr-leak -- out_free only kfree()s the holder; the MR from ib_alloc_mr() is lost
	}
	INIT_LIST_HEAD(&ibmr->entry);
	atomic_inc(&pool->item_count);
	return ibmr;

out_free:
	kfree(ibmr);
	return ERR_PTR(err);
}

void *kd_rds_get_mr(struct kd_rds_pool *pool, struct scatterlist *sg,
		    unsigned int nents, u32 *key_ret)
{
	struct kd_rds_ibmr *ibmr;
	int ret;

	ibmr = kd_rds_frmr_alloc(pool);
	if (IS_ERR(ibmr))
		return ibmr;

	memcpy(ibmr->sg, sg, nents * sizeof(*sg));
	ibmr->sg_len = nents;
	ibmr->sg_dma_len = ib_dma_map_sg(pool->ic->i_dev, ibmr->sg, nents,
					 DMA_BIDIRECTIONAL);
	if (unlikely(!ibmr->sg_dma_len)) {
		ret = -EBUSY;
		goto out_recycle;
	}

	ret = kd_rds_post_reg_frmr(ibmr);
	if (ret)
		goto out_recycle;

	if (!wait_for_completion_timeout(&ibmr->reg_done,
					 msecs_to_jiffies(KD_RDS_REG_TMO_MS))) {
		ret = -ETIMEDOUT;
		goto out_recycle;	// BUG: rdma-invalidation-leak -- the REG_MR is still queued and will make the key valid; the MR goes back to the free list with no LOCAL_INV
	}
	if (ibmr->state != KD_FRMR_INUSE) {
		ret = -EIO;
		goto out_recycle;
	}

	*key_ret = ibmr->mr->rkey;
	return ibmr;

out_recycle:
	kd_rds_recycle(ibmr);
	return ERR_PTR(ret);
}

/* Use-once MRs die with their RDMA op: invalidate right away. */
static void kd_rds_free_use_once(struct kd_rds_ibmr *ibmr)
{
	struct kd_rds_pool *pool = ibmr->pool;

	ibmr->use_once = true;
	if (kd_rds_post_inv(ibmr)) {
		kd_rds_park(ibmr, &pool->stale_list);
		return;
	}
	/* the pages belong to the user again once the op has completed */
	ib_dma_unmap_sg(pool->ic->i_dev, ibmr->sg, ibmr->sg_len, /* BUG: rdma-unmap-before-invalidate -- the signaled LOCAL_INV was only posted; the pages are unmapped before its completion, while the peer's key still works */
			DMA_BIDIRECTIONAL);
	ibmr->sg_dma_len = 0;
	INIT_LIST_HEAD(&ibmr->entry);	/* kd_rds_inv_done() recycles it */
}

void kd_rds_free_mr(void *trans_private, int invalidate)
{
	struct kd_rds_ibmr *ibmr = trans_private;
	struct kd_rds_pool *pool = ibmr->pool;

	if (ibmr->use_once) {
		kd_rds_free_use_once(ibmr);
		return;
	}
	if (!invalidate) {
		/* the socket says the peer is done with the cookie */
		kd_rds_recycle(ibmr);	// BUG: rdma-invalidation-leak -- the rkey registered for the peer is still valid when the MR goes back on the free list
		return;
	}

	kd_rds_park(ibmr, &pool->drop_list);
	if (atomic_inc_return(&pool->dirty_count) >= KD_RDS_FLUSH_BATCH)
		kd_rds_flush_dirty(pool);
}

static void kd_rds_free_list(struct list_head *list)
{
	struct kd_rds_ibmr *ibmr, *next;

	list_for_each_entry_safe(ibmr, next, list, entry) {
		list_del(&ibmr->entry);
		ib_dereg_mr(ibmr->mr);	/* OK: rdma-mr-leak, rdma-invalidation-leak -- deregistration releases the MR and kills its key */
		kfree(ibmr->sg);
		kfree(ibmr);
	}
}

void kd_rds_pool_destroy(struct kd_rds_pool *pool)
{
	struct kd_rds_ibmr *ibmr, *next;

	kd_rds_flush_dirty(pool);
	kd_rds_free_list(&pool->free_list);

	list_for_each_entry_safe(ibmr, next, &pool->stale_list, entry) {
		list_del(&ibmr->entry);
		kfree(ibmr->sg);
		kfree(ibmr);	// BUG: rdma-mr-leak -- stale FRMRs are freed with their MR still allocated
	}
	kfree(pool);
}

int kd_rds_setup_qp(struct kd_rds_conn *ic)
{
	struct ib_device *dev = ic->i_dev;
	struct ib_qp_init_attr attr;
	int ret;

	if (dev->attrs.max_send_sge < KD_RDS_MAX_SGE)
		return -EOPNOTSUPP;
	atomic_set(&ic->i_fastreg_wrs, KD_RDS_FR_WRS);
	memset(&attr, 0, sizeof(attr));
	attr.qp_context = ic;
	/* REG_MR and LOCAL_INV are limited by i_fastreg_wrs, +1 for drain */
	attr.cap.max_send_wr = ic->i_send_ring_nr + KD_RDS_FR_WRS + 1;	// OK: rdma-send-queue-undersized -- registrations and invalidations are gated by the i_fastreg_wrs credits the queue reserves
	attr.cap.max_recv_wr = ic->i_recv_ring_nr + 1;
	attr.cap.max_send_sge = KD_RDS_MAX_SGE;	// OK: rdma-queue-cap-unchecked -- compared with dev->attrs.max_send_sge above
	attr.cap.max_recv_sge = 2;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = ic->i_cq;
	attr.recv_cq = ic->i_cq;

	ret = rdma_create_qp(ic->i_cm_id, ic->i_pd, &attr);
	if (ret)
		return ret;
	ic->i_qp = ic->i_cm_id->qp;
	return 0;
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kd RDS-IB-like FRMR pool");
