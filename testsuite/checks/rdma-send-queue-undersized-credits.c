// RUN: %check_ulplint --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DCR_GATED=0
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DCR_GATED=1
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.reserved -- -- -DCR_GATED=2
// RUN: %check_ulplint --mode=plugin --check-suffixes=SMALL %s rdma-send-queue-undersized %t.plugin -- -- -DCR_GATED=0

// A replication stream: each record is an array of work requests linked to
// each other (the value WRITE, the log WRITE and the commit SEND), posted
// at once; the queue is sized one entry per record slot, CR_SLOTS named by
// a constant (and a table of CR_SLOTS records). Ungated (SMALL) that is three entries per record against one.
// The other run counts the free send-queue entries in work requests before
// every post, as ULPs with an sq_free counter do: the queue never holds more
// than it has, whatever one record costs. The third run reserves the
// entries between the test and the post and gives them back when the post
// fails (smbdirect's and SMB-Direct-like clients' accounting).

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define CR_SLOTS 64

struct cr_conn {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  uint32_t rkey;
  uint64_t remote;
  int sq_free;
};

struct cr_record {
  struct ibv_sge sge[3];
  struct ibv_send_wr wr[3];
};

/* One record per send-queue slot. */
static struct cr_record cr_records[CR_SLOTS];

int cr_create(struct cr_conn *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = CR_SLOTS;
  // CHECK-MESSAGES-SMALL: :[[@LINE-1]]:3: warning: {{.*}}3 WRs{{.*}}[rdma-send-queue-undersized]
  attr.cap.max_recv_wr = 1;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  c->qp = ibv_create_qp(c->pd, &attr);
  c->sq_free = CR_SLOTS;
  return c->qp ? 0 : -1;
}

static inline void cr_sq_put(struct cr_conn *c, int n)
{
  c->sq_free += n;
}

int cr_ship(struct cr_conn *c, struct cr_record *r, uint64_t at)
{
  struct ibv_send_wr *bad;
  int i;

#if CR_GATED
  if (c->sq_free < 3)
    return -EAGAIN;
#endif
#if CR_GATED == 2
  c->sq_free -= 3;
#endif
  for (i = 0; i < 3; i++) {
    r->sge[i].lkey = c->mr->lkey;
    r->wr[i].sg_list = &r->sge[i];
    r->wr[i].num_sge = 1;
    r->wr[i].send_flags = 0;
    r->wr[i].next = i < 2 ? &r->wr[i + 1] : NULL;
  }
  r->wr[0].opcode = IBV_WR_RDMA_WRITE;
  r->wr[0].wr.rdma.remote_addr = c->remote + at;
  r->wr[0].wr.rdma.rkey = c->rkey;
  r->wr[1].opcode = IBV_WR_RDMA_WRITE;
  r->wr[1].wr.rdma.remote_addr = c->remote;
  r->wr[1].wr.rdma.rkey = c->rkey;
  r->wr[2].opcode = IBV_WR_SEND;
  if (ibv_post_send(c->qp, r->wr, &bad)) {
#if CR_GATED == 2
    cr_sq_put(c, 3);
#endif
    return -1;
  }
#if CR_GATED == 1
  c->sq_free -= 3;
#endif
  return 0;
}
