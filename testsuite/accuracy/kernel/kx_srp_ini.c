// SPDX-License-Identifier: GPL-2.0
/*
 * kx_srp_ini.c - SRP-style initiator, fast registration data path.
 *
 * Each RDMA channel has a pool of FR descriptors and a ring of requests.
 * A command is mapped into as many FR descriptors as it needs (the
 * request's fr_list); when it needs more than one, the table of direct
 * buffer descriptors is itself registered with the request's own idb_mr
 * so that the target can fetch it.  All REG_MRs are posted before the
 * SRP_CMD.  After the response every key of the request is invalidated.
 *
 * Correct here: FR pool creation, the data descriptor registration, the
 * map error path, the synchronous invalidation used by a confirmed abort.
 * Wrong here: the request ring allocation (one error path leaks an MR), the
 * indirect table registration (never changes its key), the response path
 * (releases right behind unsignaled LOCAL_INVs, and also when they could not
 * be posted), and the abort path when the target did not confirm.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define SXP_MAX_MR_PER_CMD	8
#define SXP_ABORT_TMO_MS	5000

enum { SXP_SUCCESS = 0x2002, SXP_FAILED = 0x2003, SXP_FAST_IO_FAIL = 0x2005 };

struct sxp_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct sxp_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct sxp_fr_pool {
	int			size;
	int			max_page_list_len;
	spinlock_t		lock;
	struct list_head	free_list;
	struct sxp_fr_desc	desc[];
};

struct sxp_request {
	void			*scmnd;
	struct scatterlist	*sg;
	int			sg_cnt;
	enum dma_data_direction	dir;
	struct sxp_fr_desc	**fr_list;
	short			nmdesc;
	struct sxp_direct_buf	*indirect_desc;
	u64			indirect_dma;
	struct ib_mr		*idb_mr;
	bool			idb_registered;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	inv_wr[SXP_MAX_MR_PER_CMD + 1];
	struct completion	inv_done;
	int			inv_status;
};

struct sxp_rdma_ch {
	struct ib_qp		*qp;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct sxp_fr_pool	*fr_pool;
	struct sxp_request	*req_ring;
	int			queue_size;
	unsigned int		mr_page_size;
	struct work_struct	tl_err_work;
};

int sxp_send_tsk_mgmt(struct sxp_rdma_ch *ch, struct sxp_request *req);
void sxp_scsi_done(struct sxp_request *req, int result);

static void sxp_destroy_fr_pool(struct sxp_fr_pool *pool)
{
	int i;

	if (!pool)
		return;
	for (i = 0; i < pool->size; i++)
		if (pool->desc[i].mr)
			ib_dereg_mr(pool->desc[i].mr);
	kfree(pool);
}

static struct sxp_fr_pool *sxp_create_fr_pool(struct ib_pd *pd, int pool_size,
					      int max_page_list_len)
{
	struct sxp_fr_pool *pool;
	struct sxp_fr_desc *d;
	struct ib_mr *mr;
	int i, ret;

	pool = kzalloc(sizeof(*pool) + pool_size * sizeof(*d), GFP_KERNEL);
	if (!pool)
		return ERR_PTR(-ENOMEM);
	pool->size = pool_size;
	pool->max_page_list_len = max_page_list_len;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0, d = &pool->desc[0]; i < pool->size; i++, d++) {
		mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, max_page_list_len);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto destroy_pool; /* OK: rdma-mr-leak -- the pool teardown deregisters every MR stored so far */
		}
		d->mr = mr;
		list_add_tail(&d->entry, &pool->free_list);
	}
	return pool;

destroy_pool:
	sxp_destroy_fr_pool(pool);
	return ERR_PTR(ret);
}

static struct sxp_fr_desc *sxp_fr_pool_get(struct sxp_fr_pool *pool)
{
	struct sxp_fr_desc *d = NULL;
	unsigned long flags;

	spin_lock_irqsave(&pool->lock, flags);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, typeof(*d), entry);
		list_del(&d->entry);
	}
	spin_unlock_irqrestore(&pool->lock, flags);
	return d;
}

