// SPDX-License-Identifier: GPL-2.0
/*
 * rd_rds_frmr.c - RDS-style reliable datagram transport: FRMR memory pool
 *
 * Applications map buffers with a "get MR" control message; the resulting
 * rkey is handed to the peer inside the RDS cookie.  Each connection keeps a
 * pool of fast-registration MRs (struct rdsx_frmr) on a clean list; a MR that
 * failed a registration or invalidation goes to the drop list, which the
 * flush worker walks, deregisters and replaces.  When the pool runs dry a
 * one-off frmr is allocated and destroyed with its operation.
 *
 * The local side of an RDMA READ is registered here as well; iWARP needs the
 * READ sink to carry remote-write rights.  The peer's congestion map is
 * pulled with an RDMA READ into a DMA-mapped page.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- the MR pool is ULP-managed throughout (not annotated site by site); the queue and key checks were not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define RDSX_MAX_FRMR_PAGES	256
#define RDSX_FRMR_POOL_SIZE	128
#define RDSX_WAIT_MS		5000

enum rdsx_mr_kind { RDSX_MR_RDMA, RDSX_MR_ATOMIC, RDSX_MR_READ_SINK };
enum rdsx_frmr_state { FRMR_IS_FREE, FRMR_IS_INUSE, FRMR_IS_STALE };

struct rdsx_conn;

struct rdsx_frmr {
	struct list_head	list;
	struct ib_mr		*mr;
	enum rdsx_frmr_state	state;
	bool			temporary;
	struct rdsx_conn	*conn;
	struct scatterlist	*sg;
	int			sg_len;
	int			dma_nents;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	comp;
	enum ib_wc_status	wc_status;
};

struct rdsx_pool {
	spinlock_t		lock;
	struct list_head	clean_list;
	struct list_head	drop_list;
	struct rdsx_frmr	*frmrs;
	int			nr;
	u32			max_pages;
	struct work_struct	flush_work;
};

struct rdsx_conn {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	u32			port;
	u32			max_send_sge;
	struct rdsx_pool	pool;
	u64			cong_dma;	/* DMA address of our copy of the peer's map */
	struct ib_cqe		cong_cqe;
};

struct rdsx_rdma_op {
	struct rdsx_frmr	*frmr;
	u64			remote_addr;
	u32			remote_rkey;
	u32			len;
	struct ib_sge		sge;
	struct ib_rdma_wr	wr;
	struct ib_cqe		cqe;
};

struct rdsx_msg {
	struct rdsx_frmr	*free_frmr;
	struct scatterlist	*map_sg;
	int			map_nents;
	enum rdsx_mr_kind	map_kind;
	u32			cookie_rkey;
	struct rdsx_rdma_op	*op;
	u64			cong_raddr;	/* peer announced a new congestion map */
	u32			cong_rkey;
};

static void rdsx_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_frmr *f = container_of(wc->wr_cqe, struct rdsx_frmr, reg_cqe);

	f->wc_status = wc->status;
	complete(&f->comp);
}

static void rdsx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rdsx_frmr *f = container_of(wc->wr_cqe, struct rdsx_frmr, inv_cqe);

	f->wc_status = wc->status;
	complete(&f->comp);
}

