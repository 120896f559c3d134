// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// An object server that exposes memory through type-2 windows bound with
// BIND_MW work requests: the window grants access to the memory named by
// bind_info.addr (a bounce copy or a slot of the server's slab), so that
// memory must outlive the window's key, exactly as for an MR.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OS_SLOTS 64
#define OS_SLOT_SIZE 65536

struct os_region {
  struct ibv_mw *mw;
  uint32_t key;
  void *bounce; /* owned copy when the caller asked for one */
  size_t len;
  int open;
  int doomed;
};

struct os_server {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  char *slab;
  struct ibv_mr *slab_mr; /* LOCAL_WRITE | MW_BIND */
  struct os_region regions[OS_SLOTS];
};

static int os_wait(struct os_server *s, uint64_t wr_id) {
  struct ibv_wc wc;
  int n;

  for (;;) {
    n = ibv_poll_cq(s->cq, 1, &wc);
    if (n < 0)
      return -EIO;
    if (n == 1 && wc.wr_id == wr_id)
      return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
  }
}

/* Near miss: the server is zeroed first, so no window of its regions is
 * bound when the slab goes back on the registration failure. */
int os_server_init(struct os_server *s, struct ibv_pd *pd) {
  memset(s, 0, sizeof(*s));
  s->pd = pd;
  s->slab = aligned_alloc(4096, (size_t)OS_SLOTS * OS_SLOT_SIZE);
  if (!s->slab)
    return -ENOMEM;
  s->slab_mr = ibv_reg_mr(pd, s->slab, (size_t)OS_SLOTS * OS_SLOT_SIZE,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  if (!s->slab_mr) {
    free(s->slab);
    return -errno;
  }
  return 0;
}

/* Binds the region's window over its bounce copy or its slab slot. A
 * failed post or bind completion leaves nothing bound: the bounce copy
 * may go at once (near miss). */
int os_expose(struct os_server *s, int slot, const void *src, size_t len,
              int copy, uint32_t *key_out) {
  struct os_region *r = &s->regions[slot];
  struct ibv_send_wr wr, *bad;

  if (!r->mw) {
    r->mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2);
    if (!r->mw)
      return -errno;
    r->key = r->mw->rkey;
  }
  r->bounce = NULL;
  if (copy) {
    r->bounce = malloc(len);
    if (!r->bounce)
      return -ENOMEM;
    memcpy(r->bounce, src, len);
  }
  r->len = len;
  r->key = ibv_inc_rkey(r->key);

  memset(&wr, 0, sizeof(wr));
  wr.wr_id = (uintptr_t)r;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = r->mw;
  wr.bind_mw.rkey = r->key;
  wr.bind_mw.bind_info.mr = s->slab_mr;
  wr.bind_mw.bind_info.addr =
      (uintptr_t)(copy ? r->bounce : s->slab + (size_t)slot * OS_SLOT_SIZE);
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags =
      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_post_send(s->qp, &wr, &bad) || os_wait(s, (uintptr_t)r)) {
    free(r->bounce);
    r->bounce = NULL;
    return -EIO;
  }
  r->open = 1;
  *key_out = r->key;
  return 0;
}

static void os_region_drop(struct os_region *r) {
  free(r->bounce);
  r->bounce = NULL;
}

/* Near miss: a signaled LOCAL_INV, waited for, before the copy goes. */
int os_close(struct os_server *s, struct os_region *r) {
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.wr_id = (uintptr_t)r | 1;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = r->key;
  if (ibv_post_send(s->qp, &wr, &bad))
    return -EIO;
  if (os_wait(s, (uintptr_t)r | 1))
    return -EIO;
  r->open = 0;
  os_region_drop(r);
  return 0;
}

/* Shutdown: the LOCAL_INV is posted unsignaled and never waited for, so the
 * peer may still write through the window into the freed copy. */
void os_abort(struct os_server *s) {
  struct ibv_send_wr wr, *bad;
  int i;

  for (i = 0; i < OS_SLOTS; i++) {
    struct os_region *r = &s->regions[i];

    if (!r->open)
      continue;
    memset(&wr, 0, sizeof(wr));
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.invalidate_rkey = r->key;
    ibv_post_send(s->qp, &wr, &bad);
    /* `open` is the flag slots are handed out by: clearing it is the
     * first release, before the free. */
    r->open = 0;
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'r->open = 0' runs right after posting an unsignaled LOCAL_INV; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
    // CHECK-MESSAGES: :[[@LINE-5]]:5: note: LOCAL_INV posted here
    free(r->bounce);
    r->bounce = NULL;
  }
}

/* Expired regions marked for deletion are dropped with their window still
 * bound: no invalidation at all on this path. */
void os_reap(struct os_server *s) {
  int i;

  for (i = 0; i < OS_SLOTS; i++) {
    struct os_region *r = &s->regions[i];

    if (!r->open || !r->doomed)
      continue;
    r->open = 0;
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'r->open = 0' recycles the request that holds a memory window whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
    os_region_drop(r);
  }
}
