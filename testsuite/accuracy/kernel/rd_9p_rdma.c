// SPDX-License-Identifier: GPL-2.0-only
/*
 * rd_9p_rdma.c - 9P2000.L RDMA transport with zero-copy payloads
 *
 * T-messages and R-messages travel in kmalloc'ed buffers that are DMA-mapped
 * and addressed with the PD's local_dma_lkey (this transport used to fall
 * back to ib_get_dma_mr() on devices without a local DMA lkey; the PD now
 * provides one everywhere).  Large Tread/Twrite payloads are not copied:
 * the client registers the user pages with a fast-registration MR from a
 * per-connection pool and puts addr/rkey in the request; the server answers
 * with SEND_WITH_INV, otherwise the client posts LOCAL_INV.  Payloads larger
 * than a pool MR get an MR of their own.  Treaddir results are pulled by the
 * client with RDMA READ into a buffer behind a connection-wide MR.
 *
 * NOT-ANNOTATED: rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define P9X_ZC_POOL	32
#define P9X_ZC_PAGES	64
#define P9X_RD_PAGES	16

/* Server RDMA-WRITEs Rread payloads into these pages. */
#define P9X_SINK_ACCESS	(IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ)

struct p9x_rdma;

struct p9x_zc {
	struct list_head	list;
	struct ib_mr		*mr;
	struct scatterlist	sg[P9X_ZC_PAGES];
	int			nents;
	enum dma_data_direction	dir;
	struct ib_reg_wr	reg_wr;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct p9x_rdma		*rdma;
};

struct p9x_req {
	u16			tag;
	void			*tc;
	size_t			tc_len;
	u64			tc_dma;
	struct ib_sge		send_sge;
	struct ib_send_wr	send_wr;
	struct ib_cqe		send_cqe;
	struct p9x_zc		*zc;
	struct ib_mr		*big_mr;
	struct scatterlist	*big_sg;
	int			big_nents;
	struct ib_reg_wr	big_reg;
	struct completion	done;
	int			status;
};

struct p9x_recv_ctx {
	struct ib_cqe		cqe;
	struct p9x_rdma		*rdma;
	u8			*rc;		/* R-message buffer */
};

struct p9x_rdma {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*cq;
	u32			port;
	u32			lkey;
	u32			max_zc_pages;
	u32			max_send_sge;
	bool			closing;
	spinlock_t		lock;
	struct p9x_zc		*zcs;
	struct list_head	zc_free;
	struct p9x_req		*tags[256];

	struct ib_mr		*rd_mr;
	bool			rd_mr_valid;
	struct scatterlist	rd_sg;
	struct ib_send_wr	rd_inv;
	struct ib_reg_wr	rd_reg;
	struct ib_rdma_wr	rd_read;
	struct ib_sge		rd_sge;
	struct ib_cqe		rd_cqe;
	struct completion	rd_done;
};

static void p9x_inv_done(struct ib_cq *cq, struct ib_wc *wc);

static struct ib_mr *p9x_alloc_frmr(struct p9x_rdma *rdma, u32 pages)
{
	return ib_alloc_mr(rdma->pd, IB_MR_TYPE_MEM_REG, pages); /* BUG: rdma-local-mr-management -- the transport allocates its own fast-registration MRs */ /* OK: rdma-mr-leak -- handed to the caller */ /* OK: rdma-registration-in-datapath -- used only by the pool setup */
}

