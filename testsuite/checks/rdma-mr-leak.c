// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// Userspace registrations and windows that are not released on some path.

#include <infiniband/verbs.h>
#include <stdlib.h>

struct ulp_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_mr *data_mr;
  struct ibv_mw *mw;
};

struct ulp_req {
  struct ibv_mr *mr;
  void *buf;
  size_t len;
};

int ulp_send_buf(struct ulp_conn *c, void *buf, size_t len);

/* A scratch registration leaked when the send fails. */
int ulp_send_once(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);

  if (!mr)
    return -1;
  if (ulp_send_buf(c, buf, len))
    return -1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ibv_reg_mr'; it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-7]]:23: note: memory region obtained here
  // CHECK-MESSAGES: :[[@LINE-4]]:3: note: error path taken here
  ibv_dereg_mr(mr);
  return 0;
}

/* Registering again over a live registration. */
int ulp_reregister(struct ulp_conn *c, void *buf, size_t len)
{
  c->data_mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!c->data_mr)
    return -1;
  if (len > 4096)
    c->data_mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: the memory region from 'ibv_reg_mr' is overwritten while still held; it leaks
  // CHECK-MESSAGES: :[[@LINE-6]]:16: note: memory region obtained here
  return c->data_mr ? 0 : -1;
}

void ulp_conn_destroy(struct ulp_conn *c)
{
  ibv_dereg_mr(c->data_mr);
}

/* The request freed with its registration. */
void ulp_req_abort(struct ulp_conn *c, struct ulp_req *req)
{
  req->mr = ibv_reg_mr(c->pd, req->buf, req->len, IBV_ACCESS_LOCAL_WRITE);
  if (!req->mr)
    return;
  free(req);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' frees the struct that still holds a memory region from 'ibv_reg_mr'; it leaks
  // CHECK-MESSAGES: :[[@LINE-5]]:13: note: memory region obtained here
}

/* A window that nothing ever deallocates. */
int ulp_window(struct ulp_conn *c)
{
  c->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: the memory window from 'ibv_alloc_mw' is stored in 'ulp_conn.mw' but nothing releases it; it leaks
  return c->mw ? 0 : -1;
}

/* Near misses: unwinding labels, a returned handle, a handle kept. */
int ok_unwind(struct ulp_conn *c, void *a, void *b, size_t len)
{
  struct ibv_mr *ma, *mb;
  int ret = -1;

  ma = ibv_reg_mr(c->pd, a, len, IBV_ACCESS_LOCAL_WRITE);
  if (!ma)
    goto out;
  mb = ibv_reg_mr(c->pd, b, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mb)
    goto out_dereg_a;
  ret = ulp_send_buf(c, a, len);
  ibv_dereg_mr(mb);
out_dereg_a:
  ibv_dereg_mr(ma);
out:
  return ret;
}

struct ibv_mr *ok_returned(struct ulp_conn *c, void *buf, size_t len)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  return mr;
}

/* A global handle outlives the function: the success return keeps it for
   the program, and the teardown releases it. */
static struct ibv_mr *g_ring_mr;
static char g_ring[1 << 16];

int ok_global_ring(struct ibv_pd *pd)
{
  g_ring_mr = ibv_reg_mr(pd, g_ring, sizeof(g_ring), IBV_ACCESS_LOCAL_WRITE);
  if (!g_ring_mr)
    return -1;
  return 0;
}

void ok_global_ring_teardown(void)
{
  ibv_dereg_mr(g_ring_mr);
  g_ring_mr = NULL;
}
