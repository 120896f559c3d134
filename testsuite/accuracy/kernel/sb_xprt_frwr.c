// SPDX-License-Identifier: GPL-2.0
/*
 * sb_xprt_frwr.c - RPC-over-RDMA style client transport: FRWR memory
 * registration for the read, write and reply chunks.
 *
 * Each RPC request owns a short list of MRs (rl_free_mrs).  Marshaling
 * registers up to three chunks (head, page list, tail); their REG_MRs are
 * chained in front of the RPC Call SEND.  The server may invalidate one
 * of the MRs with SEND_WITH_INV: the reply handler retires that MR after
 * matching the rkey and invalidates the others with a LOCAL_INV chain
 * whose last WR is signaled.  A request that is interrupted while its MRs
 * are registered invalidates them synchronously.
 *
 * Problems in this version:
 *  - the completion handler of the asynchronous LOCAL_INV chain recycles
 *    the MRs without looking at the completion status;
 *  - the retransmit path resets a request's MRs while the server still
 *    holds their rkeys from the first transmission.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-rkey-reuse, rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/mm.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

#define SBX_MAX_MRS		3	/* head, page list, tail */
#define SBX_BC_WRS		4	/* backchannel replies */
#define SBX_MAX_PAGES		64
#define SBX_INLINE_SIZE		1024

struct sbx_xprt;
struct sbx_req;

struct sbx_chunk {
	struct scatterlist	*sg;
	int			nents;
	bool			writing;
	__be32			*seg;		/* handle, length, offset in the header */
};

struct sbx_mr {
	struct list_head	mr_list;
	struct sbx_req		*mr_req;
	struct ib_mr		*ibmr;
	struct scatterlist	*mr_sg;
	int			mr_nents;
	enum dma_data_direction	mr_dir;
	u32			mr_handle;
	u32			mr_length;
	u64			mr_offset;
	struct ib_reg_wr	mr_regwr;
	struct ib_send_wr	mr_invwr;
	struct ib_cqe		mr_cqe;
	struct completion	mr_linv_done;
	int			mr_status;
};

struct sbx_rep {
	struct ib_cqe		rr_cqe;
	struct sbx_xprt		*rr_rxprt;
	__be32			rr_xid;
	int			rr_wc_flags;
	u32			rr_inv_rkey;
	u64			rr_dma;
	void			*rr_buf;
};

struct sbx_req {
	struct list_head	rl_list;
	struct sbx_xprt		*rl_xprt;
	__be32			rl_xid;
	struct list_head	rl_free_mrs;
	struct list_head	rl_registered;
	struct sbx_rep		*rl_reply;
	struct ib_send_wr	rl_sendwr;
	struct ib_sge		rl_sge[2];
	struct ib_cqe		rl_cqe;
	void			(*rl_complete)(struct sbx_req *req, int status);
};

struct sbx_ep {
	struct rdma_cm_id	*re_id;
	struct ib_pd		*re_pd;
	struct ib_qp_init_attr	re_attr;
	unsigned int		re_max_requests;
};

struct sbx_xprt {
	struct sbx_ep		*rx_ep;
	spinlock_t		rx_lock;
	struct list_head	rx_pending;
	struct work_struct	rx_disconnect_work;
};

static void sbx_force_disconnect(struct sbx_xprt *xprt)
{
	queue_work(system_wq, &xprt->rx_disconnect_work);
}

static struct ib_device *sbx_dev(struct sbx_req *req)
{
	return req->rl_xprt->rx_ep->re_id->device;
}

/* Back on the request's free list; the key must be dead already. */
static void sbx_mr_put(struct sbx_mr *mr)
{
	ib_dma_unmap_sg(sbx_dev(mr->mr_req), mr->mr_sg, mr->mr_nents, mr->mr_dir);
	list_add(&mr->mr_list, &mr->mr_req->rl_free_mrs);
}

