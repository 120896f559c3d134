// SPDX-License-Identifier: GPL-2.0
/*
 * rdsx: the FRWR memory-region pool of an RDS-over-InfiniBand transport, in
 * the shape of net/rds/ib_frmr.c before upstream commit "net/rds: Wait for
 * the FRMR_IS_FREE (or FRMR_IS_STALE) state transition after posting
 * IB_WR_LOCAL_INV" (Gerd Rausch, 2019). Written fresh for the held-out
 * accuracy batch.
 *
 * An RDS MR is fast-registered for the peer (its rkey goes back to the
 * application, which sends it in an RDMA cmsg) with a rolling 8-bit key
 * taken from remap_count, and the registration is waited for. When the pool
 * is flushed, rdsx_unreg_frmr() posts a signaled LOCAL_INV for every MR on
 * the list and then, without waiting for any of those completions,
 * DMA-unmaps the pages and deregisters the MRs it frees. That is the race
 * the upstream commit describes: a pending IB_WR_LOCAL_INV against a
 * teardown (dma_unmap_sg, put_page) and de-registration of the memory.
 * An MR whose LOCAL_INV could not be posted (FRMR_IS_STALE) goes through
 * the same loop: its pages are unmapped while its key is still valid, and
 * it is deregistered only afterwards.
 *
 * rdsx_free_frmr_one() has the fixed shape: it waits for the FREE/STALE
 * transition made by the completion handler before it unmaps, and an MR
 * whose LOCAL_INV could not be posted goes to the drop list, where it is
 * deregistered before its pages are unmapped.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

enum rdsx_frmr_state {
	FRMR_IS_FREE,
	FRMR_IS_INUSE,
	FRMR_IS_STALE,
};

struct rdsx_ib_connection {
	struct rdma_cm_id	*i_cm_id;
	atomic_t		i_fastreg_wrs;
};

struct rdsx_mr_pool {
	unsigned int		max_pages;
	struct list_head	free_list;
	struct list_head	drop_list;
	atomic_t		item_count;
};

struct rdsx_frmr {
	struct ib_mr		*mr;
	enum rdsx_frmr_state	fr_state;
	bool			fr_inv;
	bool			fr_reg;
	wait_queue_head_t	fr_inv_done;
	wait_queue_head_t	fr_reg_done;
	struct ib_send_wr	fr_wr;
	unsigned int		sg_byte_len;
};

struct rdsx_ib_mr {
	struct rdsx_ib_connection *ic;
	struct ib_device	*dev;
	struct rdsx_mr_pool	*pool;
	struct rdsx_frmr	frmr;
	struct scatterlist	*sg;
	unsigned int		sg_len;
	int			sg_dma_len;
	u8			remap_count;
	struct list_head	unmap_list;
	struct list_head	pool_list;
};

static void rdsx_transition_frwr_state(struct rdsx_ib_mr *ibmr,
				       enum rdsx_frmr_state old,
				       enum rdsx_frmr_state new)
{
	if (ibmr->frmr.fr_state == old)
		ibmr->frmr.fr_state = new;
}

/**
 * rdsx_alloc_frmr - allocate one pool entry and its fast-registration MR
 * @dev: the IB device
 * @pd: protection domain of the connection
 * @pool: pool the entry will belong to
 *
 * Called when the pool has no free entry; the MR lives until the entry is
 * dropped by a flush.
 */
struct rdsx_ib_mr *rdsx_alloc_frmr(struct ib_device *dev, struct ib_pd *pd,
				   struct rdsx_mr_pool *pool)
{
	struct rdsx_ib_mr *ibmr;
	struct rdsx_frmr *frmr;
	int err;

	ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
	if (!ibmr)
		return ERR_PTR(-ENOMEM);

	frmr = &ibmr->frmr;
	/* BUG: rdma-local-mr-management -- the ULP allocates its own fast-registration MRs */
	frmr->mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, pool->max_pages);
	if (IS_ERR(frmr->mr)) {
		err = PTR_ERR(frmr->mr);
		pr_warn("RDS/IB: %s failed to allocate MR\n", __func__);
		kfree(ibmr);
		return ERR_PTR(err);
	}

	ibmr->dev = dev;
	ibmr->pool = pool;
	frmr->fr_state = FRMR_IS_FREE;
	init_waitqueue_head(&frmr->fr_inv_done);
	init_waitqueue_head(&frmr->fr_reg_done);
	atomic_inc(&pool->item_count);
	return ibmr;
}

