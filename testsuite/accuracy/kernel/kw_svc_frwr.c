// SPDX-License-Identifier: GPL-2.0
/*
 * kwe -- server side of an RPC-over-RDMA style transport (svcrdma as it was
 * before rdma_rw: the server registers its own READ sinks).
 *
 * Large call arguments arrive as read chunks that the server pulls with
 * RDMA READ.  The sink pages of a chunk are registered with an FRWR taken
 * from a per-transport free list built at accept time; where the device can,
 * the READ itself invalidates the sink (READ_WITH_INV), elsewhere a LOCAL_INV
 * follows the READ's completion.  Chunks of at most one page skip the FRWR:
 * they are read into a per-call slot of a bounce area covered by one MR that
 * the transport allocates and registers on first use.  Replies are SENDs,
 * preceded by an RDMA WRITE for a write chunk whose source pages are
 * addressed with the PD's local_dma_lkey.
 *
 * Correct: the descriptor failure path that releases its MR, the first-use
 * bounce MR and its teardown, WRITE sources, signaling, the inline size read
 * back after QP creation.  Not correct: the FRWR list leaks the MR when the
 * descriptor allocation fails; the FRWR sink rights are picked with an
 * inline iWARP test; the bounce area is a READ sink registered with local
 * write only, which an iWARP device cannot place READ responses into; the
 * receive queue depth is a constant never compared with max_qp_wr; and the
 * send queue is sized by a hand-kept per-call WR count that includes the
 * registration and invalidation.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed in this transport
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define KWE_SQ_WRS_PER_CALL	5	/* REG_MR, READ, LOCAL_INV, WRITE, SEND */
#define KWE_SQ_SLACK		2	/* backchannel + drain */
#define KWE_MAX_RECVS		4096
#define KWE_MAX_INLINE		128
#define KWE_FRMR_PAGES		64

struct kwe_xprt;

struct kwe_frmr {
	struct list_head	list;
	struct kwe_xprt		*xprt;
	struct ib_mr		*mr;
	struct scatterlist	*sg;
	int			sg_nents;
	bool			need_inv;
	struct ib_cqe		reg_cqe;
	struct ib_reg_wr	reg_wr;
	struct ib_cqe		inv_cqe;
	struct ib_send_wr	inv_wr;
};

struct kwe_call {
	struct kwe_xprt		*xprt;
	unsigned int		slot;

	/* read chunk */
	struct kwe_frmr		*frmr;
	struct page		*pages[KWE_FRMR_PAGES];
	unsigned int		npages;
	u64			raddr;
	u32			rkey;
	u32			len;
	struct ib_rdma_wr	read_wr;
	struct ib_sge		read_sge;
	struct ib_cqe		read_cqe;

	/* reply */
	u64			reply_dma;
	u32			reply_len;
	u64			wdata_dma;
	u32			wdata_len;
	u64			wchunk_addr;
	u32			wchunk_rkey;
	struct ib_rdma_wr	write_wr;
	struct ib_sge		write_sge;
	struct ib_send_wr	send_wr;
	struct ib_sge		send_sge;
	struct ib_cqe		send_cqe;
};

struct kwe_xprt {
	struct rdma_cm_id	*cm_id;
	struct ib_device	*dev;
	struct ib_pd		*pd;
	struct ib_cq		*sq_cq;
	struct ib_cq		*rq_cq;
	struct ib_qp		*qp;
	u32			port;
	unsigned int		max_requests;
	unsigned int		nr_frmrs;
	u32			max_inline;

	spinlock_t		frmr_lock;
	struct list_head	frmr_free;

	struct ib_mr		*bounce_mr;
	bool			bounce_registered;
	void			*bounce_buf;
	struct sg_table		bounce_sgt;
	struct ib_reg_wr	bounce_reg;
	struct ib_cqe		bounce_cqe;
};

/* RPC layer */
void kwe_call_ready(struct kwe_call *call, int status);
void kwe_call_release(struct kwe_call *call);

static void kwe_reg_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwe_read_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwe_read_small_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwe_inv_done(struct ib_cq *cq, struct ib_wc *wc);
static void kwe_send_done(struct ib_cq *cq, struct ib_wc *wc);

static void kwe_free_frmrs(struct kwe_xprt *xprt)
{
	struct kwe_frmr *frmr, *tmp;

	list_for_each_entry_safe(frmr, tmp, &xprt->frmr_free, list) {
		list_del(&frmr->list);
		ib_dereg_mr(frmr->mr);
		kfree(frmr->sg);
		kfree(frmr);
	}
}

