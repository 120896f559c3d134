// SPDX-License-Identifier: GPL-2.0
/*
 * xrr: receive side of an RPC-over-RDMA client that supports Remote
 * Invalidation, in the shape of net/sunrpc/xprtrdma (rpcrdma_wc_receive
 * copying wc_flags and ex.invalidate_rkey into the rep,
 * rpcrdma_reply_handler, frwr_reminv matching the MR by handle) with two
 * more reply channels added for this batch. Written fresh.
 *
 * The server may send a reply with SEND_WITH_INV, invalidating one rkey of
 * the request. Four receive paths accept that:
 *  - the RPC reply handler passes the rep (which carries the copied rkey)
 *    to xrr_reminv(), which only retires the MR whose handle matches;
 *  - the bulk read reply compares the invalidated rkey with the request's
 *    data MR and tears the connection down on a mismatch (nvme-rdma's rule);
 *  - the data-server reply compares the invalidated rkey with the key the
 *    server itself echoed in the reply header: a comparison the peer
 *    controls on both sides, so nothing ties the key to this request;
 *  - the notification channel accepts the flag in a switch, with no
 *    comparison at all.
 * A request whose key is still live gets a signaled LOCAL_INV, and its MR
 * is recycled from that completion.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct xrr_xprt {
	struct ib_qp		*qp;
	spinlock_t		lock;
	struct list_head	free_mrs;
	struct work_struct	close_work;
};

struct xrr_mr {
	struct list_head	mr_list;
	struct ib_mr		*mr;
	u32			handle;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct xrr_xprt		*xprt;
};

struct xrr_req {
	struct list_head	registered;	/* xrr_mr, by mr_list */
	struct xrr_mr		*data_mr;	/* bulk data, one MR */
	bool			need_inv;
	int			status;
};

struct xrr_rep {
	struct ib_cqe		cqe;
	struct xrr_xprt		*xprt;
	int			wc_flags;
	u32			inv_rkey;
	__be32			xid;
};

struct xrr_ds_hdr {
	__be32			xid;
	__be32			inv_rkey;	/* "the key I invalidated" */
	__be32			status;
};

struct xrr_req *xrr_lookup_rqst(struct xrr_xprt *xprt, __be32 xid);
void xrr_complete_rqst(struct xrr_req *req);
void *xrr_rep_buf(struct ib_wc *wc);

static void xrr_force_disconnect(struct xrr_xprt *xprt)
{
	schedule_work(&xprt->close_work);
}

static void xrr_mr_recycle(struct xrr_xprt *xprt, struct xrr_mr *mr)
{
	spin_lock(&xprt->lock);
	list_add_tail(&mr->mr_list, &xprt->free_mrs);
	spin_unlock(&xprt->lock);
}

/* Invalidation completion: the key is dead, the MR may be reused. */
static void xrr_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrr_mr *mr = container_of(wc->wr_cqe, struct xrr_mr, inv_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		xrr_force_disconnect(mr->xprt);
		return;
	}
	xrr_mr_recycle(mr->xprt, mr);
}

static void xrr_invalidate(struct xrr_xprt *xprt, struct xrr_mr *mr)
{
	int rc;

	mr->inv_wr.next = NULL;
	mr->inv_wr.opcode = IB_WR_LOCAL_INV;
	mr->inv_wr.ex.invalidate_rkey = mr->handle;
	mr->inv_wr.send_flags = IB_SEND_SIGNALED;
	mr->inv_cqe.done = xrr_wc_localinv_done;
	mr->inv_wr.wr_cqe = &mr->inv_cqe;

	rc = ib_post_send(xprt->qp, &mr->inv_wr, NULL);
	if (rc)
		xrr_force_disconnect(xprt);
}

/**
 * xrr_reminv - retire the MR the server invalidated
 * @rep: the received reply, carrying the invalidated rkey
 * @mrs: the request's registered MRs
 */
static void xrr_reminv(struct xrr_rep *rep, struct list_head *mrs)
{
	struct xrr_mr *mr;

	list_for_each_entry(mr, mrs, mr_list) {
		if (mr->handle == rep->inv_rkey) {
			list_del_init(&mr->mr_list);
			/* OK: rdma-invalidation-leak -- this MR's own handle was the key the server invalidated */
			xrr_mr_recycle(rep->xprt, mr);
			return;
		}
	}
}

