// RUN: %check_ulplint %s rdma-invalidation-leak %t

// A block export over mlx5 UMR: each export slot owns an indirect mkey,
// configured per export with mlx5dv_wr_mr_list() over extents of a
// registered arena; the client gets the mkey's key. Slots are handed out by
// an in-use flag.

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#define BX_SLOTS 16
#define BX_MAX_EXT 8

struct bx_slot {
  struct mlx5dv_mkey *mkey;
  struct ibv_sge sge[BX_MAX_EXT];
  uint16_t n;
  bool busy;
  uint32_t adv_key;
};

struct bx {
  struct ibv_qp_ex *qpx;
  struct mlx5dv_qp_ex *mqpx;
  struct ibv_mr *msg_mr;
  struct bx_slot slots[BX_SLOTS];
};

static struct bx_slot *bx_slot_get(struct bx *x)
{
  for (unsigned i = 0; i < BX_SLOTS; i++)
    if (!x->slots[i].busy) {
      x->slots[i].busy = true;
      return &x->slots[i];
    }
  return 0;
}

static void bx_slot_put(struct bx_slot *s)
{
  s->n = 0;
  s->busy = false;
}

int bx_export(struct bx *x, uint16_t n, int writable)
{
  struct bx_slot *s = bx_slot_get(x);
  uint32_t access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;

  if (!s)
    return -1;
  if (writable)
    access |= IBV_ACCESS_REMOTE_WRITE;
  s->n = n;
  ibv_wr_start(x->qpx);
  x->qpx->wr_id = (uintptr_t)s;
  x->qpx->wr_flags = IBV_SEND_SIGNALED;
  mlx5dv_wr_mr_list(x->mqpx, s->mkey, access, n, s->sge);
  if (ibv_wr_complete(x->qpx)) {
    /* Near miss: the UMR was never posted; the key never left. */
    bx_slot_put(s);
    return -1;
  }
  s->adv_key = s->mkey->rkey;
  return 0;
}

/* The client vanished: the slot goes back with the mkey's key still valid. */
void bx_expire(struct bx *x, struct bx_slot *s)
{
  (void)x;
  bx_slot_put(s);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'bx_slot_put' recycles the request that holds a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  // CHECK-MESSAGES: :44:3: note: released here, by 's->busy = false' in 'bx_slot_put'
}

/* Near miss: the client is done; the key is invalidated, and the slot goes
 * back from the LOCAL_INV's completion. */
int bx_release(struct bx *x, struct bx_slot *s)
{
  ibv_wr_start(x->qpx);
  x->qpx->wr_id = (uintptr_t)s | 1;
  x->qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_local_inv(x->qpx, s->mkey->rkey);
  return ibv_wr_complete(x->qpx);
}

void bx_inv_done(struct bx *x, struct ibv_wc *wc)
{
  struct bx_slot *s = (struct bx_slot *)(uintptr_t)(wc->wr_id & ~1ull);

  (void)x;
  if (wc->status == IBV_WC_SUCCESS)
    bx_slot_put(s);
}
