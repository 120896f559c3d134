// RUN: %check_ulplint %s rdma-registration-in-datapath %t

// A streaming sender with three staging strategies on its submit path: a
// bounce MR registered on first use and kept (through a local, then into
// the connection), a staging buffer that grows only past the largest size
// seen (registered with the size it then records), and an oversized
// message registered for this one send behind a credit check.

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

struct lz_conn {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  void *bounce;
  struct ibv_mr *bounce_mr;
  char *stage;
  size_t stage_len;
  struct ibv_mr *stage_mr;
  int credits;
};

static int lz_post(struct lz_conn *c, void *buf, size_t len, uint32_t lkey) {
  struct ibv_sge sge = {(uintptr_t)buf, (uint32_t)len, lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED};
  struct ibv_send_wr *bad;

  return ibv_post_send(c->qp, &wr, &bad);
}

// Near miss: registered once, the first time a bounce is needed.
static int lz_get_bounce(struct lz_conn *c, size_t len) {
  struct ibv_mr *mr;

  if (!c->bounce_mr) {
    mr = ibv_reg_mr(c->pd, c->bounce, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
      return -errno;
    c->bounce_mr = mr;
  }
  return 0;
}

// Near miss: re-registered only when a message outgrows the staging buffer.
static int lz_grow_stage(struct lz_conn *c, size_t want) {
  struct ibv_mr *nmr;
  char *nbuf;

  if (want <= c->stage_len)
    return 0;
  nbuf = malloc(want);
  if (!nbuf)
    return -ENOMEM;
  nmr = ibv_reg_mr(c->pd, nbuf, want, IBV_ACCESS_LOCAL_WRITE);
  if (!nmr) {
    free(nbuf);
    return -errno;
  }
  if (c->stage_mr)
    ibv_dereg_mr(c->stage_mr);
  free(c->stage);
  c->stage = nbuf;
  c->stage_len = want;
  c->stage_mr = nmr;
  return 0;
}

int lz_send_bounced(struct lz_conn *c, const void *data, size_t len) {
  if (lz_get_bounce(c, 65536))
    return -1;
  memcpy(c->bounce, data, len);
  return lz_post(c, c->bounce, len, c->bounce_mr->lkey);
}

int lz_send_staged(struct lz_conn *c, const void *data, size_t len) {
  if (lz_grow_stage(c, len))
    return -1;
  memcpy(c->stage, data, len);
  return lz_post(c, c->stage, len, c->stage_mr->lkey);
}

// A credit check is no cache: every oversized send registers.
int lz_send_large(struct lz_conn *c, void *data, size_t len) {
  struct ibv_mr *mr;
  int ret;

  if (!c->credits)
    return -EAGAIN;
  mr = ibv_reg_mr(c->pd, data, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: 'ibv_reg_mr' runs once per I/O: {{.*}}[rdma-registration-in-datapath]
  if (!mr)
    return -errno;
  c->credits--;
  ret = lz_post(c, data, len, mr->lkey);
  ibv_dereg_mr(mr);
  return ret;
}

// A provider-style registration cache: a hit jumps past the registration;
// a miss registers into the least recently used entry, whose old MR goes.
struct lz_entry {
  struct ibv_mr *mr;
  uintptr_t start;
  size_t len;
  unsigned int refs;
};

struct lz_cache {
  struct ibv_pd *pd;
  struct lz_entry ent[64];
};

static struct lz_entry *lz_lookup(struct lz_cache *rc, const void *buf, size_t len) {
  for (int i = 0; i < 64; i++) {
    struct lz_entry *e = &rc->ent[i];
    if (e->mr && e->start <= (uintptr_t)buf && (uintptr_t)buf + len <= e->start + e->len)
      return e;
  }
  return NULL;
}

static struct lz_entry *lz_victim(struct lz_cache *rc) {
  struct lz_entry *lru = NULL;
  for (int i = 0; i < 64; i++)
    if (!rc->ent[i].refs && (!lru || !rc->ent[i].mr))
      lru = &rc->ent[i];
  return lru;
}

static int lz_cache_get(struct lz_cache *rc, void *buf, size_t len, uint32_t *lkey) {
  struct lz_entry *e;
  struct ibv_mr *mr;

  e = lz_lookup(rc, buf, len);
  if (e)
    goto hit;
  e = lz_victim(rc);
  if (!e)
    return -EAGAIN;
  mr = ibv_reg_mr(rc->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mr)
    return -errno;
  if (e->mr)
    ibv_dereg_mr(e->mr);
  e->mr = mr;
  e->start = (uintptr_t)buf;
  e->len = len;
hit:
  e->refs++;
  *lkey = e->mr->lkey;
  return 0;
}

int lz_send_cached(struct lz_conn *c, struct lz_cache *rc, void *data, size_t len) {
  uint32_t lkey;

  if (lz_cache_get(rc, data, len, &lkey))
    return -1;
  return lz_post(c, data, len, lkey);
}

// A lookup of something else is no cache: the registration is this send's.
struct lz_slot {
  void *buf;
  int busy;
};

static struct lz_slot *lz_slot_find(struct lz_conn *c, const void *data);

int lz_send_slotted(struct lz_conn *c, void *data, size_t len) {
  struct lz_slot *s;
  struct ibv_mr *mr;
  int ret;

  s = lz_slot_find(c, data);
  if (s)
    return -EBUSY;
  mr = ibv_reg_mr(c->pd, data, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: 'ibv_reg_mr' runs once per I/O: {{.*}}[rdma-registration-in-datapath]
  if (!mr)
    return -errno;
  ret = lz_post(c, data, len, mr->lkey);
  ibv_dereg_mr(mr);
  return ret;
}