static int p9x_alloc_zc_pool(struct p9x_rdma *rdma)
{
	int i, j;

	rdma->zcs = kcalloc(P9X_ZC_POOL, sizeof(*rdma->zcs), GFP_KERNEL);
	if (!rdma->zcs)
		return -ENOMEM;
	INIT_LIST_HEAD(&rdma->zc_free);
	for (i = 0; i < P9X_ZC_POOL; i++) {
		struct p9x_zc *zc = &rdma->zcs[i];

		zc->mr = p9x_alloc_frmr(rdma, rdma->max_zc_pages);
		if (IS_ERR(zc->mr))
			goto unwind;
		zc->rdma = rdma;
		zc->inv_cqe.done = p9x_inv_done;
		list_add_tail(&zc->list, &rdma->zc_free);
	}
	return 0;

unwind:
	for (j = i - 1; j >= 0; j--)	/* OK: rdma-mr-leak -- element i failed to allocate, all below it are released */
		ib_dereg_mr(rdma->zcs[j].mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MRs */
	kfree(rdma->zcs);
	rdma->zcs = NULL;
	return -ENOMEM;
}

static void p9x_zc_put(struct p9x_rdma *rdma, struct p9x_zc *zc)
{
	unsigned long flags;

	ib_dma_unmap_sg(rdma->dev, zc->sg, zc->nents, zc->dir);
	spin_lock_irqsave(&rdma->lock, flags);
	list_add(&zc->list, &rdma->zc_free);
	spin_unlock_irqrestore(&rdma->lock, flags);
}

static int p9x_zc_register(struct p9x_rdma *rdma, struct p9x_req *req,
			   struct scatterlist *sg, int nents, enum dma_data_direction dir)
{
	struct p9x_zc *zc;
	unsigned long flags;
	int n;

	spin_lock_irqsave(&rdma->lock, flags);
	zc = list_first_entry_or_null(&rdma->zc_free, struct p9x_zc, list);
	if (zc)
		list_del(&zc->list);
	spin_unlock_irqrestore(&rdma->lock, flags);
	if (!zc)
		return -EAGAIN;

	memcpy(zc->sg, sg, nents * sizeof(*sg));
	zc->dir = dir;
	zc->nents = ib_dma_map_sg(rdma->dev, zc->sg, nents, dir);
	n = ib_map_mr_sg(zc->mr, zc->sg, zc->nents, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- ULP maps its own MR */
	if (n < zc->nents) {
		p9x_zc_put(rdma, zc);	/* OK: rdma-invalidation-leak -- nothing was registered yet */
		return -EIO;
	}
	ib_update_fast_reg_key(zc->mr, ib_inc_rkey(zc->mr->rkey));

	memset(&zc->reg_wr, 0, sizeof(zc->reg_wr));
	zc->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- ULP registers payload pages with its own REG_MR */
	zc->reg_wr.mr = zc->mr;
	zc->reg_wr.key = zc->mr->rkey;
	zc->reg_wr.access = dir == DMA_FROM_DEVICE ? P9X_SINK_ACCESS : IB_ACCESS_REMOTE_READ; /* BUG: rdma-access-flags-invalid -- the Rread sink asks REMOTE_WRITE without LOCAL_WRITE */
	zc->reg_wr.wr.next = &req->send_wr;
	req->zc = zc;
	return 0;
}

static int p9x_big_register(struct p9x_rdma *rdma, struct p9x_req *req)
{
	struct ib_mr *mr;
	int n;

	mr = ib_alloc_mr(rdma->pd, IB_MR_TYPE_MEM_REG, req->big_nents); /* BUG: rdma-registration-in-datapath -- an MR allocated for a single request */ /* BUG: rdma-local-mr-management -- ULP-managed MR */
	if (IS_ERR(mr))
		return PTR_ERR(mr);
	n = ib_map_mr_sg(mr, req->big_sg, req->big_nents, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- ULP maps its own MR */
	if (n < req->big_nents)
		return -EIO;	/* BUG: rdma-mr-leak -- the MR from ib_alloc_mr() is dropped on this error return */

	memset(&req->big_reg, 0, sizeof(req->big_reg));
	req->big_reg.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- ULP posts its own REG_MR */
	req->big_reg.mr = mr;
	req->big_reg.key = mr->rkey;
	req->big_reg.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE; /* OK: rdma-access-flags-invalid -- remote write with local write */
	req->big_reg.wr.next = &req->send_wr;
	req->big_mr = mr;
	return 0;
}

/* Drop the request's private MR; deregistration also kills its rkey. */
static void p9x_big_release(struct p9x_req *req)
{
	if (!req->big_mr)
		return;
	ib_dereg_mr(req->big_mr);	/* BUG: rdma-registration-in-datapath -- per-request deregistration on the reply path */ /* BUG: rdma-local-mr-management -- ULP deregisters its own MR */ /* OK: rdma-mr-leak -- released before the field is cleared */ /* OK: rdma-invalidation-leak -- ib_dereg_mr invalidates */
	req->big_mr = NULL;
}

int p9x_request(struct p9x_rdma *rdma, struct p9x_req *req, struct scatterlist *sg,
		int nents, enum dma_data_direction dir)
{
	struct ib_send_wr *first = &req->send_wr;
	int ret;

	req->send_sge.addr = req->tc_dma;
	req->send_sge.length = req->tc_len;
	req->send_sge.lkey = rdma->lkey;	/* OK: rdma-local-mr-management -- T-message buffer uses local_dma_lkey */
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.send_flags = IB_SEND_SIGNALED;
	req->send_wr.next = NULL;

	if (nents && nents <= rdma->max_zc_pages) {
		ret = p9x_zc_register(rdma, req, sg, nents, dir);
		if (ret)
			return ret;
		first = &req->zc->reg_wr.wr;
	} else if (nents) {
		req->big_sg = sg;
		req->big_nents = nents;
		ret = p9x_big_register(rdma, req);
		if (ret)
			return ret;
		first = &req->big_reg.wr;
	}
	rdma->tags[req->tag & 0xff] = req;
	return ib_post_send(rdma->qp, first, NULL);
}

static void p9x_post_inv(struct p9x_rdma *rdma, struct p9x_zc *zc)
{
	memset(&zc->inv_wr, 0, sizeof(zc->inv_wr));
	zc->inv_wr.opcode = IB_WR_LOCAL_INV;
	zc->inv_wr.ex.invalidate_rkey = zc->mr->rkey;
	zc->inv_wr.wr_cqe = &zc->inv_cqe;
	zc->inv_wr.send_flags = IB_SEND_SIGNALED;
	if (ib_post_send(rdma->qp, &zc->inv_wr, NULL))
		pr_err("9p-rdma: LOCAL_INV post failed, zc %p parked\n", zc);
}

static void p9x_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct p9x_zc *zc = container_of(wc->wr_cqe, struct p9x_zc, inv_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		pr_err("9p-rdma: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	p9x_zc_put(zc->rdma, zc);	/* OK: rdma-invalidation-leak -- back to the pool only after a successful LOCAL_INV */
}

void p9x_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct p9x_recv_ctx *c = container_of(wc->wr_cqe, struct p9x_recv_ctx, cqe);
	struct p9x_rdma *rdma = c->rdma;
	struct p9x_req *req;
	u16 tag = c->rc[5] | (c->rc[6] << 8);	/* size[4] type[1] tag[2] */

	req = rdma->tags[tag & 0xff];
	if (!req)
		return;
	rdma->tags[tag & 0xff] = NULL;
	if (req->zc) {
		if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) &&
		    wc->ex.invalidate_rkey == req->zc->mr->rkey)
			p9x_zc_put(rdma, req->zc);	/* OK: rdma-invalidation-leak -- the server invalidated exactly this rkey */
		else
			p9x_post_inv(rdma, req->zc);
		req->zc = NULL;
	}
	p9x_big_release(req);
	req->status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&req->done);
}

