// SPDX-License-Identifier: GPL-2.0
/*
 * tb_srp_ini.c - SCSI RDMA Protocol initiator, fast-registration data path
 * (srp style, one MR per command).
 *
 * Every RDMA channel owns a pool of fast-registration descriptors. A
 * command with data takes one descriptor, registers the command's pages
 * with an unsignaled REG_MR posted ahead of the SRP_CMD, and describes the
 * buffer to the target with a direct descriptor carrying the rkey. When the
 * response arrives, srp_unmap_data() posts an unsignaled LOCAL_INV and
 * hands the descriptor and the pages back. Task-management aborts
 * invalidate synchronously and wait before releasing.
 *
 * Known problems: srp_unmap_data() releases right after the unsignaled
 * LOCAL_INV, and also when posting it failed; the send queue is sized with
 * a hand-made factor and leaves no room for ib_drain_qp(); a channel
 * creation error after the descriptor pool was built leaks its MRs.
 * SRP targets do not use SEND_WITH_INV; responses are not checked for it.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-rkey-reuse, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/jiffies.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SRP_SQ_WRS_PER_CMD	3	/* REG_MR, SRP_CMD, LOCAL_INV */
#define SRP_INV_TIMEOUT_MS	5000
#define SRP_MAX_SGE		16

struct srp_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct srp_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct srp_fr_pool {
	int			size;
	int			max_page_list_len;
	spinlock_t		lock;
	struct list_head	free_list;
	struct srp_fr_desc	desc[];
};

struct srp_device {
	struct ib_device	*dev;
	struct ib_pd		*pd;
	u32			max_pages_per_mr;
	unsigned int		mr_page_size;
};

struct srp_target_port {
	struct srp_device	*srp_dev;
	u32			queue_size;
	u32			mr_pool_size;
	struct work_struct	tl_err_work;
};

struct srp_cmd_data {
	struct scatterlist	*sgl;
	int			sg_count;
	enum dma_data_direction	dir;
};

struct srp_request {
	struct srp_cmd_data	*scmnd;
	struct srp_fr_desc	*fr_desc;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct completion	inv_done;
	enum ib_wc_status	inv_status;
};

struct srp_iu {
	u64			dma;
	u32			len;
	struct srp_direct_buf	*buf;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	bool			in_use;
};

struct srp_rdma_ch {
	struct srp_target_port	*target;
	struct rdma_cm_id	*cm_id;
	struct ib_qp		*qp;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct srp_fr_pool	*fr_pool;
	void			**rx_ring;
	int			comp_vector;
};

static void srp_destroy_fr_pool(struct srp_fr_pool *pool)
{
	struct srp_fr_desc *d;
	int i;

	if (!pool)
		return;

	for (i = 0, d = &pool->desc[0]; i < pool->size; i++, d++) {
		if (d->mr)
			ib_dereg_mr(d->mr); /* OK: rdma-invalidation-leak -- deregistration invalidates the key */
	}
	kfree(pool);
}

static struct srp_fr_pool *srp_create_fr_pool(struct ib_device *device,
					      struct ib_pd *pd, int pool_size,
					      int max_page_list_len)
{
	struct srp_fr_pool *pool;
	struct srp_fr_desc *d;
	struct ib_mr *mr;
	int i, ret = -EINVAL;

	if (pool_size <= 0)
		goto err;
	ret = -ENOMEM;
	pool = kzalloc(sizeof(*pool) + pool_size * sizeof(*d), GFP_KERNEL);
	if (!pool)
		goto err;
	pool->size = pool_size;
	pool->max_page_list_len = max_page_list_len;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0, d = &pool->desc[0]; i < pool->size; i++, d++) {
		mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, max_page_list_len);
		if (IS_ERR(mr)) {
			ret = PTR_ERR(mr);
			if (ret == -ENOMEM)
				pr_info("srp: %s: ib_alloc_mr() failed\n",
					device->name);
			goto destroy_pool; /* OK: rdma-mr-leak -- srp_destroy_fr_pool() deregisters the MRs already stored */
		}
		d->mr = mr;
		list_add_tail(&d->entry, &pool->free_list);
	}

	return pool;

destroy_pool:
	srp_destroy_fr_pool(pool);
err:
	return ERR_PTR(ret);
}

static struct srp_fr_desc *srp_fr_pool_get(struct srp_fr_pool *pool)
{
	struct srp_fr_desc *d = NULL;
	unsigned long flags;

	spin_lock_irqsave(&pool->lock, flags);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, typeof(*d), entry);
		list_del(&d->entry);
	}
	spin_unlock_irqrestore(&pool->lock, flags);
	return d;
}

static void srp_fr_pool_put(struct srp_fr_pool *pool, struct srp_fr_desc *d)
{
	unsigned long flags;

	spin_lock_irqsave(&pool->lock, flags);
	list_add(&d->entry, &pool->free_list);
	spin_unlock_irqrestore(&pool->lock, flags);
}

