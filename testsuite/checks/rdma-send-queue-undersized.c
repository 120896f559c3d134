// RUN: %check_ulplint --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DDEMO_SQ_FACTOR=1
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DDEMO_SQ_FACTOR=2
// RUN: %check_ulplint --mode=plugin --check-suffixes=SMALL %s rdma-send-queue-undersized %t.plugin -- -- -DDEMO_SQ_FACTOR=1

// Userspace with the extended post API: each request sends its command,
// and the response handler invalidates the buffer's rkey. Two send-queue
// entries per request; the SMALL run reserves one.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct demo_conn {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_qp_ex *qpx;
  uint32_t depth;
  struct ibv_mr *msg_mr;
};

struct demo_req {
  struct demo_conn *conn;
  struct ibv_mr *mr;
  void *cmd;
  uint32_t cmd_len;
};

int demo_conn_create(struct demo_conn *c)
{
  struct ibv_qp_init_attr_ex attr;

  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.pd = c->pd;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
  attr.cap.max_send_wr = DEMO_SQ_FACTOR * c->depth;
  // CHECK-MESSAGES-SMALL: :[[@LINE-1]]:3: warning: each request posts up to 2 WRs (SEND, LOCAL_INV) but max_send_wr is 1*c->depth; with c->depth requests in flight the send queue overflows and posts fail [rdma-send-queue-undersized]
  // CHECK-MESSAGES-SMALL: :[[@LINE+20]]:3: note: work request built here
  // CHECK-MESSAGES-SMALL: :[[@LINE+31]]:3: note: work request built here
  attr.cap.max_recv_wr = c->depth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.sq_sig_all = 1;
  c->qp = ibv_create_qp_ex(c->ctx, &attr);
  if (!c->qp)
    return -1;
  c->qpx = ibv_qp_to_qp_ex(c->qp);
  return 0;
}

int demo_submit(struct demo_req *req)
{
  struct ibv_qp_ex *qpx = req->conn->qpx;

  ibv_wr_start(qpx);
  qpx->wr_id = (uintptr_t)req;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, req->conn->msg_mr->lkey, (uintptr_t)req->cmd, req->cmd_len);
  return ibv_wr_complete(qpx);
}

int demo_response(struct demo_req *req)
{
  struct ibv_qp_ex *qpx = req->conn->qpx;

  ibv_wr_start(qpx);
  qpx->wr_id = (uintptr_t)req;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_local_inv(qpx, req->mr->rkey);
  return ibv_wr_complete(qpx);
}