/* For MRs in an unknown state: destroy it, the rkey dies with it. */
static void sbx_mr_recycle(struct sbx_mr *mr)
{
	ib_dereg_mr(mr->ibmr);
	ib_dma_unmap_sg(sbx_dev(mr->mr_req), mr->mr_sg, mr->mr_nents, mr->mr_dir);
	kfree(mr);
}

static void sbx_wc_fastreg(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbx_mr *mr = container_of(wc->wr_cqe, struct sbx_mr, mr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		sbx_force_disconnect(mr->mr_req->rl_xprt);
}

static int sbx_mr_map(struct sbx_req *req, struct sbx_chunk *chunk)
{
	struct sbx_mr *mr;
	struct ib_mr *ibmr;
	u8 key;
	int n;

	mr = list_first_entry_or_null(&req->rl_free_mrs, struct sbx_mr, mr_list);
	if (!mr)
		return -EAGAIN;
	list_del(&mr->mr_list);

	mr->mr_sg = chunk->sg;
	mr->mr_dir = chunk->writing ? DMA_FROM_DEVICE : DMA_TO_DEVICE;
	mr->mr_nents = ib_dma_map_sg(sbx_dev(req), mr->mr_sg, chunk->nents,
				     mr->mr_dir);
	if (!mr->mr_nents)
		goto out_free;

	ibmr = mr->ibmr;
	n = ib_map_mr_sg(ibmr, mr->mr_sg, mr->mr_nents, NULL, PAGE_SIZE);
	if (n != mr->mr_nents)
		goto out_unmap;

	ibmr->iova &= 0x00000000ffffffffULL;
	ibmr->iova |= ((u64)be32_to_cpu(req->rl_xid)) << 32;
	key = (u8)(ibmr->rkey & 0x000000ff);
	ib_update_fast_reg_key(ibmr, ++key);

	mr->mr_regwr.mr = ibmr;
	mr->mr_regwr.key = ibmr->rkey;
	mr->mr_regwr.access = chunk->writing ?
		IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE :
		IB_ACCESS_REMOTE_READ;

	mr->mr_handle = ibmr->rkey;
	mr->mr_length = ibmr->length;
	mr->mr_offset = ibmr->iova;
	chunk->seg[0] = cpu_to_be32(mr->mr_handle);
	chunk->seg[1] = cpu_to_be32(mr->mr_length);
	list_add_tail(&mr->mr_list, &req->rl_registered);
	return 0;

out_unmap:
	ib_dma_unmap_sg(sbx_dev(req), mr->mr_sg, chunk->nents, mr->mr_dir);
out_free:
	list_add(&mr->mr_list, &req->rl_free_mrs);	/* OK: rdma-invalidation-leak -- mapping failed before any REG_MR; the MR's previous key was invalidated before it reached the free list */
	return -EIO;
}

static int sbx_send(struct sbx_xprt *xprt, struct sbx_req *req)
{
	struct ib_send_wr *post_wr = &req->rl_sendwr;
	struct sbx_mr *mr;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		mr->mr_regwr.wr.next = post_wr;
		mr->mr_regwr.wr.wr_cqe = &mr->mr_cqe;
		mr->mr_regwr.wr.num_sge = 0;
		mr->mr_regwr.wr.opcode = IB_WR_REG_MR;
		mr->mr_regwr.wr.send_flags = 0;
		mr->mr_cqe.done = sbx_wc_fastreg;
		post_wr = &mr->mr_regwr.wr;
	}

	req->rl_sendwr.next = NULL;
	req->rl_sendwr.wr_cqe = &req->rl_cqe;
	req->rl_sendwr.sg_list = req->rl_sge;
	req->rl_sendwr.num_sge = 2;
	req->rl_sendwr.opcode = IB_WR_SEND;
	req->rl_sendwr.send_flags = IB_SEND_SIGNALED;

	return ib_post_send(xprt->rx_ep->re_id->qp, post_wr, NULL);
}

static int sbx_transmit(struct sbx_xprt *xprt, struct sbx_req *req,
			struct sbx_chunk *chunks, int nchunks)
{
	struct sbx_mr *mr, *tmp;
	int i, rc;

