// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// The offload side of a scratch-buffer service: each request's buffer is
// exposed through a window that another file binds (the bind is not in
// this unit), and this file retires requests by posting a LOCAL_INV of
// the key kept next to the window. The buffer beside the window may go
// only once that LOCAL_INV has completed.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct sx_req {
  struct sx_req *next;
  void *buf;
  size_t len;
  struct ibv_mw *mw;
  uint32_t key;
  uint64_t deadline;
  int busy;
  struct ibv_send_wr inv;
};

struct sx_dev {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct sx_req *inv_pending; /* waiting for their LOCAL_INV completion */
  struct sx_req reqs[128];
};

static int sx_post_inv(struct sx_dev *d, struct sx_req *r, unsigned int flags) {
  struct ibv_send_wr *bad;

  memset(&r->inv, 0, sizeof(r->inv));
  r->inv.wr_id = (uintptr_t)r;
  r->inv.opcode = IBV_WR_LOCAL_INV;
  r->inv.invalidate_rkey = r->key;
  r->inv.send_flags = flags;
  return ibv_post_send(d->qp, &r->inv, &bad);
}

static int sx_wait(struct sx_dev *d, struct sx_req *r) {
  struct ibv_wc wc;
  int n;

  do
    n = ibv_poll_cq(d->cq, 1, &wc);
  while (n == 0 || (n == 1 && wc.wr_id != (uintptr_t)r));
  return n < 0 || wc.status != IBV_WC_SUCCESS ? -EIO : 0;
}

/* Near miss: parked on the pending list; the completion frees the buffer. */
int sx_retire_async(struct sx_dev *d, struct sx_req *r) {
  if (sx_post_inv(d, r, IBV_SEND_SIGNALED))
    return -EIO;
  r->next = d->inv_pending;
  d->inv_pending = r;
  return 0;
}

void sx_inv_done(struct sx_dev *d, struct ibv_wc *wc) {
  struct sx_req *r = (struct sx_req *)(uintptr_t)wc->wr_id;
  struct sx_req **pp;

  for (pp = &d->inv_pending; *pp; pp = &(*pp)->next)
    if (*pp == r) {
      *pp = r->next;
      break;
    }
  if (wc->status != IBV_WC_SUCCESS)
    return;
  free(r->buf);
  r->buf = NULL;
  r->busy = 0;
}

/* Near miss: the LOCAL_INV's completion is waited for first. */
int sx_retire_sync(struct sx_dev *d, struct sx_req *r) {
  if (sx_post_inv(d, r, IBV_SEND_SIGNALED) || sx_wait(d, r))
    return -EIO;
  free(r->buf);
  r->buf = NULL;
  r->busy = 0;
  return 0;
}

/* Cancel: signaled, but nobody waits before the buffer goes. */
int sx_cancel(struct sx_dev *d, struct sx_req *r) {
  if (sx_post_inv(d, r, IBV_SEND_SIGNALED))
    return -EIO;
  free(r->buf);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :42:10: note: LOCAL_INV posted here
  r->buf = NULL;
  r->busy = 0;
  return 0;
}

/* Timeouts: the LOCAL_INV is not even signaled. */
void sx_expire(struct sx_dev *d, uint64_t now) {
  unsigned int i;

  for (i = 0; i < 128; i++) {
    struct sx_req *r = &d->reqs[i];

    if (!r->busy || r->deadline > now)
      continue;
    sx_post_inv(d, r, 0);
    free(r->buf);
    // The helper's flags come from its parameter: the finding says no one waits.
    // CHECK-MESSAGES: :[[@LINE-2]]:5: warning: 'free' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
    // CHECK-MESSAGES: :42:10: note: LOCAL_INV posted here
    r->buf = NULL;
    r->busy = 0;
  }
}
