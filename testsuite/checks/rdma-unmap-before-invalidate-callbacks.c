// RUN: %check_ulplint %s rdma-unmap-before-invalidate %t

// A slab exporter whose memory comes from the application's allocator: the
// arena gives slabs out and takes them back through callbacks. A slab's
// window is invalidated when the slab moves or is dropped.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct slab_ops {
  void *(*arena_get)(void *ctx, size_t len);
  void (*arena_release)(void *ctx, void *mem);
  void (*notify)(void *ctx, void *mem);
};

struct slab {
  struct ibv_mw *mw;
  uint32_t key;
  char *mem;
};

struct slab_srv {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  const struct slab_ops *ops;
  void *ctx;
};

static int slab_post_inv(struct slab_srv *s, struct slab *sl, unsigned flags)
{
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = sl->key;
  wr.send_flags = flags;
  return ibv_post_send(s->qp, &wr, &bad);
}

int slab_bind(struct slab_srv *s, struct ibv_mr *arena_mr, struct slab *sl, size_t len)
{
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = sl->mw;
  wr.bind_mw.rkey = sl->key = ibv_inc_rkey(sl->key);
  wr.bind_mw.bind_info.mr = arena_mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)sl->mem;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  return ibv_post_send(s->qp, &wr, &bad);
}

/* The slab goes back to the arena right after an unsignaled LOCAL_INV. */
int slab_drop(struct slab_srv *s, struct slab *sl)
{
  if (slab_post_inv(s, sl, 0))
    return -1;
  s->ops->arena_release(s->ctx, sl->mem);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'arena_release' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  sl->mem = NULL;
  return 0;
}

/* Near miss: a callback that does not release (its name says so). */
int slab_announce_drop(struct slab_srv *s, struct slab *sl)
{
  if (slab_post_inv(s, sl, 0))
    return -1;
  s->ops->notify(s->ctx, sl->mem);
  return 0;
}

/* Near miss: the LOCAL_INV is signaled and waited for first. */
int slab_drop_sync(struct slab_srv *s, struct slab *sl)
{
  struct ibv_wc wc;

  if (slab_post_inv(s, sl, IBV_SEND_SIGNALED))
    return -1;
  while (ibv_poll_cq(s->cq, 1, &wc) == 0)
    ;
  s->ops->arena_release(s->ctx, sl->mem);
  sl->mem = NULL;
  return 0;
}
