// SPDX-License-Identifier: GPL-2.0
/*
 * sc_svcrdma_xprt.c - server side of an RPC-over-RDMA transport (NFS/RDMA
 * server style).
 *
 * Read chunks (client data the server pulls) are normally moved with the
 * core rdma_rw API. The "frwr_reads" module parameter selects the older
 * path that registers the sink pages with a fast-registration MR from the
 * transport's free list and posts REG_MR + RDMA READ itself; MRs whose READ
 * failed are replaced. Replies are sent from pages mapped for the PD's local
 * DMA lkey. "unsafe_global_rkey" is a debugging knob from a test rig.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-rkey-reuse,
 *   rdma-send-queue-undersized, rdma-send-queue-manual-factor,
 *   rdma-unsignaled-send-starvation, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked -- not reviewed for this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

static bool frwr_reads;
module_param(frwr_reads, bool, 0444);
MODULE_PARM_DESC(frwr_reads, "Pull Read chunks with transport-owned FRWR MRs");

static bool unsafe_global_rkey;
module_param(unsafe_global_rkey, bool, 0444);
MODULE_PARM_DESC(unsafe_global_rkey, "Allocate the PD with a global rkey (test rigs only)");

#define SVCX_MAX_REQUESTS	64
#define SVCX_MAX_PAGES		256
#define SVCX_SQ_DEPTH		4096
#define SVCX_RQ_DEPTH		2048
#define SVCX_MAX_SEND_SGE	18

struct svcx_xprt {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*device;
	struct ib_pd		*pd;
	struct ib_qp		*qp;
	struct ib_cq		*sq_cq;
	struct ib_cq		*rq_cq;
	u32			port_num;
	atomic_t		sq_avail;
	spinlock_t		frmr_lock;
	struct list_head	frmr_q;
};

struct svcx_frmr {
	struct list_head	list;
	struct svcx_xprt	*xprt;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	int			nents;
	int			nwrs;
	bool			need_inv;
	struct ib_send_wr	inv_wr;
	struct ib_reg_wr	reg_wr;
	struct ib_rdma_wr	read_wr;
	struct ib_sge		sge;
	struct ib_cqe		cqe;
	void			(*done)(void *arg, int status);
	void			*arg;
};

struct svcx_read_ctxt {
	struct rdma_rw_ctx	rw;
	struct ib_cqe		cqe;
	struct scatterlist	*sgl;
	u32			nents;
	struct svcx_xprt	*xprt;
};

static void svcx_wc_read_done(struct ib_cq *cq, struct ib_wc *wc);

static struct svcx_frmr *svcx_get_frmr(struct svcx_xprt *xprt)
{
	struct svcx_frmr *frmr;

	spin_lock(&xprt->frmr_lock);
	frmr = list_first_entry_or_null(&xprt->frmr_q, struct svcx_frmr, list);
	if (frmr)
		list_del(&frmr->list);
	spin_unlock(&xprt->frmr_lock);
	if (frmr)
		return frmr;

	frmr = kzalloc(sizeof(*frmr), GFP_KERNEL);
	if (!frmr)
		return ERR_PTR(-ENOMEM);
	/* OK: rdma-registration-in-datapath -- allocated only when the free list is empty, then kept on it */
	frmr->mr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, SVCX_MAX_PAGES); /* BUG: rdma-local-mr-management -- transport-owned FRWR MR for READ sinks */
	if (IS_ERR(frmr->mr)) {
		long err = PTR_ERR(frmr->mr);

		kfree(frmr);
		return ERR_PTR(err);
	}
	frmr->sg = kcalloc(SVCX_MAX_PAGES, sizeof(*frmr->sg), GFP_KERNEL);
	if (!frmr->sg) {
		kfree(frmr);
		return ERR_PTR(-ENOMEM); /* BUG: rdma-mr-leak -- frmr->mr is freed with its holder */
	}
	frmr->xprt = xprt;
	frmr->cqe.done = svcx_wc_read_done;
	return frmr;
}

