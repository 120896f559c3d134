// SPDX-License-Identifier: GPL-2.0
/*
 * mex: response handling of an invented memory-expansion initiator over
 * RDMA ("mex"). Five response handlers, five ways of looking at
 * IB_WC_WITH_INVALIDATE:
 *
 *   - mex_rsp_read(): "if not remotely invalidated, invalidate locally,
 *     else complete": the accepting branch is the else, and it compares
 *     nothing (bug);
 *   - mex_rsp_write(): need_inv = !(wc_flags & WITH_INVALIDATE), accepting
 *     the flag without a comparison in an assignment rather than an if (bug;
 *     the doc speaks of if/else, the bug class is the same);
 *   - mex_rsp_atomic(): checks only that the invalidated rkey is non-zero,
 *     which says nothing about whose key it was (bug);
 *   - mex_rsp_flush(): copies the rkey into a local and compares it with the
 *     request's MR, and mex_rsp_batch() finds the request by the invalidated
 *     rkey itself, so the key that died is by construction that request's
 *     (both right).
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct mex_queue {
	struct ib_qp	*qp;
	void		*ctrl;
};

struct mex_req {
	struct mex_queue	*q;
	struct ib_mr		*mr;
	bool			need_inv;
	int			status;
};

void mex_post_local_inv(struct mex_req *req);
void mex_complete(struct mex_req *req);
void mex_fatal(struct mex_queue *q);
struct mex_req *mex_req_by_rkey(struct mex_queue *q, u32 rkey);

void mex_rsp_read(struct mex_req *req, struct ib_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- the else branch accepts the remote invalidation without comparing the rkey */
	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE)) {
		mex_post_local_inv(req);
	} else {
		req->need_inv = false;
		mex_complete(req);
	}
}

void mex_rsp_write(struct mex_req *req, struct ib_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- the flag alone decides that this request's key is gone */
	req->need_inv = !(wc->wc_flags & IB_WC_WITH_INVALIDATE);
	if (req->need_inv)
		mex_post_local_inv(req);
	else
		mex_complete(req);
}

void mex_rsp_atomic(struct mex_req *req, struct ib_wc *wc)
{
	/* BUG: rdma-remote-invalidate-unchecked -- a non-zero invalidated rkey is not this request's rkey */
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) && wc->ex.invalidate_rkey) {
		req->need_inv = false;
		mex_complete(req);
		return;
	}
	mex_post_local_inv(req);
}

void mex_rsp_flush(struct mex_req *req, struct ib_wc *wc)
{
	u32 inv_rkey = wc->ex.invalidate_rkey;

	/* OK: rdma-remote-invalidate-unchecked -- the local copy of the invalidated rkey is compared with the request's */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (inv_rkey != req->mr->rkey) {
			mex_fatal(req->q);
			return;
		}
		req->need_inv = false;
		mex_complete(req);
		return;
	}
	mex_post_local_inv(req);
}

void mex_rsp_batch(struct mex_queue *q, struct ib_wc *wc)
{
	struct mex_req *req;

	/* OK: rdma-remote-invalidate-unchecked -- the request is looked up by the invalidated rkey, so the dead key is that request's */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		req = mex_req_by_rkey(q, wc->ex.invalidate_rkey);
		if (!req) {
			mex_fatal(q);
			return;
		}
		req->need_inv = false;
		mex_complete(req);
	}
}