/* Back to the clean list; the caller guarantees the key is dead. */
static void rdsx_frmr_put(struct rdsx_pool *pool, struct rdsx_frmr *f)
{
	ib_dma_unmap_sg(f->conn->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
	f->state = FRMR_IS_FREE;
	spin_lock(&pool->lock);
	list_add_tail(&f->list, &pool->clean_list);
	spin_unlock(&pool->lock);
}

static void rdsx_frmr_mark_stale(struct rdsx_pool *pool, struct rdsx_frmr *f)
{
	f->state = FRMR_IS_STALE;
	spin_lock(&pool->lock);
	list_add_tail(&f->list, &pool->drop_list);
	spin_unlock(&pool->lock);
	schedule_work(&pool->flush_work);
}

static void rdsx_temp_free(struct rdsx_conn *conn, struct rdsx_frmr *f)
{
	ib_dereg_mr(f->mr);	/* BUG: rdma-registration-in-datapath -- one-off frmrs are destroyed per operation */ /* OK: rdma-mr-leak -- released before its holder is freed */
	ib_dma_unmap_sg(conn->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);	/* OK: rdma-invalidation-leak -- the key died with ib_dereg_mr above */
	kfree(f->sg);
	kfree(f);
}

static int rdsx_reg_frmr(struct rdsx_conn *conn, struct rdsx_frmr *f, enum rdsx_mr_kind kind)
{
	int n, ret;

	f->dma_nents = ib_dma_map_sg(conn->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
	if (!f->dma_nents)
		return -ENOMEM;
	n = ib_map_mr_sg(f->mr, f->sg, f->dma_nents, NULL, PAGE_SIZE);
	if (n != f->dma_nents) {
		ret = n < 0 ? n : -EINVAL;
		goto out_put;	/* OK: rdma-invalidation-leak -- nothing registered yet */
	}
	ib_update_fast_reg_key(f->mr, ib_inc_rkey(f->mr->rkey));

	memset(&f->reg_wr, 0, sizeof(f->reg_wr));
	f->reg_wr.wr.opcode = IB_WR_REG_MR;
	f->reg_wr.wr.wr_cqe = &f->reg_cqe;
	f->reg_wr.wr.send_flags = IB_SEND_SIGNALED;
	f->reg_wr.mr = f->mr;
	f->reg_wr.key = f->mr->rkey;
	switch (kind) {
	case RDSX_MR_RDMA:
		f->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
				   IB_ACCESS_REMOTE_WRITE;	/* OK: rdma-access-flags-invalid -- remote write with local write */
		break;
	case RDSX_MR_ATOMIC:
		f->reg_wr.access = IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_REMOTE_READ; /* BUG: rdma-access-flags-invalid -- REMOTE_ATOMIC without LOCAL_WRITE, the REG_MR completes in error */
		break;
	case RDSX_MR_READ_SINK:
		f->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
		if (rdma_protocol_iwarp(conn->dev, conn->port))
			f->reg_wr.access |= IB_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-transport -- READ-sink rights chosen by an inline rdma_protocol_iwarp() test */
		break;
	}

	reinit_completion(&f->comp);
	f->state = FRMR_IS_INUSE;
	ret = ib_post_send(conn->qp, &f->reg_wr.wr, NULL);
	if (ret)
		goto out_put;	/* OK: rdma-invalidation-leak -- the REG_MR was never posted */
	if (!wait_for_completion_timeout(&f->comp, msecs_to_jiffies(RDSX_WAIT_MS))) {
		ret = -ETIMEDOUT;
		goto out_put;	/* BUG: rdma-invalidation-leak -- the REG_MR may still complete; the frmr goes back to the clean list with a live rkey */
	}
	if (f->wc_status != IB_WC_SUCCESS) {
		if (f->temporary)
			rdsx_temp_free(conn, f);
		else
			rdsx_frmr_mark_stale(&conn->pool, f);
		return -EIO;
	}
	return 0;

out_put:
	if (f->temporary)
		rdsx_temp_free(conn, f);
	else
		rdsx_frmr_put(&conn->pool, f);
	return ret;
}

static int rdsx_get_mr(struct rdsx_conn *conn, struct scatterlist *sg, int nents,
		       enum rdsx_mr_kind kind, struct rdsx_frmr **out)
{
	struct rdsx_pool *pool = &conn->pool;
	struct rdsx_frmr *f;
	int ret;

	if (nents > pool->max_pages)
		return -EMSGSIZE;

	spin_lock(&pool->lock);
	f = list_first_entry_or_null(&pool->clean_list, struct rdsx_frmr, list);
	if (f)
		list_del_init(&f->list);
	spin_unlock(&pool->lock);

	if (!f) {
		/* Pool exhausted: a one-off frmr, destroyed with the op. */
		f = kzalloc(sizeof(*f), GFP_ATOMIC);
		if (!f)
			return -ENOMEM;
		f->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, pool->max_pages); /* BUG: rdma-registration-in-datapath -- MR allocated on the send path for one operation */
		if (IS_ERR(f->mr)) {
			ret = PTR_ERR(f->mr);
			kfree(f);
			return ret;
		}
		f->sg = kcalloc(pool->max_pages, sizeof(*f->sg), GFP_ATOMIC);
		if (!f->sg) {
			kfree(f);	/* BUG: rdma-mr-leak -- the holder is freed with its MR still allocated */
			return -ENOMEM;
		}
		f->temporary = true;
		f->conn = conn;
		f->reg_cqe.done = rdsx_reg_done;
		f->inv_cqe.done = rdsx_inv_done;
		init_completion(&f->comp);
	}

	memcpy(f->sg, sg, nents * sizeof(*sg));
	f->sg_len = nents;
	ret = rdsx_reg_frmr(conn, f, kind);
	if (ret)
		return ret;
	*out = f;
	return 0;
}

static void rdsx_free_mr(struct rdsx_conn *conn, struct rdsx_frmr *f)
{
	int ret;

	if (f->temporary) {
		rdsx_temp_free(conn, f);
		return;
	}
	memset(&f->inv_wr, 0, sizeof(f->inv_wr));
	f->inv_wr.opcode = IB_WR_LOCAL_INV;
	f->inv_wr.ex.invalidate_rkey = f->mr->rkey;
	f->inv_wr.wr_cqe = &f->inv_cqe;
	f->inv_wr.send_flags = IB_SEND_SIGNALED;
	reinit_completion(&f->comp);
	ret = ib_post_send(conn->qp, &f->inv_wr, NULL);
	if (ret || !wait_for_completion_timeout(&f->comp, msecs_to_jiffies(RDSX_WAIT_MS)) ||
	    f->wc_status != IB_WC_SUCCESS) {
		rdsx_frmr_mark_stale(&conn->pool, f);	/* OK: rdma-invalidation-leak -- the drop list is only walked by the flush worker, which deregisters */
		return;
	}
	rdsx_frmr_put(&conn->pool, f);	/* OK: rdma-invalidation-leak -- after the LOCAL_INV completed successfully */
}

static int rdsx_frmr_refresh(struct rdsx_conn *conn, struct rdsx_frmr *f)
{
	struct ib_mr *mr;

	ib_dereg_mr(f->mr);
	mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, conn->pool.max_pages); /* OK: rdma-registration-in-datapath -- runs from the flush worker, not per I/O */
	if (IS_ERR(mr)) {
		f->mr = NULL;
		return PTR_ERR(mr);
	}
	f->mr = mr;	/* OK: rdma-mr-leak -- the stale MR was deregistered above */
	return 0;
}