static int rdsx_post_reg_frmr(struct rdsx_ib_mr *ibmr)
{
	struct rdsx_frmr *frmr = &ibmr->frmr;
	struct ib_reg_wr reg_wr;
	int ret, off = 0;

	while (atomic_dec_return(&ibmr->ic->i_fastreg_wrs) <= 0)
		atomic_inc(&ibmr->ic->i_fastreg_wrs);

	/* BUG: rdma-local-mr-management -- the ULP maps the pages into its own MR */
	ret = ib_map_mr_sg(frmr->mr, ibmr->sg, ibmr->sg_len,
			   (unsigned int *)&off, PAGE_SIZE);
	if (unlikely(ret != ibmr->sg_len))
		return ret < 0 ? ret : -EINVAL;

	if (frmr->fr_state != FRMR_IS_FREE)
		return -EBUSY;
	frmr->fr_state = FRMR_IS_INUSE;

	/*
	 * The key is a rolling 8-bit counter, which should guarantee
	 * uniqueness for the life of this MR.
	 */
	ib_update_fast_reg_key(frmr->mr, ibmr->remap_count++);
	frmr->fr_reg = true;

	memset(&reg_wr, 0, sizeof(reg_wr));
	reg_wr.wr.wr_id = (unsigned long)(void *)ibmr;
	reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration built by the ULP */
	reg_wr.wr.num_sge = 0;
	reg_wr.mr = frmr->mr; /* OK: rdma-rkey-reuse -- remap_count++ gave the MR a new key byte just above */
	reg_wr.key = frmr->mr->rkey;
	reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			IB_ACCESS_REMOTE_WRITE;
	reg_wr.wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ibmr->ic->i_cm_id->qp, &reg_wr.wr, NULL);
	if (unlikely(ret)) {
		rdsx_transition_frwr_state(ibmr, FRMR_IS_INUSE, FRMR_IS_STALE);
		frmr->fr_reg = false;
		atomic_inc(&ibmr->ic->i_fastreg_wrs);
		pr_warn("RDS/IB: %s returned error(%d)\n", __func__, ret);
		return ret;
	}

	/* Wait for the registration before the key is handed out. */
	wait_event(frmr->fr_reg_done, !frmr->fr_reg);
	return 0;
}

/**
 * rdsx_map_frmr - DMA-map a user scatterlist and register it
 * Returns 0 and the new rkey in @key, or a negative errno.
 */
int rdsx_map_frmr(struct rdsx_ib_mr *ibmr, struct scatterlist *sg,
		  unsigned int sg_len, u32 *key)
{
	int ret;

	ibmr->sg = sg;
	ibmr->sg_len = sg_len;
	ibmr->sg_dma_len = ib_dma_map_sg(ibmr->dev, sg, sg_len,
					 DMA_BIDIRECTIONAL);
	if (unlikely(!ibmr->sg_dma_len))
		return -EBUSY;

	ret = rdsx_post_reg_frmr(ibmr);
	if (ret) {
		ib_dma_unmap_sg(ibmr->dev, ibmr->sg, ibmr->sg_len,
				DMA_BIDIRECTIONAL);
		ibmr->sg_dma_len = 0;
		return ret;
	}

	*key = ibmr->frmr.mr->rkey;
	return 0;
}

static int rdsx_post_inv(struct rdsx_ib_mr *ibmr)
{
	struct rdsx_frmr *frmr = &ibmr->frmr;
	struct rdma_cm_id *i_cm_id = ibmr->ic->i_cm_id;
	struct ib_send_wr *s_wr;
	int ret;

	if (!i_cm_id || !i_cm_id->qp || !frmr->mr)
		return -EINVAL;
	if (frmr->fr_state != FRMR_IS_INUSE)
		return -EINVAL;

	while (atomic_dec_return(&ibmr->ic->i_fastreg_wrs) <= 0)
		atomic_inc(&ibmr->ic->i_fastreg_wrs);

	frmr->fr_inv = true;
	s_wr = &frmr->fr_wr;
	memset(s_wr, 0, sizeof(*s_wr));
	s_wr->wr_id = (unsigned long)(void *)ibmr;
	s_wr->opcode = IB_WR_LOCAL_INV;
	s_wr->ex.invalidate_rkey = frmr->mr->rkey;
	s_wr->send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(i_cm_id->qp, s_wr, NULL);
	if (unlikely(ret)) {
		rdsx_transition_frwr_state(ibmr, FRMR_IS_INUSE, FRMR_IS_STALE);
		frmr->fr_inv = false;
		atomic_inc(&ibmr->ic->i_fastreg_wrs);
		pr_err("RDS/IB: %s returned error(%d)\n", __func__, ret);
	}
	/* no wait here: the completion arrives in rdsx_mr_cqe_handler() */
	return ret;
}

