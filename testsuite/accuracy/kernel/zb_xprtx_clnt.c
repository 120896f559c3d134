// SPDX-License-Identifier: GPL-2.0 OR BSD-3-Clause
/*
 * zb_xprtx_clnt.c - client end of an RPC-over-RDMA style transport.
 *
 * Marshaling registers the chunks the server will touch (a Read chunk for a
 * large call, a Write or Reply chunk for a large reply; up to
 * XC_MAX_CHUNK_MRS per RPC) with FRWR MRs from the endpoint's MR list, and
 * a call whose inline payload has more pages than max_send_sge gets its
 * page list registered (local access only) so that one SGE covers it. The
 * REG_MRs are chained ahead of the Send. When the reply arrives the MRs are
 * invalidated with a LOCAL_INV chain, except the one the server invalidated
 * remotely. Large callback payloads are pulled with RDMA READ into an MR.
 *
 * The send queue is sized by hand at XC_WRS_PER_REQ (REG, SEND, INV) per
 * request, which is short for RPCs with several chunks or a registered page
 * list. Sends are signaled with a countdown; the LOCAL_INV chains were meant
 * to be signaled every XC_INV_BATCH replies but the batch counter is never
 * advanced. The callback sink's rights are chosen with an inline
 * rdma_protocol_iwarp() test.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not reviewed for this file
 */

#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define XC_MAX_CHUNK_MRS	3	/* read, write and reply chunk */
#define XC_MAX_SEGS		64
#define XC_WRS_PER_REQ		3	/* REG_MR, SEND, LOCAL_INV */
#define XC_BC_WRS		4
#define XC_MAX_SEND_SGES	16
#define XC_INV_BATCH		8
#define XC_MIN_SLOTS		2

struct xc_ep;

struct xc_mr {
	struct list_head	mr_list;	/* re_mrs, while free */
	struct list_head	mr_all;		/* re_all_mrs */
	struct xc_ep		*mr_ep;
	struct ib_mr		*mr_ibmr;
	struct scatterlist	mr_sg[XC_MAX_SEGS];
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	u32			mr_handle;
	u64			mr_offset;
	u32			mr_length;
};

struct xc_req {
	struct xc_ep		*rl_ep;
	struct xc_mr		*rl_mrs[XC_MAX_CHUNK_MRS];
	int			rl_nr_mrs;
	struct xc_mr		*rl_send_mr;
	struct ib_send_wr	rl_send_wr;
	struct ib_sge		rl_send_sge[XC_MAX_SEND_SGES];
	int			rl_num_sge;
	struct ib_cqe		rl_send_cqe;
	struct ib_cqe		rl_inv_cqe;
	struct ib_cqe		rl_read_cqe;
	struct completion	rl_done;
	int			rl_status;
};

struct xc_ep {
	struct rdma_cm_id	*re_id;
	struct ib_pd		*re_pd;
	struct ib_qp_init_attr	re_attr;
	unsigned int		re_max_requests;
	unsigned int		re_max_fr_depth;
	enum ib_mr_type		re_mrtype;
	unsigned int		re_send_batch;
	unsigned int		re_send_count;
	atomic_t		re_inv_unsignaled;
	spinlock_t		re_mr_lock;
	struct list_head	re_mrs;
	struct list_head	re_all_mrs;
};

void xc_reply_complete(struct xc_req *req, int status);

/* ---- MR list ---- */

static void xc_mr_release(struct xc_mr *mr)
{
	list_del(&mr->mr_all);
	if (!list_empty(&mr->mr_list))
		list_del(&mr->mr_list);
	if (mr->mr_ibmr)
		ib_dereg_mr(mr->mr_ibmr);	/* BUG: rdma-local-mr-management -- the transport frees its own FRWR MRs */
	kfree(mr);
}

static int xc_mrs_create(struct xc_ep *ep)
{
	unsigned int i, count = ep->re_max_requests * (XC_MAX_CHUNK_MRS + 1);
	struct xc_mr *mr;

	for (i = 0; i < count; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			break;
		mr->mr_ep = ep;
		mr->mr_ibmr = ib_alloc_mr(ep->re_pd, ep->re_mrtype,	/* BUG: rdma-local-mr-management -- MRs allocated and cycled by the ULP */
					  ep->re_max_fr_depth);
		if (IS_ERR(mr->mr_ibmr)) {
			kfree(mr);
			break;
		}
		sg_init_table(mr->mr_sg, XC_MAX_SEGS);
		list_add(&mr->mr_all, &ep->re_all_mrs);
		list_add(&mr->mr_list, &ep->re_mrs);
	}
	if (i < ep->re_max_requests * 2)
		return -ENOMEM;
	return 0;
}