/* Tflush acknowledged or the caller was interrupted: give up on @req. */
void p9x_cancel(struct p9x_rdma *rdma, struct p9x_req *req)
{
	rdma->tags[req->tag & 0xff] = NULL;
	if (req->zc) {
		p9x_zc_put(rdma, req->zc);	/* BUG: rdma-invalidation-leak -- the server may still hold the zero-copy rkey; the MR returns to the pool without LOCAL_INV */
		req->zc = NULL;
	}
	p9x_big_release(req);
}

static void p9x_rd_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct p9x_rdma *rdma = container_of(wc->wr_cqe, struct p9x_rdma, rd_cqe);

	ib_dma_unmap_sg(rdma->dev, &rdma->rd_sg, 1, DMA_FROM_DEVICE);
	complete(&rdma->rd_done);
}

int p9x_readdir_pull(struct p9x_rdma *rdma, void *buf, u32 len, u64 raddr, u32 rkey)
{
	struct ib_send_wr *first;
	struct ib_mr *mr;
	int n;

	if (!rdma->rd_mr) {
		mr = ib_alloc_mr(rdma->pd, IB_MR_TYPE_MEM_REG, P9X_RD_PAGES); /* OK: rdma-registration-in-datapath -- allocated on first use and kept by the connection */ /* BUG: rdma-local-mr-management -- ULP-managed MR */
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		if (rdma->closing)
			return -ESHUTDOWN;	/* BUG: rdma-mr-leak -- the fresh MR is dropped when the connection is closing */
		rdma->rd_mr = mr;
	}

	sg_init_one(&rdma->rd_sg, buf, len);
	if (!ib_dma_map_sg(rdma->dev, &rdma->rd_sg, 1, DMA_FROM_DEVICE))
		return -ENOMEM;
	n = ib_map_mr_sg(rdma->rd_mr, &rdma->rd_sg, 1, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- ULP maps its own MR */
	if (n < 1) {
		ib_dma_unmap_sg(rdma->dev, &rdma->rd_sg, 1, DMA_FROM_DEVICE);
		return -EIO;
	}

	memset(&rdma->rd_reg, 0, sizeof(rdma->rd_reg));
	rdma->rd_reg.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- ULP posts its own REG_MR */
	rdma->rd_reg.mr = rdma->rd_mr;
	rdma->rd_reg.key = rdma->rd_mr->rkey;
	rdma->rd_reg.access = IB_ACCESS_LOCAL_WRITE;	/* OK: rdma-access-flags-invalid -- local write only */
	rdma->rd_reg.wr.next = &rdma->rd_read.wr;
	first = &rdma->rd_reg.wr;
	if (rdma->rd_mr_valid) {
		memset(&rdma->rd_inv, 0, sizeof(rdma->rd_inv));
		rdma->rd_inv.opcode = IB_WR_LOCAL_INV;
		rdma->rd_inv.ex.invalidate_rkey = rdma->rd_mr->rkey;
		rdma->rd_inv.next = &rdma->rd_reg.wr;
		first = &rdma->rd_inv;
	}

	rdma->rd_sge.addr = rdma->rd_mr->iova;
	rdma->rd_sge.length = len;
	rdma->rd_sge.lkey = rdma->rd_mr->lkey;
	memset(&rdma->rd_read, 0, sizeof(rdma->rd_read));
	rdma->rd_read.wr.opcode = IB_WR_RDMA_READ;
	rdma->rd_read.wr.sg_list = &rdma->rd_sge;
	rdma->rd_read.wr.num_sge = 1;
	rdma->rd_read.wr.wr_cqe = &rdma->rd_cqe;
	rdma->rd_read.wr.send_flags = IB_SEND_SIGNALED;
	rdma->rd_read.remote_addr = raddr;
	rdma->rd_read.rkey = rkey;
	rdma->rd_mr_valid = true;
	return ib_post_send(rdma->qp, first, NULL); /* BUG: rdma-access-flags-transport -- READ sink registered with LOCAL_WRITE only; an iWARP read response cannot land */
}

int p9x_create_conn(struct p9x_rdma *rdma)
{
	struct ib_qp_init_attr qp_attr = { };
	int ret;

	rdma->pd = ib_alloc_pd(rdma->dev, 0);
	if (IS_ERR(rdma->pd))
		return PTR_ERR(rdma->pd);
	/*
	 * Older kernels called ib_get_dma_mr() here when the device lacked
	 * IB_DEVICE_LOCAL_DMA_LKEY; ib_alloc_pd() now sets that up itself.
	 */
	rdma->lkey = rdma->pd->local_dma_lkey;	/* OK: rdma-local-mr-management -- no DMA MR of our own */

	rdma->max_zc_pages = min_t(u32, rdma->dev->attrs.max_fast_reg_page_list_len, P9X_ZC_PAGES);
	rdma->max_send_sge = min_t(u32, rdma->dev->attrs.max_send_sge, 2);
	if (rdma_protocol_iwarp(rdma->dev, rdma->port))	/* OK: rdma-access-flags-transport -- SGE sizing only */
		rdma->max_send_sge = 1;
	spin_lock_init(&rdma->lock);
	rdma->rd_cqe.done = p9x_rd_done;
	init_completion(&rdma->rd_done);

	rdma->cq = ib_alloc_cq(rdma->dev, rdma, 256, 0, IB_POLL_SOFTIRQ);
	if (IS_ERR(rdma->cq)) {
		ret = PTR_ERR(rdma->cq);
		goto out_pd;
	}
	qp_attr.send_cq = rdma->cq;
	qp_attr.recv_cq = rdma->cq;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.cap.max_send_wr = 3 * 64;
	qp_attr.cap.max_recv_wr = 64;
	qp_attr.cap.max_send_sge = rdma->max_send_sge;
	qp_attr.cap.max_recv_sge = 1;
	ret = rdma_create_qp(rdma->cm_id, rdma->pd, &qp_attr);
	if (ret)
		goto out_cq;
	rdma->qp = rdma->cm_id->qp;

	ret = p9x_alloc_zc_pool(rdma);
	if (ret)
		goto out_qp;
	return 0;

out_qp:
	rdma_destroy_qp(rdma->cm_id);
out_cq:
	ib_free_cq(rdma->cq);
out_pd:
	ib_dealloc_pd(rdma->pd);
	return ret;
}

void p9x_close(struct p9x_rdma *rdma)
{
	int i;

	rdma->closing = true;
	ib_drain_qp(rdma->qp);
	for (i = 0; i < P9X_ZC_POOL; i++)
		ib_dereg_mr(rdma->zcs[i].mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MRs */ /* OK: rdma-registration-in-datapath -- teardown of the whole pool */
	kfree(rdma->zcs);
	if (rdma->rd_mr)
		ib_dereg_mr(rdma->rd_mr);	/* BUG: rdma-local-mr-management -- ULP deregisters its own MR */
	rdma_destroy_qp(rdma->cm_id);
	ib_free_cq(rdma->cq);
	ib_dealloc_pd(rdma->pd);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("9P RDMA transport with zero-copy payloads");