static void rdsx_pool_flush_worker(struct work_struct *work)
{
	struct rdsx_pool *pool = container_of(work, struct rdsx_pool, flush_work);
	struct rdsx_conn *conn = container_of(pool, struct rdsx_conn, pool);
	struct rdsx_frmr *f, *tmp;
	LIST_HEAD(batch);

	spin_lock(&pool->lock);
	list_splice_init(&pool->drop_list, &batch);
	spin_unlock(&pool->lock);

	list_for_each_entry_safe(f, tmp, &batch, list) {
		list_del_init(&f->list);
		if (rdsx_frmr_refresh(conn, f))
			continue;
		rdsx_frmr_put(pool, f);	/* OK: rdma-invalidation-leak -- the old key died with ib_dereg_mr in the refresh */
	}
}

static int rdsx_pool_create(struct rdsx_conn *conn)
{
	struct rdsx_pool *pool = &conn->pool;
	struct rdsx_frmr *f;
	int i, ret;

	pool->max_pages = min_t(u32, conn->dev->attrs.max_fast_reg_page_list_len,
				RDSX_MAX_FRMR_PAGES);
	pool->nr = RDSX_FRMR_POOL_SIZE;
	pool->frmrs = kcalloc(pool->nr, sizeof(*pool->frmrs), GFP_KERNEL);
	if (!pool->frmrs)
		return -ENOMEM;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->clean_list);
	INIT_LIST_HEAD(&pool->drop_list);
	INIT_WORK(&pool->flush_work, rdsx_pool_flush_worker);

	for (i = 0; i < pool->nr; i++) {
		f = &pool->frmrs[i];
		f->mr = ib_alloc_mr(conn->pd, IB_MR_TYPE_MEM_REG, pool->max_pages); /* OK: rdma-registration-in-datapath -- the whole pool is allocated at connection setup */
		if (IS_ERR(f->mr)) {
			ret = PTR_ERR(f->mr);
			goto out_unwind;	/* OK: rdma-mr-leak -- element i holds no MR, the unwinding covers all below it */
		}
		f->sg = kcalloc(pool->max_pages, sizeof(*f->sg), GFP_KERNEL);
		if (!f->sg) {
			ret = -ENOMEM;
			goto out_unwind;	/* BUG: rdma-mr-leak -- element i's MR is allocated but the unwinding stops below i */
		}
		f->conn = conn;
		f->reg_cqe.done = rdsx_reg_done;
		f->inv_cqe.done = rdsx_inv_done;
		init_completion(&f->comp);
		list_add_tail(&f->list, &pool->clean_list);
	}
	return 0;