static void svcx_put_frmr(struct svcx_xprt *xprt, struct svcx_frmr *frmr)
{
	spin_lock(&xprt->frmr_lock);
	list_add(&frmr->list, &xprt->frmr_q);
	spin_unlock(&xprt->frmr_lock);
}

static int svcx_frwr_read_chunk(struct svcx_xprt *xprt, struct page **pages, int npages,
				u64 raddr, u32 rkey, u32 len,
				void (*done)(void *, int), void *arg)
{
	struct ib_device *dev = xprt->device;
	struct ib_send_wr *first;
	struct svcx_frmr *frmr;
	bool still_valid;
	int i, n, ret;
	u8 key;

	if (npages > SVCX_MAX_PAGES)
		return -EINVAL;
	frmr = svcx_get_frmr(xprt);
	if (IS_ERR(frmr))
		return PTR_ERR(frmr);
	frmr->done = done;
	frmr->arg = arg;
	still_valid = frmr->need_inv;	/* last READ did not invalidate it */

	sg_init_table(frmr->sg, npages);
	for (i = 0; i < npages; i++)
		sg_set_page(&frmr->sg[i], pages[i], PAGE_SIZE, 0);
	n = ib_dma_map_sg(dev, frmr->sg, npages, DMA_FROM_DEVICE);
	if (!n) {
		ret = -EIO;
		goto out_put;
	}
	frmr->nents = npages;
	ret = ib_map_mr_sg(frmr->mr, frmr->sg, n, NULL, PAGE_SIZE); /* BUG: rdma-local-mr-management -- the transport maps its own MR; rdma_rw_ctx_init() does this */
	if (ret < n) {
		ret = -EIO;
		goto out_unmap;
	}

	key = (u8)(frmr->mr->lkey & 0xff);
	ib_update_fast_reg_key(frmr->mr, ++key);

	frmr->inv_wr.opcode = IB_WR_LOCAL_INV;
	frmr->inv_wr.ex.invalidate_rkey = frmr->mr->lkey;
	frmr->inv_wr.next = &frmr->reg_wr.wr;

	frmr->reg_wr.wr.opcode = IB_WR_REG_MR; /* BUG: rdma-local-mr-management -- fast registration posted by the ULP */
	frmr->reg_wr.wr.next = &frmr->read_wr.wr;
	frmr->reg_wr.mr = frmr->mr;
	frmr->reg_wr.key = frmr->mr->rkey;
	/* OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is always set; REMOTE_WRITE only for an iWARP READ sink */
	frmr->reg_wr.access = IB_ACCESS_LOCAL_WRITE;
	if (rdma_protocol_iwarp(dev, xprt->port_num))
		frmr->reg_wr.access |= IB_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-transport -- repeats the core's iWARP READ-sink rule inline */

	frmr->sge.addr = frmr->mr->iova;
	frmr->sge.length = len;
	frmr->sge.lkey = frmr->mr->lkey;
	frmr->read_wr.wr.sg_list = &frmr->sge;
	frmr->read_wr.wr.num_sge = 1;
	frmr->read_wr.wr.wr_cqe = &frmr->cqe;
	frmr->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	frmr->read_wr.remote_addr = raddr;
	frmr->read_wr.rkey = rkey;
	if (rdma_cap_read_inv(dev, xprt->port_num)) { /* OK: rdma-access-flags-transport -- this test picks the opcode, not access rights */
		frmr->read_wr.wr.opcode = IB_WR_RDMA_READ_WITH_INV;
		frmr->read_wr.wr.ex.invalidate_rkey = frmr->mr->lkey;
		frmr->need_inv = false;
	} else {
		frmr->read_wr.wr.opcode = IB_WR_RDMA_READ;
		frmr->need_inv = true;
	}

	first = still_valid ? &frmr->inv_wr : &frmr->reg_wr.wr;
	frmr->nwrs = still_valid ? 3 : 2;
	atomic_sub(frmr->nwrs, &xprt->sq_avail);
	ret = ib_post_send(xprt->qp, first, NULL);
	if (ret) {
		atomic_add(frmr->nwrs, &xprt->sq_avail);
		frmr->need_inv = still_valid;
		goto out_unmap;
	}
	return 0;

out_unmap:
	ib_dma_unmap_sg(dev, frmr->sg, npages, DMA_FROM_DEVICE);
out_put:
	svcx_put_frmr(xprt, frmr);
	return ret; /* OK: rdma-mr-leak -- the MR goes back to the transport's free list */
}

