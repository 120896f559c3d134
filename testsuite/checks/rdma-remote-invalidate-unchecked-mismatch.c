// RUN: %check_ulplint --kernel %s rdma-remote-invalidate-unchecked %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-remote-invalidate-unchecked %t.plugin

// A host that compares the remotely invalidated rkey with its request's key
// (the nvme-rdma scheme). Finding another key is only safe if the request
// is not completed on that branch: completing it hands the pages back while
// the request's own rkey is still valid (Linux 6.1's nvme-rdma, fixed by a
// `return` after the error recovery).

#include <rdma/mr_pool.h>
#include <linux/printk.h>
#include <linux/slab.h>

struct wk_queue {
	struct ib_qp *qp;
	int recovering;
};

struct wk_req {
	struct wk_queue *queue;
	struct ib_mr *mr;
	struct ib_reg_wr reg_wr;
	struct ib_cqe reg_cqe;
	int status;
};

void wk_error_recovery(struct wk_queue *queue);
bool wk_try_complete(struct wk_req *req, int status);

static void wk_unmap_data(struct wk_req *req)
{
	if (req->mr) {
		ib_mr_pool_put(req->queue->qp, &req->queue->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
}

static void wk_complete_rq(struct wk_req *req)
{
	wk_unmap_data(req);
}

static void wk_end_request(struct wk_req *req)
{
	if (!wk_try_complete(req, req->status))
		wk_complete_rq(req);
}

int wk_map_data(struct wk_queue *queue, struct wk_req *req)
{
	req->mr = ib_mr_pool_get(queue->qp, &queue->qp->rdma_mrs);
	if (WARN_ON_ONCE(!req->mr))
		return -EAGAIN;
	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_wr.wr.opcode = IB_WR_REG_MR;
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.mr = req->mr;
	req->reg_wr.key = req->mr->rkey;
	req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return ib_post_send(queue->qp, &req->reg_wr.wr, NULL);
}

/* The 6.1 shape: the mismatch is logged and recovery queued, then the
 * request is completed anyway. */
void wk_process_rsp(struct wk_queue *queue, struct wk_req *req, struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
		// CHECK-MESSAGES: :[[@LINE-2]]:7: warning: the invalidated rkey (wc->ex.invalidate_rkey) is found to be another key, but the request is still completed: its memory is released with its own rkey valid [rdma-remote-invalidate-unchecked]
			pr_err("bogus remote invalidation for rkey %#x\n",
			       req->mr ? req->mr->rkey : 0);
			wk_error_recovery(queue);
		}
	} else if (req->mr) {
		/* a LOCAL_INV completion ends the request */
		return;
	}
	wk_end_request(req);
}

/* Near miss, the 6.12 shape: the request is left to error recovery. */
void wk_process_rsp_fixed(struct wk_queue *queue, struct wk_req *req,
			  struct ib_wc *wc)
{
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (unlikely(!req->mr ||
			     wc->ex.invalidate_rkey != req->mr->rkey)) {
			pr_err("bogus remote invalidation for rkey %#x\n",
			       req->mr ? req->mr->rkey : 0);
			wk_error_recovery(queue);
			return;
		}
	} else if (req->mr) {
		return;
	}
	wk_end_request(req);
}
