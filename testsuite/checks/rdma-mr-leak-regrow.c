// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// A time-series reader: the catalog buffer grows on demand, its old
// registration deregistered before the larger one replaces it in the
// context, which the close path releases. A READ into it that fails to
// post returns with the new registration in the context: not a leak, the
// context held one before and still does. The setup path, which registers
// into a context that held nothing, must unwind what it registered.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

struct ts_ctx {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  void *catalog;
  size_t catalog_len;
  struct ibv_mr *cat_mr;
  void *ack;
  struct ibv_mr *ack_mr;
  uint64_t raddr;
  uint32_t rkey;
};

static int ts_post_read(struct ts_ctx *ctx, void *dst, uint32_t lkey, uint32_t len)
{
  struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {0}, *bad;

  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = ctx->raddr;
  wr.wr.rdma.rkey = ctx->rkey;
  return ibv_post_send(ctx->qp, &wr, &bad);
}

static int ts_catalog_reserve(struct ts_ctx *ctx, size_t want)
{
  void *buf;

  if (want <= ctx->catalog_len)
    return 0;
  buf = malloc(want);
  if (!buf)
    return -ENOMEM;
  ibv_dereg_mr(ctx->cat_mr);
  free(ctx->catalog);
  ctx->catalog = buf;
  ctx->cat_mr = ibv_reg_mr(ctx->pd, buf, want,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!ctx->cat_mr)
    return -ENOMEM;
  ctx->catalog_len = want;
  return 0;
}

int ts_read_catalog(struct ts_ctx *ctx, size_t len)
{
  int ret = ts_catalog_reserve(ctx, len);

  if (ret)
    return ret;
  return ts_post_read(ctx, ctx->catalog, ctx->cat_mr->lkey, (uint32_t)len) ? -EIO : 0;
}

int ts_setup(struct ts_ctx *ctx, size_t len)
{
  ctx->ack = malloc(64);
  if (!ctx->ack)
    return -ENOMEM;
  ctx->ack_mr = ibv_reg_mr(ctx->pd, ctx->ack, 64, IBV_ACCESS_LOCAL_WRITE);
  if (!ctx->ack_mr)
    goto err_ack;
  ctx->catalog = malloc(len);
  if (!ctx->catalog)
    goto err_ack; /* wrong label: ack_mr stays registered */
  ctx->cat_mr = ibv_reg_mr(ctx->pd, ctx->catalog, len,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!ctx->cat_mr)
    goto err_cat;
  ctx->catalog_len = len;
  return 0;
err_cat:
  free(ctx->catalog);
  ibv_dereg_mr(ctx->ack_mr);
err_ack:
  free(ctx->ack);
  return -ENOMEM;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ibv_reg_mr' (held in ts_ctx.ack_mr){{.*}}[rdma-mr-leak]
}

void ts_close(struct ts_ctx *ctx)
{
  ibv_dereg_mr(ctx->cat_mr);
  free(ctx->catalog);
  ibv_dereg_mr(ctx->ack_mr);
  free(ctx->ack);
}
