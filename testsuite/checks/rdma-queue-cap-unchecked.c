// RUN: %check_ulplint %s rdma-queue-cap-unchecked %t
// RUN: %check_ulplint --mode=plugin %s rdma-queue-cap-unchecked %t.plugin

// Userspace QP creation with constants beyond what every device supports.

#include <infiniband/verbs.h>
#include <string.h>

#define DEMO_SQ_DEPTH 4096
#define DEMO_INLINE 256

struct demo_conn {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
};

int demo_create_qp(struct demo_conn *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = DEMO_SQ_DEPTH;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: max_send_wr = 4096 is requested without comparing it with the device's max_qp_wr; QP creation fails on devices with smaller limits (1024 is the most every RDMA device supports); clamp it to what ibv_query_device() reports [rdma-queue-cap-unchecked]
  attr.cap.max_recv_wr = 512;
  attr.cap.max_send_sge = 16;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: max_send_sge = 16 is requested without comparing it with the device's max_sge
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = DEMO_INLINE;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: max_inline_data = 256 is requested without comparing it with the inline size the device grants
  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}

/* Near miss: the same sizes, clamped to the device's limits. */
int ok_clamped(struct demo_conn *c)
{
  struct ibv_device_attr dev;
  struct ibv_qp_init_attr attr;
  unsigned int depth = DEMO_SQ_DEPTH;

  if (ibv_query_device(c->ctx, &dev))
    return -1;
  if (depth > (unsigned int)dev.max_qp_wr)
    depth = dev.max_qp_wr;
  memset(&attr, 0, sizeof(attr));
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = depth;
  attr.cap.max_recv_wr = depth;
  attr.cap.max_send_sge = dev.max_sge < 16 ? dev.max_sge : 16;
  attr.cap.max_recv_sge = 1;
  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}
