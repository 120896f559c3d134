// RUN: %check_ulplint --check-suffixes=NEVER %s rdma-unsignaled-send-starvation %t.never -- -- -DDEMO_NEVER
// RUN: %check_ulplint --check-suffixes=STUCK %s rdma-unsignaled-send-starvation %t.stuck -- -- -DDEMO_STUCK
// RUN: %check_ulplint %s rdma-unsignaled-send-starvation %t.ok
// RUN: %check_ulplint --mode=plugin --check-suffixes=NEVER %s rdma-unsignaled-send-starvation %t.plugin -- -- -DDEMO_NEVER

// A userspace sender that signals every 16th SEND (the correct default run),
// one that never signals (NEVER), and one whose counter is never advanced
// (STUCK).

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

#define DEMO_SIGNAL_EVERY 16

struct demo_conn {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  unsigned int unsignaled;
  unsigned int depth;
};

int demo_conn_create(struct demo_conn *c)
{
  struct ibv_qp_init_attr attr = {
      .send_cq = c->cq,
      .recv_cq = c->cq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1},
      .sq_sig_all = 0,
      // CHECK-MESSAGES-NEVER: :[[@LINE-1]]:21: warning: only work requests that ask for it are signaled on this QP, but no post on it sets IBV_SEND_SIGNALED; completed send-queue entries are never reclaimed and posts fail once the queue fills [rdma-unsignaled-send-starvation]
      // CHECK-MESSAGES-NEVER: :[[@LINE+30]]:10: note: posted unsignaled here
  };

  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}

int demo_send(struct demo_conn *c, void *buf, uint32_t len)
{
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = c->mr->lkey};
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
#if defined(DEMO_NEVER)
  wr.send_flags = IBV_SEND_INLINE;
#elif defined(DEMO_STUCK)
  if (c->unsignaled >= DEMO_SIGNAL_EVERY) {
    // CHECK-MESSAGES-STUCK: :[[@LINE-1]]:7: warning: signaling depends on 'c->unsignaled', which nothing in the program goes up; the signaled branch never runs and the send queue is never reclaimed [rdma-unsignaled-send-starvation]
    wr.send_flags = IBV_SEND_SIGNALED;
    c->unsignaled = 0;
  }
#else
  if (++c->unsignaled >= DEMO_SIGNAL_EVERY) {
    wr.send_flags = IBV_SEND_SIGNALED;
    c->unsignaled = 0;
  }
#endif
  return ibv_post_send(c->qp, &wr, &bad);
}