static struct xc_mr *xc_mr_get(struct xc_ep *ep)
{
	struct xc_mr *mr;

	spin_lock(&ep->re_mr_lock);
	mr = list_first_entry_or_null(&ep->re_mrs, struct xc_mr, mr_list);
	if (mr)
		list_del_init(&mr->mr_list);
	spin_unlock(&ep->re_mr_lock);
	return mr;
}

static void xc_mr_put(struct xc_ep *ep, struct xc_mr *mr)
{
	ib_dma_unmap_sg(ep->re_id->device, mr->mr_sg, mr->mr_nents, mr->mr_dir);
	spin_lock(&ep->re_mr_lock);
	list_add_tail(&mr->mr_list, &ep->re_mrs);
	spin_unlock(&ep->re_mr_lock);
}

/* ---- registration ---- */

/* Register one chunk; the server gets mr_handle/mr_offset/mr_length. */
static int xc_frwr_map(struct xc_ep *ep, struct xc_mr *mr, int nsegs,
		       bool writing)
{
	int dma_nents, n;

	mr->mr_dir = writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = nsegs;
	dma_nents = ib_dma_map_sg(ep->re_id->device, mr->mr_sg, nsegs, mr->mr_dir);
	if (!dma_nents)
		return -EIO;

	n = ib_map_mr_sg(mr->mr_ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE);	/* BUG: rdma-local-mr-management -- chunk mapped by hand */
	if (n != dma_nents)
		return -EIO;

	ib_update_fast_reg_key(mr->mr_ibmr, ib_inc_rkey(mr->mr_ibmr->rkey));
	mr->mr_regwr.wr.next = NULL;
	mr->mr_regwr.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- per-RPC REG_MR posted by the ULP */
	mr->mr_regwr.wr.send_flags = 0;
	mr->mr_regwr.mr = mr->mr_ibmr;
	mr->mr_regwr.key = mr->mr_ibmr->rkey;
	/* OK: rdma-access-flags-invalid -- remote write comes with local write; a Read chunk needs remote read only */
	mr->mr_regwr.access = writing ?
		IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
		IB_ACCESS_REMOTE_READ;

	mr->mr_handle = mr->mr_ibmr->rkey;
	mr->mr_length = mr->mr_ibmr->length;
	mr->mr_offset = mr->mr_ibmr->iova;
	return 0;
}

/* More inline pages than Send SGEs: cover the page list with one lkey. */
static int xc_reg_send_pages(struct xc_ep *ep, struct xc_req *req, int npages)
{
	struct xc_mr *mr = req->rl_send_mr;
	int dma_nents;

	mr->mr_dir = DMA_TO_DEVICE;
	mr->mr_nents = npages;
	dma_nents = ib_dma_map_sg(ep->re_id->device, mr->mr_sg, npages,
				  DMA_TO_DEVICE);
	if (!dma_nents)
		return -EIO;
	if (ib_map_mr_sg(mr->mr_ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE) !=	/* BUG: rdma-local-mr-management -- a local-only registration the PD's local_dma_lkey could replace */
	    dma_nents)
		return -EIO;

	ib_update_fast_reg_key(mr->mr_ibmr, ib_inc_rkey(mr->mr_ibmr->rkey));
	mr->mr_regwr.wr.next = NULL;
	mr->mr_regwr.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- REG_MR for local access only */
	mr->mr_regwr.wr.send_flags = 0;
	mr->mr_regwr.mr = mr->mr_ibmr;
	mr->mr_regwr.key = mr->mr_ibmr->rkey;
	mr->mr_regwr.access = IB_ACCESS_LOCAL_WRITE;

	req->rl_send_sge[1].addr = mr->mr_ibmr->iova;
	req->rl_send_sge[1].length = mr->mr_ibmr->length;
	req->rl_send_sge[1].lkey = mr->mr_ibmr->lkey;
	req->rl_num_sge = 2;
	return 0;
}

/* ---- send and invalidate ---- */

static void xc_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xc_req *req = container_of(wc->wr_cqe, struct xc_req, rl_send_cqe);

	if (wc->status != IB_WC_SUCCESS && wc->status != IB_WC_WR_FLUSH_ERR)
		pr_err("xc: send failed: %s\n", ib_wc_status_msg(wc->status));
}