	for (i = 0; i < nchunks && i < SBX_MAX_MRS; i++) {
		rc = sbx_mr_map(req, &chunks[i]);
		if (rc)
			goto out_reset;
	}

	rc = sbx_send(xprt, req);
	if (rc)
		goto out_reset;

	spin_lock(&xprt->rx_lock);
	list_add_tail(&req->rl_list, &xprt->rx_pending);
	spin_unlock(&xprt->rx_lock);
	return 0;

out_reset:
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		sbx_mr_put(mr);	/* OK: rdma-invalidation-leak -- marshaling or the post failed, no REG_MR reached the device */
	}
	return rc;
}

/*
 * The RPC layer gave up waiting for the reply and sends the Call again on
 * the same connection: marshal it from scratch.
 */
static int sbx_retransmit(struct sbx_xprt *xprt, struct sbx_req *req,
			  struct sbx_chunk *chunks, int nchunks)
{
	struct sbx_mr *mr, *tmp;

	spin_lock(&xprt->rx_lock);
	list_del_init(&req->rl_list);
	spin_unlock(&xprt->rx_lock);

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		sbx_mr_put(mr);	/* BUG: rdma-invalidation-leak -- the first transmission exposed these rkeys and the server may still use them */
	}
	return sbx_transmit(xprt, req, chunks, nchunks);
}

static struct sbx_mr *sbx_build_linv_chain(struct sbx_req *req,
					   struct ib_send_wr **first);

static void sbx_wc_localinv(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbx_mr *mr = container_of(wc->wr_cqe, struct sbx_mr, mr_cqe);

	if (wc->status != IB_WC_SUCCESS)
		sbx_force_disconnect(mr->mr_req->rl_xprt);
}

static void sbx_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbx_mr *last = container_of(wc->wr_cqe, struct sbx_mr, mr_cqe);
	struct sbx_req *req = last->mr_req;
	struct sbx_mr *mr, *tmp;

	/* The last LOCAL_INV of the chain: all of them are done. */
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		sbx_mr_put(mr);	/* BUG: rdma-invalidation-leak -- wc->status is never tested; after a flushed or failed LOCAL_INV the rkeys are still valid */
	}
	req->rl_complete(req, 0);
}

static void sbx_wc_localinv_wake(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbx_mr *mr = container_of(wc->wr_cqe, struct sbx_mr, mr_cqe);

	mr->mr_status = wc->status;
	complete(&mr->mr_linv_done);
}

static struct sbx_mr *sbx_build_linv_chain(struct sbx_req *req,
					   struct ib_send_wr **first)
{
	struct ib_send_wr **prev = first;
	struct sbx_mr *mr, *last = NULL;

	list_for_each_entry(mr, &req->rl_registered, mr_list) {
		struct ib_send_wr *wr = &mr->mr_invwr;

		wr->next = NULL;
		wr->wr_cqe = &mr->mr_cqe;
		wr->sg_list = NULL;
		wr->num_sge = 0;
		wr->opcode = IB_WR_LOCAL_INV;
		wr->send_flags = 0;
		wr->ex.invalidate_rkey = mr->mr_handle;
		mr->mr_cqe.done = sbx_wc_localinv;

		*prev = wr;
		prev = &wr->next;
		last = mr;
	}
	return last;
}

static void sbx_unmap_async(struct sbx_xprt *xprt, struct sbx_req *req)
{
	struct ib_send_wr *first = NULL;
	struct sbx_mr *last, *mr, *tmp;

	last = sbx_build_linv_chain(req, &first);
	last->mr_cqe.done = sbx_wc_localinv_done;
	last->mr_invwr.send_flags = IB_SEND_SIGNALED;

	if (!ib_post_send(xprt->rx_ep->re_id->qp, first, NULL))
		return;

	/* The chain never went out, so nothing will complete the RPC. */
	sbx_force_disconnect(xprt);
	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		sbx_mr_recycle(mr);	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the LOCAL_INV post failed; ib_dereg_mr() kills the rkey before the pages are unmapped */
	}
	req->rl_complete(req, -ENOTCONN);
}