static void xrr_reply_handler(struct xrr_rep *rep)
{
	struct xrr_xprt *xprt = rep->xprt;
	struct xrr_req *req;
	struct xrr_mr *mr, *tmp;

	req = xrr_lookup_rqst(xprt, rep->xid);
	if (!req)
		return;

	/* OK: rdma-remote-invalidate-unchecked -- the rep carries the copied invalidated rkey and xrr_reminv() matches it against each MR's handle */
	if (rep->wc_flags & IB_WC_WITH_INVALIDATE)
		xrr_reminv(rep, &req->registered);

	list_for_each_entry_safe(mr, tmp, &req->registered, mr_list) {
		list_del_init(&mr->mr_list);
		xrr_invalidate(xprt, mr);
	}
	xrr_complete_rqst(req);
}

/**
 * xrr_wc_receive - receive completion for RPC replies
 * @cq: completion queue
 * @wc: the completion; the flags and the invalidated rkey are copied
 */
void xrr_wc_receive(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrr_rep *rep = container_of(wc->wr_cqe, struct xrr_rep, cqe);
	__be32 *p;

	if (wc->status != IB_WC_SUCCESS) {
		xrr_force_disconnect(rep->xprt);
		return;
	}

	rep->wc_flags = wc->wc_flags;
	rep->inv_rkey = wc->ex.invalidate_rkey;
	p = xrr_rep_buf(wc);
	rep->xid = p[0];
	xrr_reply_handler(rep);
}

/**
 * xrr_read_reply_done - completion of a bulk READ reply
 * @cq: completion queue
 * @wc: the completion
 */
void xrr_read_reply_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrr_rep *rep = container_of(wc->wr_cqe, struct xrr_rep, cqe);
	__be32 *p = xrr_rep_buf(wc);
	struct xrr_req *req = xrr_lookup_rqst(rep->xprt, p[0]);

	if (!req || wc->status != IB_WC_SUCCESS)
		return;

	/* OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the request's own MR; a mismatch closes the connection */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->data_mr->handle)) {
			pr_err("bogus remote invalidation of rkey %#x\n",
			       wc->ex.invalidate_rkey);
			xrr_force_disconnect(rep->xprt);
			return;
		}
		req->need_inv = false;
		xrr_mr_recycle(rep->xprt, req->data_mr);
	} else {
		xrr_invalidate(rep->xprt, req->data_mr);
	}
	xrr_complete_rqst(req);
}

/**
 * xrr_ds_reply_done - completion of a reply from a data server
 * @cq: completion queue
 * @wc: the completion
 *
 * Data servers report in their reply header which rkey they invalidated.
 */
void xrr_ds_reply_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrr_rep *rep = container_of(wc->wr_cqe, struct xrr_rep, cqe);
	struct xrr_ds_hdr *hdr = xrr_rep_buf(wc);
	struct xrr_req *req;

	if (wc->status != IB_WC_SUCCESS)
		return;
	req = xrr_lookup_rqst(rep->xprt, hdr->xid);
	if (!req)
		return;

	/* BUG: rdma-remote-invalidate-unchecked -- the invalidated rkey is only compared with the key the server wrote into its own reply header, never with req->data_mr's key */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (wc->ex.invalidate_rkey == be32_to_cpu(hdr->inv_rkey))
			req->need_inv = false;
	}

	if (req->need_inv)
		xrr_invalidate(rep->xprt, req->data_mr);
	else
		xrr_mr_recycle(rep->xprt, req->data_mr);
	req->status = be32_to_cpu(hdr->status);
	xrr_complete_rqst(req);
}

/**
 * xrr_notify_recv_done - completion on the notification channel
 * @cq: completion queue
 * @wc: the completion
 */
void xrr_notify_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct xrr_rep *rep = container_of(wc->wr_cqe, struct xrr_rep, cqe);
	__be32 *p = xrr_rep_buf(wc);
	struct xrr_req *req;

	if (wc->status != IB_WC_SUCCESS)
		return;
	req = xrr_lookup_rqst(rep->xprt, p[0]);
	if (!req)
		return;

	switch (wc->wc_flags & (IB_WC_WITH_INVALIDATE | IB_WC_WITH_IMM)) {
	case IB_WC_WITH_INVALIDATE:
		/* BUG: rdma-remote-invalidate-unchecked -- any invalidated key is taken as this request's: wc->ex.invalidate_rkey is never looked at */
		req->need_inv = false;
		break;
	case IB_WC_WITH_IMM:
		req->status = be32_to_cpu(wc->ex.imm_data);
		break;
	default:
		break;
	}

	if (req->need_inv)
		xrr_invalidate(rep->xprt, req->data_mr);
	else
		xrr_mr_recycle(rep->xprt, req->data_mr);
	xrr_complete_rqst(req);
}
