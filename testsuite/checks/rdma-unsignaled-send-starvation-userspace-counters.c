// RUN: %check_ulplint %s rdma-unsignaled-send-starvation %t
// RUN: %check_ulplint --mode=plugin %s rdma-unsignaled-send-starvation %t.plugin

// Signal intervals in userspace: a benchmark whose work requests are built
// once in a setup helper and signaled one in cq_mod, a replication daemon
// that acknowledges through rdma_post_send() with a flags argument, and a
// sender on the extended QP API (qpx->wr_flags). Each counts posts since
// the last signaled one; in the buggy ones the counter is only ever reset.
// Near misses: the counter that moves, and a test that signals on either
// of two conditions when one of them works.

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>
#include <stdlib.h>

#define ACK_SIG_EVERY 16

struct bench_params {
  int iters;
  int cq_mod;
  int tx_depth;
};

struct bench_ctx {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct ibv_send_wr wr;
  struct ibv_sge sge;
  uint32_t since_sig; /* posts since the last signaled one */
  uint32_t sent_unsig;
  uint64_t scnt, ccnt;
};

static struct ibv_qp *bench_create_qp(struct ibv_pd *pd, struct ibv_cq *cq,
                                      struct bench_params *p) {
  struct ibv_qp_init_attr attr = {
      .send_cq = cq,
      .recv_cq = cq,
      .qp_type = IBV_QPT_RC,
      .sq_sig_all = 0,
      .cap = {.max_send_wr = 128, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
  };
  return ibv_create_qp(pd, &attr);
}

void bench_parse(struct bench_params *p, char **argv) {
  p->iters = atoi(argv[1]);
  p->cq_mod = atoi(argv[2]); /* set once: a limit, not a counter */
  p->tx_depth = 128;
}

static void bench_set_wqes(struct bench_ctx *ctx, void *buf, uint32_t lkey) {
  ctx->sge.addr = (uintptr_t)buf;
  ctx->sge.length = 64;
  ctx->sge.lkey = lkey;
  ctx->wr.sg_list = &ctx->sge;
  ctx->wr.num_sge = 1;
  ctx->wr.opcode = IBV_WR_SEND;
  ctx->wr.send_flags = 0;
  ctx->since_sig = 0;
  ctx->sent_unsig = 0;
}

/* Positive: since_sig is reset when it signals and never counted up. */
int bench_run_bw(struct bench_ctx *ctx, struct bench_params *p) {
  struct ibv_send_wr *bad;

  while (ctx->scnt < (uint64_t)p->iters) {
    if (ctx->since_sig == (uint32_t)p->cq_mod - 1) {
      // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: signaling depends on 'ctx->since_sig', which nothing in the program changes
      ctx->wr.send_flags |= IBV_SEND_SIGNALED;
      ctx->since_sig = 0;
    } else {
      ctx->wr.send_flags &= ~IBV_SEND_SIGNALED;
    }
    if (ibv_post_send(ctx->qp, &ctx->wr, &bad))
      return -1;
    ctx->scnt++;
  }
  return 0;
}

/* Near-miss: the same loop with the counter moving. */
int bench_run_lat(struct bench_ctx *ctx, struct bench_params *p) {
  struct ibv_send_wr *bad;

  while (ctx->scnt < (uint64_t)p->iters) {
    if (++ctx->sent_unsig >= (uint32_t)p->cq_mod) {
      ctx->wr.send_flags |= IBV_SEND_SIGNALED;
      ctx->sent_unsig = 0;
    } else {
      ctx->wr.send_flags &= ~IBV_SEND_SIGNALED;
    }
    if (ibv_post_send(ctx->qp, &ctx->wr, &bad))
      return -1;
    ctx->scnt++;
  }
  return 0;
}

struct ls_conn {
  struct rdma_cm_id *id;
  struct ibv_mr *send_mr;
  char ack[64];
  uint32_t acks_unsig;
  uint32_t credits_unsig;
  int credits;
};

/* Positive: the flags go to rdma_post_send() as an argument; acks_unsig
   is reset here and nowhere counted. */
int ls_send_ack(struct ls_conn *c) {
  int flags = IBV_SEND_INLINE;

  if (c->acks_unsig >= ACK_SIG_EVERY) {
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: signaling depends on 'c->acks_unsig', which nothing in the program goes up
    flags |= IBV_SEND_SIGNALED;
    c->acks_unsig = 0;
  }
  return rdma_post_send(c->id, NULL, c->ack, sizeof(c->ack), c->send_mr, flags);
}

/* Near-miss: signaled when credits run out or every ACK_SIG_EVERY posts;
   the counter is never moved, but the credit test alone lets it run. */
int ls_send_credit(struct ls_conn *c) {
  int flags = IBV_SEND_INLINE;

  c->credits--;
  if (c->credits <= 0 || c->credits_unsig >= ACK_SIG_EVERY) {
    flags |= IBV_SEND_SIGNALED;
    c->credits_unsig = 0;
  }
  return rdma_post_send(c->id, NULL, c->ack, sizeof(c->ack), c->send_mr, flags);
}

struct umr_conn {
  struct ibv_qp *qp;
  struct ibv_qp_ex *qpx;
  unsigned unsignaled;
};

/* Positive: on the extended API the decision is a store to wr_flags. */
int umr_send(struct umr_conn *c, void *msg, size_t len, uint64_t id) {
  ibv_wr_start(c->qpx);
  c->qpx->wr_id = id;
  c->qpx->wr_flags = IBV_SEND_INLINE;
  if (c->unsignaled >= ACK_SIG_EVERY) {
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: signaling depends on 'c->unsignaled', which nothing in the program goes up
    c->qpx->wr_flags |= IBV_SEND_SIGNALED;
    c->unsignaled = 0;
  }
  ibv_wr_send(c->qpx);
  ibv_wr_set_inline_data(c->qpx, msg, len);
  return ibv_wr_complete(c->qpx);
}

int umr_setup(struct umr_conn *c, struct ibv_context *ctx, struct ibv_pd *pd,
              struct ibv_cq *cq) {
  struct ibv_qp_init_attr_ex attr = {
      .send_cq = cq,
      .recv_cq = cq,
      .qp_type = IBV_QPT_RC,
      .sq_sig_all = 0,
      .cap = {.max_send_wr = 64, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
              .max_inline_data = 64},
      .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
      .pd = pd,
      .send_ops_flags = IBV_QP_EX_WITH_SEND,
  };
  c->qp = ibv_create_qp_ex(ctx, &attr);
  if (!c->qp)
    return -1;
  c->qpx = ibv_qp_to_qp_ex(c->qp);
  c->unsignaled = 0;
  return 0;
}

// A call's chain in an array of WRs (BIND_MW, then SEND) filled by prep
// helpers: the SEND's signaling is decided in rpc_prep_send() on a counter
// that is only ever reset (the statistics counter goes up instead).
enum { RPC_WR_BIND, RPC_WR_SEND, RPC_NR_WR };
#define RPC_SIGNAL_EVERY 16

struct rpc_conn {
  struct ibv_qp *qp;
  unsigned unsignaled;
  unsigned long tx;
};

struct rpc_req {
  struct ibv_send_wr wr[RPC_NR_WR];
  struct ibv_sge sge;
  struct ibv_mw *mw;
  uint32_t mw_key;
};

static void rpc_prep_bind(struct rpc_req *req, uint32_t key)
{
  struct ibv_send_wr *wr = &req->wr[RPC_WR_BIND];

  memset(wr, 0, sizeof(*wr));
  wr->opcode = IBV_WR_BIND_MW;
  wr->bind_mw.mw = req->mw;
  wr->bind_mw.rkey = key;
  wr->next = &req->wr[RPC_WR_SEND];
  req->mw_key = key;
}

static void rpc_prep_send(struct rpc_conn *c, struct rpc_req *req)
{
  struct ibv_send_wr *wr = &req->wr[RPC_WR_SEND];

  memset(wr, 0, sizeof(*wr));
  wr->opcode = IBV_WR_SEND;
  wr->sg_list = &req->sge;
  wr->num_sge = 1;
  wr->send_flags = IBV_SEND_INLINE;
  if (c->unsignaled >= RPC_SIGNAL_EVERY) {
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: signaling depends on 'c->unsignaled', which nothing in the program goes up{{.*}}[rdma-unsignaled-send-starvation]
    wr->send_flags |= IBV_SEND_SIGNALED;
    c->unsignaled = 0;
  }
  c->tx++;
}

int rpc_call(struct rpc_conn *c, struct rpc_req *req)
{
  struct ibv_send_wr *bad;

  rpc_prep_bind(req, ibv_inc_rkey(req->mw_key));
  rpc_prep_send(c, req);
  return ibv_post_send(c->qp, &req->wr[RPC_WR_BIND], &bad);
}