out_unwind:
	while (--i >= 0) {
		kfree(pool->frmrs[i].sg);
		ib_dereg_mr(pool->frmrs[i].mr);
	}
	kfree(pool->frmrs);
	return ret;
}

static void rdsx_pool_destroy(struct rdsx_conn *conn)
{
	struct rdsx_pool *pool = &conn->pool;
	int i;

	cancel_work_sync(&pool->flush_work);
	for (i = 0; i < pool->nr; i++) {
		if (pool->frmrs[i].mr)
			ib_dereg_mr(pool->frmrs[i].mr);	/* OK: rdma-registration-in-datapath -- teardown of the whole pool */
		kfree(pool->frmrs[i].sg);
	}
	kfree(pool->frmrs);
}

static int rdsx_post_rdma_read(struct rdsx_conn *conn, struct rdsx_rdma_op *op)
{
	op->sge.addr = op->frmr->mr->iova;
	op->sge.length = op->len;
	op->sge.lkey = op->frmr->mr->lkey;

	memset(&op->wr, 0, sizeof(op->wr));
	op->wr.wr.opcode = IB_WR_RDMA_READ;
	op->wr.wr.sg_list = &op->sge;
	op->wr.wr.num_sge = 1;
	op->wr.wr.wr_cqe = &op->cqe;
	op->wr.wr.send_flags = IB_SEND_SIGNALED;
	op->wr.remote_addr = op->remote_addr;
	op->wr.rkey = op->remote_rkey;
	return ib_post_send(conn->qp, &op->wr.wr, NULL); /* OK: rdma-access-flags-transport -- the sink frmr gets REMOTE_WRITE on iWARP */
}

static int rdsx_read_cong_map(struct rdsx_conn *conn, u64 raddr, u32 rkey, u32 len)
{
	struct ib_sge sge = {
		.addr = conn->cong_dma,
		.length = len,
		.lkey = conn->pd->local_dma_lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = {
			.opcode = IB_WR_RDMA_READ,
			.sg_list = &sge,
			.num_sge = 1,
			.wr_cqe = &conn->cong_cqe,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = raddr,
		.rkey = rkey,
	};

	return ib_post_send(conn->qp, &wr.wr, NULL); /* BUG: rdma-access-flags-transport -- READ sink addressed with local_dma_lkey, which has no remote-write rights on iWARP */
}

int rdsx_sendmsg(struct rdsx_conn *conn, struct rdsx_msg *m)
{
	struct rdsx_frmr *f;
	int ret;

	if (m->free_frmr)
		rdsx_free_mr(conn, m->free_frmr);
	if (m->map_sg) {
		ret = rdsx_get_mr(conn, m->map_sg, m->map_nents, m->map_kind, &f);
		if (ret)
			return ret;
		m->cookie_rkey = f->mr->rkey;
		if (m->op)
			m->op->frmr = f;
	}
	if (m->cong_raddr) {
		ret = rdsx_read_cong_map(conn, m->cong_raddr, m->cong_rkey, PAGE_SIZE);
		if (ret)
			return ret;
	}
	if (m->op)
		return rdsx_post_rdma_read(conn, m->op);
	return 0;
}

int rdsx_conn_setup(struct rdsx_conn *conn)
{
	conn->max_send_sge = min_t(u32, conn->dev->attrs.max_send_sge, 8);
	if (rdma_protocol_iwarp(conn->dev, conn->port))	/* OK: rdma-access-flags-transport -- scatter sizing, no access flags */
		conn->max_send_sge = min_t(u32, conn->max_send_sge, conn->dev->attrs.max_sge_rd);
	return rdsx_pool_create(conn);
}

void rdsx_conn_shutdown(struct rdsx_conn *conn)
{
	ib_drain_qp(conn->qp);
	rdsx_pool_destroy(conn);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("RDS-style FRMR pool");
