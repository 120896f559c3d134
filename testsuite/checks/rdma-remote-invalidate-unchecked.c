// RUN: %check_ulplint %s rdma-remote-invalidate-unchecked %t

// Userspace: the initiator deregisters a buffer when the response says
// "with invalidate", without checking which key was invalidated.

#include <infiniband/verbs.h>

struct ulp_req {
  struct ibv_mr *mr;
  int done;
};

int ulp_local_inv(struct ulp_req *req);

void ulp_response(struct ulp_req *req, struct ibv_wc *wc)
{
  if ((wc->wc_flags & IBV_WC_WITH_INV) != 0) {
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    req->done = 1;
    return;
  }
  ulp_local_inv(req);
}

void ok_response(struct ulp_req *req, struct ibv_wc *wc)
{
  if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == req->mr->rkey) {
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    return;
  }
  ulp_local_inv(req);
}
