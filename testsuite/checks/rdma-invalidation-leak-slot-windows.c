// RUN: %check_ulplint %s rdma-invalidation-leak,rdma-unmap-before-invalidate %t

// A receiver that offers chunk slots of one ring to its sender, each
// through a type 2 window; at the end it invalidates every busy slot's
// window through a helper handed &ctx->slots[i] and frees the ring. The
// helper invalidates another slot each time round, so the loop leaves
// every window's invalidation posted.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NSLOTS 8
#define SLOT_SIZE 65536

struct xslot {
  struct ibv_mw *mw;
  uint32_t rkey;
  int busy;
};

struct xctx {
  struct ibv_qp *qp;
  struct ibv_mr *ring_mr;
  char *ring;
  struct xslot slots[NSLOTS];
  uint32_t credit_rkey;
};

int x_send_credit(struct xctx *ctx, int slot, uint32_t rkey);

static int x_bind(struct xctx *ctx, int i)
{
  struct xslot *s = &ctx->slots[i];
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = s->mw;
  s->rkey = ibv_inc_rkey(s->rkey);
  wr.bind_mw.rkey = s->rkey;
  wr.bind_mw.bind_info.mr = ctx->ring_mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)ctx->ring + (size_t)i * SLOT_SIZE;
  wr.bind_mw.bind_info.length = SLOT_SIZE;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  return ibv_post_send(ctx->qp, &wr, &bad);
}

int x_offer(struct xctx *ctx, int i)
{
  if (x_bind(ctx, i))
    return -1;
  ctx->slots[i].busy = 1;
  return x_send_credit(ctx, i, ctx->slots[i].rkey);
}

static int x_local_inv(struct xctx *ctx, struct xslot *s, unsigned int flags)
{
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = s->rkey;
  wr.send_flags = flags;
  return ibv_post_send(ctx->qp, &wr, &bad);
}

/* Invalidates every busy slot's window and waits for the completions. */
int x_finish(struct xctx *ctx, struct ibv_cq *cq)
{
  struct ibv_wc wc;
  int posted = 0;

  for (int i = 0; i < NSLOTS; i++) {
    if (!ctx->slots[i].busy)
      continue;
    if (x_local_inv(ctx, &ctx->slots[i], IBV_SEND_SIGNALED))
      return -1;
    posted++;
  }
  while (posted > 0) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0)
      return -1;
    if (n > 0 && wc.status != IBV_WC_SUCCESS)
      return -1;
    posted -= n;
  }
  return 0;
}

/* The same without waiting. */
void x_finish_nowait(struct xctx *ctx)
{
  for (int i = 0; i < NSLOTS; i++)
    if (ctx->slots[i].busy)
      x_local_inv(ctx, &ctx->slots[i], 0);
}

void x_release_ring(struct xctx *ctx)
{
  ibv_dereg_mr(ctx->ring_mr);
  free(ctx->ring);
}

/* Every busy window was invalidated and the invalidations completed. */
int x_run(struct xctx *ctx, struct ibv_cq *cq)
{
  for (int i = 0; i < NSLOTS; i++)
    if (x_offer(ctx, i))
      break;
  if (x_finish(ctx, cq))
    return -1; /* the ring stays: the windows may still be bound */
  x_release_ring(ctx);
  return 0;
}

/* The invalidations may still be queued when the ring goes. */
void x_run_nowait(struct xctx *ctx)
{
  for (int i = 0; i < NSLOTS; i++)
    if (x_offer(ctx, i))
      break;
  x_finish_nowait(ctx);
  x_release_ring(ctx);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'x_release_ring' runs right after posting {{.*}}LOCAL_INV{{.*}}[rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :66:10: note: LOCAL_INV posted here
}

/* No invalidation at all. */
void x_run_abort(struct xctx *ctx)
{
  for (int i = 0; i < NSLOTS; i++)
    if (x_offer(ctx, i))
      break;
  x_release_ring(ctx);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'x_release_ring' releases the memory behind a memory window whose rkey is still valid for the peer{{.*}}[rdma-invalidation-leak]
}
