// SPDX-License-Identifier: GPL-2.0
/*
 * srpi: channel setup, fast registration and unmapping of an SRP-style SCSI
 * initiator (modelled on drivers/infiniband/ulp/srp/ib_srp.c, written fresh).
 *
 * A command may need several MRs (mr_per_cmd). The send queue is sized
 * m * queue_size with m = 1 + 2 * mr_per_cmd: a SEND plus a REG_MR and a
 * LOCAL_INV per MR, which is enough, but it is the hand-made registration
 * factor that cap.max_rdma_ctxs replaces. Keys are rotated before every
 * registration.
 *
 * Bugs, both real in shape: the PD falls back to IB_PD_UNSAFE_GLOBAL_RKEY
 * when register_always is off or the device cannot fast-register; and
 * srpi_unmap_data() posts unsignaled LOCAL_INVs and returns the descriptors
 * to the pool and unmaps the pages right away, so the target can still write
 * through the old key into memory the SCSI midlayer already reuses (and when
 * the LOCAL_INV post fails the key is not invalidated at all).
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

static bool register_always = true;
module_param(register_always, bool, 0444);

struct srpi_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct srpi_fr_pool {
	int			size;
	int			max_page_list_len;
	spinlock_t		lock;
	struct list_head	free_list;
	struct srpi_fr_desc	desc[];
};

struct srpi_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	bool			has_fr;
	u32			max_pages_per_mr;
};

struct srpi_request {
	struct srpi_fr_desc	**fr_list;
	short			nmdesc;
	struct ib_cqe		reg_cqe;
	struct scatterlist	*sg;
	int			sg_count;
	enum dma_data_direction	dir;
};

struct srpi_channel {
	struct srpi_device	*dev;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct srpi_fr_pool	*fr_pool;
	int			queue_size;
	int			mr_per_cmd;
	struct work_struct	tl_err_work;
};

int srpi_init_device(struct srpi_device *sdev)
{
	unsigned int flags = 0;

	sdev->has_fr = sdev->dev->attrs.device_cap_flags &
		       IB_DEVICE_MEM_MGT_EXTENSIONS;
	if (!register_always || !sdev->has_fr)
		flags |= IB_PD_UNSAFE_GLOBAL_RKEY;

	/* BUG: rdma-remote-access-overbroad -- on some paths the PD gets the global rkey for all of memory, which the initiator then sends in its descriptors */
	sdev->pd = ib_alloc_pd(sdev->dev, flags);
	if (IS_ERR(sdev->pd))
		return PTR_ERR(sdev->pd);
	return 0;
}

static void srpi_destroy_fr_pool(struct srpi_fr_pool *pool)
{
	int i;

	if (!pool)
		return;
	for (i = 0; i < pool->size; i++)
		if (pool->desc[i].mr)
			ib_dereg_mr(pool->desc[i].mr); /* BUG: rdma-local-mr-management -- the ULP deregisters its own MRs */
	kfree(pool);
}

static struct srpi_fr_pool *srpi_create_fr_pool(struct srpi_device *sdev,
						int pool_size)
{
	struct srpi_fr_pool *pool;
	struct ib_mr *mr;
	int i, ret = -EINVAL;

	pool = kzalloc(sizeof(*pool) + pool_size * sizeof(pool->desc[0]),
		       GFP_KERNEL);
	if (!pool)
		return ERR_PTR(-ENOMEM);
	pool->size = pool_size;
	pool->max_page_list_len = sdev->max_pages_per_mr;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0; i < pool_size; i++) {
		/* BUG: rdma-local-mr-management -- the ULP allocates its fast-registration MRs */
		mr = ib_alloc_mr(sdev->pd, IB_MR_TYPE_MEM_REG,
				 sdev->max_pages_per_mr);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			goto destroy_pool; /* OK: rdma-mr-leak -- the pool is zeroed, so srpi_destroy_fr_pool() frees exactly the MRs taken */
		}
		pool->desc[i].mr = mr;
		list_add_tail(&pool->desc[i].entry, &pool->free_list);
	}
	return pool;

destroy_pool:
	srpi_destroy_fr_pool(pool);
	return ERR_PTR(ret);
}

static void srpi_fr_pool_put(struct srpi_fr_pool *pool,
			     struct srpi_fr_desc **desc, int n)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pool->lock, flags);
	for (i = 0; i < n; i++)
		list_add(&desc[i]->entry, &pool->free_list);
	spin_unlock_irqrestore(&pool->lock, flags);
}

