// SPDX-License-Identifier: GPL-2.0
/*
 * srpx_fr.c - fast-registration data mapping of the SRPX initiator.
 *
 * Every RDMA channel owns a pool of fast-registration descriptors sized
 * for its queue depth.  A command's scatterlist is registered with up to
 * SRPX_MR_PER_CMD descriptors whose REG_MR work requests are posted,
 * unsignaled, ahead of the command SEND; the memory descriptors in the
 * command carry the keys.  When the response arrives each key is
 * invalidated with a LOCAL_INV on the same send queue.  The task
 * management path uses a synchronous variant that waits for the
 * invalidation before it releases the command's data.  If the pool runs
 * dry a descriptor is allocated on the fly and destroyed on release.
 */
#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

#define SRPX_MR_PER_CMD		2
#define SRPX_MAX_SGE		16

struct srpx_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
	bool			overflow;
};

struct srpx_fr_pool {
	int			size;
	int			max_page_list_len;
	spinlock_t		lock;
	struct list_head	free_list;
	struct srpx_fr_desc	desc[];
};

struct srpx_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srpx_rdma_ch {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq, *recv_cq;
	struct srpx_fr_pool	*fr_pool;
	int			queue_size;
	unsigned int		mr_page_size;
	struct work_struct	tl_err_work;
};

struct srpx_request {
	struct scatterlist	*sg;
	int			sg_count;
	enum dma_data_direction	dir;
	struct srpx_fr_desc	*fr_list[SRPX_MR_PER_CMD];
	int			nmdesc;
	struct srpx_direct_buf	bufs[SRPX_MR_PER_CMD];
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
};

static void srpx_destroy_fr_pool(struct srpx_fr_pool *pool)
{
	int i;

	for (i = 0; i < pool->size; i++)
		if (pool->desc[i].mr)
			/* BUG: rdma-local-mr-management -- deregistration by the ULP */
			ib_dereg_mr(pool->desc[i].mr);
	kfree(pool);
}

struct srpx_fr_pool *srpx_create_fr_pool(struct srpx_rdma_ch *ch, int size,
					 int max_page_list_len)
{
	struct srpx_fr_pool *pool;
	struct ib_mr *mr;
	int i;

	pool = kzalloc(sizeof(*pool) + size * sizeof(pool->desc[0]), GFP_KERNEL);
	if (!pool)
		return ERR_PTR(-ENOMEM);
	pool->size = size;
	pool->max_page_list_len = max_page_list_len;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0; i < pool->size; i++) {
		/* BUG: rdma-local-mr-management -- the initiator allocates its own descriptors */
		mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, max_page_list_len); /* OK: rdma-registration-in-datapath -- the whole pool is built when the channel is created */
		if (IS_ERR(mr)) {
			srpx_destroy_fr_pool(pool); /* OK: rdma-mr-leak -- every descriptor allocated so far is deregistered */
			return ERR_PTR(PTR_ERR(mr));
		}
		pool->desc[i].mr = mr;
		list_add_tail(&pool->desc[i].entry, &pool->free_list);
	}
	return pool;
}

static struct srpx_fr_desc *srpx_alloc_overflow_desc(struct srpx_rdma_ch *ch)
{
	struct srpx_fr_desc *d = kzalloc(sizeof(*d), GFP_ATOMIC);

	if (!d)
		return NULL;
	/* BUG: rdma-local-mr-management, rdma-registration-in-datapath -- a device command to allocate an MR for one I/O when the pool is empty */
	d->mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG, ch->fr_pool->max_page_list_len);
	if (IS_ERR(d->mr)) {
		kfree(d);
		return NULL;
	}
	d->overflow = true;
	return d;
}

static struct srpx_fr_desc *srpx_fr_pool_get(struct srpx_rdma_ch *ch)
{
	struct srpx_fr_pool *pool = ch->fr_pool;
	struct srpx_fr_desc *d = NULL;

	spin_lock(&pool->lock);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, typeof(*d), entry);
		list_del(&d->entry);
	}
	spin_unlock(&pool->lock);
	return d ? d : srpx_alloc_overflow_desc(ch);
}

static void srpx_fr_pool_put(struct srpx_fr_pool *pool,
			     struct srpx_fr_desc **desc, int n)
{
	int i;

	spin_lock(&pool->lock);
	for (i = 0; i < n; i++) {
		if (desc[i]->overflow) {
			/* BUG: rdma-local-mr-management, rdma-registration-in-datapath -- the overflow MR is destroyed again from the response path */
			ib_dereg_mr(desc[i]->mr);
			kfree(desc[i]);
			continue;
		}
		list_add(&desc[i]->entry, &pool->free_list);
	}
	spin_unlock(&pool->lock);
}

static void srpx_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("srpx: FAST_REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
}

int srpx_map_finish_fr(struct srpx_rdma_ch *ch, struct srpx_request *req,
		       struct scatterlist *sg, int sg_nents)
{
	struct srpx_fr_desc *desc;
	struct ib_reg_wr wr;
	u32 rkey;
	int n;

	if (req->nmdesc >= SRPX_MR_PER_CMD)
		return -ENOMEM;
	desc = srpx_fr_pool_get(ch);
	if (!desc)
		return -ENOMEM;

	rkey = ib_inc_rkey(desc->mr->rkey);
	ib_update_fast_reg_key(desc->mr, rkey);

	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(desc->mr, sg, sg_nents, NULL, ch->mr_page_size);
	if (unlikely(n < 0)) {
		srpx_fr_pool_put(ch->fr_pool, &desc, 1);
		return n;
	}

