// RUN: %check_ulplint --kernel %s rdma-remote-invalidate-unchecked %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-remote-invalidate-unchecked %t.plugin

// Response handlers of kernel initiators that get SEND_WITH_INV from the
// target.

#include <rdma/ib_verbs.h>

struct demo_req {
	struct ib_mr *mr;
	bool need_inval;
};

struct demo_rep {
	int rr_wc_flags;
	u32 rr_inv_rkey;
};

void demo_error_recovery(struct demo_req *req);
void demo_complete(struct demo_req *req);
int demo_local_inv(struct demo_req *req);

/* Trusts the flag: any invalidated key ends this request's registration. */
static void demo_recv_done(struct demo_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing the invalidated rkey (wc->ex.invalidate_rkey) with the request's; a peer that invalidates another key leaves this request's memory open to it [rdma-remote-invalidate-unchecked]
		req->need_inval = false;
		demo_complete(req);
		return;
	}
	demo_local_inv(req);
}

/* The same with the test negated: the else branch accepts. */
static void demo_recv_done2(struct demo_req *req, struct ib_wc *wc)
{
	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE))
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing
		demo_local_inv(req);
	else
		demo_complete(req);
}

/* Near miss: nvme-rdma compares the key and recovers on mismatch. */
static void ok_nvme(struct demo_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(wc->ex.invalidate_rkey != req->mr->rkey))
			demo_error_recovery(req);
	} else if (req->mr) {
		demo_local_inv(req);
		return;
	}
	demo_complete(req);
}

/* Near miss: iser copies the key and a helper compares it. */
static int demo_inv_desc(struct demo_req *req, u32 rkey)
{
	if (rkey != req->mr->rkey)
		return -EINVAL;
	req->need_inval = false;
	return 0;
}

static int ok_iser(struct demo_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		u32 rkey = wc->ex.invalidate_rkey;

		if (demo_inv_desc(req, rkey))
			return -EINVAL;
	}
	return 0;
}

/* Near miss: xprtrdma copies flags and key into the reply; the comparison
 * happens where the reply is processed. */
static void ok_xprtrdma_wc(struct demo_rep *rep, struct ib_wc *wc)
{
	rep->rr_wc_flags = wc->wc_flags;
	rep->rr_inv_rkey = wc->ex.invalidate_rkey;
}

static void ok_xprtrdma_reply(struct demo_rep *rep, struct demo_req *req)
{
	if (rep->rr_wc_flags & IB_WC_WITH_INVALIDATE) {
		if (req->mr->rkey == rep->rr_inv_rkey)
			req->need_inval = false;
	}
}