int xc_send(struct xc_ep *ep, struct xc_req *req)
{
	struct ib_send_wr *first = &req->rl_send_wr, **prev = &first;
	int i;

	for (i = 0; i < req->rl_nr_mrs; i++) {
		*prev = &req->rl_mrs[i]->mr_regwr.wr;
		prev = &req->rl_mrs[i]->mr_regwr.wr.next;
	}
	if (req->rl_send_mr) {
		*prev = &req->rl_send_mr->mr_regwr.wr;
		prev = &req->rl_send_mr->mr_regwr.wr.next;
	}
	*prev = &req->rl_send_wr;

	req->rl_send_cqe.done = xc_send_done;
	req->rl_send_wr.next = NULL;
	req->rl_send_wr.wr_cqe = &req->rl_send_cqe;
	req->rl_send_wr.opcode = IB_WR_SEND;
	req->rl_send_wr.sg_list = req->rl_send_sge;
	req->rl_send_wr.num_sge = req->rl_num_sge;
	/* OK: rdma-unsignaled-send-starvation -- the countdown is decremented on every unsignaled Send and reloaded when it reaches zero */
	if (!ep->re_send_count || req->rl_send_mr) {
		req->rl_send_wr.send_flags |= IB_SEND_SIGNALED;
		ep->re_send_count = ep->re_send_batch;
	} else {
		req->rl_send_wr.send_flags &= ~IB_SEND_SIGNALED;
		--ep->re_send_count;
	}

	return ib_post_send(ep->re_id->qp, first, NULL);
}

/*
 * Register the chunks of one RPC and send it. chunk_segs[i] pages of
 * chunk i are already in the MR's scatterlist by the time it is mapped.
 */
int xc_marshal(struct xc_ep *ep, struct xc_req *req, int nchunks,
	       const int *chunk_segs, const bool *chunk_writing, int inline_pages)
{
	int i, rc;

	req->rl_num_sge = 1;
	for (i = 0; i < nchunks && i < XC_MAX_CHUNK_MRS; i++) {
		req->rl_mrs[i] = xc_mr_get(ep);
		if (!req->rl_mrs[i]) {
			rc = -EAGAIN;
			goto out_put;
		}
		req->rl_nr_mrs++;
		rc = xc_frwr_map(ep, req->rl_mrs[i], chunk_segs[i], chunk_writing[i]);
		if (rc)
			goto out_put;
	}
	if (inline_pages >= XC_MAX_SEND_SGES) {
		req->rl_send_mr = xc_mr_get(ep);
		if (!req->rl_send_mr) {
			rc = -EAGAIN;
			goto out_put;
		}
		rc = xc_reg_send_pages(ep, req, inline_pages);
		if (rc)
			goto out_put;
	}
	rc = xc_send(ep, req);
	if (!rc)
		return 0;
out_put:
	for (i = 0; i < req->rl_nr_mrs; i++)
		xc_mr_put(ep, req->rl_mrs[i]);
	if (req->rl_send_mr)
		xc_mr_put(ep, req->rl_send_mr);
	req->rl_nr_mrs = 0;
	req->rl_send_mr = NULL;
	return rc;
}

static void xc_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xc_req *req = container_of(wc->wr_cqe, struct xc_req, rl_inv_cqe);

	complete(&req->rl_done);
}

