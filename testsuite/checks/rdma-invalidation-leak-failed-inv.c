// RUN: %check_ulplint --kernel %s rdma-invalidation-leak %t

// The response path of an NVMe-oF-style initiator: a response that did not
// invalidate the command's MR remotely has it invalidated locally, and the
// LOCAL_INV's completion ends the request. When that LOCAL_INV cannot be
// posted, nothing has invalidated the key yet.

#include <linux/kernel.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct blk_queue {
  struct ib_qp *qp;
  void (*error_recovery)(struct blk_queue *q);
};

struct blk_req {
  struct blk_queue *queue;
  struct ib_mr *mr;
  struct ib_cqe inv_cqe;
  struct ib_reg_wr reg_wr;
  int status;
};

static void blk_end_request(struct blk_req *req)
{
  if (req->mr) {
    ib_mr_pool_put(req->queue->qp, &req->queue->qp->rdma_mrs, req->mr);
    req->mr = NULL;
  }
}

int blk_map(struct blk_req *req, __be32 *key)
{
  req->mr = ib_mr_pool_get(req->queue->qp, &req->queue->qp->rdma_mrs);
  if (!req->mr)
    return -EAGAIN;
  req->reg_wr.wr.opcode = IB_WR_REG_MR;
  req->reg_wr.mr = req->mr;
  req->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
  *key = cpu_to_be32(req->mr->rkey);
  return ib_post_send(req->queue->qp, &req->reg_wr.wr, NULL);
}

static void blk_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
  struct blk_req *req = container_of(wc->wr_cqe, struct blk_req, inv_cqe);

  if (wc->status != IB_WC_SUCCESS) {
    req->queue->error_recovery(req->queue);
    return;
  }
  blk_end_request(req);
}

static int blk_inv_rkey(struct blk_req *req)
{
  struct ib_send_wr wr = {
    .opcode = IB_WR_LOCAL_INV,
    .send_flags = IB_SEND_SIGNALED,
    .ex.invalidate_rkey = req->mr->rkey,
  };

  req->inv_cqe.done = blk_inv_done;
  wr.wr_cqe = &req->inv_cqe;
  return ib_post_send(req->queue->qp, &wr, NULL);
}

/* The LOCAL_INV was not posted, yet the MR goes back to the pool. */
void blk_process_rsp(struct blk_req *req, struct ib_wc *wc)
{
  int ret;

  if (req->mr) {
    ret = blk_inv_rkey(req);
    if (unlikely(ret < 0)) {
      req->status = ret;
      blk_end_request(req);
      // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: 'blk_end_request' releases a memory region whose rkey is still valid for the peer: no LOCAL_INV or checked remote invalidation on this path; the peer keeps access to memory that is handed back [rdma-invalidation-leak]
    }
    return;
  }
  blk_end_request(req);
}

/* Near miss: a failed LOCAL_INV post starts error recovery (which drains
 * the queue and invalidates); the request ends from the completion. */
void blk_process_rsp_recover(struct blk_req *req, struct ib_wc *wc)
{
  int ret;

  if (req->mr) {
    ret = blk_inv_rkey(req);
    if (unlikely(ret < 0))
      req->queue->error_recovery(req->queue);
    return;
  }
  blk_end_request(req);
}
