// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak,rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak,rdma-mr-leak %t.plugin

// An initiator whose poll loop hands each completion to one handler, which
// finds the request from wr_id itself (SPDK style). The request the handler
// finishes in one round is not the one whose LOCAL_INV the previous round
// posted; the connection the loop passes along is the same every round.

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CONTAINER_OF(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

enum nr_wr_type { NR_WR_SEND, NR_WR_INV, NR_WR_RECV };

struct nr_wr {
  enum nr_wr_type type;
};

struct nr_req {
  struct ibv_mw *mw;
  uint32_t rkey;
  char *payload;
  int bound;
  struct nr_wr send_wr_ctx;
  struct nr_wr inv_wr_ctx;
  struct ibv_send_wr inv_wr;
  struct nr_req *next;
};

struct nr_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct nr_req *free_reqs;
  struct nr_req *reqs;
  char *log_buf;
  size_t log_len;
  struct ibv_mr *log_mr;
};

static void nr_req_put(struct nr_conn *c, struct nr_req *r)
{
  free(r->payload);
  r->payload = NULL;
  r->next = c->free_reqs;
  c->free_reqs = r;
}

static int nr_post_inv(struct nr_conn *c, struct nr_req *r, unsigned int flags)
{
  struct ibv_send_wr *bad;

  memset(&r->inv_wr, 0, sizeof(r->inv_wr));
  r->inv_wr.wr_id = (uintptr_t)&r->inv_wr_ctx;
  r->inv_wr.opcode = IBV_WR_LOCAL_INV;
  r->inv_wr.invalidate_rkey = r->rkey;
  r->inv_wr.send_flags = flags;
  return ibv_post_send(c->qp, &r->inv_wr, &bad);
}

/* Grown on demand; the old registration goes first. */
static int nr_grow_log(struct nr_conn *c, size_t want)
{
  char *buf;

  if (want <= c->log_len)
    return 0;
  if (c->log_mr) {
    ibv_dereg_mr(c->log_mr);
    c->log_mr = NULL;
  }
  buf = realloc(c->log_buf, want);
  if (!buf)
    return -1;
  c->log_buf = buf;
  c->log_mr = ibv_reg_mr(c->pd, buf, want, IBV_ACCESS_LOCAL_WRITE);
  if (!c->log_mr)
    return -1;
  c->log_len = want;
  return 0;
}

static void nr_handle_wc(struct nr_conn *c, struct ibv_wc *wc)
{
  struct nr_wr *ctx = (struct nr_wr *)(uintptr_t)wc->wr_id;
  struct nr_req *r;

  switch (ctx->type) {
  case NR_WR_RECV:
    r = CONTAINER_OF(ctx, struct nr_req, send_wr_ctx);
    nr_grow_log(c, wc->byte_len);
    /* no SEND_WITH_INV from this target: invalidate, finish on completion */
    if (r->bound && nr_post_inv(c, r, IBV_SEND_SIGNALED))
      r->bound = -1; /* stays out until the connection is torn down */
    break;
  case NR_WR_INV:
    r = CONTAINER_OF(ctx, struct nr_req, inv_wr_ctx);
    if (wc->status != IBV_WC_SUCCESS)
      break;
    r->bound = 0;
    nr_req_put(c, r);
    break;
  default:
    break;
  }
}

/* Each round hands another completion, so another request, to the handler. */
int nr_poll(struct nr_conn *c)
{
  struct ibv_wc wc[16];
  int n = ibv_poll_cq(c->cq, 16, wc);

  for (int i = 0; i < n; i++)
    nr_handle_wc(c, &wc[i]);
  return n;
}

/* The same, one completion at a time. */
int nr_poll_one_by_one(struct nr_conn *c)
{
  struct ibv_wc wc;
  int n = 0;

  while (ibv_poll_cq(c->cq, 1, &wc) > 0) {
    nr_handle_wc(c, &wc);
    n++;
  }
  return n;
}

/* Cancel path written without waiting: still the same request. */
static void nr_cancel(struct nr_conn *c, struct nr_req *r)
{
  if (nr_post_inv(c, r, 0))
    return;
  nr_req_put(c, r);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'nr_req_put' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :62:10: note: LOCAL_INV posted here
}

int nr_cancel_all(struct nr_conn *c, int depth)
{
  for (int i = 0; i < depth; i++)
    if (c->reqs[i].bound > 0)
      nr_cancel(c, &c->reqs[i]);
  return 0;
}