static void srp_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("srp: FAST REG failed: %s\n", ib_wc_status_msg(wc->status));
}

static int srp_inv_rkey(struct srp_request *req, struct srp_rdma_ch *ch,
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
	req->reg_cqe.done = srp_reg_mr_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

static int srp_map_fr(struct srp_rdma_ch *ch, struct srp_request *req,
		      struct srp_direct_buf *buf, int count)
{
	struct srp_device *dev = ch->target->srp_dev;
	struct srp_cmd_data *scmnd = req->scmnd;
	struct srp_fr_desc *desc;
	struct ib_reg_wr wr;
	int n, err;

	desc = srp_fr_pool_get(ch->fr_pool);
	if (!desc)
		return -ENOMEM;

	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));

	n = ib_map_mr_sg(desc->mr, scmnd->sgl, count, NULL, dev->mr_page_size);
	if (unlikely(n < count)) {
		srp_fr_pool_put(ch->fr_pool, desc); /* OK: rdma-invalidation-leak -- nothing was registered yet */
		return n < 0 ? n : -EINVAL;
	}

	req->reg_cqe.done = srp_reg_mr_err_done;

	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr;
	wr.key = desc->mr->rkey;
	wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		    IB_ACCESS_REMOTE_WRITE;

	req->fr_desc = desc;
	buf->va  = cpu_to_be64(desc->mr->iova);
	buf->key = cpu_to_be32(desc->mr->rkey);
	buf->len = cpu_to_be32(desc->mr->length);

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	if (unlikely(err))
		pr_err("srp: FAST REG post failed: %d\n", err);
	/* on error the descriptor stays in req->fr_desc; srp_unmap_data() returns it */
	return err;
}

/* hands the descriptor and the command's pages back */
static void srp_release_mem(struct srp_rdma_ch *ch, struct srp_request *req)
{
	struct srp_device *dev = ch->target->srp_dev;
	struct srp_cmd_data *scmnd = req->scmnd;

	if (req->fr_desc) {
		srp_fr_pool_put(ch->fr_pool, req->fr_desc);
		req->fr_desc = NULL;
	}
	ib_dma_unmap_sg(dev->dev, scmnd->sgl, scmnd->sg_count, scmnd->dir);
}

static void srp_unmap_data(struct srp_rdma_ch *ch, struct srp_request *req)
{
	struct srp_target_port *target = ch->target;
	int res;

	if (!req->scmnd->sg_count)
		return;

	if (req->fr_desc) {
		res = srp_inv_rkey(req, ch, req->fr_desc->mr->rkey);
		if (res < 0) {
			pr_err("srp: queueing INV WR for rkey %#x failed (%d)\n",
			       req->fr_desc->mr->rkey, res);
			queue_work(system_wq, &target->tl_err_work);
		}
	}

	/* BUG: rdma-invalidation-leak -- also reached after the LOCAL_INV post failed; the rkey is live when the descriptor goes back */
	srp_release_mem(ch, req); /* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV was only queued */
}

int srp_map_data(struct srp_rdma_ch *ch, struct srp_request *req,
		 struct srp_direct_buf *buf)
{
	struct srp_device *dev = ch->target->srp_dev;
	struct srp_cmd_data *scmnd = req->scmnd;
	int count, ret;

	req->fr_desc = NULL;
	if (!scmnd->sg_count)
		return 0;

	count = ib_dma_map_sg(dev->dev, scmnd->sgl, scmnd->sg_count, scmnd->dir);
	if (unlikely(count == 0))
		return -EIO;

	ret = srp_map_fr(ch, req, buf, count);
	if (ret < 0)
		srp_unmap_data(ch, req);
	return ret;
}

static void srp_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srp_iu *iu = container_of(wc->wr_cqe, struct srp_iu, cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("srp: SEND failed: %s\n", ib_wc_status_msg(wc->status));
	iu->in_use = false;
}

int srp_queuecommand(struct srp_rdma_ch *ch, struct srp_request *req,
		     struct srp_iu *iu)
{
	struct srp_device *dev = ch->target->srp_dev;
	struct ib_send_wr wr;
	int ret;

	ret = srp_map_data(ch, req, iu->buf);
	if (ret < 0)
		return ret;

	iu->sge.addr   = iu->dma;
	iu->sge.length = iu->len;
	iu->sge.lkey   = dev->pd->local_dma_lkey;
	iu->cqe.done   = srp_send_done;

	wr.next       = NULL;
	wr.wr_cqe     = &iu->cqe;
	wr.sg_list    = &iu->sge;
	wr.num_sge    = 1;
	wr.opcode     = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	ret = ib_post_send(ch->qp, &wr, NULL);
	if (ret) {
		pr_err("srp: SRP_CMD post failed: %d\n", ret);
		srp_unmap_data(ch, req);
	}
	return ret;
}

void srp_process_rsp(struct srp_rdma_ch *ch, struct srp_request *req)
{
	srp_unmap_data(ch, req);
	req->scmnd = NULL;
}

