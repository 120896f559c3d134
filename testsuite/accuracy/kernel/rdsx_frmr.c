// SPDX-License-Identifier: GPL-2.0
/*
 * rdsx_frmr.c - fast-registration MRs for RDSX over InfiniBand.
 *
 * Applications map a buffer with a cmsg and hand the returned key to the
 * peer; the MR stays registered until the application frees it or closes
 * the socket.  MRs are kept per device: a clean list of registered-free
 * MRs, and a drop list that the flush worker invalidates and returns to
 * the clean list.  Registration and invalidation work requests are gated
 * by the connection's fast-registration credits and waited for by
 * sleeping on the MR.  The key of each registration is rotated with the
 * MR's remap counter.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/workqueue.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDSX_FR_WRS		512
#define RDSX_RECV_WRS		1024
#define RDSX_MAX_SGE		8

enum rdsx_fr_state { FRMR_IS_FREE, FRMR_IS_INUSE, FRMR_IS_STALE };

struct rdsx_mr_pool;

struct rdsx_ib_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq, *recv_cq;
	unsigned int		send_ring_size;
	atomic_t		fastreg_wrs;
	bool			dead;
};

struct rdsx_ib_mr {
	struct rdsx_mr_pool	*pool;
	struct rdsx_ib_conn	*ic;
	struct list_head	list;
	struct ib_mr		*mr;
	enum rdsx_fr_state	fr_state;
	bool			fr_reg, fr_inv;
	wait_queue_head_t	fr_reg_done, fr_inv_done;
	struct ib_cqe		cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct scatterlist	*sg;
	int			sg_len, sg_dma_len;
	unsigned int		remap_count;
};

struct rdsx_mr_pool {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	spinlock_t		lock;
	struct list_head	clean_list;
	struct list_head	drop_list;
	struct work_struct	flush_worker;
	int			max_items;
	int			max_pages;
};

struct rdsx_sock {
	struct list_head	mr_list;
	struct rdsx_ib_conn	*ic;
};

int rdsx_ib_setup_qp(struct rdsx_ib_conn *ic, struct ib_pd *pd)
{
	struct ib_device *dev = ic->cm_id->device;
	struct ib_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	/* OK: rdma-send-queue-undersized -- REG_MR/LOCAL_INV are gated by fastreg_wrs credits, reserved on top of the send ring */
	attr.cap.max_send_wr = ic->send_ring_size + RDSX_FR_WRS + 1;
	attr.cap.max_recv_wr = RDSX_RECV_WRS; /* OK: rdma-queue-cap-unchecked -- 1024 work requests fit every RC device */
	attr.cap.max_send_sge = min_t(u32, RDSX_MAX_SGE, dev->attrs.max_send_sge);
	attr.cap.max_recv_sge = 2;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	attr.qp_type = IB_QPT_RC;
	attr.send_cq = ic->send_cq;
	attr.recv_cq = ic->recv_cq;
	atomic_set(&ic->fastreg_wrs, RDSX_FR_WRS);
	return rdma_create_qp(ic->cm_id, pd, &attr);
}

int rdsx_mr_pool_fill(struct rdsx_mr_pool *pool)
{
	struct rdsx_ib_mr *ibmr, *tmp;
	int i;

	for (i = 0; i < pool->max_items; i++) {
		ibmr = kzalloc(sizeof(*ibmr), GFP_KERNEL);
		if (!ibmr)
			goto out_free;
		/* BUG: rdma-local-mr-management -- RDSX allocates its own FRMRs */
		ibmr->mr = ib_alloc_mr(pool->pd, IB_MR_TYPE_MEM_REG, pool->max_pages);
		if (IS_ERR(ibmr->mr)) {
			kfree(ibmr);
			goto out_free;
		}
		ibmr->sg = kcalloc(pool->max_pages, sizeof(*ibmr->sg), GFP_KERNEL);
		if (!ibmr->sg) {
			kfree(ibmr); // BUG: rdma-mr-leak -- the holder is freed with its MR still allocated
			goto out_free;
		}
		ibmr->pool = pool;
		ibmr->fr_state = FRMR_IS_FREE;
		init_waitqueue_head(&ibmr->fr_reg_done);
		init_waitqueue_head(&ibmr->fr_inv_done);
		list_add_tail(&ibmr->list, &pool->clean_list);
	}
	return 0;

out_free:
	list_for_each_entry_safe(ibmr, tmp, &pool->clean_list, list) {
		list_del(&ibmr->list);
		/* BUG: rdma-local-mr-management -- deregistration by the ULP */
		ib_dereg_mr(ibmr->mr);
		kfree(ibmr->sg);
		kfree(ibmr);
	}
	return -ENOMEM;
}

