// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// A perftest-style streamer that keeps its resources in globals, with a
// small registration cache in a global table of anonymous structs, and a
// queue-pair object whose setup helper leaves a registration behind when
// it fails half-way.

#include <errno.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

#define GS_CACHE 8

static struct ibv_pd *g_pd;
static char *g_ring, *g_cnt;
static struct ibv_mr *g_ring_mr, *g_cnt_mr;

static struct {
  void *addr;
  size_t len;
  struct ibv_mr *mr;
} g_cache[GS_CACHE];
static unsigned int g_cache_next;

// Near miss: the first registration stays in its global when the second
// fails; gs_teardown() releases whatever the globals hold.
static int gs_reg_buffers(size_t len) {
  g_ring_mr = ibv_reg_mr(g_pd, g_ring, len, IBV_ACCESS_LOCAL_WRITE);
  if (!g_ring_mr)
    return -errno;
  g_cnt_mr = ibv_reg_mr(g_pd, g_cnt, 64, IBV_ACCESS_LOCAL_WRITE);
  if (!g_cnt_mr)
    return -errno;
  return 0;
}

void gs_teardown(void) {
  if (g_cnt_mr)
    ibv_dereg_mr(g_cnt_mr);
  if (g_ring_mr)
    ibv_dereg_mr(g_ring_mr);
}

// The cache keeps what it returns: the caller borrows the MR.
static struct ibv_mr *gs_cache_get(void *addr, size_t len) {
  unsigned int i, slot;

  for (i = 0; i < GS_CACHE; i++)
    if (g_cache[i].mr && g_cache[i].addr == addr && g_cache[i].len >= len)
      return g_cache[i].mr;
  slot = g_cache_next++ % GS_CACHE;
  if (g_cache[slot].mr)
    ibv_dereg_mr(g_cache[slot].mr);
  g_cache[slot].addr = addr;
  g_cache[slot].len = len;
  g_cache[slot].mr = ibv_reg_mr(g_pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
  return g_cache[slot].mr;
}

// Near miss: the MR belongs to the cache.
int gs_push_cached(void *buf, size_t len, uint32_t *lkey) {
  struct ibv_mr *mr = gs_cache_get(buf, len);

  if (!mr)
    return -errno;
  if (len > (1u << 30))
    return -EINVAL;
  *lkey = mr->lkey;
  return 0;
}

int gs_setup(size_t len) {
  if (gs_reg_buffers(len)) {
    gs_teardown();
    return -1;
  }
  return 0;
}

struct gs_qp {
  struct ibv_pd *pd;
  char *data, *cmds;
  struct ibv_mr *data_mr, *cmd_mr;
};

// The second registration fails and the first is left in the struct; the
// only caller frees the struct: this return is the leak.
static int gs_qp_alloc(struct gs_qp *qp, size_t len) {
  qp->data_mr = ibv_reg_mr(qp->pd, qp->data, len, IBV_ACCESS_LOCAL_WRITE);
  if (!qp->data_mr)
    return -errno;
  qp->cmd_mr = ibv_reg_mr(qp->pd, qp->cmds, 4096, IBV_ACCESS_LOCAL_WRITE);
  if (!qp->cmd_mr)
    return -ENOMEM;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ibv_reg_mr' (held in gs_qp.data_mr); it leaks [rdma-mr-leak]
  return 0;
}

void gs_qp_free(struct gs_qp *qp) {
  ibv_dereg_mr(qp->cmd_mr);
  ibv_dereg_mr(qp->data_mr);
  free(qp);
}

struct gs_qp *gs_qp_create(struct ibv_pd *pd, char *data, char *cmds, size_t len) {
  struct gs_qp *qp = calloc(1, sizeof(*qp));

  if (!qp)
    return NULL;
  qp->pd = pd;
  qp->data = data;
  qp->cmds = cmds;
  if (gs_qp_alloc(qp, len)) {
    free(qp);
    return NULL;
  }
  return qp;
}
