// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// A connection whose full-feature resources are registered once, with a
// flag that says so (tgt's iSER `ff_res_alloc`): the release helper returns
// early while the flag is clear, because then there is nothing to release.

#include <infiniband/verbs.h>
#include <stdlib.h>

struct gf_conn {
  struct ibv_pd *pd;
  char *pdu_pool;
  struct ibv_mr *pdu_mr;
  int ff_res_alloc;
  char *login_buf;
  struct ibv_mr *login_mr;
};

int gf_alloc_ff(struct gf_conn *c, size_t len) {
  c->pdu_pool = malloc(len);
  if (!c->pdu_pool)
    return -1;
  c->pdu_mr = ibv_reg_mr(c->pd, c->pdu_pool, len, IBV_ACCESS_LOCAL_WRITE);
  if (!c->pdu_mr) {
    free(c->pdu_pool);
    c->pdu_pool = NULL;
    return -1;
  }
  c->ff_res_alloc = 1;
  return 0;
}

static void gf_free_ff(struct gf_conn *c) {
  if (!c->ff_res_alloc)
    return;
  if (c->pdu_mr)
    ibv_dereg_mr(c->pdu_mr);
  free(c->pdu_pool);
  c->ff_res_alloc = 0;
}

int gf_login(struct gf_conn *c, size_t len) {
  c->login_buf = malloc(len);
  if (!c->login_buf)
    return -1;
  c->login_mr = ibv_reg_mr(c->pd, c->login_buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!c->login_mr) {
    free(c->login_buf);
    return -1;
  }
  return 0;
}

/* Near miss: the flag-gated helper releases whatever was registered. */
void gf_conn_free(struct gf_conn *c) {
  gf_free_ff(c);
  if (c->login_mr)
    ibv_dereg_mr(c->login_mr);
  free(c->login_buf);
  free(c);
}

/* The login MR has no release at all before the connection goes. */
void gf_conn_abort(struct gf_conn *c) {
  gf_free_ff(c);
  free(c->login_buf);
  free(c);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' frees the struct that still holds a memory region; it leaks [rdma-mr-leak]
}
