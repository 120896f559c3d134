
// Userspace: the queue depth doubled by hand for LOCAL_INV after each
// SEND. The near miss below sizes by what it posts without registrations.

#include <infiniband/verbs.h>
#include <string.h>

#define DEMO_INV_FACTOR 2

struct demo_conn {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  unsigned int depth;
};

struct demo_req {
  struct demo_conn *conn;
  struct ibv_mr *mr;
  struct ibv_send_wr inv_wr;
};

int demo_create(struct demo_conn *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.send_cq = attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = DEMO_INV_FACTOR * c->depth;
  attr.cap.max_recv_wr = c->depth;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  c->qp = ibv_create_qp(c->pd, &attr);
  return c->qp ? 0 : -1;
}

int demo_invalidate(struct demo_req *req)
{
  struct ibv_send_wr *bad;

  memset(&req->inv_wr, 0, sizeof(req->inv_wr));
  req->inv_wr.opcode = IBV_WR_LOCAL_INV;
  req->inv_wr.invalidate_rkey = req->mr->rkey;
  req->inv_wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(req->conn->qp, &req->inv_wr, &bad);
}
