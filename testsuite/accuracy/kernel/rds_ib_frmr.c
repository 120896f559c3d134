// SPDX-License-Identifier: GPL-2.0
/*
 * rdsf: the fast-registration MR pool of an RDS-over-IB-style transport
 * (modelled on net/rds/ib_frmr.c, written fresh).
 *
 * Applications ask RDS to register a buffer for their peer (the rkey goes
 * back to user space in a cookie and from there to the peer). MRs come from
 * a per-device pool that grows on demand up to a limit and is kept: a cache,
 * not per-I/O allocation. Each registration rotates the key with a rolling
 * counter, is signaled and waited for. Freeing posts a signaled LOCAL_INV,
 * waits for the state machine to leave FRMR_IS_INUSE, and only then unmaps
 * the pages; an MR whose LOCAL_INV could not be posted is marked stale and
 * deregistered rather than reused.
 *
 * The bug: rdsf_alloc_frmr() frees the ibmr (and with it the only pointer to
 * a freshly allocated MR) when the scatterlist allocation fails.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/atomic.h>
#include <linux/wait.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>

enum rdsf_fr_state {
	FRMR_IS_FREE,	/* mr invalidated & ready for use */
	FRMR_IS_INUSE,	/* mr is in use or used & can be invalidated */
	FRMR_IS_STALE,	/* Stale MR and needs to be dropped  */
};

struct rdsf_frmr {
	struct ib_mr		*mr;
	enum rdsf_fr_state	fr_state;
	bool			fr_inv;
	bool			fr_reg;
	wait_queue_head_t	fr_inv_done;
	wait_queue_head_t	fr_reg_done;
	struct ib_send_wr	fr_wr;
};

struct rdsf_pool {
	atomic_t		item_count;
	unsigned int		max_items;
	unsigned int		max_pages;
	struct list_head	clean_list;
};

struct rdsf_conn {
	struct ib_qp		*qp;
	atomic_t		i_fastreg_wrs;
};

struct rdsf_mr {
	struct rdsf_pool	*pool;
	struct rdsf_conn	*ic;
	struct ib_device	*ibdev;
	struct list_head	unmap_list;
	unsigned int		remap_count;
	struct scatterlist	*sg;
	unsigned int		sg_len;
	int			sg_dma_len;
	struct rdsf_frmr	frmr;
};

struct rdsf_mr *rdsf_alloc_frmr(struct ib_pd *pd, struct rdsf_pool *pool)
{
	struct rdsf_mr *ibmr;
	struct rdsf_frmr *frmr;
	int err;

	if (atomic_inc_return(&pool->item_count) > pool->max_items) {
		atomic_dec(&pool->item_count);
		return ERR_PTR(-EAGAIN);
	}

	ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
	if (!ibmr) {
		err = -ENOMEM;
		goto out_no_cigar;
	}

	frmr = &ibmr->frmr;
	/* BUG: rdma-local-mr-management -- the transport allocates its own FRWR MRs */
	frmr->mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, pool->max_pages); /* OK: rdma-registration-in-datapath -- the pool grows on demand up to max_items and keeps its MRs */
	if (IS_ERR(frmr->mr)) {
		pr_warn("RDS/IB: ib_alloc_mr failed\n");
		err = PTR_ERR(frmr->mr);
		goto out_no_cigar;
	}

	ibmr->sg = kcalloc(pool->max_pages, sizeof(*ibmr->sg), GFP_KERNEL);
	if (!ibmr->sg) {
		err = -ENOMEM;
		goto out_no_cigar; /* BUG: rdma-mr-leak -- out_no_cigar frees the ibmr that holds the new MR without deregistering it */
	}

	ibmr->pool = pool;
	frmr->fr_state = FRMR_IS_FREE;
	init_waitqueue_head(&frmr->fr_inv_done);
	init_waitqueue_head(&frmr->fr_reg_done);
	return ibmr;

out_no_cigar:
	kfree(ibmr);
	atomic_dec(&pool->item_count);
	return ERR_PTR(err);
}

