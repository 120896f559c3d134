// RUN: %check_ulplint %s rdma-invalidation-leak %t
// RUN: %check_ulplint --mode=plugin %s rdma-invalidation-leak %t.plugin

// Userspace: a buffer registered for remote writes is freed while its MR is
// still registered; the peer's rkey then reaches whatever malloc puts there.

#include <infiniband/verbs.h>
#include <stdlib.h>

struct ulp_msg {
  uint64_t addr;
  uint32_t rkey;
};

struct ulp_io {
  struct ibv_pd *pd;
  void *buf;
  size_t len;
  struct ibv_mr *mr;
};

int ulp_io_start(struct ulp_io *io)
{
  io->buf = malloc(io->len);
  if (!io->buf)
    return -1;
  io->mr = ibv_reg_mr(io->pd, io->buf, io->len,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!io->mr) {
    free(io->buf);
    return -1;
  }
  return 0;
}

/* The rkey goes to the peer in the request message. */
int ulp_io_advertise(struct ulp_io *io, struct ibv_qp *qp, struct ulp_msg *msg,
                     struct ibv_mr *msg_mr)
{
  struct ibv_sge sge = {
      .addr = (uintptr_t)msg, .length = sizeof(*msg), .lkey = msg_mr->lkey};
  struct ibv_send_wr wr = {0}, *bad;

  msg->addr = (uintptr_t)io->buf;
  msg->rkey = io->mr->rkey;
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(qp, &wr, &bad);
}

void ulp_io_abort(struct ulp_io *io)
{
  free(io->buf);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'free' releases the memory behind a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path
  // CHECK-MESSAGES: :[[@LINE-12]]:15: note: rkey handed to the peer here (rkey)
  io->buf = NULL;
}

/* Near miss: a local registration deregistered before the free. */
int ok_scratch(struct ibv_pd *pd, size_t len)
{
  void *tmp = malloc(len);
  struct ibv_mr *mr;

  if (!tmp)
    return -1;
  mr = ibv_reg_mr(pd, tmp, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr) {
    free(tmp);
    return -1;
  }
  ibv_dereg_mr(mr);
  free(tmp);
  return 0;
}
