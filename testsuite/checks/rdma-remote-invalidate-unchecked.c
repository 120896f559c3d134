// RUN: %check_ulplint %s rdma-remote-invalidate-unchecked %t
// RUN: %check_ulplint --mode=plugin %s rdma-remote-invalidate-unchecked %t.plugin

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

// A poller that copies each completion into a context on its stack and
// hands the context to the message handlers: the copied key is the
// invalidated rkey, compared by one handler (directly, or through the
// extended CQ's read in a conditional) and not by the other.
struct rx_ctx {
  unsigned int wc_flags;
  uint32_t inv_rkey;
  uint32_t slot;
};

struct grant {
  struct ibv_mw *mw;
  uint32_t rkey;
  int busy;
};

void grant_put(struct grant *g);

static void rx_commit(struct grant *g, const struct rx_ctx *rx)
{
  if (rx->wc_flags & IBV_WC_WITH_INV) {
    if (rx->inv_rkey != g->rkey)
      fprintf(stderr, "client invalidated %#x, granted %#x\n", rx->inv_rkey, g->rkey);
  }
  g->busy = 0;
}

static void rx_abort(struct grant *g, const struct rx_ctx *rx)
{
  if (rx->wc_flags & IBV_WC_WITH_INV)
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    grant_put(g);
}

void rx_poll(struct ibv_cq *cq, struct grant *grants)
{
  struct ibv_wc wc;
  struct rx_ctx rx;

  while (ibv_poll_cq(cq, 1, &wc) > 0) {
    rx.wc_flags = wc.wc_flags;
    rx.inv_rkey = wc.invalidated_rkey;
    rx.slot = (uint32_t)wc.wr_id;
    if (wc.opcode == IBV_WC_RECV && rx.slot & 1)
      rx_abort(&grants[rx.slot >> 1], &rx);
    else
      rx_commit(&grants[rx.slot >> 1], &rx);
  }
}

static int rxx_release(struct grant *g, const struct rx_ctx *rx)
{
  if (rx->wc_flags & IBV_WC_WITH_INV) {
    if (rx->inv_rkey == g->rkey) {
      g->busy = 0;
      return 0;
    }
  }
  return -EPROTO;
}

void rxx_poll(struct ibv_cq_ex *cq, struct grant *g)
{
  struct ibv_poll_cq_attr attr = {};
  struct rx_ctx rx;

  if (ibv_start_poll(cq, &attr))
    return;
  rx.wc_flags = ibv_wc_read_wc_flags(cq);
  rx.inv_rkey = (rx.wc_flags & IBV_WC_WITH_INV) ? ibv_wc_read_invalidated_rkey(cq) : 0;
  rxx_release(g, &rx);
  ibv_end_poll(cq);
}

/* UCX style: the poller reads the flags and the key out of the extended
 * CQ and hands both to the protocol handler as plain integers. */
struct rndv_req {
  struct ibv_mw *mw;
  uint32_t rkey;
  int frags_left;
  int status;
};

void rndv_complete(struct rndv_req *req);
int rndv_local_inv(struct rndv_req *req);

static void rndv_handle_ats(struct rndv_req *req, unsigned wc_flags, uint32_t inv_rkey)
{
  if (wc_flags & IBV_WC_WITH_INV) {
    if (inv_rkey != req->rkey)
      goto local_inv;
    rndv_complete(req); /* the peer invalidated this window's key */
    return;
  }
local_inv:
  rndv_local_inv(req);
}

static void rndv_handle_last_frag(struct rndv_req *req, unsigned wc_flags)
{
  if (--req->frags_left > 0)
    return;
  if (wc_flags & IBV_WC_WITH_INV) {
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: completion with IBV_WC_WITH_INV is accepted without comparing the invalidated rkey (wc->invalidated_rkey) with the request's
    rndv_complete(req);
    return;
  }
  rndv_local_inv(req);
}

unsigned rndv_progress(struct ibv_cq_ex *cq, struct rndv_req *reqs)
{
  struct ibv_poll_cq_attr attr = {};
  unsigned count = 0;

  if (ibv_start_poll(cq, &attr))
    return 0;
  do {
    struct rndv_req *req = &reqs[cq->wr_id >> 1];
    unsigned wc_flags = ibv_wc_read_wc_flags(cq);
    uint32_t inv_rkey = 0;

    if (wc_flags & IBV_WC_WITH_INV)
      inv_rkey = ibv_wc_read_invalidated_rkey(cq);
    if (cq->wr_id & 1)
      rndv_handle_last_frag(req, wc_flags);
    else
      rndv_handle_ats(req, wc_flags, inv_rkey);
    count++;
  } while (ibv_next_poll(cq) == 0);
  ibv_end_poll(cq);
  return count;
}
