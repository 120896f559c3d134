// RUN: %check_ulplint %s rdma-rkey-reuse %t
// RUN: %check_ulplint --mode=plugin %s rdma-rkey-reuse %t.plugin

// Userspace type-2 windows re-bound for each request.

#include <infiniband/verbs.h>
#include <stdint.h>

struct ulp_conn {
  struct ibv_qp_ex *qpx;
  struct ibv_qp *qp;
  struct ibv_mw *mw;
  struct ibv_mr *mr;
};

void ulp_expose(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mw_bind_info info = {
      .mr = c->mr, .addr = (uintptr_t)buf, .length = len,
      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};

  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, c->mw, c->mw->rkey, &info);
  // CHECK-MESSAGES: :[[@LINE-1]]:33: warning: memory window re-bound without a new key; pass ibv_inc_rkey(c->mw->rkey) so a peer holding the old rkey loses access [rdma-rkey-reuse]
  // CHECK-FIXES: ibv_wr_bind_mw(c->qpx, c->mw, ibv_inc_rkey(c->mw->rkey), &info);
  ibv_wr_complete(c->qpx);
}

int ulp_expose_wr(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_send_wr wr = {0}, *bad;

  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = c->mw;
  wr.bind_mw.rkey = c->mw->rkey;
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: memory window re-bound without a new key
  // CHECK-FIXES: wr.bind_mw.rkey = ibv_inc_rkey(c->mw->rkey);
  wr.bind_mw.bind_info.mr = c->mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)buf;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  return ibv_post_send(c->qp, &wr, &bad);
}

/* Near miss: the new key computed from ibv_inc_rkey, through a local. */
void ok_expose(struct ulp_conn *c, void *buf, size_t len)
{
  uint32_t rkey = ibv_inc_rkey(c->mw->rkey);
  struct ibv_mw_bind_info info = {
      .mr = c->mr, .addr = (uintptr_t)buf, .length = len,
      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};

  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, c->mw, rkey, &info);
  ibv_wr_complete(c->qpx);
}