/* The RPC was interrupted; its pages go back to the caller on return. */
static void sbx_unmap_sync(struct sbx_xprt *xprt, struct sbx_req *req)
{
	struct ib_send_wr *first = NULL;
	struct sbx_mr *last, *mr, *tmp;
	int status;

	if (list_empty(&req->rl_registered))
		return;

	last = sbx_build_linv_chain(req, &first);
	last->mr_cqe.done = sbx_wc_localinv_wake;
	last->mr_invwr.send_flags = IB_SEND_SIGNALED;
	reinit_completion(&last->mr_linv_done);

	if (ib_post_send(xprt->rx_ep->re_id->qp, first, NULL)) {
		sbx_force_disconnect(xprt);
		status = -EIO;
	} else {
		wait_for_completion(&last->mr_linv_done);
		status = last->mr_status;
	}

	list_for_each_entry_safe(mr, tmp, &req->rl_registered, mr_list) {
		list_del(&mr->mr_list);
		if (status == IB_WC_SUCCESS)
			sbx_mr_put(mr);	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- waited for the signaled LOCAL_INV chain and it succeeded */
		else
			sbx_mr_recycle(mr);
	}
}

static void sbx_reminv(struct sbx_rep *rep, struct list_head *mrs)
{
	struct sbx_mr *mr;

	list_for_each_entry(mr, mrs, mr_list)
		if (mr->mr_handle == rep->rr_inv_rkey) {
			list_del_init(&mr->mr_list);
			sbx_mr_put(mr);	/* OK: rdma-invalidation-leak -- the server invalidated exactly this rkey */
			break;	/* only one invalidated rkey per reply */
		}
}

static struct sbx_req *sbx_lookup_rqst(struct sbx_xprt *xprt, __be32 xid)
{
	struct sbx_req *req, *found = NULL;

	spin_lock(&xprt->rx_lock);
	list_for_each_entry(req, &xprt->rx_pending, rl_list)
		if (req->rl_xid == xid) {
			list_del_init(&req->rl_list);
			found = req;
			break;
		}
	spin_unlock(&xprt->rx_lock);
	return found;
}

static void sbx_reply_handler(struct sbx_rep *rep)
{
	struct sbx_xprt *xprt = rep->rr_rxprt;
	struct sbx_req *req;

	req = sbx_lookup_rqst(xprt, rep->rr_xid);
	if (!req) {
		pr_warn("reply for unknown xid %08x\n", be32_to_cpu(rep->rr_xid));
		return;
	}
	req->rl_reply = rep;

	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE)
		sbx_reminv(rep, &req->rl_registered);	/* OK: rdma-remote-invalidate-unchecked -- sbx_reminv() retires only the MR whose handle equals rr_inv_rkey */
	if (!list_empty(&req->rl_registered)) {
		sbx_unmap_async(xprt, req);
		return;
	}
	req->rl_complete(req, 0);
}

static void sbx_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sbx_rep *rep = container_of(wc->wr_cqe, struct sbx_rep, rr_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			sbx_force_disconnect(rep->rr_rxprt);
		return;
	}

	ib_dma_sync_single_for_cpu(rep->rr_rxprt->rx_ep->re_id->device,
				   rep->rr_dma, SBX_INLINE_SIZE, DMA_FROM_DEVICE);
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;	/* OK: rdma-remote-invalidate-unchecked -- only recorded here; the reply handler matches it */
	rep->rr_xid = *(__be32 *)rep->rr_buf;
	sbx_reply_handler(rep);
}

