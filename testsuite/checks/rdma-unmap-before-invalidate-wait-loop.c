// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// A userspace NVMe-oF style initiator queue: each request's type-2 window
// is bound under the key kept next to it (req->rkey), the key travels in
// the command, and a helper posts the LOCAL_INV of a key it gets as an
// integer and returns what ibv_wr_complete() said. Teardown posts every
// LOCAL_INV first, then polls until the count of outstanding ones is zero,
// then recycles the requests.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

struct wq_req {
  struct wq_req *next;
  int busy;
  uint16_t cid;
  void *data;
  struct ibv_mw *mw;
  uint32_t rkey; /* the key the window is bound under */
  uint64_t deadline;
};

struct wq_queue {
  struct ibv_qp_ex *qpx;
  struct ibv_cq *cq;
  struct ibv_mr *pool_mr;
  struct wq_req *reqs, *free_reqs;
  uint32_t *cmd_keys;
  int depth;
};

static void wq_req_done(struct wq_queue *q, struct wq_req *req) {
  req->busy = 0;
  req->next = q->free_reqs;
  q->free_reqs = req;
}

static struct wq_req *wq_req_get(struct wq_queue *q) {
  struct wq_req *req = q->free_reqs;

  if (req)
    q->free_reqs = req->next;
  return req;
}

static int wq_post_inv(struct wq_queue *q, uint16_t cid, uint32_t rkey,
                       unsigned int flags) {
  ibv_wr_start(q->qpx);
  q->qpx->wr_id = cid;
  q->qpx->wr_flags = flags;
  ibv_wr_local_inv(q->qpx, rkey);
  return ibv_wr_complete(q->qpx);
}

int wq_alloc_windows(struct wq_queue *q, struct ibv_pd *pd) {
  int i;

  for (i = 0; i < q->depth; i++) {
    struct wq_req *r = &q->reqs[i];

    r->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!r->mw)
      goto undo;
    r->rkey = r->mw->rkey;
  }
  return 0;
undo:
  while (i--)
    ibv_dealloc_mw(q->reqs[i].mw);
  return -1;
}

int wq_submit(struct wq_queue *q, void *data, size_t len) {
  struct wq_req *req = wq_req_get(q);
  struct ibv_mw_bind_info bind = {
      .mr = q->pool_mr,
      .addr = (uintptr_t)data,
      .length = len,
      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
  };

  if (!req)
    return -1;
  req->data = data;
  req->busy = 1;
  req->rkey = ibv_inc_rkey(req->rkey);
  q->cmd_keys[req->cid] = req->rkey;
  ibv_wr_start(q->qpx);
  ibv_wr_bind_mw(q->qpx, req->mw, req->rkey, &bind);
  ibv_wr_send(q->qpx);
  return ibv_wr_complete(q->qpx);
}

// The helper's result is dropped: this function never learns that the
// post failed, so no path of it recycles a request after a failed post.
// What it does wrong is not to wait for the signaled LOCAL_INV.
void wq_abort_all(struct wq_queue *q) {
  int i;

  for (i = 0; i < q->depth; i++) {
    struct wq_req *req = &q->reqs[i];

    if (!req->busy)
      continue;
    wq_post_inv(q, req->cid, req->rkey, IBV_SEND_SIGNALED);
    wq_req_done(q, req);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'wq_req_done' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
    // CHECK-MESSAGES-NOT: :[[@LINE-2]]:5: warning: {{.*}}[rdma-invalidation-leak]
  }
}

// The same without a signal, and with the result tested: the failed post
// is seen here, and the request still goes back with its key valid.
void wq_cancel(struct wq_queue *q, struct wq_req *req) {
  if (wq_post_inv(q, req->cid, req->rkey, 0))
    wq_req_done(q, req);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'wq_req_done' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
}

// Near miss: every LOCAL_INV is posted, then the loop polls until none is
// outstanding. A path that never enters the wait loop posted nothing that
// succeeded (its condition is the count of posted invalidations).
void wq_quiesce(struct wq_queue *q) {
  struct ibv_wc wc;
  int i, pending = 0;

  for (i = 0; i < q->depth; i++)
    if (q->reqs[i].busy) {
      wq_post_inv(q, q->reqs[i].cid, q->reqs[i].rkey, IBV_SEND_SIGNALED);
      pending++;
    }
  while (pending > 0) {
    if (ibv_poll_cq(q->cq, 1, &wc) <= 0)
      continue;
    pending--;
  }
  for (i = 0; i < q->depth; i++)
    if (q->reqs[i].busy)
      wq_req_done(q, &q->reqs[i]);
}