static int kwe_alloc_frmrs(struct kwe_xprt *xprt)
{
	struct kwe_frmr *frmr;
	struct ib_mr *mr;
	unsigned int i;

	for (i = 0; i < xprt->nr_frmrs; i++) {
		mr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, KWE_FRMR_PAGES);
		if (IS_ERR(mr))
			goto out_unwind;
		frmr = kzalloc(sizeof(*frmr), GFP_KERNEL);
		if (!frmr)
			goto out_unwind;	// BUG: rdma-mr-leak -- the MR just allocated in 'mr' is neither stored nor deregistered
		frmr->sg = kcalloc(KWE_FRMR_PAGES, sizeof(*frmr->sg), GFP_KERNEL);
		if (!frmr->sg) {
			kfree(frmr);
			ib_dereg_mr(mr);
			goto out_unwind;	// OK: rdma-mr-leak -- this iteration's MR is deregistered before the jump
		}
		frmr->xprt = xprt;
		frmr->mr = mr;
		list_add(&frmr->list, &xprt->frmr_free);
	}
	return 0;

out_unwind:
	kwe_free_frmrs(xprt);
	return -ENOMEM;
}

static struct kwe_frmr *kwe_get_frmr(struct kwe_xprt *xprt)
{
	struct kwe_frmr *frmr = NULL;

	spin_lock(&xprt->frmr_lock);
	if (!list_empty(&xprt->frmr_free)) {
		frmr = list_first_entry(&xprt->frmr_free, struct kwe_frmr, list);
		list_del_init(&frmr->list);
	}
	spin_unlock(&xprt->frmr_lock);
	return frmr;
}

static void kwe_put_frmr(struct kwe_xprt *xprt, struct kwe_frmr *frmr)
{
	ib_dma_unmap_sg(xprt->dev, frmr->sg, frmr->sg_nents, DMA_FROM_DEVICE);
	spin_lock(&xprt->frmr_lock);
	list_add(&frmr->list, &xprt->frmr_free);
	spin_unlock(&xprt->frmr_lock);
}

/* Map the call's sink pages into its FRWR and build the REG_MR. */
static int kwe_frmr_reg(struct kwe_xprt *xprt, struct kwe_call *call)
{
	struct kwe_frmr *frmr = call->frmr;
	bool iwarp = rdma_protocol_iwarp(xprt->dev, xprt->port);
	unsigned int i;
	int n;

	sg_init_table(frmr->sg, call->npages);
	for (i = 0; i < call->npages; i++)
		sg_set_page(&frmr->sg[i], call->pages[i], PAGE_SIZE, 0);
	frmr->sg_nents = ib_dma_map_sg(xprt->dev, frmr->sg, call->npages,
				       DMA_FROM_DEVICE);
	if (!frmr->sg_nents)
		return -EIO;
	n = ib_map_mr_sg(frmr->mr, frmr->sg, frmr->sg_nents, NULL, PAGE_SIZE);
	if (n != frmr->sg_nents)
		return -EINVAL;

	ib_update_fast_reg_key(frmr->mr, ib_inc_rkey(frmr->mr->rkey));
	memset(&frmr->reg_wr, 0, sizeof(frmr->reg_wr));
	frmr->reg_cqe.done = kwe_reg_done;
	frmr->reg_wr.wr.opcode = IB_WR_REG_MR;
	frmr->reg_wr.wr.wr_cqe = &frmr->reg_cqe;
	frmr->reg_wr.mr = frmr->mr;
	frmr->reg_wr.key = frmr->mr->rkey;
	/* OK: rdma-access-flags-invalid -- local write is present on both branches */
	frmr->reg_wr.access = iwarp ? IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
				      IB_ACCESS_LOCAL_WRITE;	// BUG: rdma-access-flags-transport -- the sink's rights are chosen by an inline rdma_protocol_iwarp() test
	return 0;
}

