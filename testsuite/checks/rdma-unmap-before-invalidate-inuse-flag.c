// RUN: %check_ulplint %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t

// An export server that hands out slots by an in-use flag: the submit path
// scans for a slot whose `busy` is clear and sets it; giving the slot back
// clears it. Each slot's MR is registered once; its rkey goes to the client
// with every export and is invalidated when the client is done.

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define EXP_SLOTS 32

struct exp_slot {
  struct ibv_mr *mr;
  char *buf;
  bool busy;
  int live; /* the client holds the key: a state, not an in-use flag */
};

struct exp_srv {
  struct ibv_pd *pd;
  struct ibv_qp *qp;
  struct ibv_cq *cq;
  struct ibv_mr *msg_mr;
  uint32_t msg[EXP_SLOTS];
  struct exp_slot slots[EXP_SLOTS];
};

static void exp_slot_put(struct exp_slot *s)
{
  memset(s->buf, 0, 4096);
  s->busy = false;
}

static int exp_post_inv(struct exp_srv *x, struct exp_slot *s, unsigned flags)
{
  struct ibv_send_wr wr, *bad;

  memset(&wr, 0, sizeof(wr));
  wr.wr_id = (uintptr_t)s;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = s->mr->rkey;
  wr.send_flags = flags;
  return ibv_post_send(x->qp, &wr, &bad);
}

int exp_export(struct exp_srv *x)
{
  struct ibv_send_wr wr, *bad;
  struct ibv_sge sge;
  unsigned i;

  for (i = 0; i < EXP_SLOTS; i++)
    if (!x->slots[i].busy)
      break;
  if (i == EXP_SLOTS)
    return -1;
  x->slots[i].busy = true;
  x->slots[i].live = 1;
  x->msg[i] = x->slots[i].mr->rkey;
  sge.addr = (uintptr_t)&x->msg[i];
  sge.length = sizeof(x->msg[i]);
  sge.lkey = x->msg_mr->lkey;
  memset(&wr, 0, sizeof(wr));
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(x->qp, &wr, &bad);
}

/* The slot (and the memory behind its key) is handed back right after an
 * unsignaled LOCAL_INV that nothing waits for. */
void exp_client_done(struct exp_srv *x, unsigned i)
{
  struct exp_slot *s = &x->slots[i];

  if (exp_post_inv(x, s, 0))
    return;
  exp_slot_put(s);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'exp_slot_put' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :34:3: note: released here, by 's->busy = false' in 'exp_slot_put'
  // CHECK-MESSAGES: :46:10: note: LOCAL_INV posted here
}

/* Near miss: the slot goes back from the LOCAL_INV's own completion. */
void exp_inv_done(struct exp_srv *x, struct ibv_wc *wc)
{
  struct exp_slot *s = (struct exp_slot *)(uintptr_t)wc->wr_id;

  (void)x;
  if (wc->status != IBV_WC_SUCCESS)
    return;
  s->live = 0;
  exp_slot_put(s);
}

/* Near miss: a signaled LOCAL_INV, waited for before the slot goes back. */
int exp_client_done_sync(struct exp_srv *x, unsigned i)
{
  struct exp_slot *s = &x->slots[i];
  struct ibv_wc wc;

  if (exp_post_inv(x, s, IBV_SEND_SIGNALED))
    return -1;
  while (ibv_poll_cq(x->cq, 1, &wc) == 0)
    ;
  if (wc.status != IBV_WC_SUCCESS)
    return -1;
  s->live = 0;
  exp_slot_put(s);
  return 0;
}

/* Near miss: `live` is tested, but not to find a free slot; clearing it
 * after an unsignaled LOCAL_INV releases nothing. */
void exp_forget(struct exp_srv *x, unsigned i)
{
  struct exp_slot *s = &x->slots[i];

  if (!s->live)
    return;
  if (exp_post_inv(x, s, 0) == 0)
    s->live = 0;
}