	req->reg_cqe.done = srpx_reg_mr_err_done;
	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr; /* OK: rdma-rkey-reuse -- ib_inc_rkey() gave the descriptor a new key above */
	wr.key = desc->mr->rkey;
	/* OK: rdma-access-flags-invalid -- local write accompanies the remote rights */
	wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;

	req->fr_list[req->nmdesc] = desc;
	req->bufs[req->nmdesc].va = cpu_to_be64(desc->mr->iova);
	req->bufs[req->nmdesc].key = cpu_to_be32(desc->mr->rkey); /* OK: rdma-remote-access-overbroad -- the key travels in the SRP memory descriptor */
	req->bufs[req->nmdesc].len = cpu_to_be32(desc->mr->length);
	req->nmdesc++;

	return ib_post_send(ch->qp, &wr.wr, NULL);
}

static void srpx_inv_rkey_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srpx_request *req = container_of(wc->wr_cqe, struct srpx_request, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("srpx: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
	complete(&req->inv_done);
}

static int srpx_inv_rkey(struct srpx_request *req, struct srpx_rdma_ch *ch,
			 u32 rkey, bool signaled)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = signaled ? IB_SEND_SIGNALED : 0,
		.ex.invalidate_rkey = rkey,
	};

	req->inv_cqe.done = srpx_inv_rkey_done;
	wr.wr_cqe = &req->inv_cqe;
	return ib_post_send(ch->qp, &wr, NULL);
}

static void srpx_release_data(struct srpx_rdma_ch *ch, struct srpx_request *req)
{
	if (req->nmdesc)
		srpx_fr_pool_put(ch->fr_pool, req->fr_list, req->nmdesc);
	req->nmdesc = 0;
	ib_dma_unmap_sg(ch->dev, req->sg, req->sg_count, req->dir);
}

/* Called when the response for the command has been received. */
void srpx_unmap_data(struct srpx_rdma_ch *ch, struct srpx_request *req)
{
	struct srpx_fr_desc **pfr;
	int i, res;

	for (i = req->nmdesc, pfr = req->fr_list; i > 0; i--, pfr++) {
		res = srpx_inv_rkey(req, ch, (*pfr)->mr->rkey, false);
		if (res < 0) {
			pr_err("srpx: queueing INV WR for rkey %#x failed (%d)\n",
			       (*pfr)->mr->rkey, res);
			queue_work(system_wq, &ch->tl_err_work);
		}
	}
	// BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the pages are unmapped right behind the unsignaled LOCAL_INVs, and a key whose LOCAL_INV failed to post is recycled all the same
	srpx_release_data(ch, req);
}

/* Task management: the command's memory is reused as soon as we return. */
int srpx_unmap_data_sync(struct srpx_rdma_ch *ch, struct srpx_request *req)
{
	int i, res;

	for (i = 0; i < req->nmdesc; i++) {
		reinit_completion(&req->inv_done);
		res = srpx_inv_rkey(req, ch, req->fr_list[i]->mr->rkey, true);
		if (res < 0) {
			queue_work(system_wq, &ch->tl_err_work);
			return res;
		}
		wait_for_completion(&req->inv_done);
	}
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV was signaled and waited for */
	srpx_release_data(ch, req);
	return 0;
}

void srpx_process_rsp(struct srpx_rdma_ch *ch, struct srpx_request *req,
		      struct ib_wc *wc)
{
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) && req->nmdesc == 1) {
		/* OK: rdma-remote-invalidate-unchecked -- the target's invalidation is accepted only for the command's own key */
		if (wc->ex.invalidate_rkey == req->fr_list[0]->mr->rkey) {
			srpx_release_data(ch, req); /* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the target invalidated this very key */
			return;
		}
		pr_err("srpx: target invalidated foreign rkey %#x\n",
		       wc->ex.invalidate_rkey);
	}
	srpx_unmap_data(ch, req);
}

int srpx_create_ch_ib(struct srpx_rdma_ch *ch)
{
	struct ib_qp_init_attr *init_attr;
	const int m = 1 + 2 * SRPX_MR_PER_CMD;
	int ret;

	init_attr = kzalloc(sizeof(*init_attr), GFP_KERNEL);
	if (!init_attr)
		return -ENOMEM;
	/* BUG: rdma-send-queue-manual-factor -- the SEND plus the REG_MR/LOCAL_INV pairs are counted by hand */
	init_attr->cap.max_send_wr = m * ch->queue_size; // BUG(file): rdma-send-queue-undersized -- no entry left for the drain WR of ib_drain_qp()
	init_attr->cap.max_recv_wr = ch->queue_size + 1;
	init_attr->cap.max_recv_sge = 1;
	init_attr->cap.max_send_sge = min_t(u32, SRPX_MAX_SGE, ch->dev->attrs.max_send_sge); /* OK: rdma-queue-cap-unchecked -- clamped to the device */
	init_attr->sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = ch->send_cq;
	init_attr->recv_cq = ch->recv_cq;

	ch->qp = ib_create_qp(ch->pd, init_attr);
	kfree(init_attr);
	if (IS_ERR(ch->qp))
		return PTR_ERR(ch->qp);

	ch->fr_pool = srpx_create_fr_pool(ch, ch->queue_size * SRPX_MR_PER_CMD,
					  min_t(int, 256, ch->dev->attrs.max_fast_reg_page_list_len));
	if (IS_ERR(ch->fr_pool)) {
		ret = PTR_ERR(ch->fr_pool);
		ib_destroy_qp(ch->qp);
		return ret;
	}
	return 0;
}

void srpx_free_ch_ib(struct srpx_rdma_ch *ch)
{
	ib_drain_qp(ch->qp);
	srpx_destroy_fr_pool(ch->fr_pool);
	ib_destroy_qp(ch->qp);
}
