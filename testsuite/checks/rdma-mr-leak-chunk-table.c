// RUN: %check_ulplint --kernel %s rdma-mr-leak %t
// RUN: %check_ulplint --kernel --mode=plugin %s rdma-mr-leak %t.plugin

// A multipath block client (RTRS style): a session registers its chunk
// table once, one MR per chunk kept in path->mrs[]; on reconnect the same
// MRs are re-registered with a LOCAL_INV chained in front of each REG_MR.
// The abort path walks every request and gives its pool MR back.

#include <linux/kernel.h>
#include <linux/errno.h>
#include <linux/err.h>
#include <linux/completion.h>
#include <linux/string.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

#define CHUNK_PAGES 64

struct blk_path {
  struct ib_device *ibdev;
  struct ib_pd *pd;
  struct ib_qp *qp;
  struct ib_mr **mrs;
  struct sg_table *chunk_sgt;
  int mrs_num;
  struct completion reg_done;
};

struct blk_req {
  struct ib_mr *mr;
  int nents;
};

struct blk_queue {
  struct ib_qp *qp;
  struct ib_device *ibdev;
  struct blk_req *tags;
  int queue_size;
};

// Near-miss: each new MR goes into path->mrs[i] before the post, and the
// reconnect branch takes it from there; the LOCAL_INV in the chain belongs
// to the table's entry, not to the local `mr` of the next iteration.
int blk_reg_chunks(struct blk_path *path, bool reconnect)
{
  struct ib_send_wr inv, *first;
  struct ib_reg_wr rwr;
  struct ib_mr *mr;
  int i, err;

  for (i = 0; i < path->mrs_num; i++) {
    memset(&rwr, 0, sizeof(rwr));
    first = &rwr.wr;
    if (reconnect) {
      mr = path->mrs[i];
      memset(&inv, 0, sizeof(inv));
      inv.opcode = IB_WR_LOCAL_INV;
      inv.ex.invalidate_rkey = mr->rkey;
      inv.next = &rwr.wr;
      first = &inv;
    } else {
      mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG, CHUNK_PAGES);
      if (IS_ERR(mr)) {
        err = PTR_ERR(mr);
        goto err_dereg;
      }
      path->mrs[i] = mr;
    }
    rwr.wr.opcode = IB_WR_REG_MR;
    rwr.mr = mr;
    rwr.key = mr->rkey;
    rwr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
    err = ib_post_send(path->qp, first, NULL);
    if (err) {
      i++;
      goto err_dereg;
    }
  }
  wait_for_completion(&path->reg_done);
  return 0;

err_dereg:
  if (reconnect)
    return err;
  while (i--)
    ib_dereg_mr(path->mrs[i]);
  return err;
}

// Positive: the MR is not in the table yet when the mapping fails.
int blk_reg_one(struct blk_path *path, int i)
{
  struct ib_mr *mr;
  int nr;

  mr = ib_alloc_mr(path->pd, IB_MR_TYPE_MEM_REG, CHUNK_PAGES);
  if (IS_ERR(mr))
    return PTR_ERR(mr);
  nr = ib_map_mr_sg(mr, path->chunk_sgt[i].sgl, path->chunk_sgt[i].nents, NULL, 4096);
  if (nr != path->chunk_sgt[i].nents)
    return -EINVAL;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: error path returns without releasing the memory region from 'ib_alloc_mr'
  path->mrs[i] = mr;
  return 0;
}

static void blk_unmap_data(struct blk_queue *q, struct blk_req *req)
{
  if (!req->nents)
    return;
  if (req->mr) {
    ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
    req->mr = NULL;
  }
  req->nents = 0;
}

// Near-miss: each request's MR is put back before its pointer is cleared;
// the state of one request does not carry into the next one's clear.
void blk_abort_inflight(struct blk_queue *q)
{
  struct blk_req *req;
  int i;

  for (i = 0; i < q->queue_size; i++) {
    req = &q->tags[i];
    if (!req->nents)
      continue;
    blk_unmap_data(q, req);
  }
}

int blk_map_data(struct blk_queue *q, struct blk_req *req)
{
  req->mr = ib_mr_pool_get(q->qp, &q->qp->rdma_mrs);
  if (!req->mr)
    return -EAGAIN;
  req->nents = 1;
  return 0;
}
