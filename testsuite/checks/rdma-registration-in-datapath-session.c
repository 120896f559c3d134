// RUN: %check_ulplint %s rdma-registration-in-datapath %t

// A bulk puller: the session function reads the manifest once (a READ it
// waits for), sets up its ring of slots through a helper, then runs its
// I/O loop, which posts READs into the slots and reaps their completions.
// The ring's registrations run once per session, before the loop; so does
// a table of RAM blocks registered through a local alias of each element.
// A caller's buffer registered for one READ, and a helper called from
// inside the I/O loop, are per I/O.

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdlib.h>

#define RING 16
#define SLOT_SIZE 65536

struct slot {
  void *area;
  struct ibv_mr *mr;
  int busy;
};

struct block {
  void *host;
  size_t length;
  struct ibv_mr *mr;
};

struct client {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct slot ring[RING];
  struct block *blocks;
  int nb_blocks;
  uint64_t raddr;
  uint32_t rkey;
};

static int post_read(struct client *c, void *dst, uint32_t lkey, uint32_t len,
                     uint64_t off)
{
  struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {0}, *bad;

  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = c->raddr + off;
  wr.wr.rdma.rkey = c->rkey;
  return ibv_post_send(c->qp, &wr, &bad);
}

static int wait_one(struct client *c)
{
  struct ibv_wc wc;
  int n;

  while ((n = ibv_poll_cq(c->cq, 1, &wc)) == 0)
    ;
  return n < 0 || wc.status != IBV_WC_SUCCESS ? -1 : 0;
}

static int ring_setup(struct client *c)
{
  int i;

  for (i = 0; i < RING; i++) {
    c->ring[i].area = malloc(SLOT_SIZE);
    c->ring[i].mr = ibv_reg_mr(c->pd, c->ring[i].area, SLOT_SIZE,
                               IBV_ACCESS_LOCAL_WRITE);
    if (!c->ring[i].mr)
      return -1;
  }
  return 0;
}

static int blocks_register(struct client *c)
{
  int i;

  for (i = 0; i < c->nb_blocks; i++) {
    struct block *b = &c->blocks[i];

    b->mr = ibv_reg_mr(c->pd, b->host, b->length, IBV_ACCESS_LOCAL_WRITE);
    if (!b->mr)
      goto unwind;
  }
  return 0;
unwind:
  while (i--)
    ibv_dereg_mr(c->blocks[i].mr);
  return -1;
}

static int read_header(struct client *c, void *hdr, uint32_t lkey)
{
  if (post_read(c, hdr, lkey, 64, 0))
    return -1;
  return wait_one(c);
}

/* A scratch buffer for a slow slot, registered each time it is needed. */
static struct ibv_mr *slow_path_mr(struct client *c, void *buf)
{
  return ibv_reg_mr(c->pd, buf, SLOT_SIZE, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: 'ibv_reg_mr' runs once per I/O{{.*}}[rdma-registration-in-datapath]
}

int pull_read_range(struct client *c, void *dst, uint32_t len, uint64_t off)
{
  struct ibv_mr *mr = ibv_reg_mr(c->pd, dst, len, IBV_ACCESS_LOCAL_WRITE);
  // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: 'ibv_reg_mr' runs once per I/O{{.*}}[rdma-registration-in-datapath]
  struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = len};
  struct ibv_send_wr wr = {0}, *bad;
  int ret;

  if (!mr)
    return -1;
  sge.lkey = mr->lkey;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = c->raddr + off;
  wr.wr.rdma.rkey = c->rkey;
  ret = ibv_post_send(c->qp, &wr, &bad) ? -1 : wait_one(c);
  ibv_dereg_mr(mr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ibv_dereg_mr' runs once per I/O{{.*}}[rdma-registration-in-datapath]
  return ret;
}

int pull_run(struct client *c, void *hdr, uint32_t hdr_lkey, uint64_t len,
             void *scratch)
{
  struct ibv_wc wc[16];
  uint64_t off = 0;
  int i, n;

  if (read_header(c, hdr, hdr_lkey) || ring_setup(c) || blocks_register(c))
    return -1;
  while (off < len) {
    for (i = 0; i < RING && off < len; i++, off += SLOT_SIZE) {
      struct ibv_mr *mr = c->ring[i].mr;

      if (c->ring[i].busy) {
        mr = slow_path_mr(c, scratch);
        if (!mr)
          return -1;
      }
      if (post_read(c, c->ring[i].area, mr->lkey, SLOT_SIZE, off))
        return -1;
    }
    n = ibv_poll_cq(c->cq, 16, wc);
    if (n < 0)
      return -1;
  }
  return 0;
}
