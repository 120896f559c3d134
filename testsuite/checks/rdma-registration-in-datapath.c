// RUN: %check_ulplint %s rdma-registration-in-datapath %t -- -- -I%srcroot/regcore/include
// RUN: %check_ulplint --mode=plugin %s rdma-registration-in-datapath %t.plugin -- -- -I%srcroot/regcore/include

// A userspace ULP half way to regcore: the connection already has a core,
// but some paths still register per I/O.

#include <errno.h>
#include <infiniband/verbs.h>
#include <regcore/regcore.h>
#include <stdint.h>
#include <string.h>

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct regcore *core;
  char *ring;
  struct ibv_mr *ring_mr;
};

struct ulp_req {
  struct ulp_conn *conn;
  void *buf;
  size_t len;
  struct ibv_mr *mr;        /* registered by ulp_map_req() */
  struct ibv_sge sge;
  struct ibv_send_wr wr;
};

struct ulp_cached_buf {
  void *data;
  size_t len;
  struct ibv_mr *mr;        /* registered on first use, then kept */
};

/* 1. A small SEND registers its buffer, posts, and deregisters: every call
 * enters the kernel twice. The handle is a local: the fix-it rewrites it. */
int ulp_send_small(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_send_wr wr, *bad;
  struct ibv_sge sge;
  struct ibv_mr *mr;
  int ret;

  mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: 'ibv_reg_mr' runs once per I/O: 'ulp_send_small' posts work requests (ibv_post_send); registration enters the kernel and pins the pages on every I/O; use regcore_mr_get/regcore_mr_put (the registration cache) [rdma-registration-in-datapath]
  // CHECK-MESSAGES: :[[@LINE+15]]:9: note: 'ulp_send_small' posts work requests (ibv_post_send) here
  // CHECK-FIXES: struct regcore_mr *mr;
  // CHECK-FIXES: regcore_mr_get(c->core, buf, len, IBV_ACCESS_LOCAL_WRITE, &mr);
  if (!mr)
    return -errno;
  sge.addr = (uintptr_t)buf;
  sge.length = (uint32_t)len;
  sge.lkey = mr->lkey;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  /* The completion is reaped synchronously by the caller's loop; the
   * example deregisters right away for brevity. */
  ret = ibv_post_send(c->qp, &wr, &bad);
  ibv_dereg_mr(mr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ibv_dereg_mr' runs once per I/O: 'ulp_send_small' posts work requests (ibv_post_send); deregistration enters the kernel and unpins the pages on every I/O
  // CHECK-MESSAGES: :[[@LINE-3]]:9: note: 'ulp_send_small' posts work requests (ibv_post_send) here
  // CHECK-FIXES: regcore_mr_put(c->core, mr);
  return ret;
}

/* 2. A helper of the submit path registers into the request: per I/O too.
 * The handle is a struct field, so the rewrite is offered on a note. */
static int ulp_map_req(struct ulp_req *req)
{
  struct ulp_conn *c = req->conn;

  req->mr = ibv_reg_mr(c->pd, req->buf, req->len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'ibv_reg_mr' runs once per I/O: it is called from 'ulp_submit', which posts work requests (ibv_post_send)
  // CHECK-MESSAGES: :[[@LINE+16]]:10: note: 'ulp_submit' posts work requests (ibv_post_send) here
  // CHECK-MESSAGES: :[[@LINE-3]]:13: note: the handle is a struct field: this rewrite changes its type and every use in this file
  if (!req->mr)
    return -errno;
  req->sge.addr = (uintptr_t)req->buf;
  req->sge.length = (uint32_t)req->len;
  req->sge.lkey = req->mr->lkey;
  return 0;
}

int ulp_submit(struct ulp_req *req)
{
  struct ibv_send_wr *bad;

  if (ulp_map_req(req))
    return -EIO;
  return ibv_post_send(req->conn->qp, &req->wr, &bad);
}

/* 3. The completion handler deregisters: per I/O. */
void ulp_handle_wc(struct ulp_conn *c, struct ibv_wc *wc)
{
  struct ulp_req *req = (struct ulp_req *)(uintptr_t)wc->wr_id;

  (void)c;
  ibv_dereg_mr(req->mr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ibv_dereg_mr' runs once per I/O: 'ulp_handle_wc' handles completions; deregistration enters the kernel
  // CHECK-MESSAGES: :[[@LINE-7]]:6: note: 'ulp_handle_wc' handles completions here
  req->mr = NULL;
}

/* Near misses. */

/* Setup registers the receive ring once; posting receives is not the
 * per-I/O send path. */
int ulp_conn_setup(struct ulp_conn *c, size_t ring_bytes)
{
  struct ibv_recv_wr wr, *bad;
  struct ibv_sge sge;

  c->ring_mr = ibv_reg_mr(c->pd, c->ring, ring_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!c->ring_mr)
    return -errno;
  sge.addr = (uintptr_t)c->ring;
  sge.length = (uint32_t)ring_bytes;
  sge.lkey = c->ring_mr->lkey;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(c->qp, &wr, &bad);
}

/* Registered on first use and kept: a cache of its own. */
int ulp_send_cached(struct ulp_conn *c, struct ulp_cached_buf *b)
{
  struct ibv_send_wr wr, *bad;
  struct ibv_sge sge;

  if (!b->mr) {
    b->mr = ibv_reg_mr(c->pd, b->data, b->len, IBV_ACCESS_LOCAL_WRITE);
    if (!b->mr)
      return -errno;
  }
  sge.addr = (uintptr_t)b->data;
  sge.length = (uint32_t)b->len;
  sge.lkey = b->mr->lkey;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(c->qp, &wr, &bad);
}

/* Already on the registration cache. */
int ulp_send_via_cache(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_send_wr wr, *bad;
  struct ibv_sge sge;
  struct regcore_mr *mr;
  int ret;

  ret = regcore_mr_get(c->core, buf, len, IBV_ACCESS_LOCAL_WRITE, &mr);
  if (ret)
    return ret;
  sge.addr = (uintptr_t)buf;
  sge.length = (uint32_t)len;
  sge.lkey = mr->lkey;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  ret = ibv_post_send(c->qp, &wr, &bad);
  regcore_mr_put(c->core, mr);
  return ret;
}

/* The login buffer belongs to the connection (the struct holds its QP):
 * it is freed once, when the login phase ends, even though a completion
 * triggers that. */
struct ulp_login_conn {
  struct ibv_qp *qp;
  struct ibv_mr *login_mr;
  int full_feature;
};

static void ulp_free_login(struct ulp_login_conn *lc)
{
  if (lc->login_mr)
    ibv_dereg_mr(lc->login_mr);
  lc->login_mr = NULL;
}

void ulp_login_wc(struct ulp_login_conn *lc, struct ibv_wc *wc)
{
  if (wc->opcode == IBV_WC_RECV && !lc->full_feature) {
    lc->full_feature = 1;
    ulp_free_login(lc);
  }
}

/* Near miss: a registration cache. The sender looks for a registration of
 * the buffer first and registers (evicting a victim) only on a miss. */
#define ULP_RCACHE_SLOTS 8

struct ulp_rcache_entry {
  const void *buf;
  size_t len;
  struct ibv_mr *mr;
};

struct ulp_rcache_ep {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ulp_rcache_entry slots[ULP_RCACHE_SLOTS];
  unsigned int next;
};

static struct ibv_mr *ulp_rcache_get(struct ulp_rcache_ep *ep, const void *buf,
                                     size_t len)
{
  struct ulp_rcache_entry *e;
  unsigned int i;

  for (i = 0; i < ULP_RCACHE_SLOTS; i++) {
    e = &ep->slots[i];
    if (e->mr && e->buf == buf && e->len >= len)
      return e->mr;
  }
  e = &ep->slots[ep->next++ % ULP_RCACHE_SLOTS];
  if (e->mr)
    ibv_dereg_mr(e->mr);
  e->buf = buf;
  e->len = len;
  e->mr = ibv_reg_mr(ep->pd, (void *)buf, len, IBV_ACCESS_LOCAL_WRITE);
  return e->mr;
}

int ulp_rcache_send(struct ulp_rcache_ep *ep, const void *buf, size_t len)
{
  struct ibv_mr *mr = ulp_rcache_get(ep, buf, len);
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = (uint32_t)len};
  struct ibv_send_wr wr = {0}, *bad;

  if (!mr)
    return -errno;
  sge.lkey = mr->lkey;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_send(ep->qp, &wr, &bad);
}

/* Near miss: a session function registers its two message buffers once,
 * then echoes in a loop; only the loop is per I/O. */
int ulp_echo_session(struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_cq *cq,
                     char *msg, size_t len, int rounds)
{
  struct ibv_mr *mr = ibv_reg_mr(pd, msg, len, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_sge sge;
  struct ibv_send_wr wr, *bad;
  struct ibv_wc wc;
  int ret = 0;

  if (!mr)
    return -errno;
  while (rounds--) {
    memset(&wr, 0, sizeof(wr));
    sge.addr = (uintptr_t)msg;
    sge.length = (uint32_t)len;
    sge.lkey = mr->lkey;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ret = ibv_post_send(qp, &wr, &bad);
    if (ret)
      break;
    while (ibv_poll_cq(cq, 1, &wc) == 0)
      ;
  }
  ibv_dereg_mr(mr);
  return ret;
}

/* Positive: the same shape, but the buffer is registered inside the loop,
 * for every round. */
int ulp_echo_session_per_round(struct ibv_pd *pd, struct ibv_qp *qp, char *msg,
                               size_t len, int rounds)
{
  struct ibv_sge sge;
  struct ibv_send_wr wr, *bad;
  int ret = 0;

  while (rounds--) {
    struct ibv_mr *mr = ibv_reg_mr(pd, msg, len, IBV_ACCESS_LOCAL_WRITE);
    // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'ibv_reg_mr' runs once per I/O: 'ulp_echo_session_per_round' posts work requests (ibv_post_send)

    if (!mr)
      return -errno;
    memset(&wr, 0, sizeof(wr));
    sge.addr = (uintptr_t)msg;
    sge.length = (uint32_t)len;
    sge.lkey = mr->lkey;
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ret = ibv_post_send(qp, &wr, &bad);
    ibv_dereg_mr(mr);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'ibv_dereg_mr' runs once per I/O: 'ulp_echo_session_per_round' posts work requests (ibv_post_send)
    if (ret)
      break;
  }
  return ret;
}