static void sxp_fr_pool_put(struct sxp_fr_pool *pool, struct sxp_fr_desc **desc,
			    int n)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pool->lock, flags);
	for (i = 0; i < n; i++)
		list_add(&desc[i]->entry, &pool->free_list);
	spin_unlock_irqrestore(&pool->lock, flags);
}

static int sxp_alloc_req_ring(struct sxp_rdma_ch *ch)
{
	struct sxp_request *req;
	int i;

	ch->req_ring = kcalloc(ch->queue_size, sizeof(*ch->req_ring),
			       GFP_KERNEL);
	if (!ch->req_ring)
		return -ENOMEM;

	for (i = 0; i < ch->queue_size; i++) {
		req = &ch->req_ring[i];
		req->fr_list = kmalloc_array(SXP_MAX_MR_PER_CMD,
					     sizeof(void *), GFP_KERNEL);
		req->indirect_desc = kmalloc(SXP_MAX_MR_PER_CMD *
					     sizeof(struct sxp_direct_buf),
					     GFP_KERNEL);
		if (!req->fr_list || !req->indirect_desc)
			goto err_free_cur;

		req->idb_mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, 1);
		if (IS_ERR(req->idb_mr))
			goto err_free_cur; /* OK: rdma-mr-leak -- nothing allocated for this slot */

		req->indirect_dma = ib_dma_map_single(ch->dev, req->indirect_desc,
					SXP_MAX_MR_PER_CMD * sizeof(struct sxp_direct_buf),
					DMA_TO_DEVICE);
		if (ib_dma_mapping_error(ch->dev, req->indirect_dma))
			goto err_free_cur; /* BUG: rdma-mr-leak -- this slot's idb_mr is not released; the unwinding below only covers earlier slots */
		init_completion(&req->inv_done);
	}
	return 0;

err_free_cur:
	kfree(req->indirect_desc);
	kfree(req->fr_list);
	while (--i >= 0) {
		req = &ch->req_ring[i];
		ib_dma_unmap_single(ch->dev, req->indirect_dma,
				    SXP_MAX_MR_PER_CMD * sizeof(struct sxp_direct_buf),
				    DMA_TO_DEVICE);
		ib_dereg_mr(req->idb_mr);
		kfree(req->indirect_desc);
		kfree(req->fr_list);
	}
	kfree(ch->req_ring);
	ch->req_ring = NULL;
	return -ENOMEM;
}

static void sxp_free_req_ring(struct sxp_rdma_ch *ch)
{
	int i;

	for (i = 0; i < ch->queue_size; i++) {
		struct sxp_request *req = &ch->req_ring[i];

		ib_dma_unmap_single(ch->dev, req->indirect_dma,
				    SXP_MAX_MR_PER_CMD * sizeof(struct sxp_direct_buf),
				    DMA_TO_DEVICE);
		ib_dereg_mr(req->idb_mr);
		kfree(req->indirect_desc);
		kfree(req->fr_list);
	}
	kfree(ch->req_ring);
}

static void sxp_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sxp_request *req = container_of(wc->wr_cqe, struct sxp_request,
					       reg_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("sxp: REG_MR/LOCAL_INV for req %p failed: %s\n", req,
		       ib_wc_status_msg(wc->status));
}

static int sxp_map_finish_fr(struct sxp_rdma_ch *ch, struct sxp_request *req,
			     struct scatterlist *sg, int sg_nents,
			     struct sxp_direct_buf *buf)
{
	struct sxp_fr_desc *desc;
	struct ib_reg_wr wr;
	u32 rkey;
	int n, err;

	if (req->nmdesc >= SXP_MAX_MR_PER_CMD)
		return -ENOMEM;

	desc = sxp_fr_pool_get(ch->fr_pool);
	if (!desc)
		return -ENOMEM;

	rkey = ib_inc_rkey(desc->mr->rkey);
	ib_update_fast_reg_key(desc->mr, rkey);

	n = ib_map_mr_sg(desc->mr, sg, sg_nents, NULL, ch->mr_page_size);
	if (unlikely(n < 0)) {
		sxp_fr_pool_put(ch->fr_pool, &desc, 1); /* OK: rdma-invalidation-leak -- not registered yet */
		return n;
	}