/* Reply received: invalidate what the server did not invalidate. */
void xc_frwr_unmap(struct xc_ep *ep, struct xc_req *req, u32 remote_inv_rkey)
{
	struct ib_send_wr *first = NULL, **prev = &first, *last = NULL;
	struct xc_mr *mr;
	int i, n = req->rl_nr_mrs;

	for (i = 0; i <= n; i++) {
		mr = i < n ? req->rl_mrs[i] : req->rl_send_mr;
		if (!mr || (remote_inv_rkey && mr->mr_handle == remote_inv_rkey))
			continue;
		memset(&mr->mr_invwr, 0, sizeof(mr->mr_invwr));
		mr->mr_invwr.opcode = IB_WR_LOCAL_INV;
		mr->mr_invwr.ex.invalidate_rkey = mr->mr_ibmr->rkey;
		*prev = &mr->mr_invwr;
		prev = &mr->mr_invwr.next;
		last = &mr->mr_invwr;
	}
	if (!first)
		goto out;

	/* BUG: rdma-unsignaled-send-starvation -- re_inv_unsignaled is only ever set to 0, so the LOCAL_INV chains are never signaled */
	if (atomic_read(&ep->re_inv_unsignaled) >= XC_INV_BATCH) {
		req->rl_inv_cqe.done = xc_inv_done;
		last->wr_cqe = &req->rl_inv_cqe;
		last->send_flags = IB_SEND_SIGNALED;
		atomic_set(&ep->re_inv_unsignaled, 0);
	}
	if (ib_post_send(ep->re_id->qp, first, NULL))
		pr_warn("xc: LOCAL_INV failed, disconnecting\n");
out:
	for (i = 0; i < n; i++)
		xc_mr_put(ep, req->rl_mrs[i]);
	if (req->rl_send_mr)
		xc_mr_put(ep, req->rl_send_mr);
	req->rl_nr_mrs = 0;
	req->rl_send_mr = NULL;
}

/* ---- backchannel: pull a large callback payload ---- */

static void xc_read_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xc_req *req = container_of(wc->wr_cqe, struct xc_req, rl_read_cqe);

	req->rl_status = wc->status == IB_WC_SUCCESS ? 0 : -EIO;
	complete(&req->rl_done);
}

int xc_bc_pull(struct xc_ep *ep, struct xc_req *req, int nsegs,
	       u64 remote_addr, u32 remote_rkey, u32 len)
{
	struct ib_device *dev = ep->re_id->device;
	u32 port = ep->re_id->port_num;
	struct ib_rdma_wr rd = { };
	struct ib_sge sge;
	struct xc_mr *mr;
	int dma_nents, ret;

	mr = xc_mr_get(ep);
	if (!mr)
		return -EAGAIN;
	mr->mr_dir = DMA_FROM_DEVICE;
	mr->mr_nents = nsegs;
	dma_nents = ib_dma_map_sg(dev, mr->mr_sg, nsegs, DMA_FROM_DEVICE);
	if (ib_map_mr_sg(mr->mr_ibmr, mr->mr_sg, dma_nents, NULL, PAGE_SIZE) !=	/* BUG: rdma-local-mr-management -- sink registered by hand instead of rdma_rw */
	    dma_nents) {
		ret = -EIO;
		goto out_put;
	}
	ib_update_fast_reg_key(mr->mr_ibmr, ib_inc_rkey(mr->mr_ibmr->rkey));
	mr->mr_regwr.wr.next = &rd.wr;
	mr->mr_regwr.wr.opcode = IB_WR_REG_MR;	/* BUG: rdma-local-mr-management -- REG_MR of a READ sink posted by the ULP */
	mr->mr_regwr.wr.send_flags = 0;
	mr->mr_regwr.mr = mr->mr_ibmr;
	mr->mr_regwr.key = mr->mr_ibmr->rkey;
	/* iWARP places READ responses with the sink's STag */
	/* BUG: rdma-access-flags-transport -- access flags chosen by an inline rdma_protocol_iwarp() test */
	/* OK: rdma-access-flags-invalid -- remote write is requested together with local write */
	mr->mr_regwr.access = rdma_protocol_iwarp(dev, port) ?
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE :
		IB_ACCESS_LOCAL_WRITE;

	sge.addr = mr->mr_ibmr->iova;
	sge.length = len;
	sge.lkey = mr->mr_ibmr->lkey;
	req->rl_read_cqe.done = xc_read_done;
	rd.wr.wr_cqe = &req->rl_read_cqe;
	rd.wr.sg_list = &sge;
	rd.wr.num_sge = 1;
	rd.wr.send_flags = IB_SEND_SIGNALED;
	rd.remote_addr = remote_addr;
	rd.rkey = remote_rkey;
	/* OK: rdma-access-flags-transport -- this transport test picks the opcode, not access flags */
	if (rdma_cap_read_inv(dev, port)) {
		rd.wr.opcode = IB_WR_RDMA_READ_WITH_INV;
		rd.wr.ex.invalidate_rkey = mr->mr_ibmr->lkey;
	} else {
		rd.wr.opcode = IB_WR_RDMA_READ;
	}

	init_completion(&req->rl_done);
	/* OK: rdma-access-flags-transport -- the sink MR carries remote write on iWARP */
	ret = ib_post_send(ep->re_id->qp, &mr->mr_regwr.wr, NULL);
	if (ret)
		goto out_put;
	wait_for_completion(&req->rl_done);
	ret = req->rl_status;
	if (!ret && !rdma_cap_read_inv(dev, port)) {
		req->rl_mrs[0] = mr;
		req->rl_nr_mrs = 1;
		return 0;	/* invalidated with the reply's LOCAL_INV chain */
	}
out_put:
	xc_mr_put(ep, mr);
	return ret;
}

