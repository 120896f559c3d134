// SPDX-License-Identifier: GPL-2.0
/*
 * sb_srp_ini.c - SRP style initiator channel: fast-registration pool,
 * command submission, response handling and the abort handler.
 *
 * Each RDMA channel owns a pool of FR descriptors.  A command maps its
 * scatterlist with up to SBS_MR_PER_CMD descriptors; every REG_MR is
 * posted by itself ahead of the SRP_CMD SEND and the rkeys are written
 * into the command's descriptor table.  SRP targets never invalidate
 * remotely, so every descriptor needs a LOCAL_INV when the command ends.
 *
 * Problems in this version:
 *  - the response path posts the LOCAL_INVs unsignaled and immediately
 *    recycles the descriptors and unmaps the data, even after one of the
 *    posts failed;
 *  - the send queue has no entry left for ib_drain_qp().
 * The abort handler uses sbs_unmap_data_sync(), which waits for its
 * LOCAL_INVs before the buffer is handed back to the SCSI midlayer.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SBS_MR_PER_CMD		2
#define SBS_MAX_PAGES_PER_MR	256
#define SBS_CMD_IU_LEN		256
#define SBS_RSP_IU_LEN		128
#define SBS_DID_OK		0
#define SBS_DID_ERROR		(7 << 16)
#define SBS_DID_ABORT		(5 << 16)

struct sbs_direct_buf {
	__be64	va;
	__be32	key;
	__be32	len;
};

struct sbs_rsp {
	u8	opcode;
	u8	status;
	u16	rsvd;
	__be32	req_lim_delta;
	u64	tag;
};

struct sbs_cmnd {
	struct scatterlist	*sgl;
	int			sg_count;
	enum dma_data_direction	dir;
	int			result;
	void			(*scsi_done)(struct sbs_cmnd *cmd);
};

struct sbs_fr_desc {
	struct list_head	entry;
	struct ib_mr		*mr;
};

struct sbs_fr_pool {
	spinlock_t		lock;
	int			size;
	int			max_page_list_len;
	struct list_head	free_list;
	struct sbs_fr_desc	desc[];
};

struct sbs_rdma_ch;

struct sbs_request {
	struct sbs_rdma_ch	*ch;
	struct sbs_cmnd		*scmnd;
	struct sbs_fr_desc	*fr_list[SBS_MR_PER_CMD];
	short			nmdesc;
	struct sbs_direct_buf	*desc_table;
	u64			cmd_dma;
	struct ib_sge		cmd_sge;
	struct ib_cqe		tx_cqe;
	struct ib_cqe		reg_cqe;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	inv_wr[SBS_MR_PER_CMD];
	struct completion	inv_done;
	int			inv_status;
};

struct sbs_rx_iu {
	struct sbs_rdma_ch	*ch;
	struct sbs_rsp		*buf;
	u64			dma;
	struct ib_cqe		cqe;
};

struct sbs_rdma_ch {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*ibdev;
	struct ib_pd		*pd;
	struct ib_cq		*send_cq;
	struct ib_cq		*recv_cq;
	struct ib_qp		*qp;
	struct sbs_fr_pool	*fr_pool;
	struct sbs_request	*req_ring;
	int			queue_size;
	unsigned int		mr_page_size;
	spinlock_t		lock;
	struct work_struct	tl_err_work;
};

int sbs_send_tsk_mgmt(struct sbs_rdma_ch *ch, u64 tag);

static struct sbs_fr_pool *sbs_create_fr_pool(struct sbs_rdma_ch *ch,
					      int pool_size, int max_pages)
{
	struct sbs_fr_pool *pool;
	int i;

	pool = kzalloc(sizeof(*pool) + pool_size * sizeof(pool->desc[0]),
		       GFP_KERNEL);
	if (!pool)
		return ERR_PTR(-ENOMEM);
	pool->size = pool_size;
	pool->max_page_list_len = max_pages;
	spin_lock_init(&pool->lock);
	INIT_LIST_HEAD(&pool->free_list);

	for (i = 0; i < pool_size; i++) {
		struct ib_mr *mr = ib_alloc_mr(ch->pd, IB_MR_TYPE_MEM_REG,
					       max_pages);

		if (IS_ERR(mr)) {
			while (i--)
				ib_dereg_mr(pool->desc[i].mr);
			kfree(pool);
			return ERR_PTR(PTR_ERR(mr));
		}
		pool->desc[i].mr = mr;
		list_add_tail(&pool->desc[i].entry, &pool->free_list);
	}
	return pool;
}

static void sbs_destroy_fr_pool(struct sbs_fr_pool *pool)
{
	int i;

	if (!pool)
		return;
	for (i = 0; i < pool->size; i++)
		ib_dereg_mr(pool->desc[i].mr);	/* OK: rdma-invalidation-leak -- deregistration kills the keys */
	kfree(pool);
}

