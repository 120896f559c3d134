// RUN: %check_ulplint --check-suffixes=SMALL %s rdma-send-queue-undersized %t.small -- -- -DWX_SQ=128
// RUN: %check_ulplint %s rdma-send-queue-undersized %t.ok -- -- -DWX_SQ=512
// RUN: %check_ulplint --mode=plugin --check-suffixes=SMALL %s rdma-send-queue-undersized %t.plugin -- -- -DWX_SQ=128

// A window service: the connection keeps a table of WX_SLOTS slots; a
// grant binds the slot's window and sends the key (BIND_MW + SEND), the
// revoke posts LOCAL_INV, and a grant the peer missed is sent again by a
// resend path that binds the same window once more (an alternative to the
// first bind, not a second one). The send queue is sized by its own
// constant: 512 entries hold 64 slots of three; 128 do not. The bulk path
// is credit-gated the UCX way: each caller tests the free entries
// (WX_CHECK_RES) and the posting helper takes as many as its caller says.

#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#define WX_SLOTS 64

#define WX_CHECK_RES(_c, _n) \
  do { if ((_c)->tx_available < (_n)) return -EAGAIN; } while (0)

struct wx_slot {
  struct ibv_mw *mw;
  uint32_t key;
  char *mem;
  struct ibv_send_wr bulk[4];
};

struct wx_conn {
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *arena_mr;
  struct ibv_mr *msg_mr;
  int tx_available;
  struct wx_slot slots[WX_SLOTS];
};

int wx_create(struct wx_conn *c)
{
  struct ibv_qp_init_attr attr;

  memset(&attr, 0, sizeof(attr));
  attr.qp_type = IBV_QPT_RC;
  attr.send_cq = c->cq;
  attr.recv_cq = c->cq;
  attr.cap.max_send_wr = WX_SQ;
  // CHECK-MESSAGES-SMALL: :[[@LINE-1]]:3: warning: each request posts up to 3 WRs {{.*}}up to 64 requests can be in flight, 192 entries{{.*}}[rdma-send-queue-undersized]
  attr.cap.max_recv_wr = WX_SLOTS;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  c->qp = ibv_create_qp(c->pd, &attr);
  c->tx_available = WX_SQ;
  return c->qp ? 0 : -1;
}

static int wx_bind_and_send(struct wx_conn *c, struct wx_slot *s, uint32_t key)
{
  struct ibv_send_wr bind, msg, *bad;
  struct ibv_sge sge = {.addr = (uintptr_t)&key, .length = 4, .lkey = c->msg_mr->lkey};

  memset(&bind, 0, sizeof(bind));
  bind.opcode = IBV_WR_BIND_MW;
  bind.bind_mw.mw = s->mw;
  bind.bind_mw.rkey = key;
  bind.bind_mw.bind_info.mr = c->arena_mr;
  bind.bind_mw.bind_info.addr = (uintptr_t)s->mem;
  bind.bind_mw.bind_info.length = 4096;
  bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  bind.next = &msg;
  memset(&msg, 0, sizeof(msg));
  msg.opcode = IBV_WR_SEND;
  msg.sg_list = &sge;
  msg.num_sge = 1;
  msg.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(c->qp, &bind, &bad);
}

int wx_grant(struct wx_conn *c, struct wx_slot *s)
{
  s->key = ibv_inc_rkey(s->key);
  return wx_bind_and_send(c, s, s->key);
}

/* The peer missed the grant: bind once more and resend. */
int wx_regrant(struct wx_conn *c, struct wx_slot *s)
{
  struct ibv_send_wr bind, *bad;

  memset(&bind, 0, sizeof(bind));
  bind.opcode = IBV_WR_BIND_MW;
  bind.bind_mw.mw = s->mw;
  bind.bind_mw.rkey = s->key;
  bind.bind_mw.bind_info.mr = c->arena_mr;
  bind.bind_mw.bind_info.addr = (uintptr_t)s->mem;
  bind.bind_mw.bind_info.length = 4096;
  bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  bind.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(c->qp, &bind, &bad);
}

int wx_revoke(struct wx_conn *c, struct wx_slot *s)
{
  struct ibv_send_wr inv, *bad;

  memset(&inv, 0, sizeof(inv));
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.invalidate_rkey = s->key;
  inv.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(c->qp, &inv, &bad);
}

/* Posts a slot's bulk chain; the callers tested the credits. */
static int wx_post_bulk(struct wx_conn *c, struct wx_slot *s, int wqes)
{
  struct ibv_send_wr *bad;

  if (ibv_post_send(c->qp, s->bulk, &bad))
    return -EIO;
  c->tx_available -= wqes;
  return 0;
}

static void wx_fill(struct wx_slot *s, int n, enum ibv_wr_opcode op)
{
  int i;

  for (i = 0; i < n; i++) {
    s->bulk[i].opcode = op;
    s->bulk[i].send_flags = i == n - 1 ? IBV_SEND_SIGNALED : 0;
    s->bulk[i].next = i < n - 1 ? &s->bulk[i + 1] : NULL;
  }
}

int wx_push4(struct wx_conn *c, struct wx_slot *s)
{
  WX_CHECK_RES(c, 4);
  wx_fill(s, 4, IBV_WR_RDMA_WRITE);
  return wx_post_bulk(c, s, 4);
}

int wx_push1(struct wx_conn *c, struct wx_slot *s)
{
  WX_CHECK_RES(c, 1);
  wx_fill(s, 1, IBV_WR_RDMA_WRITE);
  return wx_post_bulk(c, s, 1);
}