static struct rdsx_ib_mr *rdsx_frmr_get(struct rdsx_mr_pool *pool)
{
	struct rdsx_ib_mr *ibmr;

	spin_lock(&pool->lock);
	ibmr = list_first_entry_or_null(&pool->clean_list, struct rdsx_ib_mr, list);
	if (ibmr)
		list_del_init(&ibmr->list);
	spin_unlock(&pool->lock);
	return ibmr;
}

/* Unmap the pages and make the MR available for the next mapping. */
static void rdsx_frmr_to_clean(struct rdsx_mr_pool *pool, struct rdsx_ib_mr *ibmr)
{
	ib_dma_unmap_sg(pool->dev, ibmr->sg, ibmr->sg_len, DMA_BIDIRECTIONAL);
	spin_lock(&pool->lock);
	list_add(&ibmr->list, &pool->clean_list);
	spin_unlock(&pool->lock);
}

void rdsx_frmr_cqe_handler(struct rdsx_ib_conn *ic, struct ib_wc *wc)
{
	struct rdsx_ib_mr *ibmr = container_of(wc->wr_cqe, struct rdsx_ib_mr, cqe);

	if (wc->status != IB_WC_SUCCESS)
		ibmr->fr_state = FRMR_IS_STALE;
	if (ibmr->fr_inv) {
		if (ibmr->fr_state == FRMR_IS_INUSE)
			ibmr->fr_state = FRMR_IS_FREE;
		ibmr->fr_inv = false;
		wake_up(&ibmr->fr_inv_done);
	}
	if (ibmr->fr_reg) {
		ibmr->fr_reg = false;
		wake_up(&ibmr->fr_reg_done);
	}
	atomic_inc(&ic->fastreg_wrs);
}

static int rdsx_frmr_post_reg(struct rdsx_ib_conn *ic, struct rdsx_ib_mr *ibmr)
{
	int n, ret;

	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(ibmr->mr, ibmr->sg, ibmr->sg_dma_len, NULL, PAGE_SIZE);
	if (unlikely(n != ibmr->sg_dma_len))
		return n < 0 ? n : -EINVAL;

	while (atomic_dec_return(&ic->fastreg_wrs) <= 0)
		atomic_inc(&ic->fastreg_wrs);

	ib_update_fast_reg_key(ibmr->mr, ibmr->remap_count++);
	ibmr->fr_state = FRMR_IS_INUSE;
	ibmr->fr_reg = true;
	ibmr->ic = ic;

	memset(&ibmr->reg_wr, 0, sizeof(ibmr->reg_wr));
	ibmr->reg_wr.wr.wr_cqe = &ibmr->cqe;
	ibmr->reg_wr.wr.num_sge = 0;
	ibmr->reg_wr.mr = ibmr->mr; /* OK: rdma-rkey-reuse -- the key byte follows remap_count, bumped for every registration */
	ibmr->reg_wr.key = ibmr->mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- remote write and atomics come with local write; rdsx_get_mr() returns the key for the peer */
	ibmr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
			      IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_ATOMIC;
	ibmr->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	ibmr->reg_wr.wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ic->qp, &ibmr->reg_wr.wr, NULL);
	if (unlikely(ret)) {
		atomic_inc(&ic->fastreg_wrs);
		ibmr->fr_state = FRMR_IS_STALE;
		return ret;
	}
	wait_event(ibmr->fr_reg_done, !ibmr->fr_reg);
	return ibmr->fr_state == FRMR_IS_INUSE ? 0 : -EAGAIN;
}

static int rdsx_frmr_post_inv(struct rdsx_ib_mr *ibmr)
{
	struct rdsx_ib_conn *ic = ibmr->ic;
	int ret;

	if (ibmr->fr_state == FRMR_IS_FREE)
		return 0;
	if (ibmr->fr_state == FRMR_IS_STALE)
		return -EIO;
	while (atomic_dec_return(&ic->fastreg_wrs) <= 0)
		atomic_inc(&ic->fastreg_wrs);

	ibmr->fr_inv = true;
	memset(&ibmr->inv_wr, 0, sizeof(ibmr->inv_wr));
	ibmr->inv_wr.wr_cqe = &ibmr->cqe;
	ibmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	ibmr->inv_wr.ex.invalidate_rkey = ibmr->mr->rkey;
	ibmr->inv_wr.send_flags = IB_SEND_SIGNALED;
	ret = ib_post_send(ic->qp, &ibmr->inv_wr, NULL);
	if (unlikely(ret)) {
		ibmr->fr_state = FRMR_IS_STALE;
		ibmr->fr_inv = false;
		atomic_inc(&ic->fastreg_wrs);
	}
	return ret;
}