	req->reg_cqe.done = sxp_reg_mr_err_done;
	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr; /* OK: rdma-rkey-reuse -- ib_update_fast_reg_key() above */
	wr.key = desc->mr->rkey;
	wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		    IB_ACCESS_REMOTE_WRITE;

	req->fr_list[req->nmdesc++] = desc;
	buf->va = cpu_to_be64(desc->mr->iova);
	buf->key = cpu_to_be32(desc->mr->rkey);
	buf->len = cpu_to_be32(desc->mr->length);

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	return err ? err : n;
}

static int sxp_map_idb(struct sxp_rdma_ch *ch, struct sxp_request *req,
		       u32 idb_len, __be32 *idb_rkey)
{
	struct scatterlist idb_sg;
	struct ib_reg_wr wr;
	int n, err;

	sg_init_one(&idb_sg, req->indirect_desc, idb_len);
	idb_sg.dma_address = req->indirect_dma;
	idb_sg.dma_length = idb_len;

	n = ib_map_mr_sg(req->idb_mr, &idb_sg, 1, NULL, SZ_4K);
	if (unlikely(n != 1))
		return -EINVAL;

	req->reg_cqe.done = sxp_reg_mr_err_done;
	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = req->idb_mr; /* BUG: rdma-rkey-reuse -- idb_mr is registered for every command and invalidated after it, always under the same key */
	wr.key = req->idb_mr->rkey;
	wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ;

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	if (err)
		return err;
	req->idb_registered = true;
	*idb_rkey = cpu_to_be32(req->idb_mr->rkey);
	return 0;
}

static void sxp_release_req(struct sxp_rdma_ch *ch, struct sxp_request *req)
{
	if (req->nmdesc)
		sxp_fr_pool_put(ch->fr_pool, req->fr_list, req->nmdesc);
	req->nmdesc = 0;
	req->idb_registered = false;
	ib_dma_unmap_sg(ch->dev, req->sg, req->sg_cnt, req->dir);
}

static int sxp_inv_rkey(struct sxp_rdma_ch *ch, struct sxp_request *req,
			u32 rkey)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	wr.wr_cqe = &req->reg_cqe;
	req->reg_cqe.done = sxp_reg_mr_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

/* Response path: called from the receive completion handler. */
static void sxp_unmap_data(struct sxp_rdma_ch *ch, struct sxp_request *req)
{
	struct sxp_fr_desc **pfr;
	int i, res;

	for (i = req->nmdesc, pfr = req->fr_list; i > 0; i--, pfr++) {
		res = sxp_inv_rkey(ch, req, (*pfr)->mr->rkey);
		if (res < 0) {
			pr_err("sxp: queueing INV WR for rkey %#x failed (%d)\n",
			       (*pfr)->mr->rkey, res);
			queue_work(system_wq, &ch->tl_err_work);
		}
	}
	if (req->idb_registered)
		sxp_inv_rkey(ch, req, req->idb_mr->rkey);

	/* BUG: rdma-unmap-before-invalidate -- the LOCAL_INVs above are unsignaled and not waited for */
	/* BUG: rdma-invalidation-leak -- also reached after a LOCAL_INV post failed; that descriptor goes back with a live rkey */
	sxp_release_req(ch, req);
}

static int sxp_map_data(struct sxp_rdma_ch *ch, struct sxp_request *req,
			struct scatterlist *sg, int nents,
			enum dma_data_direction dir, __be32 *idb_rkey)
{
	struct scatterlist *s = sg;
	int count, i, n, ret;

	req->sg = sg;
	req->sg_cnt = nents;
	req->dir = dir;
	req->nmdesc = 0;
	count = ib_dma_map_sg(ch->dev, sg, nents, dir);
	if (unlikely(count == 0))
		return -EIO;

	for (i = 0; count > 0; i++) {
		n = sxp_map_finish_fr(ch, req, s, count, &req->indirect_desc[i]);
		if (n < 0) {
			ret = n;
			goto unmap;
		}
		count -= n;
		while (n-- > 0)
			s = sg_next(s);
	}