static struct sbs_fr_desc *sbs_fr_pool_get(struct sbs_fr_pool *pool)
{
	struct sbs_fr_desc *d = NULL;
	unsigned long flags;

	spin_lock_irqsave(&pool->lock, flags);
	if (!list_empty(&pool->free_list)) {
		d = list_first_entry(&pool->free_list, typeof(*d), entry);
		list_del(&d->entry);
	}
	spin_unlock_irqrestore(&pool->lock, flags);
	return d;
}

static void sbs_fr_pool_put(struct sbs_fr_pool *pool,
			    struct sbs_fr_desc **desc, int n)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&pool->lock, flags);
	for (i = 0; i < n; i++)
		list_add(&desc[i]->entry, &pool->free_list);
	spin_unlock_irqrestore(&pool->lock, flags);
}

static void sbs_release_mapping(struct sbs_rdma_ch *ch, struct sbs_request *req)
{
	struct sbs_cmnd *scmnd = req->scmnd;

	if (req->nmdesc)
		sbs_fr_pool_put(ch->fr_pool, req->fr_list, req->nmdesc);
	req->nmdesc = 0;
	ib_dma_unmap_sg(ch->ibdev, scmnd->sgl, scmnd->sg_count, scmnd->dir);
}

static void sbs_handle_qp_err(struct sbs_rdma_ch *ch, struct ib_wc *wc,
			      const char *opname)
{
	if (wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("failed %s status %s (%d)\n", opname,
		       ib_wc_status_msg(wc->status), wc->status);
	queue_work(system_wq, &ch->tl_err_work);
}

static void sbs_reg_mr_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbs_request *req = container_of(wc->wr_cqe, struct sbs_request, reg_cqe);

	sbs_handle_qp_err(req->ch, wc, "FAST REG");
}

static void sbs_inv_rkey_err_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbs_request *req = container_of(wc->wr_cqe, struct sbs_request, inv_cqe);

	sbs_handle_qp_err(req->ch, wc, "INV RKEY");
}

static int sbs_inv_rkey(struct sbs_request *req, struct sbs_rdma_ch *ch,
			u32 rkey)
{
	struct ib_send_wr wr = {
		.opcode		    = IB_WR_LOCAL_INV,
		.next		    = NULL,
		.num_sge	    = 0,
		.send_flags	    = 0,
		.ex.invalidate_rkey = rkey,
	};

	wr.wr_cqe = &req->inv_cqe;
	req->inv_cqe.done = sbs_inv_rkey_err_done;
	return ib_post_send(ch->qp, &wr, NULL);
}

static int sbs_map_finish_fr(struct sbs_rdma_ch *ch, struct sbs_request *req,
			     struct scatterlist *sg, int sg_nents)
{
	struct sbs_direct_buf *db = &req->desc_table[req->nmdesc];
	struct sbs_fr_desc *desc;
	struct ib_reg_wr wr;
	int n, err;

	if (req->nmdesc >= SBS_MR_PER_CMD)
		return -ENOMEM;

	desc = sbs_fr_pool_get(ch->fr_pool);
	if (!desc)
		return -ENOMEM;

	ib_update_fast_reg_key(desc->mr, ib_inc_rkey(desc->mr->rkey));

	n = ib_map_mr_sg(desc->mr, sg, sg_nents, NULL, ch->mr_page_size);
	if (unlikely(n < 0)) {
		sbs_fr_pool_put(ch->fr_pool, &desc, 1);	/* OK: rdma-invalidation-leak -- never registered, the key did not leave */
		return n;
	}

	req->reg_cqe.done = sbs_reg_mr_err_done;
	wr.wr.next = NULL;
	wr.wr.opcode = IB_WR_REG_MR;
	wr.wr.wr_cqe = &req->reg_cqe;
	wr.wr.num_sge = 0;
	wr.wr.send_flags = 0;
	wr.mr = desc->mr;
	wr.key = desc->mr->rkey;
	wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ |
		    IB_ACCESS_REMOTE_WRITE;

	req->fr_list[req->nmdesc++] = desc;
	db->va = cpu_to_be64(desc->mr->iova);
	db->key = cpu_to_be32(desc->mr->rkey);
	db->len = cpu_to_be32(desc->mr->length);

