// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// A block initiator's completion loop: every completion names its own
// request (wr_id), so what one iteration did to its request's window says
// nothing about the request the next iteration finishes.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TAG_RECV 1u
#define TAG_INV 2u
#define TAG_SEND 3u
#define TAG_MASK 3u

struct vb_req {
  struct ibv_mw *mw;
  uint32_t rkey;
  char *buf;
  int done_flags;
  struct ibv_send_wr inv_wr;
  struct vb_req *next;
};

struct vb_dev {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct vb_req *free_reqs;
  struct vb_req *reqs;
};

static void vb_put(struct vb_dev *d, struct vb_req *r)
{
  r->next = d->free_reqs;
  d->free_reqs = r;
}

struct vb_req *vb_get(struct vb_dev *d)
{
  struct vb_req *r = d->free_reqs;

  if (r)
    d->free_reqs = r->next;
  return r;
}

static int vb_post_inv(struct vb_dev *d, struct vb_req *r)
{
  struct ibv_send_wr *bad;

  memset(&r->inv_wr, 0, sizeof(r->inv_wr));
  r->inv_wr.wr_id = (uintptr_t)r | TAG_INV;
  r->inv_wr.opcode = IBV_WR_LOCAL_INV;
  r->inv_wr.invalidate_rkey = r->rkey;
  r->inv_wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(d->qp, &r->inv_wr, &bad);
}

/* The response came without SEND_WITH_INV: invalidate locally first. */
static void vb_recv_done(struct vb_dev *d, struct vb_req *r)
{
  if (vb_post_inv(d, r))
    r->done_flags = -1; /* kept out until teardown */
}

/* The LOCAL_INV completed: the request may go back. */
static void vb_inv_done(struct vb_dev *d, struct vb_req *r, struct ibv_wc *wc)
{
  if (wc->status != IBV_WC_SUCCESS)
    return;
  vb_put(d, r);
}

int vb_poll(struct vb_dev *d)
{
  struct ibv_wc wc[16];
  int n = ibv_poll_cq(d->cq, 16, wc);

  for (int k = 0; k < n; k++) {
    struct vb_req *r = (struct vb_req *)(uintptr_t)(wc[k].wr_id & ~(uint64_t)TAG_MASK);

    switch (wc[k].wr_id & TAG_MASK) {
    case TAG_RECV:
      vb_recv_done(d, r);
      break;
    case TAG_INV:
      vb_inv_done(d, r, &wc[k]);
      break;
    }
  }
  return n;
}

/* Within one iteration it is the same request: its buffer goes back to the
 * allocator while its LOCAL_INV is still queued. */
int vb_abort_all(struct vb_dev *d, int count)
{
  for (int i = 0; i < count; i++) {
    struct vb_req *r = &d->reqs[i];

    if (vb_post_inv(d, r))
      continue;
    free(r->buf);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'free' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
    // CHECK-MESSAGES: :58:10: note: LOCAL_INV posted here
    r->buf = NULL;
  }
  return 0;
}

/* The same loop written with an untyped context (libfabric style): the
 * completion's wr_id carries a pointer the handlers cast themselves. */
#define VB_WRID_PTR(id) ((void *)(uintptr_t)((id) & ~(uint64_t)TAG_MASK))
#define VB_WRID_OP(id) ((unsigned)((id) & TAG_MASK))

int vb_poll_untyped(struct vb_dev *d)
{
  struct ibv_wc wc[16];
  int n = ibv_poll_cq(d->cq, 16, wc);

  for (int k = 0; k < n; k++) {
    void *ctx = VB_WRID_PTR(wc[k].wr_id);

    switch (VB_WRID_OP(wc[k].wr_id)) {
    case TAG_RECV:
      vb_recv_done(d, ctx);
      break;
    case TAG_INV:
      vb_inv_done(d, ctx, &wc[k]); /* another request than the one just invalidated */
      break;
    }
  }
  return n;
}

static void vb_release(struct vb_dev *d, struct vb_req *r)
{
  free(r->buf);
  r->buf = NULL;
  vb_put(d, r);
}

/* One mistake, one finding: the free right after the unawaited LOCAL_INV;
 * the helper that gives the request back is the same mistake. */
int vb_cancel(struct vb_dev *d, struct vb_req *r)
{
  if (vb_post_inv(d, r))
    return -1;
  free(r->buf);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' runs right after posting a LOCAL_INV that nothing waits for
  // CHECK-MESSAGES: :58:10: note: LOCAL_INV posted here
  r->buf = NULL;
  vb_release(d, r);
  return 0;
}
