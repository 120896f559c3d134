// RUN: %check_ulplint --kernel %s rdma-remote-invalidate-unchecked %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-remote-invalidate-unchecked %t.plugin

// Receive handlers of protocols that never negotiate remote invalidation:
// a SEND_WITH_INV is a protocol error. Dropping the message (log, hand the
// channel to error recovery, leave with nothing or a failure) refuses the
// invalidation; only a branch that goes on with the request accepts it.

#include <linux/printk.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

struct lk_req {
	struct ib_mr *mr;
	bool remote_invalidated;
	struct ib_cqe cqe;
};

struct lk_chan {
	struct work_struct err_work;
	int nodeid;
};

void lk_deliver(struct lk_chan *ch, void *msg);
void lk_req_put(struct lk_chan *ch, struct lk_req *req); /* rpc_conn.c */
static void lk_finish(struct lk_req *req);

/* Near miss: SRP style, the channel is reset and the message dropped. */
static void lk_recv_done(struct lk_chan *ch, struct ib_wc *wc, void *msg)
{
	if (unlikely(wc->wc_flags & IB_WC_WITH_INVALIDATE)) {
		pr_err("unexpected SEND_WITH_INV (rkey %#x), resetting\n",
		       wc->ex.invalidate_rkey);
		queue_work(system_wq, &ch->err_work);
		return;
	}
	lk_deliver(ch, msg);
}

/* Near miss: a negotiation response with invalidate is rejected. */
static bool lk_negotiate_resp(struct lk_chan *ch, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		pr_err("node %d: negotiate response with invalidate\n", ch->nodeid);
		return false;
	}
	return wc->byte_len >= 32;
}

/* Accepts: the flag alone marks this request's MR invalidated. */
static void lk_read_rsp(struct lk_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing the invalidated rkey
		req->remote_invalidated = true;
	lk_finish(req);
}

/* Accepts: logs, then completes the request through a helper of this
 * file before leaving. */
static void lk_read_rsp_logged(struct lk_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing the invalidated rkey
		pr_err("invalidated by peer\n");
		lk_finish(req);
		return;
	}
	lk_finish(req);
}

/* Accepts: a bare return skips the LOCAL_INV that follows. */
static void lk_write_rsp(struct lk_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE)
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing the invalidated rkey
		return;
	req->remote_invalidated = false;
}

/* Accepts: the request goes back to its pool (in another file) as done. */
static void lk_reply_done(struct lk_chan *ch, struct lk_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
	// CHECK-MESSAGES: :[[@LINE-1]]:6: warning: completion with IB_WC_WITH_INVALIDATE is accepted without comparing the invalidated rkey
		lk_req_put(ch, req);
		return;
	}
	lk_finish(req);
}

static void lk_finish(struct lk_req *req)
{
	req->mr = NULL;
}

void lk_handlers(struct lk_chan *ch, struct lk_req *req, struct ib_wc *wc)
{
	lk_recv_done(ch, wc, req);
	lk_negotiate_resp(ch, wc);
	lk_read_rsp(req, wc);
	lk_read_rsp_logged(req, wc);
	lk_write_rsp(req, wc);
	lk_reply_done(ch, req, wc);
}