	if (req->nmdesc > 1) {
		ib_dma_sync_single_for_device(ch->dev, req->indirect_dma,
					      req->nmdesc * sizeof(struct sxp_direct_buf),
					      DMA_TO_DEVICE);
		ret = sxp_map_idb(ch, req, req->nmdesc *
				  sizeof(struct sxp_direct_buf), idb_rkey);
		if (ret)
			goto unmap;
	}
	return 0;

unmap:
	sxp_unmap_data(ch, req); /* OK: rdma-invalidation-leak -- descriptors registered so far get their LOCAL_INVs in sxp_unmap_data() */
	return ret;
}

static void sxp_inv_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sxp_request *req = container_of(wc->wr_cqe, struct sxp_request,
					       inv_cqe);

	req->inv_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&req->inv_done);
}

/* Process context only: posts every LOCAL_INV, waits for the last one. */
static int sxp_invalidate_sync(struct sxp_rdma_ch *ch, struct sxp_request *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *wr = NULL;
	int i, n = 0, ret;

	for (i = 0; i < req->nmdesc; i++) {
		wr = &req->inv_wr[n++];
		memset(wr, 0, sizeof(*wr));
		wr->opcode = IB_WR_LOCAL_INV;
		wr->wr_cqe = &req->reg_cqe;
		wr->ex.invalidate_rkey = req->fr_list[i]->mr->rkey;
		*prev = wr;
		prev = &wr->next;
	}
	if (req->idb_registered) {
		wr = &req->inv_wr[n++];
		memset(wr, 0, sizeof(*wr));
		wr->opcode = IB_WR_LOCAL_INV;
		wr->ex.invalidate_rkey = req->idb_mr->rkey;
		*prev = wr;
	}
	if (!wr)
		return 0;

	reinit_completion(&req->inv_done);
	req->inv_cqe.done = sxp_inv_sync_done;
	wr->wr_cqe = &req->inv_cqe;
	wr->send_flags = IB_SEND_SIGNALED;
	ret = ib_post_send(ch->qp, first, NULL);
	if (ret)
		return ret;
	if (!wait_for_completion_timeout(&req->inv_done,
					 msecs_to_jiffies(SXP_ABORT_TMO_MS)))
		return -ETIMEDOUT;
	return req->inv_status;
}

int sxp_eh_abort(struct sxp_rdma_ch *ch, struct sxp_request *req)
{
	int ret;

	if (sxp_send_tsk_mgmt(ch, req) == 0) {
		ret = sxp_invalidate_sync(ch, req);
		if (ret) {
			queue_work(system_wq, &ch->tl_err_work);
			return SXP_FAILED;
		}
		sxp_release_req(ch, req); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- signaled LOCAL_INV chain completed */
		sxp_scsi_done(req, -ECANCELED);
		return SXP_SUCCESS;
	}

	/* target did not confirm the abort: the transport reset cleans up */
	queue_work(system_wq, &ch->tl_err_work);
	sxp_release_req(ch, req); /* BUG: rdma-invalidation-leak -- channel still connected, the target may still use these rkeys */
	sxp_scsi_done(req, -ETIMEDOUT);
	return SXP_FAST_IO_FAIL;
}

int sxp_create_ch_ib(struct sxp_rdma_ch *ch, int pool_size, int max_pages)
{
	struct sxp_fr_pool *fr_pool;
	int ret;

	fr_pool = sxp_create_fr_pool(ch->pd, pool_size, max_pages);
	if (IS_ERR(fr_pool))
		return PTR_ERR(fr_pool);

	ret = sxp_alloc_req_ring(ch);
	if (ret) {
		sxp_destroy_fr_pool(fr_pool);
		return ret;
	}

	if (ch->fr_pool)
		sxp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = fr_pool;
	return 0;
}

void sxp_free_ch_ib(struct sxp_rdma_ch *ch)
{
	ib_drain_qp(ch->qp);
	sxp_free_req_ring(ch);
	sxp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = NULL;
}

const struct {
	int (*map)(struct sxp_rdma_ch *ch, struct sxp_request *req,
		   struct scatterlist *sg, int nents,
		   enum dma_data_direction dir, __be32 *idb_rkey);
	void (*unmap)(struct sxp_rdma_ch *ch, struct sxp_request *req);
} sxp_data_ops = {
	.map	= sxp_map_data,
	.unmap	= sxp_unmap_data,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("SRP-style initiator fast registration");
