// RUN: %check_ulplint %s rdma-registration-in-datapath %t

// A checkpoint sink: a table of slots registered when the stream opens
// (the open handshake posts a SEND) and torn down when it quiesces (after
// polling the last completions). Only the scatter list of one write is
// registered per I/O.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

#define SINK_SLOTS 16
#define SINK_MAX_IOV 8

struct sink_slot {
  struct ibv_mr *mr;
  char *buf;
};

struct sink_io {
  struct ibv_mr *iov_mr[SINK_MAX_IOV];
  int niov;
};

struct sink {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  unsigned nslots;
  struct sink_slot slots[SINK_SLOTS];
};

static int sink_fill(struct sink *s, size_t len)
{
  int i;

  for (i = 0; i < SINK_SLOTS; i++) {
    s->slots[i].buf = malloc(len);
    s->slots[i].mr = ibv_reg_mr(s->pd, s->slots[i].buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!s->slots[i].mr)
      goto unwind;
  }
  s->nslots = SINK_SLOTS;
  return 0;

unwind:
  free(s->slots[i].buf);
  while (i--) {
    ibv_dereg_mr(s->slots[i].mr);
    free(s->slots[i].buf);
  }
  return -1;
}

int sink_open(struct sink *s, struct ibv_send_wr *hello, size_t len)
{
  struct ibv_send_wr *bad;

  if (sink_fill(s, len))
    return -1;
  return ibv_post_send(s->qp, hello, &bad);
}

void sink_quiesce(struct sink *s)
{
  struct ibv_wc wc;

  while (ibv_poll_cq(s->cq, 1, &wc) > 0)
    ;
  for (unsigned i = 0; i < s->nslots; i++) {
    ibv_dereg_mr(s->slots[i].mr);
    free(s->slots[i].buf);
  }
}

/* The caller's scatter list, registered for every write. */
int sink_write_iov(struct sink *s, struct sink_io *io, const struct ibv_sge *iov,
                   int cnt, struct ibv_send_wr *wr)
{
  struct ibv_send_wr *bad;
  int i, ret;

  for (i = 0; i < cnt; i++)
    io->iov_mr[i] = ibv_reg_mr(s->pd, (void *)(uintptr_t)iov[i].addr, iov[i].length,
                               IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-2]]:21: warning: 'ibv_reg_mr' runs once per I/O: 'sink_write_iov' posts work requests (ibv_post_send); registration enters the kernel and pins the pages on every I/O; use regcore_mr_get/regcore_mr_put (the registration cache) [rdma-registration-in-datapath]
  // CHECK-MESSAGES: :[[@LINE+1]]:9: note: 'sink_write_iov' posts work requests (ibv_post_send) here
  ret = ibv_post_send(s->qp, wr, &bad);
  return ret;
}