	err = ib_post_send(ch->qp, &wr.wr, NULL);
	if (unlikely(err))
		return err;
	return n;
}

/*
 * Normal completion: invalidate every descriptor of the command, then give
 * them and the data mapping back.
 */
static void sbs_unmap_data(struct sbs_rdma_ch *ch, struct sbs_request *req)
{
	struct sbs_cmnd *scmnd = req->scmnd;
	int i, res;

	if (!scmnd->sg_count || scmnd->dir == DMA_NONE)
		return;

	for (i = 0; i < req->nmdesc; i++) {
		res = sbs_inv_rkey(req, ch, req->fr_list[i]->mr->rkey);
		if (res < 0) {
			pr_err("queueing LOCAL_INV for rkey %#x failed (%d)\n",
			       req->fr_list[i]->mr->rkey, res);
			queue_work(system_wq, &ch->tl_err_work);
		}
	}
	sbs_release_mapping(ch, req);	/* BUG: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the unsignaled LOCAL_INVs have not executed (or one was never posted) when the descriptors are recycled and the data unmapped */
}

static int sbs_map_data(struct sbs_rdma_ch *ch, struct sbs_request *req)
{
	struct sbs_cmnd *scmnd = req->scmnd;
	struct scatterlist *sg = scmnd->sgl;
	int count, n;

	req->nmdesc = 0;
	if (!scmnd->sg_count || scmnd->dir == DMA_NONE)
		return 0;

	count = ib_dma_map_sg(ch->ibdev, scmnd->sgl, scmnd->sg_count,
			      scmnd->dir);
	if (unlikely(count == 0))
		return -EIO;

	while (count > 0) {
		n = sbs_map_finish_fr(ch, req, sg, count);
		if (unlikely(n < 0)) {
			sbs_unmap_data(ch, req);
			return n;
		}
		count -= n;
		sg += n;
	}
	return req->nmdesc * sizeof(struct sbs_direct_buf);
}

static int sbs_post_send(struct sbs_rdma_ch *ch, struct sbs_request *req,
			 int len)
{
	struct ib_send_wr wr;

	req->cmd_sge.addr = req->cmd_dma;
	req->cmd_sge.length = len;
	req->cmd_sge.lkey = ch->pd->local_dma_lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_cqe = &req->tx_cqe;
	wr.sg_list = &req->cmd_sge;
	wr.num_sge = 1;
	wr.opcode = IB_WR_SEND;
	wr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(ch->qp, &wr, NULL);
}

static int sbs_queuecommand(struct sbs_rdma_ch *ch, struct sbs_cmnd *scmnd,
			    int tag)
{
	struct sbs_request *req = &ch->req_ring[tag];
	int len;

	req->ch = ch;
	req->scmnd = scmnd;
	len = sbs_map_data(ch, req);
	if (len < 0)
		goto err;

	if (sbs_post_send(ch, req, 64 + len)) {
		pr_err("SRP_CMD send failed\n");
		scmnd->result = SBS_DID_ERROR;
		sbs_unmap_data(ch, req);
		goto err;
	}
	return 0;

err:
	req->scmnd = NULL;
	return -EBUSY;
}

static void sbs_process_rsp(struct sbs_rdma_ch *ch, struct sbs_rsp *rsp)
{
	struct sbs_request *req;
	struct sbs_cmnd *scmnd;

	if (rsp->tag >= ch->queue_size)
		return;
	req = &ch->req_ring[rsp->tag];
	scmnd = req->scmnd;
	if (!scmnd)
		return;

	scmnd->result = rsp->status;
	sbs_unmap_data(ch, req);
	req->scmnd = NULL;
	scmnd->scsi_done(scmnd);
}

static void sbs_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbs_rx_iu *iu = container_of(wc->wr_cqe, struct sbs_rx_iu, cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		sbs_handle_qp_err(iu->ch, wc, "RECV");
		return;
	}
	sbs_process_rsp(iu->ch, iu->buf);
}

static void sbs_inv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbs_request *req = container_of(wc->wr_cqe, struct sbs_request, inv_cqe);

	req->inv_status = wc->status;
	complete(&req->inv_done);
}