int kwe_read_chunk(struct kwe_xprt *xprt, struct kwe_call *call)
{
	struct kwe_frmr *frmr;
	int ret;

	frmr = kwe_get_frmr(xprt);
	if (!frmr)
		return -EAGAIN;
	call->frmr = frmr;
	ret = kwe_frmr_reg(xprt, call);
	if (ret) {
		kwe_put_frmr(xprt, frmr);
		call->frmr = NULL;
		return ret;
	}

	memset(&call->read_wr, 0, sizeof(call->read_wr));
	call->read_sge.addr = frmr->mr->iova;
	call->read_sge.length = call->len;
	call->read_sge.lkey = frmr->mr->lkey;
	call->read_cqe.done = kwe_read_done;
	if (rdma_cap_read_inv(xprt->dev, xprt->port)) {	// OK: rdma-access-flags-transport -- this test picks the opcode; the sink's rights were set in kwe_frmr_reg(), with remote write on iWARP
		call->read_wr.wr.opcode = IB_WR_RDMA_READ_WITH_INV;
		call->read_wr.wr.ex.invalidate_rkey = frmr->mr->lkey;
		frmr->need_inv = false;
	} else {
		call->read_wr.wr.opcode = IB_WR_RDMA_READ;
		frmr->need_inv = true;
	}
	call->read_wr.wr.wr_cqe = &call->read_cqe;
	call->read_wr.wr.sg_list = &call->read_sge;
	call->read_wr.wr.num_sge = 1;
	call->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	call->read_wr.remote_addr = call->raddr;
	call->read_wr.rkey = call->rkey;
	frmr->reg_wr.wr.next = &call->read_wr.wr;

	ret = ib_post_send(xprt->qp, &frmr->reg_wr.wr, NULL);
	if (ret) {
		kwe_put_frmr(xprt, frmr);
		call->frmr = NULL;
	}
	return ret;
}

/*
 * The bounce area is mapped at accept time; the MR that covers it is only
 * needed once a client sends short read chunks (see kwe_get_bounce()).
 */
static int kwe_alloc_bounce_area(struct kwe_xprt *xprt)
{
	struct scatterlist *sg;
	unsigned int i;
	int ret;

	xprt->bounce_buf = kcalloc(xprt->max_requests, PAGE_SIZE, GFP_KERNEL);
	if (!xprt->bounce_buf)
		return -ENOMEM;
	ret = sg_alloc_table(&xprt->bounce_sgt, xprt->max_requests, GFP_KERNEL);
	if (ret)
		goto out_free_buf;
	for_each_sg(xprt->bounce_sgt.sgl, sg, xprt->max_requests, i)
		sg_set_buf(sg, (char *)xprt->bounce_buf + i * PAGE_SIZE, PAGE_SIZE);
	xprt->bounce_sgt.nents = ib_dma_map_sg(xprt->dev, xprt->bounce_sgt.sgl,
					       xprt->max_requests, DMA_FROM_DEVICE);
	if (!xprt->bounce_sgt.nents) {
		ret = -EIO;
		goto out_free_table;
	}
	return 0;

out_free_table:
	sg_free_table(&xprt->bounce_sgt);
out_free_buf:
	kfree(xprt->bounce_buf);
	return ret;
}

static void kwe_free_bounce_area(struct kwe_xprt *xprt)
{
	ib_dma_unmap_sg(xprt->dev, xprt->bounce_sgt.sgl, xprt->max_requests,
			DMA_FROM_DEVICE);
	sg_free_table(&xprt->bounce_sgt);
	kfree(xprt->bounce_buf);
}

static int kwe_register_bounce(struct kwe_xprt *xprt)
{
	int n, ret;

	n = ib_map_mr_sg(xprt->bounce_mr, xprt->bounce_sgt.sgl,
			 xprt->bounce_sgt.nents, NULL, PAGE_SIZE);
	if (n != xprt->bounce_sgt.nents)
		return -EINVAL;

	memset(&xprt->bounce_reg, 0, sizeof(xprt->bounce_reg));
	xprt->bounce_cqe.done = kwe_reg_done;
	xprt->bounce_reg.wr.opcode = IB_WR_REG_MR;
	xprt->bounce_reg.wr.wr_cqe = &xprt->bounce_cqe;
	xprt->bounce_reg.mr = xprt->bounce_mr;
	xprt->bounce_reg.key = xprt->bounce_mr->rkey;
	xprt->bounce_reg.access = IB_ACCESS_LOCAL_WRITE;
	ret = ib_post_send(xprt->qp, &xprt->bounce_reg.wr, NULL);
	if (!ret)
		xprt->bounce_registered = true;
	return ret;
}

static int kwe_get_bounce(struct kwe_xprt *xprt)
{
	struct ib_mr *mr;

	if (!xprt->bounce_mr) {
		mr = ib_alloc_mr(xprt->pd, IB_MR_TYPE_MEM_REG, xprt->max_requests);	// OK: rdma-registration-in-datapath -- allocated on first use and kept by the transport until it is destroyed
		if (IS_ERR(mr))
			return PTR_ERR(mr);
		xprt->bounce_mr = mr;
		xprt->bounce_registered = false;
	}
	if (!xprt->bounce_registered)
		return kwe_register_bounce(xprt);
	return 0;
}