static int rdsf_post_reg_frmr(struct rdsf_mr *ibmr, u32 *key_ret)
{
	struct rdsf_frmr *frmr = &ibmr->frmr;
	struct ib_reg_wr reg_wr;
	unsigned int off = 0;
	int ret;

	while (atomic_dec_return(&ibmr->ic->i_fastreg_wrs) <= 0)
		atomic_inc(&ibmr->ic->i_fastreg_wrs);

	/* BUG: rdma-local-mr-management -- the transport maps pages into its MR */
	ret = ib_map_mr_sg(frmr->mr, ibmr->sg, ibmr->sg_dma_len, &off, PAGE_SIZE);
	if (unlikely(ret != ibmr->sg_dma_len)) {
		atomic_inc(&ibmr->ic->i_fastreg_wrs);
		return ret < 0 ? ret : -EINVAL;
	}

	frmr->fr_state = FRMR_IS_INUSE;

	/* The key is a rolling 8 bit counter, unique per registration. */
	ib_update_fast_reg_key(frmr->mr, ibmr->remap_count++);
	frmr->fr_reg = true;

	memset(&reg_wr, 0, sizeof(reg_wr));
	reg_wr.wr.wr_id = (unsigned long)(void *)ibmr;
	reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the transport */
	reg_wr.wr.num_sge = 0;
	reg_wr.mr = frmr->mr; /* OK: rdma-rkey-reuse -- the rolling counter gives every registration a new key */
	reg_wr.key = frmr->mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is present, and the rkey goes to the application for its peer */
	reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			IB_ACCESS_REMOTE_WRITE;
	reg_wr.wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ibmr->ic->qp, &reg_wr.wr, NULL);
	if (unlikely(ret)) {
		frmr->fr_state = FRMR_IS_STALE;
		atomic_inc(&ibmr->ic->i_fastreg_wrs);
		return ret;
	}

	/* Wait so that the peer cannot race the pending registration. */
	wait_event(frmr->fr_reg_done, !frmr->fr_reg);
	*key_ret = frmr->mr->rkey;
	return 0;
}

int rdsf_reg_frmr(struct rdsf_conn *ic, struct rdsf_mr *ibmr,
		  struct scatterlist *sg, unsigned int sg_len, u32 *key_ret)
{
	ibmr->ic = ic;
	ibmr->sg = sg;
	ibmr->sg_len = sg_len;
	ibmr->sg_dma_len = ib_dma_map_sg(ibmr->ibdev, sg, sg_len,
					 DMA_BIDIRECTIONAL);
	if (unlikely(!ibmr->sg_dma_len))
		return -EBUSY;
	return rdsf_post_reg_frmr(ibmr, key_ret);
}

static int rdsf_post_inv(struct rdsf_mr *ibmr)
{
	struct rdsf_frmr *frmr = &ibmr->frmr;
	struct ib_send_wr *s_wr;
	int ret;

	if (frmr->fr_state != FRMR_IS_INUSE)
		return 0;

	while (atomic_dec_return(&ibmr->ic->i_fastreg_wrs) <= 0)
		atomic_inc(&ibmr->ic->i_fastreg_wrs);

	frmr->fr_inv = true;
	s_wr = &frmr->fr_wr;
	memset(s_wr, 0, sizeof(*s_wr));
	s_wr->wr_id = (unsigned long)(void *)ibmr;
	s_wr->opcode = IB_WR_LOCAL_INV;
	s_wr->ex.invalidate_rkey = frmr->mr->rkey;
	s_wr->send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ibmr->ic->qp, s_wr, NULL);
	if (unlikely(ret)) {
		frmr->fr_state = FRMR_IS_STALE;
		frmr->fr_inv = false;
		atomic_inc(&ibmr->ic->i_fastreg_wrs);
		return ret;
	}

	/* Wait for the LOCAL_INV before the pages may go away. */
	wait_event(frmr->fr_inv_done, frmr->fr_state != FRMR_IS_INUSE);
	return 0;
}

void rdsf_unreg_frmr(struct list_head *list, unsigned int *nfreed)
{
	struct rdsf_mr *ibmr, *next;
	struct rdsf_frmr *frmr;

	list_for_each_entry(ibmr, list, unmap_list)
		if (ibmr->sg_dma_len && rdsf_post_inv(ibmr))
			pr_warn("RDS/IB: LOCAL_INV post failed\n");

	list_for_each_entry_safe(ibmr, next, list, unmap_list) {
		frmr = &ibmr->frmr;
		/* OK: rdma-unmap-before-invalidate -- rdsf_post_inv() waited for the signaled LOCAL_INV to complete */
		ib_dma_unmap_sg(ibmr->ibdev, ibmr->sg, ibmr->sg_len,
				DMA_BIDIRECTIONAL);
		ibmr->sg_dma_len = 0;

		if (frmr->fr_state == FRMR_IS_STALE) {
			list_del(&ibmr->unmap_list);
			/* BUG: rdma-local-mr-management -- the transport deregisters its MR */
			ib_dereg_mr(frmr->mr); /* OK: rdma-invalidation-leak, rdma-registration-in-datapath -- an MR whose LOCAL_INV failed is deregistered, which kills the key; this is the pool flush, and only stale MRs are dropped */
			atomic_dec(&ibmr->pool->item_count);
			kfree(ibmr);
			(*nfreed)++;
			continue;
		}
		list_move_tail(&ibmr->unmap_list, &ibmr->pool->clean_list);
	}
}