int srpi_create_ch_ib(struct srpi_channel *ch)
{
	struct srpi_device *dev = ch->dev;
	struct ib_qp_init_attr *init_attr;
	const int m = 1 + dev->has_fr * ch->mr_per_cmd * 2;
	int ret;

	init_attr = kzalloc(sizeof(*init_attr), GFP_KERNEL);
	if (!init_attr)
		return -ENOMEM;

	init_attr->event_handler = NULL;
	/* BUG: rdma-send-queue-manual-factor -- the queue depth times a hand-made REG+INV factor per MR */
	init_attr->cap.max_send_wr = m * ch->queue_size; /* OK: rdma-send-queue-undersized -- a SEND plus REG_MR and LOCAL_INV for each of mr_per_cmd MRs, exactly m per command */
	init_attr->cap.max_recv_wr = ch->queue_size + 1;
	init_attr->cap.max_recv_sge = 1;
	init_attr->cap.max_send_sge = 1;
	init_attr->sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- the command SENDs are signaled */
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = ch->send_cq;
	init_attr->recv_cq = ch->recv_cq;

	ch->qp = ib_create_qp(dev->pd, init_attr);
	if (IS_ERR(ch->qp)) {
		ret = PTR_ERR(ch->qp);
		goto out;
	}

	ch->fr_pool = srpi_create_fr_pool(dev, ch->queue_size * ch->mr_per_cmd);
	if (IS_ERR(ch->fr_pool)) {
		ret = PTR_ERR(ch->fr_pool);
		ib_destroy_qp(ch->qp);
		goto out;
	}
	ret = 0;
out:
	kfree(init_attr);
	return ret;
}

static void srpi_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("srpi: FAST REG failed: %s\n", ib_wc_status_msg(wc->status));
}

int srpi_map_finish_fr(struct srpi_channel *ch, struct srpi_request *req,
		       struct srpi_fr_desc *desc, struct scatterlist *sg,
		       int sg_nents, __be32 *key_out, u64 *va_out)
{
	struct ib_reg_wr wr;
	u32 rkey;
	int n;

	rkey = ib_inc_rkey(desc->mr->rkey);
	ib_update_fast_reg_key(desc->mr, rkey);

	/* BUG: rdma-local-mr-management -- the ULP maps the scatterlist into its MR */
	n = ib_map_mr_sg(desc->mr, sg, sg_nents, NULL, SZ_4K);
	if (unlikely(n < 0)) {
		srpi_fr_pool_put(ch->fr_pool, &desc, 1);
		return n;
	}

	req->reg_cqe.done = srpi_reg_mr_err_done;
	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- the ULP posts its own fast registration */
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr; /* OK: rdma-rkey-reuse -- ib_update_fast_reg_key() ran above on every path */
	wr.key = desc->mr->rkey;
	wr.access = (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		     IB_ACCESS_REMOTE_WRITE);

	req->fr_list[req->nmdesc++] = desc;
	*key_out = desc->mr->rkey;
	*va_out = desc->mr->iova;

	return ib_post_send(ch->qp, &wr.wr, NULL);
}

static void srpi_inv_rkey_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS)
		pr_err("srpi: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
}

static int srpi_inv_rkey(struct srpi_request *req, struct srpi_channel *ch,
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
	req->reg_cqe.done = srpi_inv_rkey_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

void srpi_unmap_data(struct srpi_channel *ch, struct srpi_request *req)
{
	struct srpi_fr_desc **pfr;
	int i, res;

	for (i = req->nmdesc, pfr = req->fr_list; i > 0; i--, pfr++) {
		res = srpi_inv_rkey(req, ch, (*pfr)->mr->rkey);
		if (res < 0) {
			pr_err("srpi: queueing INV WR for rkey %#x failed (%d)\n",
			       (*pfr)->mr->rkey, res);
			queue_work(system_wq, &ch->tl_err_work);
		}
	}
	if (req->nmdesc)
		/* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the descriptors go back to the pool right after unsignaled LOCAL_INVs were posted (and with a valid key when the post failed) */
		srpi_fr_pool_put(ch->fr_pool, req->fr_list, req->nmdesc);
	req->nmdesc = 0;

	ib_dma_unmap_sg(ch->dev->dev, req->sg, req->sg_count, req->dir);
}