static int sbx_req_init_mrs(struct sbx_xprt *xprt, struct sbx_req *req)
{
	struct sbx_ep *ep = xprt->rx_ep;
	struct sbx_mr *mr;
	int i;

	INIT_LIST_HEAD(&req->rl_free_mrs);
	INIT_LIST_HEAD(&req->rl_registered);
	for (i = 0; i < SBX_MAX_MRS; i++) {
		mr = kzalloc(sizeof(*mr), GFP_KERNEL);
		if (!mr)
			return -ENOMEM;
		mr->ibmr = ib_alloc_mr(ep->re_pd, IB_MR_TYPE_MEM_REG, SBX_MAX_PAGES);
		if (IS_ERR(mr->ibmr)) {
			kfree(mr);
			return -ENOMEM;
		}
		mr->mr_req = req;
		init_completion(&mr->mr_linv_done);
		list_add(&mr->mr_list, &req->rl_free_mrs);
	}
	return 0;
}

static int sbx_ep_create(struct sbx_xprt *xprt)
{
	struct sbx_ep *ep = xprt->rx_ep;
	struct ib_device *dev = ep->re_id->device;
	unsigned int depth;
	struct ib_cq *cq;

	/*
	 * Per RPC: a REG_MR and a LOCAL_INV for each of head, page list and
	 * tail, plus the Call itself.
	 */
	depth = 2 * SBX_MAX_MRS + 1;
	if (ep->re_max_requests * depth + SBX_BC_WRS + 1 > dev->attrs.max_qp_wr)
		ep->re_max_requests = (dev->attrs.max_qp_wr - SBX_BC_WRS - 1) / depth;

	memset(&ep->re_attr, 0, sizeof(ep->re_attr));
	/* OK: rdma-send-queue-undersized -- 7 entries cover three REG_MR/LOCAL_INV pairs and the Call; one more for the drain */
	ep->re_attr.cap.max_send_wr = ep->re_max_requests * depth + SBX_BC_WRS + 1; /* BUG: rdma-send-queue-manual-factor -- hand-made per-RPC registration factor */
	ep->re_attr.cap.max_recv_wr = ep->re_max_requests + SBX_BC_WRS + 1;
	ep->re_attr.cap.max_send_sge = 2;
	ep->re_attr.cap.max_recv_sge = 1;
	ep->re_attr.sq_sig_type = IB_SIGNAL_REQ_WR;
	ep->re_attr.qp_type = IB_QPT_RC;

	cq = ib_alloc_cq(dev, xprt, ep->re_attr.cap.max_send_wr +
			 ep->re_attr.cap.max_recv_wr, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(cq))
		return PTR_ERR(cq);
	ep->re_attr.send_cq = cq;
	ep->re_attr.recv_cq = cq;

	return rdma_create_qp(ep->re_id, ep->re_pd, &ep->re_attr);
}

static void sbx_ep_destroy(struct sbx_xprt *xprt)
{
	struct sbx_ep *ep = xprt->rx_ep;

	ib_drain_qp(ep->re_id->qp);
	rdma_destroy_qp(ep->re_id);
	ib_free_cq(ep->re_attr.send_cq);
}

struct sbx_transport_ops {
	int (*open)(struct sbx_xprt *xprt);
	void (*close)(struct sbx_xprt *xprt);
	int (*req_init)(struct sbx_xprt *xprt, struct sbx_req *req);
	int (*send_request)(struct sbx_xprt *xprt, struct sbx_req *req,
			    struct sbx_chunk *chunks, int nchunks);
	int (*retransmit)(struct sbx_xprt *xprt, struct sbx_req *req,
			  struct sbx_chunk *chunks, int nchunks);
	void (*release_request)(struct sbx_xprt *xprt, struct sbx_req *req);
	void (*recv_done)(struct ib_cq *cq, struct ib_wc *wc);
};

const struct sbx_transport_ops sbx_frwr_ops = {
	.open		 = sbx_ep_create,
	.close		 = sbx_ep_destroy,
	.req_init	 = sbx_req_init_mrs,
	.send_request	 = sbx_transmit,
	.retransmit	 = sbx_retransmit,
	.release_request = sbx_unmap_sync,
	.recv_done	 = sbx_wc_receive,
};

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("sb RPC-over-RDMA style FRWR client");