/* A read chunk of at most one page lands in the call's bounce slot. */
int kwe_read_small(struct kwe_xprt *xprt, struct kwe_call *call)
{
	int ret;

	ret = kwe_get_bounce(xprt);
	if (ret)
		return ret;

	memset(&call->read_wr, 0, sizeof(call->read_wr));
	call->frmr = NULL;
	call->read_sge.addr = xprt->bounce_mr->iova + call->slot * PAGE_SIZE;
	call->read_sge.length = call->len;
	call->read_sge.lkey = xprt->bounce_mr->lkey;
	call->read_cqe.done = kwe_read_small_done;
	call->read_wr.wr.opcode = IB_WR_RDMA_READ;	// BUG: rdma-access-flags-transport -- READ into the bounce MR, which is registered with local write only; iWARP needs remote write on a READ sink
	call->read_wr.wr.wr_cqe = &call->read_cqe;
	call->read_wr.wr.sg_list = &call->read_sge;
	call->read_wr.wr.num_sge = 1;
	call->read_wr.wr.send_flags = IB_SEND_SIGNALED;
	call->read_wr.remote_addr = call->raddr;
	call->read_wr.rkey = call->rkey;
	return ib_post_send(xprt->qp, &call->read_wr.wr, NULL);
}

static void kwe_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kwe: REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
}

static void kwe_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwe_call *call = container_of(wc->wr_cqe, struct kwe_call, read_cqe);
	struct kwe_xprt *xprt = call->xprt;
	struct kwe_frmr *frmr = call->frmr;

	call->frmr = NULL;
	if (wc->status == IB_WC_SUCCESS && frmr->need_inv) {
		memset(&frmr->inv_wr, 0, sizeof(frmr->inv_wr));
		frmr->inv_cqe.done = kwe_inv_done;
		frmr->inv_wr.opcode = IB_WR_LOCAL_INV;
		frmr->inv_wr.wr_cqe = &frmr->inv_cqe;
		frmr->inv_wr.send_flags = IB_SEND_SIGNALED;
		frmr->inv_wr.ex.invalidate_rkey = frmr->mr->rkey;
		if (ib_post_send(xprt->qp, &frmr->inv_wr, NULL)) {
			pr_err("kwe: LOCAL_INV post failed\n");
			kwe_put_frmr(xprt, frmr);
		}
	} else {
		kwe_put_frmr(xprt, frmr);
	}
	kwe_call_ready(call, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

static void kwe_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwe_frmr *frmr = container_of(wc->wr_cqe, struct kwe_frmr, inv_cqe);

	kwe_put_frmr(frmr->xprt, frmr);
}

static void kwe_read_small_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwe_call *call = container_of(wc->wr_cqe, struct kwe_call, read_cqe);

	kwe_call_ready(call, wc->status == IB_WC_SUCCESS ? 0 : -EIO);
}

int kwe_send_reply(struct kwe_xprt *xprt, struct kwe_call *call)
{
	struct ib_send_wr *first = &call->send_wr;

	memset(&call->send_wr, 0, sizeof(call->send_wr));
	call->send_sge.addr = call->reply_dma;
	call->send_sge.length = call->reply_len;
	call->send_sge.lkey = xprt->pd->local_dma_lkey;
	call->send_cqe.done = kwe_send_done;
	call->send_wr.wr_cqe = &call->send_cqe;
	call->send_wr.sg_list = &call->send_sge;
	call->send_wr.num_sge = 1;
	call->send_wr.opcode = IB_WR_SEND;
	call->send_wr.send_flags = IB_SEND_SIGNALED;
	if (call->reply_len <= xprt->max_inline)
		call->send_wr.send_flags |= IB_SEND_INLINE;

	if (call->wdata_len) {
		memset(&call->write_wr, 0, sizeof(call->write_wr));
		call->write_sge.addr = call->wdata_dma;
		call->write_sge.length = call->wdata_len;
		call->write_sge.lkey = xprt->pd->local_dma_lkey;
		call->write_wr.wr.opcode = IB_WR_RDMA_WRITE;	// OK: rdma-access-flags-transport -- a WRITE source needs no remote rights, local_dma_lkey is right here
		call->write_wr.wr.sg_list = &call->write_sge;
		call->write_wr.wr.num_sge = 1;
		call->write_wr.wr.send_flags = 0;	// OK: rdma-unsignaled-send-starvation -- the WRITE is retired by the signaled reply SEND chained behind it
		call->write_wr.wr.next = &call->send_wr;
		call->write_wr.remote_addr = call->wchunk_addr;
		call->write_wr.rkey = call->wchunk_rkey;
		first = &call->write_wr.wr;
	}
	return ib_post_send(xprt->qp, first, NULL);
}

