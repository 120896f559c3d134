// RUN: %check_ulplint --check-suffixes=UNGATED %s rdma-send-queue-undersized %t.ungated -- -- -DPF_GATED=0
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DPF_GATED=1
// RUN: %check_ulplint --mode=plugin --check-suffixes=UNGATED %s rdma-send-queue-undersized %t.plugin -- -- -DPF_GATED=0

// A perftest-style bandwidth loop: each post is a list of PF_POST_LIST
// WRITEs linked to each other, and the send queue holds tx_depth entries.
// Gated, the loop posts only while what is in flight plus the next list
// fits the depth the QP was created with (`scnt - ccnt + post_list <=
// tx_depth`), so the queue never overflows whatever one list costs.
// Ungated, the loop keeps posting lists of eight against one entry per
// request.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

#define PF_POST_LIST 8

struct pf_param {
  unsigned tx_depth;
  unsigned iters;
};

struct pf_ctx {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  struct ibv_sge sge[PF_POST_LIST];
  struct ibv_send_wr wr[PF_POST_LIST];
  uint64_t scnt, ccnt;
};

int pf_create_qp(struct pf_ctx *ctx, struct pf_param *p)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = ctx->cq;
  attr.recv_cq = ctx->cq;
  attr.sq_sig_all = 0;
  attr.cap.max_send_wr = p->tx_depth;
  // CHECK-MESSAGES-UNGATED: :[[@LINE-1]]:3: warning: each request posts up to 8 WRs {{.*}}[rdma-send-queue-undersized]
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  ctx->qp = ibv_create_qp(ctx->pd, &attr);
  return ctx->qp ? 0 : -1;
}

static void pf_build(struct pf_ctx *ctx, uint64_t raddr, uint32_t rkey)
{
  int i;

  for (i = 0; i < PF_POST_LIST; i++) {
    ctx->sge[i].addr = (uintptr_t)ctx->mr->addr;
    ctx->sge[i].length = 4096;
    ctx->sge[i].lkey = ctx->mr->lkey;
    ctx->wr[i].opcode = IBV_WR_RDMA_WRITE;
    ctx->wr[i].sg_list = &ctx->sge[i];
    ctx->wr[i].num_sge = 1;
    ctx->wr[i].wr.rdma.remote_addr = raddr;
    ctx->wr[i].wr.rdma.rkey = rkey;
    ctx->wr[i].send_flags = i == PF_POST_LIST - 1 ? IBV_SEND_SIGNALED : 0;
    ctx->wr[i].next = i < PF_POST_LIST - 1 ? &ctx->wr[i + 1] : NULL;
  }
}

int pf_run(struct pf_ctx *ctx, struct pf_param *p, uint64_t raddr, uint32_t rkey)
{
  struct ibv_send_wr *bad;
  struct ibv_wc wc[16];
  int n;

  pf_build(ctx, raddr, rkey);
  while (ctx->scnt < p->iters || ctx->ccnt < p->iters) {
#if PF_GATED
    while (ctx->scnt < p->iters &&
           ctx->scnt - ctx->ccnt + PF_POST_LIST <= p->tx_depth) {
#else
    while (ctx->scnt < p->iters) {
#endif
      if (ibv_post_send(ctx->qp, ctx->wr, &bad))
        return -1;
      ctx->scnt += PF_POST_LIST;
    }
    n = ibv_poll_cq(ctx->cq, 16, wc);
    if (n < 0)
      return -1;
    ctx->ccnt += (uint64_t)n * PF_POST_LIST;
  }
  return 0;
}