static int sbs_unmap_data_sync(struct sbs_rdma_ch *ch, struct sbs_request *req)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	int i, ret;

	for (i = 0; i < req->nmdesc; i++) {
		struct ib_send_wr *wr = &req->inv_wr[i];

		memset(wr, 0, sizeof(*wr));
		wr->opcode = IB_WR_LOCAL_INV;
		wr->ex.invalidate_rkey = req->fr_list[i]->mr->rkey;
		wr->wr_cqe = &req->inv_cqe;
		*prev = wr;
		prev = &wr->next;
		last = wr;
	}

	if (last) {
		req->inv_cqe.done = sbs_inv_wake;
		last->send_flags = IB_SEND_SIGNALED;
		init_completion(&req->inv_done);
		ret = ib_post_send(ch->qp, first, NULL);
		if (ret) {
			queue_work(system_wq, &ch->tl_err_work);
			return ret;	/* descriptors stay with the request until reconnect */
		}
		wait_for_completion(&req->inv_done);
		if (req->inv_status != IB_WC_SUCCESS)
			return -EIO;
	}

	sbs_release_mapping(ch, req);	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- waited for the signaled LOCAL_INV chain and checked that it succeeded */
	return 0;
}

static int sbs_eh_abort(struct sbs_rdma_ch *ch, struct sbs_cmnd *scmnd, int tag)
{
	struct sbs_request *req = &ch->req_ring[tag];
	int ret;

	if (req->scmnd != scmnd)
		return 0;
	if (sbs_send_tsk_mgmt(ch, tag))
		return -EIO;

	ret = sbs_unmap_data_sync(ch, req);
	if (ret)
		return ret;
	req->scmnd = NULL;
	scmnd->result = SBS_DID_ABORT;
	scmnd->scsi_done(scmnd);
	return 0;
}

static int sbs_create_ch_ib(struct sbs_rdma_ch *ch)
{
	const int m = 1 + 2 * SBS_MR_PER_CMD;	/* SEND + (REG_MR + LOCAL_INV) per descriptor */
	struct ib_qp_init_attr *init_attr;
	int ret;

	init_attr = kzalloc(sizeof(*init_attr), GFP_KERNEL);
	if (!init_attr)
		return -ENOMEM;

	ch->recv_cq = ib_alloc_cq(ch->ibdev, ch, ch->queue_size + 1, 0,
				  IB_POLL_SOFTIRQ);
	ch->send_cq = ib_alloc_cq(ch->ibdev, ch, m * ch->queue_size, 0,
				  IB_POLL_DIRECT);

	init_attr->event_handler = NULL;
	/* BUG: rdma-send-queue-manual-factor -- per-command registration factor computed by hand */
	init_attr->cap.max_send_wr = m * ch->queue_size; /* BUG: rdma-send-queue-undersized -- exactly one command's worth per slot and nothing left for the drain WR of ib_drain_qp() */
	init_attr->cap.max_recv_wr = ch->queue_size + 1;
	init_attr->cap.max_recv_sge = 1;
	init_attr->cap.max_send_sge = 1;
	init_attr->sq_sig_type = IB_SIGNAL_REQ_WR;
	init_attr->qp_type = IB_QPT_RC;
	init_attr->send_cq = ch->send_cq;
	init_attr->recv_cq = ch->recv_cq;

	ret = rdma_create_qp(ch->cm_id, ch->pd, init_attr);
	if (ret)
		goto out;
	ch->qp = ch->cm_id->qp;

	ch->fr_pool = sbs_create_fr_pool(ch, ch->queue_size * SBS_MR_PER_CMD,
					 SBS_MAX_PAGES_PER_MR);
	if (IS_ERR(ch->fr_pool)) {
		ret = PTR_ERR(ch->fr_pool);
		ch->fr_pool = NULL;
		rdma_destroy_qp(ch->cm_id);
	}
out:
	kfree(init_attr);
	return ret;
}

static void sbs_free_ch_ib(struct sbs_rdma_ch *ch)
{
	ib_drain_qp(ch->qp);
	sbs_destroy_fr_pool(ch->fr_pool);
	ch->fr_pool = NULL;
	rdma_destroy_qp(ch->cm_id);
	ib_free_cq(ch->send_cq);
	ib_free_cq(ch->recv_cq);
}

struct sbs_ch_ops {
	int (*connect)(struct sbs_rdma_ch *ch);
	void (*disconnect)(struct sbs_rdma_ch *ch);
	int (*queuecommand)(struct sbs_rdma_ch *ch, struct sbs_cmnd *c, int tag);
	int (*eh_abort)(struct sbs_rdma_ch *ch, struct sbs_cmnd *c, int tag);
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct sbs_ch_ops sbs_rdma_ch_ops = {
	.connect	= sbs_create_ch_ib,
	.disconnect	= sbs_free_ch_ib,
	.queuecommand	= sbs_queuecommand,
	.eh_abort	= sbs_eh_abort,
	.recv_done	= sbs_recv_done,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb SRP style initiator channel");