static void kwe_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwe_call *call = container_of(wc->wr_cqe, struct kwe_call, send_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("kwe: reply failed: %s\n", ib_wc_status_msg(wc->status));
	kwe_call_release(call);
}

static int kwe_create_qp(struct kwe_xprt *xprt)
{
	struct ib_qp_init_attr qp_attr;
	int ret;

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = xprt;
	qp_attr.send_cq = xprt->sq_cq;
	qp_attr.recv_cq = xprt->rq_cq;
	qp_attr.qp_type = IB_QPT_RC;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	/* OK: rdma-send-queue-undersized -- five WRs per call covers REG_MR, READ, LOCAL_INV, WRITE and SEND, and the slack keeps room for the drain */
	qp_attr.cap.max_send_wr = KWE_SQ_WRS_PER_CALL * xprt->max_requests + KWE_SQ_SLACK;	// BUG: rdma-send-queue-manual-factor -- the per-call factor counts REG_MR and LOCAL_INV by hand
	qp_attr.cap.max_recv_wr = KWE_MAX_RECVS;	// BUG: rdma-queue-cap-unchecked -- 4096 receives requested, never compared with dev->attrs.max_qp_wr
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	qp_attr.cap.max_inline_data = KWE_MAX_INLINE;	// OK: rdma-queue-cap-unchecked -- the granted size is read back after creation and used to decide IB_SEND_INLINE

	ret = rdma_create_qp(xprt->cm_id, xprt->pd, &qp_attr);
	if (ret)
		return ret;
	xprt->qp = xprt->cm_id->qp;
	xprt->max_inline = qp_attr.cap.max_inline_data;
	return 0;
}

int kwe_accept(struct kwe_xprt *xprt, struct rdma_cm_id *cm_id,
	       struct ib_pd *pd, unsigned int max_requests)
{
	int ret;

	xprt->cm_id = cm_id;
	xprt->dev = cm_id->device;
	xprt->port = cm_id->port_num;
	xprt->pd = pd;
	xprt->max_requests = max_requests;
	xprt->nr_frmrs = max_requests;
	spin_lock_init(&xprt->frmr_lock);
	INIT_LIST_HEAD(&xprt->frmr_free);

	xprt->sq_cq = ib_alloc_cq(xprt->dev, xprt,
				  KWE_SQ_WRS_PER_CALL * max_requests + KWE_SQ_SLACK,
				  0, IB_POLL_WORKQUEUE);
	if (IS_ERR(xprt->sq_cq))
		return PTR_ERR(xprt->sq_cq);
	xprt->rq_cq = ib_alloc_cq(xprt->dev, xprt, KWE_MAX_RECVS, 0,
				  IB_POLL_WORKQUEUE);
	if (IS_ERR(xprt->rq_cq)) {
		ret = PTR_ERR(xprt->rq_cq);
		goto out_sq_cq;
	}
	ret = kwe_create_qp(xprt);
	if (ret)
		goto out_rq_cq;
	ret = kwe_alloc_frmrs(xprt);
	if (ret)
		goto out_qp;
	ret = kwe_alloc_bounce_area(xprt);
	if (ret)
		goto out_frmrs;
	return 0;

out_frmrs:
	kwe_free_frmrs(xprt);
out_qp:
	rdma_destroy_qp(cm_id);
out_rq_cq:
	ib_free_cq(xprt->rq_cq);
out_sq_cq:
	ib_free_cq(xprt->sq_cq);
	return ret;
}

void kwe_close(struct kwe_xprt *xprt)
{
	ib_drain_qp(xprt->qp);
	if (xprt->bounce_mr)
		ib_dereg_mr(xprt->bounce_mr);
	kwe_free_bounce_area(xprt);
	kwe_free_frmrs(xprt);
	rdma_destroy_qp(xprt->cm_id);
	ib_free_cq(xprt->rq_cq);
	ib_free_cq(xprt->sq_cq);
}

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kwe RPC-over-RDMA style server transport");
