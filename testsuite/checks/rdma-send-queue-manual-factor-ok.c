// RUN: %check_ulplint %s rdma-send-queue-manual-factor %t

// Near miss: a factor of two for SEND and RDMA WRITE (SPDK's "SEND, READ and
// WRITE operations") is not a registration factor: nothing here registers
// or invalidates per I/O.

#include <infiniband/verbs.h>
#include <string.h>

struct demo_conn {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  unsigned int max_queue_depth;
};

int demo_create(struct demo_conn *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.send_cq = attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = c->max_queue_depth * 2;
  attr.cap.max_recv_wr = c->max_queue_depth;
  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}

int demo_write_and_send(struct demo_conn *c, struct ibv_send_wr *write_wr,
                        struct ibv_send_wr *send_wr)
{
  struct ibv_send_wr *bad;

  write_wr->opcode = IBV_WR_RDMA_WRITE;
  write_wr->next = send_wr;
  send_wr->opcode = IBV_WR_SEND;
  send_wr->send_flags = IBV_SEND_SIGNALED;
  send_wr->next = NULL;
  return ibv_post_send(c->qp, write_wr, &bad);
}