int rdsx_get_mr(struct rdsx_sock *rs, struct rdsx_mr_pool *pool,
		struct scatterlist *sg, int sg_len, u32 *key_ret)
{
	struct rdsx_ib_mr *ibmr = rdsx_frmr_get(pool);
	int ret;

	if (!ibmr)
		return -EAGAIN;
	ibmr->sg_len = sg_len;
	memcpy(ibmr->sg, sg, sg_len * sizeof(*sg));
	ibmr->sg_dma_len = ib_dma_map_sg(pool->dev, ibmr->sg, sg_len,
					 DMA_BIDIRECTIONAL);
	if (!ibmr->sg_dma_len) {
		list_add(&ibmr->list, &pool->clean_list);
		return -EIO;
	}
	ret = rdsx_frmr_post_reg(rs->ic, ibmr);
	if (ret) {
		/* OK: rdma-invalidation-leak -- on the drop list the flush worker invalidates (or, if stale, deregisters) the MR before unmapping it */
		list_add_tail(&ibmr->list, &pool->drop_list);
		queue_work(system_wq, &pool->flush_worker);
		return ret;
	}
	*key_ret = ibmr->mr->rkey;
	list_add(&ibmr->list, &rs->mr_list);
	return 0;
}

void rdsx_free_mr(struct rdsx_ib_mr *ibmr, bool invalidate)
{
	struct rdsx_mr_pool *pool = ibmr->pool;

	list_del_init(&ibmr->list);
	if (invalidate) {
		/* The application wants the key dead now: skip the flush worker. */
		if (rdsx_frmr_post_inv(ibmr) == 0) {
			rdsx_frmr_to_clean(pool, ibmr); // BUG: rdma-unmap-before-invalidate -- nothing waits for the signaled LOCAL_INV before the pages are unmapped and the MR reused
			return;
		}
	}
	spin_lock(&pool->lock);
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the drop list is only walked by the flush worker, which invalidates and waits */
	list_add_tail(&ibmr->list, &pool->drop_list);
	spin_unlock(&pool->lock);
	queue_work(system_wq, &pool->flush_worker);
}

static void rdsx_flush_worker(struct work_struct *work)
{
	struct rdsx_mr_pool *pool = container_of(work, struct rdsx_mr_pool, flush_worker);
	struct rdsx_ib_mr *ibmr, *tmp;

	list_for_each_entry(ibmr, &pool->drop_list, list)
		rdsx_frmr_post_inv(ibmr);

	list_for_each_entry_safe(ibmr, tmp, &pool->drop_list, list) {
		wait_event(ibmr->fr_inv_done, !ibmr->fr_inv);
		list_del(&ibmr->list);
		if (ibmr->fr_state == FRMR_IS_STALE) {
			/* BUG: rdma-local-mr-management -- deregistration by the ULP */
			ib_dereg_mr(ibmr->mr); /* OK: rdma-invalidation-leak, rdma-registration-in-datapath -- deregistering a stale MR kills its key; the flush worker is not an I/O path */
			ib_dma_unmap_sg(pool->dev, ibmr->sg, ibmr->sg_len, DMA_BIDIRECTIONAL);
			kfree(ibmr->sg);
			kfree(ibmr);
			continue;
		}
		/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- wait_event() saw this MR's LOCAL_INV complete */
		rdsx_frmr_to_clean(pool, ibmr);
	}
}

void rdsx_sock_release_mrs(struct rdsx_sock *rs)
{
	struct rdsx_ib_mr *ibmr, *tmp;

	list_for_each_entry_safe(ibmr, tmp, &rs->mr_list, list) {
		if (!rs->ic->dead) {
			rdsx_free_mr(ibmr, false);
			continue;
		}
		/* The connection is gone: no QP to post a LOCAL_INV on. */
		list_del(&ibmr->list);
		/* BUG: rdma-invalidation-leak -- the MR lives in the device-wide PD: its key still works from every other connection */
		rdsx_frmr_to_clean(ibmr->pool, ibmr);
	}
}

void rdsx_mr_pool_init(struct rdsx_mr_pool *pool)
{
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->clean_list);
	INIT_LIST_HEAD(&pool->drop_list);
	INIT_WORK(&pool->flush_worker, rdsx_flush_worker);
}
