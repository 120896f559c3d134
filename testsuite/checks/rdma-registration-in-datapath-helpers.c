// RUN: %check_ulplint %s rdma-registration-in-datapath %t

// An RPC client whose submit functions post through helpers: rpc_post()
// sends a call, rpc_post_inv() invalidates a window's MR, rpc_announce()
// tells the server about a new receive pool. Vectored calls register their
// payload per call; pools, teardown and the registration cache do not.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>

#define RPC_MAX_IOV 8
#define RPC_CACHE 32

struct rpc_call {
  struct ibv_mr *iov_mr[RPC_MAX_IOV];
  int niov;
  int busy;
};

struct rpc_cache_ent {
  struct ibv_mr *mr;
  const void *buf;
  size_t len;
  unsigned refs;
};

struct rpc_pool {
  struct ibv_mr *mr;
  char *mem;
};

struct rpc_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_mr *win_mr;
  struct rpc_pool pool;
  struct rpc_cache_ent cache[RPC_CACHE];
  struct rpc_call calls[64];
};

static int rpc_post(struct rpc_conn *c, struct ibv_sge *sge, int n, uint64_t id)
{
  struct ibv_send_wr wr = {.wr_id = id, .sg_list = sge, .num_sge = n,
                           .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  return ibv_post_send(c->qp, &wr, &bad);
}

static int rpc_post_inv(struct rpc_conn *c, uint32_t rkey)
{
  struct ibv_send_wr wr = {.opcode = IBV_WR_LOCAL_INV, .invalidate_rkey = rkey,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  return ibv_post_send(c->qp, &wr, &bad);
}

static int rpc_announce(struct rpc_conn *c, struct rpc_pool *p)
{
  struct ibv_sge sge = {(uintptr_t)p->mem, 64, p->mr->lkey};

  return rpc_post(c, &sge, 1, 0);
}

/* Every element of the caller's vector, registered on every call. */
static int rpc_map_iov(struct rpc_conn *c, struct rpc_call *call,
                       const struct iovec *iov, int n, struct ibv_sge *sge)
{
  int i;

  for (i = 0; i < n; i++) {
    call->iov_mr[i] = ibv_reg_mr(c->pd, iov[i].iov_base, iov[i].iov_len, 0);
    // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: 'ibv_reg_mr' runs once per I/O: it is called from 'rpc_callv', which posts work requests through 'rpc_post'; registration enters the kernel and pins the pages on every I/O; use regcore_mr_get/regcore_mr_put (the registration cache) [rdma-registration-in-datapath]
    // CHECK-MESSAGES: :[[@LINE+36]]:7: note: 'rpc_callv' posts work requests through 'rpc_post' here
    if (!call->iov_mr[i])
      goto unwind;
    sge[i].addr = (uintptr_t)iov[i].iov_base;
    sge[i].length = (uint32_t)iov[i].iov_len;
    sge[i].lkey = call->iov_mr[i]->lkey;
  }
  call->niov = n;
  return 0;

unwind:
  while (i--)
    ibv_dereg_mr(call->iov_mr[i]);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'ibv_dereg_mr' runs once per I/O: it is called from 'rpc_callv', which posts work requests through 'rpc_post'; deregistration enters the kernel and unpins the pages on every I/O; use regcore_mr_get/regcore_mr_put (the registration cache) [rdma-registration-in-datapath]
  // CHECK-MESSAGES: :[[@LINE+22]]:7: note: 'rpc_callv' posts work requests through 'rpc_post' here
  return -1;
}

/* call->niov is one call's count, not the size of a table. */
static void rpc_unmap_iov(struct rpc_call *call)
{
  for (int i = 0; i < call->niov; i++)
    ibv_dereg_mr(call->iov_mr[i]);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'ibv_dereg_mr' runs once per I/O: it is called from 'rpc_callv', which posts work requests through 'rpc_post'; deregistration enters the kernel and unpins the pages on every I/O; use regcore_mr_get/regcore_mr_put (the registration cache) [rdma-registration-in-datapath]
  // CHECK-MESSAGES: :[[@LINE+12]]:7: note: 'rpc_callv' posts work requests through 'rpc_post' here
  call->niov = 0;
}

int rpc_callv(struct rpc_conn *c, struct rpc_call *call, const struct iovec *iov, int n)
{
  struct ibv_sge sge[RPC_MAX_IOV];

  if (n < 1 || n > RPC_MAX_IOV)
    return -1;
  if (rpc_map_iov(c, call, iov, n, sge))
    return -1;
  if (rpc_post(c, sge, n, (uintptr_t)call)) {
    rpc_unmap_iov(call);
    return -1;
  }
  return 0;
}

void rpc_complete(struct rpc_conn *c, struct ibv_wc *wc)
{
  struct rpc_call *call = (struct rpc_call *)(uintptr_t)wc->wr_id;

  (void)c;
  rpc_unmap_iov(call);
  call->busy = 0;
}

/* Near miss: a receive pool added (and announced) by an administrator;
 * the memory is allocated here and stays registered. */
int rpc_add_pool(struct rpc_conn *c, size_t len)
{
  char *mem = malloc(len);
  struct ibv_mr *mr;

  if (!mem)
    return -1;
  mr = ibv_reg_mr(c->pd, mem, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mr) {
    free(mem);
    return -1;
  }
  c->pool.mem = mem;
  c->pool.mr = mr;
  return rpc_announce(c, &c->pool);
}

/* Near miss: the pool's MR was not registered per I/O; dropping it is
 * announced through the same helper. */
int rpc_drop_pool(struct rpc_conn *c)
{
  ibv_dereg_mr(c->pool.mr);
  free(c->pool.mem);
  c->pool.mr = NULL;
  return rpc_announce(c, &c->pool);
}

/* Near miss: teardown invalidates through a helper that posts only
 * LOCAL_INV, then deregisters; no data moves here. */
int rpc_close_window(struct rpc_conn *c)
{
  int ret = rpc_post_inv(c, c->win_mr->rkey);

  ibv_dereg_mr(c->win_mr);
  c->win_mr = NULL;
  return ret;
}

/* Near miss: a registration cache that returns the entry it finds; it
 * registers (and evicts) only on a miss. */
static struct rpc_cache_ent *rpc_cache_get(struct rpc_conn *c, const void *buf, size_t len)
{
  struct rpc_cache_ent *e, *victim = NULL;

  for (unsigned i = 0; i < RPC_CACHE; i++) {
    e = &c->cache[i];
    if (e->mr && e->buf == buf && e->len >= len) {
      e->refs++;
      return e;
    }
    if (!e->refs && (!victim || !e->mr))
      victim = e;
  }
  if (!victim)
    return NULL;
  if (victim->mr)
    ibv_dereg_mr(victim->mr);
  victim->mr = ibv_reg_mr(c->pd, (void *)buf, len, 0);
  victim->buf = buf;
  victim->len = len;
  victim->refs = victim->mr ? 1 : 0;
  return victim->mr ? victim : NULL;
}

int rpc_call(struct rpc_conn *c, const void *buf, size_t len)
{
  struct rpc_cache_ent *e = rpc_cache_get(c, buf, len);
  struct ibv_sge sge;

  if (!e)
    return -1;
  sge.addr = (uintptr_t)buf;
  sge.length = (uint32_t)len;
  sge.lkey = e->mr->lkey;
  return rpc_post(c, &sge, 1, 0);
}
