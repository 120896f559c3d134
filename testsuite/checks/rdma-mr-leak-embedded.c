// RUN: %check_ulplint --kernel %s rdma-mr-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-mr-leak %t.plugin

// iSER-style registration descriptors: the MR lives in a resource struct
// embedded in the descriptor (and in its protection context), allocated
// and freed by helpers that take the embedded struct's address.

#include <linux/err.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

struct emb_res {
  struct ib_mr *mr;
  bool valid;
};

struct emb_pi {
  struct emb_res rsc;
};

struct emb_desc {
  struct emb_res rsc;
  struct emb_pi *pi;
  struct list_head list;
};

struct emb_pool {
  struct list_head all;
};

static int emb_alloc_res(struct ib_pd *pd, struct emb_res *res, u32 pages)
{
  res->mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, pages);
  if (IS_ERR(res->mr))
    return PTR_ERR(res->mr);
  res->valid = false;
  return 0;
}

static void emb_free_res(struct emb_res *res)
{
  ib_dereg_mr(res->mr);
}

/* Every failure unwinds what came before it. */
static struct emb_desc *emb_create(struct ib_pd *pd, u32 pages, bool pi)
{
  struct emb_desc *desc;
  int ret;

  desc = kzalloc(sizeof(*desc), GFP_KERNEL);
  if (!desc)
    return ERR_PTR(-ENOMEM);
  ret = emb_alloc_res(pd, &desc->rsc, pages);
  if (ret)
    goto err_free;
  if (pi) {
    desc->pi = kzalloc(sizeof(*desc->pi), GFP_KERNEL);
    if (!desc->pi) {
      ret = -ENOMEM;
      goto err_res;
    }
    ret = emb_alloc_res(pd, &desc->pi->rsc, pages);
    if (ret)
      goto err_pi;
  }
  return desc;

err_pi:
  kfree(desc->pi);
err_res:
  emb_free_res(&desc->rsc);
err_free:
  kfree(desc);
  return ERR_PTR(ret);
}

/* The protection context's failure jumps past the data MR's release. */
struct emb_desc *emb_create_pi(struct ib_pd *pd, u32 pages)
{
  struct emb_desc *desc;
  int ret;

  desc = kzalloc(sizeof(*desc), GFP_KERNEL);
  if (!desc)
    return ERR_PTR(-ENOMEM);
  ret = emb_alloc_res(pd, &desc->rsc, pages);
  if (ret)
    goto err_free;
  desc->pi = kzalloc(sizeof(*desc->pi), GFP_KERNEL);
  if (!desc->pi) {
    ret = -ENOMEM;
    goto err_free;
  }
  return desc;

err_free:
  kfree(desc);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'kfree' frees the struct that still holds a memory region from 'ib_alloc_mr'; it leaks [rdma-mr-leak]
  // CHECK-MESSAGES: :35:13: note: memory region obtained here
  return ERR_PTR(ret);
}

/* A descriptor that failed is an error pointer: nothing of it is left here. */
int emb_fill(struct emb_pool *pool, struct ib_pd *pd, int count, u32 pages)
{
  struct emb_desc *desc, *tmp;

  INIT_LIST_HEAD(&pool->all);
  for (int i = 0; i < count; i++) {
    desc = emb_create(pd, pages, i & 1);
    if (IS_ERR(desc))
      goto err;
    list_add_tail(&desc->list, &pool->all);
  }
  return 0;

err:
  list_for_each_entry_safe(desc, tmp, &pool->all, list) {
    list_del(&desc->list);
    emb_free_res(&desc->rsc);
    if (desc->pi) {
      emb_free_res(&desc->pi->rsc);
      kfree(desc->pi);
    }
    kfree(desc);
  }
  return PTR_ERR(desc);
}
