// RUN: %check_ulplint %s rdma-rkey-reuse %t
// RUN: %check_ulplint --mode=plugin %s rdma-rkey-reuse %t.plugin

// Where a window's bind key comes from: a window allocated just above, a
// helper that rotates, the caller that rotated the request's key before
// building the WR, and a key rotated once for a whole loop of binds.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

struct blk_req {
  struct ibv_mw *mw;
  uint32_t rkey;
  void *buf;
  uint32_t len;
  struct ibv_send_wr bind_wr;
};

struct blk_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_qp_ex *qpx;
  struct ibv_mr *data_mr;
  struct blk_req *free_req;
};

/* A window allocated on this path: its allocation key was never handed out. */
int blk_admit(struct blk_conn *c, struct blk_req *r)
{
  struct ibv_mw_bind_info bi = {
      .mr = c->data_mr, .addr = (uintptr_t)r->buf, .length = r->len,
      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};

  r->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
  if (!r->mw)
    return -1;
  r->rkey = r->mw->rkey;
  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, r->mw, r->rkey, &bi);
  return ibv_wr_complete(c->qpx);
}

static uint32_t blk_next_key(struct blk_req *r)
{
  return ibv_inc_rkey(r->mw->rkey);
}

/* The key comes from a helper that rotates it. */
int blk_rebind(struct blk_conn *c, struct blk_req *r)
{
  struct ibv_mw_bind_info bi = {
      .mr = c->data_mr, .addr = (uintptr_t)r->buf, .length = r->len,
      .mw_access_flags = IBV_ACCESS_REMOTE_READ};
  uint32_t key = blk_next_key(r);

  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, r->mw, key, &bi);
  return ibv_wr_complete(c->qpx);
}

/* The WR is built by a helper; its caller rotated r->rkey just before. */
static void blk_build_bind(struct blk_conn *c, struct blk_req *r)
{
  memset(&r->bind_wr, 0, sizeof(r->bind_wr));
  r->bind_wr.opcode = IBV_WR_BIND_MW;
  r->bind_wr.bind_mw.mw = r->mw;
  r->bind_wr.bind_mw.rkey = r->rkey;
  r->bind_wr.bind_mw.bind_info.mr = c->data_mr;
  r->bind_wr.bind_mw.bind_info.addr = (uintptr_t)r->buf;
  r->bind_wr.bind_mw.bind_info.length = r->len;
  r->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
}

int blk_submit(struct blk_conn *c, struct blk_req *r)
{
  struct ibv_send_wr *bad;

  r->rkey = ibv_inc_rkey(r->rkey);
  blk_build_bind(c, r);
  return ibv_post_send(c->qp, &r->bind_wr, &bad);
}

/* One rotation for a loop of binds: every segment gets the same key (the
   caller's doing: seg_bind binds with the key it is given). */
static int seg_bind(struct blk_conn *c, struct blk_req *r, uint32_t key)
{
  struct ibv_mw_bind_info bi = {
      .mr = c->data_mr, .addr = (uintptr_t)r->buf, .length = r->len,
      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};

  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, r->mw, key, &bi);
  // CHECK-FIXES: ibv_wr_bind_mw(c->qpx, r->mw, key, &bi);
  return ibv_wr_complete(c->qpx);
}

int seg_run(struct blk_conn *c, struct blk_req *r, int nsegs)
{
  uint32_t key = ibv_inc_rkey(r->mw->rkey);

  for (int seg = 0; seg < nsegs; seg++)
    if (seg_bind(c, r, key))
    // CHECK-MESSAGES: :[[@LINE-1]]:24: warning: memory window re-bound by 'seg_bind' with the key passed here, which is not a new one; a peer holding the old rkey keeps access to the re-bound memory [rdma-rkey-reuse]
    // CHECK-MESSAGES: :93:33: note: the window is bound with that key here
      return -1;
  return 0;
}

/* A request from the free list is bound under the key its last user had. */
int blk_reuse(struct blk_conn *c)
{
  struct blk_req *r = c->free_req;
  struct ibv_mw_bind_info bi = {
      .mr = c->data_mr, .addr = (uintptr_t)r->buf, .length = r->len,
      .mw_access_flags = IBV_ACCESS_REMOTE_READ};

  c->free_req = 0;
  ibv_wr_start(c->qpx);
  ibv_wr_bind_mw(c->qpx, r->mw, r->rkey, &bi);
  // CHECK-MESSAGES: :[[@LINE-1]]:33: warning: memory window re-bound without a new key; pass ibv_inc_rkey(r->mw->rkey) so a peer holding the old rkey loses access [rdma-rkey-reuse]
  // CHECK-FIXES: ibv_wr_bind_mw(c->qpx, r->mw, ibv_inc_rkey(r->mw->rkey), &bi);
  return ibv_wr_complete(c->qpx);
}

// A lease that allocates its window the first time: the allocation key is
// new on that path, the next leases rotate. The scan window reuses the key
// it had.
struct lease_cell {
  struct ibv_mw *mw;
  uint32_t rkey;
  void *mem;
  size_t len;
};

int lease_grant(struct ibv_pd *pd, struct ibv_qp_ex *qpx, struct ibv_mr *arena,
                struct lease_cell *c)
{
  struct ibv_mw_bind_info bi = { .mr = arena, .addr = (uintptr_t)c->mem,
                                 .length = c->len,
                                 .mw_access_flags = IBV_ACCESS_REMOTE_READ };
  uint32_t rkey;

  if (!c->mw) {
    c->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!c->mw)
      return -1;
    rkey = c->mw->rkey;
  } else {
    rkey = ibv_inc_rkey(c->rkey);
  }
  ibv_wr_start(qpx);
  ibv_wr_bind_mw(qpx, c->mw, rkey, &bi);
  c->rkey = rkey;
  return ibv_wr_complete(qpx);
}

int lease_rescan(struct ibv_qp_ex *qpx, struct ibv_mr *arena, struct lease_cell *c)
{
  struct ibv_mw_bind_info bi = { .mr = arena, .addr = (uintptr_t)c->mem,
                                 .length = c->len,
                                 .mw_access_flags = IBV_ACCESS_REMOTE_READ };
  uint32_t rkey = c->mw->rkey;

  ibv_wr_start(qpx);
  ibv_wr_bind_mw(qpx, c->mw, rkey, &bi);
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: memory window re-bound without a new key; pass ibv_inc_rkey(c->mw->rkey) so a peer holding the old rkey loses access [rdma-rkey-reuse]
  return ibv_wr_complete(qpx);
}
