// RUN: %check_ulplint %s rdma-remote-invalidate-unchecked %t

// Userspace: the initiator deregisters a buffer when the response says
// "with invalidate", without checking which key was invalidated.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>

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

/* The flag copied into a bool first, as many completion handlers do. */
void ulp_response_flag(struct ulp_req *req, struct ibv_wc *wc)
{
  int inv = (wc->wc_flags & IBV_WC_WITH_INV) != 0;

  if (inv) {
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    return;
  }
  ulp_local_inv(req);
}

/* Near miss: the copied flag, and the key compared before the release. */
void ok_response_flag(struct ulp_req *req, struct ibv_wc *wc)
{
  int inv = (wc->wc_flags & IBV_WC_WITH_INV) != 0;

  if (inv && wc->invalidated_rkey == req->mr->rkey) {
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    return;
  }
  ulp_local_inv(req);
}

void ulp_log_key(unsigned int key);

/* Passing the key to a logger is not a check. */
void ulp_response_logged(struct ulp_req *req, struct ibv_wc *wc)
{
  if (wc->wc_flags & IBV_WC_WITH_INV) {
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    ulp_log_key(wc->invalidated_rkey);
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    return;
  }
  ulp_local_inv(req);
}

/* Nothing is granted before the handshake: an invalidating HELLO is
   refused with an error, not accepted. */
int ulp_handle_hello(struct ulp_req *req, struct ibv_wc *wc)
{
  if (wc->wc_flags & IBV_WC_WITH_INV) {
    fprintf(stderr, "hello with invalidate from the peer\n");
    return -EPROTO;
  }
  ulp_local_inv(req);
  return 0;
}

/* Refusing it after releasing the MR is accepting it. */
int ulp_handle_hello_late(struct ulp_req *req, struct ibv_wc *wc)
{
  if (wc->wc_flags & IBV_WC_WITH_INV) {
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    ibv_dereg_mr(req->mr);
    req->mr = NULL;
    return -EPROTO;
  }
  ulp_local_inv(req);
  return 0;
}
