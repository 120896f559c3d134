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
 * whole list is unmapped. The post results are dropped: no path of this
 * function knows of a failed post, so the finding is the missing wait. */
void frx_flush(struct frx_pool *pool, struct list_head *list)
{
  struct frx_mr *f;

  list_for_each_entry(f, list, pool_list)
    frx_post_inv(pool, f);
  list_for_each_entry(f, list, pool_list)
    ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'ib_dma_unmap_sg' runs right after posting a LOCAL_INV that nothing waits for; until the invalidation completes the peer can still access the memory being released [rdma-unmap-before-invalidate]
  // CHECK-MESSAGES: :83:10: note: LOCAL_INV posted here
}

/* A helper that parks an MR on whichever list its caller names: the drop
 * list (walked by frx_drop_stale) holds MRs waiting for deregistration, so
 * parking there recycles nothing (near miss). */
static void frx_park(struct frx_pool *pool, struct frx_mr *f, struct list_head *list)
{
  list_add_tail(&f->pool_list, list);
}

void frx_unmap_or_park(struct frx_pool *pool, struct frx_mr *f)
{
  if (frx_post_inv(pool, f)) {
    frx_park(pool, f, &pool->drop_list);
    return;
  }
  wait_event(f->inv_done, f->state != FRX_INUSE);
  ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
  frx_park(pool, f, &pool->free_list);
}

/* The same helper handing the MR straight back to the free list, key live. */
void frx_give_back(struct frx_pool *pool, struct frx_mr *f)
{
  frx_park(pool, f, &pool->free_list);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'frx_park' recycles the request that holds a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
}

/* Posts the LOCAL_INV and sleeps until it completed. */
static int frx_inv_sync(struct frx_pool *pool, struct frx_mr *f)
{
  int ret = frx_post_inv(pool, f);

  if (ret) {
    f->state = FRX_STALE;
    return ret;
  }
  wait_event(f->inv_done, f->state != FRX_INUSE);
  return 0;
}

/* Near miss (RDS's flush): the drop list is moved onto a local batch, every
 * MR of it is invalidated and waited for by the helper, then each goes back
 * to the free list or, stale, to the drop list. */
void frx_flush_sync(struct frx_pool *pool)
{
  struct frx_mr *f, *next;
  LIST_HEAD(batch);

  list_splice_init(&pool->drop_list, &batch);
  list_for_each_entry(f, &batch, pool_list)
    frx_inv_sync(pool, f);
  list_for_each_entry_safe(f, next, &batch, pool_list) {
    list_del(&f->pool_list);
    if (f->state == FRX_STALE) {
      frx_park(pool, f, &pool->drop_list);
      continue;
    }
    ib_dma_unmap_sg(pool->dev, f->sg, f->sg_len, DMA_BIDIRECTIONAL);
    frx_park(pool, f, &pool->free_list);
  }
}
