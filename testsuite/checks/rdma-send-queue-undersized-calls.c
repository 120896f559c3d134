// RUN: %check_ulplint --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DRC_SQ=256
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DRC_SQ=384
// RUN: %check_ulplint --mode=plugin --check-suffixes=SMALL %s rdma-send-queue-undersized %t.plugin -- -- -DRC_SQ=256

// An RPC client with a fixed table of calls (`struct rc_call calls[128]`):
// each call binds a memory window over its reply buffer and chains the
// call SEND behind the bind in the call's own struct; the reply handler
// posts a LOCAL_INV for the window. The queue is a plain number: 128 calls
// in flight need 384 entries; the SMALL run asks for 256.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

#define RC_CALLS 128

struct rc_call {
  struct ibv_mw *mw;
  struct ibv_mr *reply_mr;
  struct ibv_sge sge;
  struct ibv_send_wr bind_wr;
  struct ibv_send_wr send_wr;
  struct ibv_send_wr inv_wr;
  void *reply;
  uint32_t reply_len;
};

struct rc_client {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *msg_mr;
  struct rc_call calls[RC_CALLS];
};

int rc_connect(struct rc_client *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = RC_SQ;
  // CHECK-MESSAGES-SMALL: :[[@LINE-1]]:3: warning: each request posts up to 3 WRs (BIND_MW, SEND, LOCAL_INV) and up to 128 requests can be in flight, 384 entries, but max_send_wr is RC_SQ; the send queue overflows and posts fail [rdma-send-queue-undersized]
  attr.cap.max_recv_wr = RC_CALLS;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}

int rc_call_start(struct rc_client *c, struct rc_call *call)
{
  struct ibv_send_wr *bad;

  memset(&call->bind_wr, 0, sizeof(call->bind_wr));
  call->bind_wr.opcode = IBV_WR_BIND_MW;
  call->bind_wr.bind_mw.mw = call->mw;
  call->bind_wr.bind_mw.rkey = ibv_inc_rkey(call->mw->rkey);
  call->bind_wr.bind_mw.bind_info.mr = call->reply_mr;
  call->bind_wr.bind_mw.bind_info.addr = (uintptr_t)call->reply;
  call->bind_wr.bind_mw.bind_info.length = call->reply_len;
  call->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  call->bind_wr.next = &call->send_wr;

  call->sge.lkey = c->msg_mr->lkey;
  memset(&call->send_wr, 0, sizeof(call->send_wr));
  call->send_wr.opcode = IBV_WR_SEND;
  call->send_wr.sg_list = &call->sge;
  call->send_wr.num_sge = 1;
  call->send_wr.next = NULL;
  return ibv_post_send(c->qp, &call->bind_wr, &bad);
}

int rc_call_reply(struct rc_client *c, struct rc_call *call)
{
  struct ibv_send_wr *bad;

  memset(&call->inv_wr, 0, sizeof(call->inv_wr));
  call->inv_wr.opcode = IBV_WR_LOCAL_INV;
  call->inv_wr.invalidate_rkey = call->mw->rkey;
  call->inv_wr.next = NULL;
  return ibv_post_send(c->qp, &call->inv_wr, &bad);
}
