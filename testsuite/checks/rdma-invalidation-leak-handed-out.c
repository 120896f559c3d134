// RUN: %check_ulplint %s rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-invalidation-leak %t.plugin

// A backup service hands snapshot descriptors (address, rkey) to its
// caller, which sends them to backup clients from another file: a key
// written into the caller's memory has left this unit, even though no
// post here sends it. The memory must then outlive the registration.

#include <infiniband/verbs.h>
#include <endian.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct bk_snap {
  struct bk_snap *gc_next;
  char *copy;
  size_t len;
  struct ibv_mr *mr;
  int refs;
};

struct bk_desc {
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

struct bk_svc {
  struct ibv_pd *pd;
  struct bk_snap *gc_list;
};

struct bk_snap *bk_snapshot(struct bk_svc *b, const void *data, size_t len,
                            struct bk_desc *d) {
  struct bk_snap *s = calloc(1, sizeof(*s));

  if (!s)
    return NULL;
  s->copy = malloc(len);
  if (!s->copy)
    goto err;
  memcpy(s->copy, data, len);
  s->len = len;
  s->mr = ibv_reg_mr(b->pd, s->copy, len, IBV_ACCESS_REMOTE_READ);
  if (!s->mr)
    goto err_copy;
  s->refs = 1;
  d->addr = htobe64((uintptr_t)s->copy);
  d->rkey = htobe32(s->mr->rkey);
  d->len = htobe32((uint32_t)len);
  return s;
err_copy:
  free(s->copy);
err:
  free(s);
  return NULL;
}

/* The copy goes at once; the registration waits for the collector. */
void bk_put(struct bk_svc *b, struct bk_snap *s) {
  if (--s->refs)
    return;
  free(s->copy);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  s->copy = NULL;
  s->gc_next = b->gc_list;
  b->gc_list = s;
}

void bk_gc(struct bk_svc *b) {
  struct bk_snap *s;

  while ((s = b->gc_list)) {
    b->gc_list = s->gc_next;
    ibv_dereg_mr(s->mr);
    free(s->copy);
    free(s);
  }
}

/* Near miss: deregistered (the key is dead) before the copy goes. */
void bk_drop(struct bk_snap *s) {
  ibv_dereg_mr(s->mr);
  free(s->copy);
  free(s);
}

struct bk_scratch {
  char *buf;
  struct ibv_mr *mr;
};

struct bk_trace {
  uint32_t rkey;
  uint32_t len;
};

void bk_trace_log(const struct bk_trace *t);

/* Near miss: the key only goes into a local trace record; no peer gets
 * it, so the scratch memory may go before its local registration. */
int bk_scratch_init(struct bk_svc *b, struct bk_scratch *x, size_t len) {
  struct bk_trace t;

  x->buf = malloc(len);
  if (!x->buf)
    return -1;
  x->mr = ibv_reg_mr(b->pd, x->buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!x->mr) {
    free(x->buf);
    return -1;
  }
  t.rkey = x->mr->rkey;
  t.len = (uint32_t)len;
  bk_trace_log(&t);
  return 0;
}

void bk_scratch_fini(struct bk_scratch *x) {
  free(x->buf);
  ibv_dereg_mr(x->mr);
}
