// RUN: %check_ulplint %s rdma-mr-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-mr-leak %t.plugin

// Handles a function did not produce but finds in its structs, and
// per-lane handles unwound by a loop: a handle this path knows is there
// (tested non-null, its key read, its memory freed) and then drops leaks;
// an unwinding loop bounded by the current index misses the element the
// interrupted iteration already holds, even when a helper ran in between.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MM_REGIONS 32
#define LANES 4

struct mm_region {
  void *vaddr;
  size_t len;
  struct ibv_mr *mr;
  int inflight;
};

struct mm_map {
  struct ibv_pd *pd;
  struct mm_region regions[MM_REGIONS];
};

int mm_register(struct mm_map *m, void *vaddr, size_t len) {
  int i;

  for (i = 0; i < MM_REGIONS; i++) {
    struct mm_region *r = &m->regions[i];

    if (r->mr)
      continue;
    r->mr = ibv_reg_mr(m->pd, vaddr, len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!r->mr)
      return -errno;
    r->vaddr = vaddr;
    r->len = len;
    return 0;
  }
  return -ENOSPC;
}

uint32_t mm_key(struct mm_map *m, int i) { return m->regions[i].mr->rkey; }

/* A region still in flight is forgotten instead of deregistered later. */
int mm_unregister(struct mm_map *m, void *vaddr) {
  int i;

  for (i = 0; i < MM_REGIONS; i++) {
    struct mm_region *r = &m->regions[i];

    if (r->vaddr != vaddr || !r->mr)
      continue;
    if (r->inflight) {
      r->mr = NULL;
      // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: 'mm_region.mr' is overwritten while it still holds a memory region; it leaks [rdma-mr-leak]
      // CHECK-MESSAGES: :[[@LINE-5]]:30: note: this path saw the memory region here
      r->vaddr = NULL;
      return 0;
    }
    ibv_dereg_mr(r->mr);
    r->mr = NULL;
    r->vaddr = NULL;
    return 0;
  }
  return -ENOENT;
}

/* Near miss: the slot is tested empty before it is filled. */
int mm_adopt(struct mm_map *m, int i, struct ibv_mr *mr) {
  struct mm_region *r = &m->regions[i];

  if (r->mr)
    return -EBUSY;
  r->mr = mr;
  return 0;
}

struct kv_store {
  struct ibv_pd *pd;
  char *heap;
  size_t heap_len;
  struct ibv_mr *heap_mr;
};

struct kv_hello {
  uint64_t addr;
  uint32_t rkey;
};

int kv_setup(struct kv_store *s, size_t len) {
  s->heap = calloc(1, len);
  if (!s->heap)
    return -ENOMEM;
  s->heap_mr = ibv_reg_mr(s->pd, s->heap, len, IBV_ACCESS_REMOTE_READ);
  if (!s->heap_mr) {
    free(s->heap);
    return -errno;
  }
  s->heap_len = len;
  return 0;
}

void kv_hello(struct kv_store *s, struct kv_hello *h) {
  h->addr = (uintptr_t)s->heap;
  h->rkey = s->heap_mr->rkey;
}

/* Growing the heap re-registers it, but the old registration (and the
 * peers' key to it) is dropped, not deregistered. */
int kv_grow(struct kv_store *s, size_t len) {
  char *heap = calloc(1, len);
  struct ibv_mr *mr;

  if (!heap)
    return -ENOMEM;
  memcpy(heap, s->heap, s->heap_len);
  mr = ibv_reg_mr(s->pd, heap, len, IBV_ACCESS_REMOTE_READ);
  if (!mr) {
    free(heap);
    return -errno;
  }
  free(s->heap);
  s->heap = heap;
  s->heap_len = len;
  s->heap_mr = mr;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'kv_store.heap_mr' is overwritten while it still holds a memory region; it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-5]]:3: note: this path saw the memory region here
  return 0;
}

/* Near miss: the same growth with the old registration swapped out and
 * deregistered first. */
int kv_grow_ok(struct kv_store *s, size_t len) {
  char *heap = calloc(1, len);
  struct ibv_mr *mr;

  if (!heap)
    return -ENOMEM;
  memcpy(heap, s->heap, s->heap_len);
  mr = ibv_reg_mr(s->pd, heap, len, IBV_ACCESS_REMOTE_READ);
  if (!mr) {
    free(heap);
    return -errno;
  }
  ibv_dereg_mr(s->heap_mr);
  free(s->heap);
  s->heap = heap;
  s->heap_len = len;
  s->heap_mr = mr;
  return 0;
}

struct lane {
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  char *staging;
};

struct striper {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct lane lane[LANES];
};

static struct ibv_qp *lane_qp(struct striper *s, struct lane *l) {
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.send_cq = attr.recv_cq = l->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 64;
  attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  return ibv_create_qp(s->pd, &attr);
}

/* When lane i's QP cannot be created, the unwind covers lanes 0..i-1 only:
 * lane i's registration leaks. */
int striper_setup(struct striper *s) {
  int i, j;

  for (i = 0; i < LANES; i++) {
    struct lane *l = &s->lane[i];

    l->staging = aligned_alloc(4096, 1 << 20);
    if (!l->staging)
      goto unwind;
    l->mr = ibv_reg_mr(s->pd, l->staging, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
    if (!l->mr) {
      free(l->staging);
      goto unwind;
    }
    l->qp = lane_qp(s, l);
    if (!l->qp) {
      free(l->staging);
      goto unwind;
    }
  }
  return 0;
unwind:
  for (j = 0; j < i; j++) {
    ibv_destroy_qp(s->lane[j].qp);
    ibv_dereg_mr(s->lane[j].mr);
    free(s->lane[j].staging);
  }
  return -ENOMEM;
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: error path returns without releasing the memory region from 'ibv_reg_mr' (held in lane.mr); it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :[[@LINE-20]]:13: note: memory region obtained here
  // CHECK-MESSAGES: :[[@LINE-15]]:5: note: error path taken here
}

/* Near miss: the failing lane's registration is released before the
 * unwind of the earlier lanes. */
int striper_setup_ok(struct striper *s) {
  int i, j;

  for (i = 0; i < LANES; i++) {
    struct lane *l = &s->lane[i];

    l->staging = aligned_alloc(4096, 1 << 20);
    if (!l->staging)
      goto unwind;
    l->mr = ibv_reg_mr(s->pd, l->staging, 1 << 20, IBV_ACCESS_LOCAL_WRITE);
    if (!l->mr) {
      free(l->staging);
      goto unwind;
    }
    l->qp = lane_qp(s, l);
    if (!l->qp) {
      ibv_dereg_mr(l->mr);
      free(l->staging);
      goto unwind;
    }
  }
  return 0;
unwind:
  while (i--) {
    ibv_destroy_qp(s->lane[i].qp);
    ibv_dereg_mr(s->lane[i].mr);
    free(s->lane[i].staging);
  }
  return -ENOMEM;
}

void striper_teardown(struct striper *s) {
  int i;

  for (i = 0; i < LANES; i++) {
    ibv_destroy_qp(s->lane[i].qp);
    ibv_dereg_mr(s->lane[i].mr);
    free(s->lane[i].staging);
  }
}
