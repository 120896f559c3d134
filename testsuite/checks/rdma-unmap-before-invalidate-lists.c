// RUN: %check_ulplint --kernel %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-unmap-before-invalidate,rdma-invalidation-leak %t.plugin

// An FRWR pool in the style of net/rds/ib_frmr.c and xprtrdma: MRs in use
// sit on the request's list, MRs whose LOCAL_INV failed go to a drop list
// the pool walks to deregister them, and a flush posts the LOCAL_INVs of a
// whole list before it tears the list down.

#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/wait.h>
#include <rdma/ib_verbs.h>

enum frx_state { FRX_FREE, FRX_INUSE, FRX_STALE };

struct frx_mr {
  struct ib_mr *mr;
  struct scatterlist *sg;
  int sg_len;
  enum frx_state state;
  wait_queue_head_t inv_done;
  struct ib_send_wr inv_wr;
  struct ib_reg_wr reg_wr;
  struct list_head pool_list;
  struct list_head req_list;
};

struct frx_pool {
  struct ib_device *dev;
  struct ib_qp *qp;
  struct list_head free_list;
  struct list_head drop_list;
};

struct frx_req {
  struct list_head registered;
};

static struct frx_mr *frx_get(struct frx_pool *pool)
{
  struct frx_mr *f = list_first_entry_or_null(&pool->free_list, struct frx_mr, pool_list);

  if (f)
    list_del(&f->pool_list);
  return f;
}

/* The MR goes on the request's list of MRs in use once its key is out. */
int frx_map(struct frx_pool *pool, struct frx_req *req, struct scatterlist *sg,
            int n, u32 *rkey)
{
  struct frx_mr *f = frx_get(pool);

  if (!f)
    return -EAGAIN;
  f->sg = sg;
  f->sg_len = ib_dma_map_sg(pool->dev, sg, n, DMA_BIDIRECTIONAL);
  ib_map_mr_sg(f->mr, sg, f->sg_len, NULL, PAGE_SIZE);
  ib_update_fast_reg_key(f->mr, ib_inc_rkey(f->mr->rkey));
  f->reg_wr.wr.opcode = IB_WR_REG_MR;
  f->reg_wr.mr = f->mr;
  f->reg_wr.key = f->mr->rkey;
  f->reg_wr.access = IB_ACCESS_REMOTE_WRITE | IB_ACCESS_LOCAL_WRITE;
  if (ib_post_send(pool->qp, &f->reg_wr.wr, NULL)) {
    ib_dma_unmap_sg(pool->dev, sg, n, DMA_BIDIRECTIONAL);
    list_add(&f->pool_list, &pool->free_list);
    return -EIO;
  }
  f->state = FRX_INUSE;
  list_add_tail(&f->req_list, &req->registered);
  *rkey = f->mr->rkey;
  return 0;
}

static int frx_post_inv(struct frx_pool *pool, struct frx_mr *f)
{
  memset(&f->inv_wr, 0, sizeof(f->inv_wr));
  f->inv_wr.opcode = IB_WR_LOCAL_INV;
  f->inv_wr.ex.invalidate_rkey = f->mr->rkey;
  f->inv_wr.send_flags = IB_SEND_SIGNALED;
  return ib_post_send(pool->qp, &f->inv_wr, NULL);
}

/* The completion handler moves the MR out of FRX_INUSE and wakes the waiter. */
void frx_unmap_one(struct frx_pool *pool, struct frx_mr *f)
{
  if (frx_post_inv(pool, f)) {
    /* The key is still live: the drop walk deregisters the MR. */
    list_add_tail(&f->pool_list, &pool->drop_list);
    return;
  }
  wait_event(f->inv_done, f->state != FRX_INUSE);
  if (f->state == FRX_STALE) {
    list_add_tail(&f->pool_list, &pool->drop_list);
    return;
  }
  ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
  list_add_tail(&f->pool_list, &pool->free_list);
}

/* Not waited for: the MR is back on the free list with its LOCAL_INV queued. */
void frx_unmap_one_nowait(struct frx_pool *pool, struct frx_mr *f)
{
  if (frx_post_inv(pool, f)) {
    list_add_tail(&f->pool_list, &pool->drop_list);
    return;
  }
  ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'ib_dma_unmap_sg' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :83:10: note: LOCAL_INV posted here
  list_add_tail(&f->pool_list, &pool->free_list);
}

void frx_drop_stale(struct frx_pool *pool)
{
  struct frx_mr *f, *next;

  list_for_each_entry_safe(f, next, &pool->drop_list, pool_list) {
    list_del(&f->pool_list);
    ib_dereg_mr(f->mr);
    kfree(f);
  }
}

/* Each iteration invalidates another MR: the failure of one post says
 * nothing about the MR the previous iteration invalidated. */
void frx_release_req(struct frx_pool *pool, struct frx_req *req)
{
  struct frx_mr *f, *next;

  list_for_each_entry_safe(f, next, &req->registered, req_list) {
    list_del(&f->req_list);
    if (frx_post_inv(pool, f)) {
      list_add_tail(&f->pool_list, &pool->drop_list);
      continue;
    }
    wait_event(f->inv_done, f->state != FRX_INUSE);
    ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
    list_add_tail(&f->pool_list, &pool->free_list);
  }
}

/* Every LOCAL_INV of the list is posted, none is waited for, and then the
 * whole list is unmapped. */
void frx_flush(struct frx_pool *pool, struct list_head *list)
{
  struct frx_mr *f;

  list_for_each_entry(f, list, pool_list)
    frx_post_inv(pool, f);
  list_for_each_entry(f, list, pool_list)
    ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'ib_dma_unmap_sg' releases the memory behind a memory region without invalidating its rkey on some paths, while other paths of this function invalidate it first; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
  // CHECK-MESSAGES: :[[@LINE-2]]:5: warning: 'ib_dma_unmap_sg' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :83:10: note: LOCAL_INV posted here
}