// The same loops without the wait between them: reported.
void wq_quiesce_nowait(struct wq_queue *q) {
  int i;

  for (i = 0; i < q->depth; i++)
    if (q->reqs[i].busy)
      wq_post_inv(q, q->reqs[i].cid, q->reqs[i].rkey, IBV_SEND_SIGNALED);
  for (i = 0; i < q->depth; i++)
    if (q->reqs[i].busy)
      wq_req_done(q, &q->reqs[i]);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: 'wq_req_done' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
}

// A status-returning grant helper (`return complete() ? WQ_ERR_IO : WQ_OK`):
// its caller recycles the request when the batch with the bind was refused
// (near miss: nothing was bound), and wrongly after a grant that went out.
enum wq_status { WQ_OK = 0, WQ_ERR_IO = 5 };

static enum wq_status wq_grant(struct wq_queue *q, struct wq_req *req, size_t len) {
  struct ibv_mw_bind_info bind = {
      .mr = q->pool_mr,
      .addr = (uintptr_t)req->data,
      .length = len,
      .mw_access_flags = IBV_ACCESS_REMOTE_READ,
  };

  req->rkey = ibv_inc_rkey(req->rkey);
  q->cmd_keys[req->cid] = req->rkey;
  ibv_wr_start(q->qpx);
  ibv_wr_bind_mw(q->qpx, req->mw, req->rkey, &bind);
  ibv_wr_send(q->qpx);
  return ibv_wr_complete(q->qpx) ? WQ_ERR_IO : WQ_OK;
}

int wq_lease(struct wq_queue *q, size_t len) {
  struct wq_req *req = wq_req_get(q);

  if (!req)
    return -1;
  req->busy = 1;
  if (wq_grant(q, req, len) != WQ_OK) {
    wq_req_done(q, req);
    return -1;
  }
  return 0;
}

int wq_lease_once(struct wq_queue *q, size_t len) {
  struct wq_req *req = wq_req_get(q);

  if (!req)
    return -1;
  req->busy = 1;
  if (wq_grant(q, req, len) == WQ_OK)
    wq_req_done(q, req);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'wq_req_done' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  return 0;
}

// A timeout reaper picks its own requests from the table: what it does
// wrong it does to them, so it is reported where it recycles them, not
// where the poll loop calls it.
static void wq_reap(struct wq_queue *q, uint64_t now) {
  int i;

  for (i = 0; i < q->depth; i++) {
    struct wq_req *req = &q->reqs[i];

    if (!req->busy || req->deadline > now)
      continue;
    wq_req_done(q, req);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'wq_req_done' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  }
}

void wq_run(struct wq_queue *q, uint64_t now) {
  struct ibv_wc wc;

  while (ibv_poll_cq(q->cq, 1, &wc) >= 0)
    wq_reap(q, now);
}

// Near miss: the direction picks one of two grants, each returning what
// ibv_wr_complete() said; a refused batch bound nothing, so the request
// goes straight back.
static int wq_grant_dir(struct wq_queue *q, struct wq_req *req, size_t len,
                        unsigned int access) {
  struct ibv_mw_bind_info bind = {
      .mr = q->pool_mr,
      .addr = (uintptr_t)req->data,
      .length = len,
      .mw_access_flags = access,
  };

  req->rkey = ibv_inc_rkey(req->rkey);
  q->cmd_keys[req->cid] = req->rkey;
  ibv_wr_start(q->qpx);
  ibv_wr_bind_mw(q->qpx, req->mw, req->rkey, &bind);
  ibv_wr_send(q->qpx);
  return ibv_wr_complete(q->qpx);
}

int wq_submit_dir(struct wq_queue *q, size_t len, int write) {
  struct wq_req *req = wq_req_get(q);
  int err;

  if (!req)
    return -1;
  req->busy = 1;
  err = write ? wq_grant_dir(q, req, len, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE)
              : wq_grant_dir(q, req, len, IBV_ACCESS_REMOTE_READ);
  if (err)
    wq_req_done(q, req);
  return err;
}