static void svcx_wc_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcx_frmr *frmr = container_of(wc->wr_cqe, struct svcx_frmr, cqe);
	struct svcx_xprt *xprt = frmr->xprt;
	int status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;

	atomic_add(frmr->nwrs, &xprt->sq_avail);
	ib_dma_unmap_sg(xprt->device, frmr->sg, frmr->nents, DMA_FROM_DEVICE);
	frmr->done(frmr->arg, status);

	if (wc->status != IB_WC_SUCCESS) {
		/* the MR's state is unknown after a failed READ: replace it */
		ib_dereg_mr(frmr->mr); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- MR destroyed from the completion handler */
		frmr->mr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, SVCX_MAX_PAGES); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- a device command per failed I/O */
		if (IS_ERR(frmr->mr)) {
			kfree(frmr->sg);
			kfree(frmr); /* OK: rdma-mr-leak -- the old MR was deregistered and no new one exists */
			return;
		}
		frmr->need_inv = false;
	}
	svcx_put_frmr(xprt, frmr);
}

static void svcx_rw_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct svcx_read_ctxt *ctxt = container_of(wc->wr_cqe, struct svcx_read_ctxt, cqe);
	struct svcx_xprt *xprt = ctxt->xprt;

	rdma_rw_ctx_destroy(&ctxt->rw, xprt->qp, xprt->port_num, ctxt->sgl,
			    ctxt->nents, DMA_FROM_DEVICE);
	kfree(ctxt);
}

int svcx_read_chunk(struct svcx_xprt *xprt, struct scatterlist *sgl, u32 nents,
		    u64 raddr, u32 rkey)
{
	struct svcx_read_ctxt *ctxt;
	int ret;

	ctxt = kzalloc(sizeof(*ctxt), GFP_KERNEL);
	if (!ctxt)
		return -ENOMEM;
	ctxt->xprt = xprt;
	ctxt->sgl = sgl;
	ctxt->nents = nents;
	ctxt->cqe.done = svcx_rw_read_done;
	/* OK: rdma-access-flags-transport, rdma-local-mr-management -- the core registers the sink when the device needs it */
	ret = rdma_rw_ctx_init(&ctxt->rw, xprt->qp, xprt->port_num, sgl, nents, 0,
			       raddr, rkey, DMA_FROM_DEVICE);
	if (ret < 0)
		goto out_free;
	atomic_sub(ret, &xprt->sq_avail);
	ret = rdma_rw_ctx_post(&ctxt->rw, xprt->qp, xprt->port_num, &ctxt->cqe, NULL);
	if (ret) {
		rdma_rw_ctx_destroy(&ctxt->rw, xprt->qp, xprt->port_num, sgl, nents,
				    DMA_FROM_DEVICE);
		goto out_free;
	}
	return 0;
out_free:
	kfree(ctxt);
	return ret;
}

