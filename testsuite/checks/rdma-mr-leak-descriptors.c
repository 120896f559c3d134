// RUN: %check_ulplint --kernel %s rdma-mr-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-mr-leak %t.plugin

// Fast-registration descriptors in the iSER and xprtrdma styles: an
// optional signature MR gated by a flag of the descriptor (not of the
// embedded resource struct that holds the MR), a REG_MR work request kept
// in the descriptor that names the MR, and a pool torn down in a loop whose
// condition first tests that the table exists.

#include <linux/blk-mq.h>
#include <linux/err.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/printk.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct dx_rsc {
  struct ib_mr *mr;
  struct ib_mr *sig_mr;
};

struct dx_desc {
  struct list_head list;
  struct dx_rsc rsc;
  bool pi_ctx;
  struct ib_reg_wr reg_wr;
};

struct dx_pool {
  struct ib_pd *pd;
  struct list_head list;
  struct dx_desc **table;
  unsigned int size;
  bool pi_support;
};

static struct dx_desc *dx_create_desc(struct dx_pool *pool, unsigned int depth) {
  struct dx_desc *desc;
  int ret;

  desc = kzalloc(sizeof(*desc), GFP_KERNEL);
  if (!desc)
    return ERR_PTR(-ENOMEM);
  desc->rsc.mr = ib_alloc_mr(pool->pd, IB_MR_TYPE_MEM_REG, depth);
  if (IS_ERR(desc->rsc.mr)) {
    ret = PTR_ERR(desc->rsc.mr);
    goto err_free;
  }
  if (pool->pi_support) {
    desc->rsc.sig_mr = ib_alloc_mr_integrity(pool->pd, depth, depth);
    if (IS_ERR(desc->rsc.sig_mr)) {
      ret = PTR_ERR(desc->rsc.sig_mr);
      goto err_free;
    }
    desc->pi_ctx = true;
  }
  return desc;

err_free:
  kfree(desc);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'kfree' frees the struct that still holds a memory region from 'ib_alloc_mr'; it leaks [rdma-mr-leak]
  return ERR_PTR(ret);
}

// Near miss: the signature MR exists exactly when pi_ctx is set, and the
// work request's mr field only names desc->rsc.mr.
static void dx_free_desc(struct dx_desc *desc) {
  ib_dereg_mr(desc->rsc.mr);
  if (desc->pi_ctx)
    ib_dereg_mr(desc->rsc.sig_mr);
  kfree(desc);
}

void dx_prepare(struct dx_desc *desc) {
  desc->reg_wr.wr.opcode = IB_WR_REG_MR;
  desc->reg_wr.mr = desc->rsc.mr;
  desc->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
}

void dx_pool_destroy(struct dx_pool *pool);

int dx_pool_init(struct dx_pool *pool, unsigned int n, unsigned int depth) {
  struct dx_desc *desc;
  unsigned int i;

  pool->table = kcalloc(n, sizeof(*pool->table), GFP_KERNEL);
  if (!pool->table)
    return -ENOMEM;
  for (i = 0; i < n; i++) {
    desc = dx_create_desc(pool, depth);
    if (IS_ERR(desc)) {
      pool->size = i;
      dx_pool_destroy(pool);
      return PTR_ERR(desc);
    }
    pool->table[i] = desc;
    list_add_tail(&desc->list, &pool->list);
  }
  pool->size = n;
  return 0;
}

// Near miss: the loop stops early when there is no table, and then there
// is no descriptor either.
void dx_pool_destroy(struct dx_pool *pool) {
  unsigned int i;

  for (i = 0; pool->table && i < pool->size; i++)
    dx_free_desc(pool->table[i]);
  kfree(pool->table);
}

// nvme-rdma's queue_rq: the map helper takes a pool MR and fails after it;
// queue_rq logs and returns a status picked by a conditional, an early exit
// all the same, so the helper's return is the leak.
struct dx_req {
  struct ib_mr *mr;
  struct scatterlist *sg;
  int nents;
};

static int dx_map(struct ib_qp *qp, struct dx_req *req) {
  int nr;

  req->mr = ib_mr_pool_get(qp, &qp->rdma_mrs);
  if (!req->mr)
    return -EAGAIN;
  nr = ib_map_mr_sg(req->mr, req->sg, req->nents, NULL, PAGE_SIZE);
  if (nr < 0) {
    ib_mr_pool_put(qp, &qp->rdma_mrs, req->mr);
    req->mr = NULL;
    return nr;
  }
  if (req->mr->length > (1u << 24))
    return -EINVAL;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ib_mr_pool_get' (held in dx_req.mr); it leaks [rdma-mr-leak]
  return 0;
}

blk_status_t dx_queue_rq(struct ib_qp *qp, struct dx_req *req) {
  int ret = dx_map(qp, req);

  if (ret < 0) {
    pr_err("dx: map failed (%d)\n", ret);
    return (ret == -ENOMEM || ret == -EAGAIN) ? BLK_STS_RESOURCE : BLK_STS_IOERR;
  }
  return BLK_STS_OK;
}

// The LOCAL_INV of a request's pool MR fails to post: dropping the pointer
// loses the MR (the request's unmap no longer sees it); giving it back to
// the pool first does not (near miss).
struct dx_inv_req {
  struct ib_mr *mr;
  struct ib_send_wr inv_wr;
};

int dx_inv_or_drop(struct ib_qp *qp, struct dx_inv_req *req) {
  int ret;

  memset(&req->inv_wr, 0, sizeof(req->inv_wr));
  req->inv_wr.opcode = IB_WR_LOCAL_INV;
  req->inv_wr.send_flags = IB_SEND_SIGNALED;
  req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
  ret = ib_post_send(qp, &req->inv_wr, NULL);
  if (ret)
    req->mr = NULL;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'dx_inv_req.mr' is overwritten while it still holds a memory region; it leaks [rdma-mr-leak]
  return ret;
}

int dx_inv_or_put(struct ib_qp *qp, struct dx_inv_req *req) {
  int ret;

  memset(&req->inv_wr, 0, sizeof(req->inv_wr));
  req->inv_wr.opcode = IB_WR_LOCAL_INV;
  req->inv_wr.send_flags = IB_SEND_SIGNALED;
  req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
  ret = ib_post_send(qp, &req->inv_wr, NULL);
  if (ret) {
    ib_mr_pool_put(qp, &qp->rdma_mrs, req->mr);
    req->mr = NULL;
  }
  return ret;
}