static void srp_inv_rkey_sync_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct srp_request *req =
		container_of(wc->wr_cqe, struct srp_request, inv_cqe);

	req->inv_status = wc->status;
	complete(&req->inv_done);
}

/* SCSI EH context: the target dropped the command, make sure it can't
 * touch the buffer anymore before the midlayer reuses it. */
int srp_abort_cmd(struct srp_rdma_ch *ch, struct srp_request *req)
{
	struct ib_send_wr wr = {
		.opcode = IB_WR_LOCAL_INV,
		.send_flags = IB_SEND_SIGNALED,
	};
	int ret;

	if (req->fr_desc) {
		init_completion(&req->inv_done);
		req->inv_cqe.done = srp_inv_rkey_sync_done;
		wr.wr_cqe = &req->inv_cqe;
		wr.ex.invalidate_rkey = req->fr_desc->mr->rkey;

		ret = ib_post_send(ch->qp, &wr, NULL);
		if (ret)
			return ret;
		if (!wait_for_completion_timeout(&req->inv_done,
					msecs_to_jiffies(SRP_INV_TIMEOUT_MS)))
			return -ETIMEDOUT;
		if (req->inv_status != IB_WC_SUCCESS)
			return -EIO;
	}

	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV completed successfully before the release */
	srp_release_mem(ch, req);
	req->scmnd = NULL;
	return 0;
}

static void srp_destroy_qp(struct srp_rdma_ch *ch)
{
	ib_drain_qp(ch->qp);
	rdma_destroy_qp(ch->cm_id);
	ch->qp = NULL;
}

int srp_create_ch_ib(struct srp_rdma_ch *ch)
{
	struct srp_target_port *target = ch->target;
	struct srp_device *dev = target->srp_dev;
	struct ib_qp_init_attr *init_attr;
	struct ib_cq *recv_cq, *send_cq;
	struct srp_fr_pool *fr_pool;
	void **rx_ring;
	int ret;

	init_attr = kzalloc(sizeof(*init_attr), GFP_KERNEL);
	if (!init_attr)
		return -ENOMEM;

	recv_cq = ib_alloc_cq(dev->dev, ch, target->queue_size + 1,
			      ch->comp_vector, IB_POLL_SOFTIRQ);
	if (IS_ERR(recv_cq)) {
		ret = PTR_ERR(recv_cq);
		goto err;
	}

	send_cq = ib_alloc_cq(dev->dev, ch, SRP_SQ_WRS_PER_CMD * target->queue_size,
			      ch->comp_vector, IB_POLL_DIRECT);
	if (IS_ERR(send_cq)) {
		ret = PTR_ERR(send_cq);
		goto err_recv_cq;
	}

	/* BUG(file): rdma-send-queue-undersized -- exactly 3 WRs per command and no spare entry, but srp_destroy_qp() drains the QP */
	init_attr->cap.max_send_wr = SRP_SQ_WRS_PER_CMD * target->queue_size; /* BUG(file): rdma-send-queue-manual-factor -- hand-made REG_MR/CMD/INV factor */
	init_attr->cap.max_recv_wr = target->queue_size + 1;
	init_attr->cap.max_recv_sge = 1;
	init_attr->cap.max_send_sge = min_t(u32, SRP_MAX_SGE,
					    dev->dev->attrs.max_send_sge);
	init_attr->sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = send_cq;
	init_attr->recv_cq = recv_cq;

	ret = rdma_create_qp(ch->cm_id, dev->pd, init_attr);
	if (ret)
		goto err_send_cq;

	fr_pool = srp_create_fr_pool(dev->dev, dev->pd, target->mr_pool_size,
				     dev->max_pages_per_mr);
	if (IS_ERR(fr_pool)) {
		ret = PTR_ERR(fr_pool);
		goto err_qp;
	}

	rx_ring = kcalloc(target->queue_size, sizeof(*rx_ring), GFP_KERNEL);
	if (!rx_ring) {
		ret = -ENOMEM;
		goto err_qp; /* BUG: rdma-mr-leak -- fr_pool and the MRs it allocated are never destroyed on this path */
	}

	if (ch->fr_pool)
		srp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = fr_pool;
	ch->qp = ch->cm_id->qp;
	ch->rx_ring = rx_ring;
	ch->recv_cq = recv_cq;
	ch->send_cq = send_cq;

	kfree(init_attr);
	return 0;

err_qp:
	rdma_destroy_qp(ch->cm_id);
err_send_cq:
	ib_free_cq(send_cq);
err_recv_cq:
	ib_free_cq(recv_cq);
err:
	kfree(init_attr);
	return ret;
}

void srp_free_ch_ib(struct srp_rdma_ch *ch)
{
	if (!ch->qp)
		return;
	srp_destroy_qp(ch);
	srp_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = NULL;
	ib_free_cq(ch->send_cq);
	ib_free_cq(ch->recv_cq);
	kfree(ch->rx_ring);
}

MODULE_LICENSE("Dual BSD/GPL");
