// RUN: %check_ulplint %s rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-invalidation-leak %t.plugin

// Landing zones that peers RDMA-WRITE into, torn down from another entry
// point than the one that registered them: the memory must outlive the
// registration, because the peer's key dies only with ibv_dereg_mr().

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

struct lz_zone {
  char *mem;
  size_t len;
  struct ibv_mr *mr;
  char *scratch;
  struct ibv_mr *scratch_mr;
};

struct lz_hello {
  uint64_t addr;
  uint32_t rkey;
};

struct lz_set {
  struct ibv_pd *pd;
  struct lz_zone *zones;
  int nzones;
};

int lz_register(struct lz_set *s, int i, struct lz_hello *h) {
  struct lz_zone *z = &s->zones[i];

  z->mr = ibv_reg_mr(s->pd, z->mem, z->len,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!z->mr)
    return -1;
  h->addr = (uintptr_t)z->mem;
  h->rkey = z->mr->rkey;
  /* Local staging only: no remote rights, no key handed out. */
  z->scratch_mr = ibv_reg_mr(s->pd, z->scratch, 4096, IBV_ACCESS_LOCAL_WRITE);
  if (!z->scratch_mr) {
    ibv_dereg_mr(z->mr);
    return -1;
  }
  return 0;
}

/* The zones go back to malloc while peers still hold their keys. */
void lz_cancel(struct lz_set *s) {
  int i;

  for (i = 0; i < s->nzones; i++) {
    struct lz_zone *z = &s->zones[i];

    free(z->mem);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
    // CHECK-MESSAGES: :[[@LINE+2]]:7: note: the memory region is deregistered only here, after its memory was handed back
    if (z->mr)
      ibv_dereg_mr(z->mr);
    z->mem = NULL;
  }
}

/* Near miss: deregistered first, then the memory goes; the local-only
 * scratch MR is freed before its deregistration, which hands no key out. */
void lz_destroy(struct lz_set *s) {
  int i;

  for (i = 0; i < s->nzones; i++) {
    struct lz_zone *z = &s->zones[i];

    if (z->mr)
      ibv_dereg_mr(z->mr);
    free(z->mem);
    free(z->scratch);
    ibv_dereg_mr(z->scratch_mr);
  }
}

/* A staging area a peer pulls from, set up in one go; the error paths free
   the memory. */
struct lz_stage {
  char *buf;
  struct ibv_mr *mr;
  struct ibv_mr *stats_mr;
};

static uint64_t lz_stats[8];

static void lz_stage_free(struct lz_stage *st) {
  free(st->buf);
  free(st);
}

int lz_stage_open(struct ibv_pd *pd, struct lz_stage *st) {
  st->buf = malloc(4096);
  if (!st->buf)
    return -1;
  st->mr = ibv_reg_mr(pd, st->buf, 4096,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!st->mr)
    goto out_free;
  st->stats_mr = ibv_reg_mr(pd, lz_stats, sizeof(lz_stats), IBV_ACCESS_REMOTE_READ);
  if (!st->stats_mr)
    goto out_free;
  return 0;

out_free:
  /* Positive: on the second failure the first MR is never deregistered:
     its key outlives the memory freed here. */
  free(st->buf);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer
  return -1;
}

struct lz_stage *lz_stage_new(struct ibv_pd *pd) {
  struct lz_stage *st = calloc(1, sizeof(*st));

  if (!st)
    return NULL;
  st->buf = malloc(4096);
  if (!st->buf) {
    free(st);
    return NULL;
  }
  st->mr = ibv_reg_mr(pd, st->buf, 4096, IBV_ACCESS_REMOTE_READ);
  if (!st->mr) {
    lz_stage_free(st); /* Near-miss: nothing was registered. */
    return NULL;
  }
  if (ibv_req_notify_cq(NULL, 0)) {
    /* Positive: the helper frees the memory under a live registration. */
    lz_stage_free(st);
    // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'lz_stage_free' releases the memory behind a memory region whose rkey is still valid for the peer
    return NULL;
  }
  return st;
}