/* ---- endpoint ---- */

static int xc_query_device(struct xc_ep *ep)
{
	struct ib_device *dev = ep->re_id->device;
	unsigned int max_qp_wr;

	if (!(dev->attrs.device_cap_flags & IB_DEVICE_MEM_MGT_EXTENSIONS))
		return -EOPNOTSUPP;
	ep->re_mrtype = IB_MR_TYPE_MEM_REG;
	if (dev->attrs.kernel_cap_flags & IBK_SG_GAPS_REG)
		ep->re_mrtype = IB_MR_TYPE_SG_GAPS;
	ep->re_max_fr_depth = min_t(unsigned int, XC_MAX_SEGS,
				    dev->attrs.max_fast_reg_page_list_len);

	max_qp_wr = dev->attrs.max_qp_wr - XC_BC_WRS - 1;
	if (max_qp_wr / XC_WRS_PER_REQ < XC_MIN_SLOTS)
		return -ENOMEM;
	if (ep->re_max_requests > max_qp_wr / XC_WRS_PER_REQ)
		ep->re_max_requests = max_qp_wr / XC_WRS_PER_REQ;

	/* BUG: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- an RPC posts up to three chunk REG_MRs, a page-list REG_MR, the Send and their LOCAL_INVs, not 3; the factor is hand-made */
	ep->re_attr.cap.max_send_wr = ep->re_max_requests * XC_WRS_PER_REQ + XC_BC_WRS + 1;
	ep->re_attr.cap.max_recv_wr = ep->re_max_requests + XC_BC_WRS + 1;
	/* OK: rdma-queue-cap-unchecked -- clamped to what the device offers */
	ep->re_attr.cap.max_send_sge = min_t(u32, dev->attrs.max_send_sge, XC_MAX_SEND_SGES);
	ep->re_attr.cap.max_recv_sge = 1;
	return 0;
}

int xc_ep_create(struct xc_ep *ep, struct ib_cq *scq, struct ib_cq *rcq)
{
	struct xc_mr *mr, *tmp;
	int rc;

	spin_lock_init(&ep->re_mr_lock);
	INIT_LIST_HEAD(&ep->re_mrs);
	INIT_LIST_HEAD(&ep->re_all_mrs);
	rc = xc_query_device(ep);
	if (rc)
		return rc;

	ep->re_pd = ib_alloc_pd(ep->re_id->device, 0);
	if (IS_ERR(ep->re_pd))
		return PTR_ERR(ep->re_pd);
	ep->re_attr.qp_context = ep;
	ep->re_attr.send_cq = scq;
	ep->re_attr.recv_cq = rcq;
	ep->re_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->re_attr.qp_type = IB_QPT_RC;
	rc = rdma_create_qp(ep->re_id, ep->re_pd, &ep->re_attr);
	if (rc)
		goto out_pd;

	ep->re_send_batch = ep->re_max_requests >> 3;
	ep->re_send_count = ep->re_send_batch;
	atomic_set(&ep->re_inv_unsignaled, 0);

	rc = xc_mrs_create(ep);
	if (rc)
		goto out_mrs;
	return 0;

out_mrs:
	list_for_each_entry_safe(mr, tmp, &ep->re_all_mrs, mr_all)
		xc_mr_release(mr);
	rdma_destroy_qp(ep->re_id);
out_pd:
	ib_dealloc_pd(ep->re_pd);
	return rc;
}

void xc_ep_destroy(struct xc_ep *ep)
{
	struct xc_mr *mr, *tmp;

	rdma_disconnect(ep->re_id);
	ib_drain_qp(ep->re_id->qp);
	list_for_each_entry_safe(mr, tmp, &ep->re_all_mrs, mr_all)
		xc_mr_release(mr);
	rdma_destroy_qp(ep->re_id);
	ib_dealloc_pd(ep->re_pd);
}

MODULE_LICENSE("Dual BSD/GPL");
MODULE_DESCRIPTION("RPC-over-RDMA client transport");