void rdsx_mr_cqe_handler(struct rdsx_ib_connection *ic, struct ib_wc *wc)
{
	struct rdsx_ib_mr *ibmr = (void *)(unsigned long)wc->wr_id;
	struct rdsx_frmr *frmr = &ibmr->frmr;

	if (wc->status != IB_WC_SUCCESS)
		rdsx_transition_frwr_state(ibmr, FRMR_IS_INUSE, FRMR_IS_STALE);

	if (frmr->fr_inv) {
		rdsx_transition_frwr_state(ibmr, FRMR_IS_INUSE, FRMR_IS_FREE);
		frmr->fr_inv = false;
		wake_up(&frmr->fr_inv_done);
	}
	if (frmr->fr_reg) {
		frmr->fr_reg = false;
		wake_up(&frmr->fr_reg_done);
	}
	atomic_inc(&ic->i_fastreg_wrs);
}

/**
 * rdsx_unreg_frmr - invalidate and tear down the MRs of a flush list
 * @list: MRs being flushed, linked by unmap_list
 * @nfreed: in/out count of MRs deregistered
 * @goal: how many MRs the flush wants to free
 */
void rdsx_unreg_frmr(struct list_head *list, unsigned int *nfreed,
		     unsigned int goal)
{
	struct rdsx_ib_mr *ibmr, *next;
	unsigned int freed = *nfreed;
	int ret = 0, ret2;

	list_for_each_entry(ibmr, list, unmap_list) {
		if (ibmr->sg_dma_len) {
			ret2 = rdsx_post_inv(ibmr);
			if (ret2 && !ret)
				ret = ret2;
		}
	}
	if (ret)
		pr_warn("RDS/IB: %s failed (err=%d)\n", __func__, ret);

	/* Now we can destroy the DMA mapping and unpin any pages */
	list_for_each_entry_safe(ibmr, next, list, unmap_list) {
		if (ibmr->sg_dma_len) {
			/* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INVs posted above are not waited for, and an MR whose LOCAL_INV failed to post (STALE) is unmapped before it is deregistered: the peer's rkey still reaches these pages */
			ib_dma_unmap_sg(ibmr->dev, ibmr->sg, ibmr->sg_len,
					DMA_BIDIRECTIONAL);
			ibmr->sg_dma_len = 0;
		}
		if (freed < goal || ibmr->frmr.fr_state == FRMR_IS_STALE) {
			list_del(&ibmr->unmap_list);
			if (ibmr->frmr.mr)
				ib_dereg_mr(ibmr->frmr.mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
			kfree(ibmr);
			freed++;
		}
	}
	*nfreed = freed;
}

/**
 * rdsx_free_frmr_one - give one MR back to the pool after invalidating it
 * @ibmr: an MR in use by a finished RDMA operation
 */
void rdsx_free_frmr_one(struct rdsx_ib_mr *ibmr)
{
	struct rdsx_frmr *frmr = &ibmr->frmr;
	struct rdsx_mr_pool *pool = ibmr->pool;

	if (rdsx_post_inv(ibmr)) {
		/* the key is still live: the drop path deregisters it */
		list_add_tail(&ibmr->pool_list, &pool->drop_list);
		return;
	}

	/*
	 * Wait for the FRMR_IS_FREE (or FRMR_IS_STALE) transition so that
	 * the pending LOCAL_INV cannot race with the teardown below.
	 */
	wait_event(frmr->fr_inv_done, frmr->fr_state != FRMR_IS_INUSE);

	if (frmr->fr_state == FRMR_IS_STALE) {
		list_add_tail(&ibmr->pool_list, &pool->drop_list);
		return;
	}

	/* OK: rdma-unmap-before-invalidate -- the LOCAL_INV completion was waited for (state left FRMR_IS_INUSE) */
	ib_dma_unmap_sg(ibmr->dev, ibmr->sg, ibmr->sg_len, DMA_BIDIRECTIONAL);
	ibmr->sg_dma_len = 0;
	list_add_tail(&ibmr->pool_list, &pool->free_list);
}

/* Drop path: stale MRs may still carry a valid key. */
void rdsx_drop_stale(struct rdsx_mr_pool *pool)
{
	struct rdsx_ib_mr *ibmr, *next;

	list_for_each_entry_safe(ibmr, next, &pool->drop_list, pool_list) {
		list_del(&ibmr->pool_list);
		ib_dereg_mr(ibmr->frmr.mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
		ibmr->frmr.mr = NULL;
		if (ibmr->sg_dma_len)
			/* OK: rdma-invalidation-leak -- the MR was deregistered on the line above, which kills its key before the pages go */
			ib_dma_unmap_sg(ibmr->dev, ibmr->sg, ibmr->sg_len,
					DMA_BIDIRECTIONAL);
		atomic_dec(&pool->item_count);
		kfree(ibmr);
	}
}