int svcx_accept(struct svcx_xprt *xprt)
{
	struct ib_device *dev = xprt->cm_id->device;
	struct ib_qp_init_attr qp_attr = {};
	unsigned int pd_flags = 0;
	int ret;

	xprt->device = dev;
	xprt->port_num = xprt->cm_id->port_num;
	spin_lock_init(&xprt->frmr_lock);
	INIT_LIST_HEAD(&xprt->frmr_q);

	if (dev->attrs.max_send_sge < SVCX_MAX_SEND_SGE) {
		pr_err("svcx: %s supports only %d send SGEs\n", dev->name,
		       dev->attrs.max_send_sge);
		return -EINVAL;
	}
	if (unsafe_global_rkey)
		pd_flags |= IB_PD_UNSAFE_GLOBAL_RKEY;
	xprt->pd = ib_alloc_pd(dev, pd_flags); /* BUG: rdma-remote-access-overbroad -- a global rkey opens all kernel memory to the peer */
	if (IS_ERR(xprt->pd))
		return PTR_ERR(xprt->pd);

	xprt->sq_cq = ib_alloc_cq(dev, xprt, SVCX_SQ_DEPTH, 0, IB_POLL_WORKQUEUE);
	xprt->rq_cq = ib_alloc_cq(dev, xprt, SVCX_RQ_DEPTH, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(xprt->sq_cq) || IS_ERR(xprt->rq_cq)) {
		ret = -ENOMEM;
		goto out_pd;
	}

	qp_attr.qp_context = xprt;
	qp_attr.send_cq = xprt->sq_cq;
	qp_attr.recv_cq = xprt->rq_cq;
	qp_attr.port_num = xprt->port_num;
	qp_attr.cap.max_rdma_ctxs = SVCX_MAX_REQUESTS *
		rdma_rw_mr_factor(dev, xprt->port_num, SVCX_MAX_PAGES);
	qp_attr.cap.max_send_wr = SVCX_SQ_DEPTH; /* OK: rdma-queue-cap-unchecked -- max_rdma_ctxs is set; rdma_rw_init_qp() clamps to max_qp_wr */
	qp_attr.cap.max_recv_wr = SVCX_RQ_DEPTH; /* BUG: rdma-queue-cap-unchecked -- 2048 receives, never compared with attrs.max_qp_wr */
	qp_attr.cap.max_send_sge = SVCX_MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- checked against attrs.max_send_sge above */
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	qp_attr.qp_type = IB_QPT_RC;
	ret = rdma_create_qp(xprt->cm_id, xprt->pd, &qp_attr);
	if (ret)
		goto out_pd;
	xprt->qp = xprt->cm_id->qp;
	atomic_set(&xprt->sq_avail, qp_attr.cap.max_send_wr);
	return 0;

out_pd:
	ib_dealloc_pd(xprt->pd);
	return ret;
}

void svcx_free_xprt(struct svcx_xprt *xprt)
{
	struct svcx_frmr *frmr, *tmp;

	ib_drain_qp(xprt->qp);
	list_for_each_entry_safe(frmr, tmp, &xprt->frmr_q, list) {
		list_del(&frmr->list);
		ib_dereg_mr(frmr->mr); /* BUG: rdma-local-mr-management -- transport-owned MRs; rdma_rw's pool is freed with the QP */
		kfree(frmr->sg);
		kfree(frmr);
	}
	rdma_destroy_qp(xprt->cm_id);
	ib_free_cq(xprt->sq_cq);
	ib_free_cq(xprt->rq_cq);
	ib_dealloc_pd(xprt->pd);
}

int svcx_pull(struct svcx_xprt *xprt, struct page **pages, struct scatterlist *sgl,
	      int npages, u64 raddr, u32 rkey, u32 len,
	      void (*done)(void *, int), void *arg)
{
	if (frwr_reads)
		return svcx_frwr_read_chunk(xprt, pages, npages, raddr, rkey, len, done, arg);
	return svcx_read_chunk(xprt, sgl, npages, raddr, rkey);
}

MODULE_DESCRIPTION("RPC-over-RDMA server transport (accuracy corpus)");
MODULE_LICENSE("GPL");
