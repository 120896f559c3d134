// RUN: %check_ulplint --kernel %s rdma-invalidation-leak %t

// An RPC-over-RDMA client (xprtrdma style): each chunk's MR is registered
// with remote rights, its rkey goes to the server in the call, and after
// the reply a chain of LOCAL_INVs fences the MRs. A LOCAL_INV's own
// completion handler returns its MR to the free list; a LOCAL_INV that was
// flushed or failed left the rkey valid, so only a successful completion
// may do that.

#include <linux/kernel.h>
#include <linux/list.h>
#include <asm/byteorder.h>
#include <rdma/ib_verbs.h>

struct xp_ep {
  struct ib_qp *qp;
  struct list_head free_mrs;
};

struct xp_mr {
  struct xp_ep *ep;
  struct ib_mr *ibmr;
  struct list_head list;
  struct ib_cqe cqe;
  struct ib_send_wr inv_wr;
  struct ib_reg_wr reg_wr;
  int state;
};

enum { XP_MR_FREE, XP_MR_STALE };

struct xp_call {
  __be32 rkey;
};

static void xp_mr_put(struct xp_mr *mr)
{
  list_add(&mr->list, &mr->ep->free_mrs);
}

struct xp_mr *xp_mr_get(struct xp_ep *ep)
{
  struct xp_mr *mr = list_first_entry_or_null(&ep->free_mrs, struct xp_mr, list);

  if (mr)
    list_del_init(&mr->list);
  return mr;
}

static void xp_mr_done(struct ib_wc *wc, struct xp_mr *mr)
{
  if (likely(wc->status == IB_WC_SUCCESS))
    xp_mr_put(mr); // the helper sees the status
}

static void xp_disconnect(struct xp_ep *ep);

// Positive: the handler never looks at wc->status.
static void xp_wc_localinv_nocheck(struct ib_cq *cq, struct ib_wc *wc)
{
  struct xp_mr *mr = container_of(wc->wr_cqe, struct xp_mr, cqe);

  xp_mr_put(mr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'xp_mr_put' recycles the request that holds a memory region when its LOCAL_INV completes, without checking the completion's status: a LOCAL_INV that failed or was flushed leaves the rkey valid
}

// Positive: the failure is seen, logged, and the MR recycled anyway.
static void xp_wc_localinv_logged(struct ib_cq *cq, struct ib_wc *wc)
{
  struct xp_mr *mr = container_of(wc->wr_cqe, struct xp_mr, cqe);

  if (wc->status != IB_WC_SUCCESS)
    pr_warn("xp: LOCAL_INV flushed: %d\n", wc->status);
  xp_mr_put(mr);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: 'xp_mr_put' recycles the request that holds a memory region after its LOCAL_INV completed in error: the rkey is still valid
}

// Near-miss: the failure path leaves the MR to the disconnect, which
// deregisters it.
static void xp_wc_localinv_done(struct ib_cq *cq, struct ib_wc *wc)
{
  struct xp_mr *mr = container_of(wc->wr_cqe, struct xp_mr, cqe);

  if (wc->status != IB_WC_SUCCESS) {
    xp_disconnect(mr->ep);
    return;
  }
  xp_mr_put(mr);
}

// Near-miss: the status check is in the helper the completion is given to.
static void xp_wc_localinv_helper(struct ib_cq *cq, struct ib_wc *wc)
{
  struct xp_mr *mr = container_of(wc->wr_cqe, struct xp_mr, cqe);

  xp_mr_done(wc, mr);
}

// Near-miss: the status is kept in the MR's state (RDS style) and the MR
// is freed only in the state a successful LOCAL_INV leaves.
static void xp_wc_localinv_state(struct ib_cq *cq, struct ib_wc *wc)
{
  struct xp_mr *mr = container_of(wc->wr_cqe, struct xp_mr, cqe);

  mr->state = wc->status == IB_WC_SUCCESS ? XP_MR_FREE : XP_MR_STALE;
  if (mr->state == XP_MR_FREE)
    xp_mr_put(mr);
}

// The chain: every LOCAL_INV signaled, each MR's cqe dispatching to one of
// the handlers above.
static void xp_arm(struct xp_mr *mr, int style)
{
  switch (style) {
  case 0:
    mr->cqe.done = xp_wc_localinv_nocheck;
    break;
  case 1:
    mr->cqe.done = xp_wc_localinv_logged;
    break;
  case 2:
    mr->cqe.done = xp_wc_localinv_done;
    break;
  case 3:
    mr->cqe.done = xp_wc_localinv_state;
    break;
  default:
    mr->cqe.done = xp_wc_localinv_helper;
    break;
  }
}

int xp_unmap_async(struct xp_ep *ep, struct xp_mr *mr, int style)
{
  xp_arm(mr, style);
  mr->inv_wr.next = NULL;
  mr->inv_wr.wr_cqe = &mr->cqe;
  mr->inv_wr.opcode = IB_WR_LOCAL_INV;
  mr->inv_wr.send_flags = IB_SEND_SIGNALED;
  mr->inv_wr.ex.invalidate_rkey = mr->ibmr->rkey;
  return ib_post_send(ep->qp, &mr->inv_wr, NULL);
}

int xp_map(struct xp_ep *ep, struct xp_mr *mr, struct xp_call *call)
{
  mr->reg_wr.wr.opcode = IB_WR_REG_MR;
  mr->reg_wr.wr.send_flags = 0;
  mr->reg_wr.mr = mr->ibmr;
  mr->reg_wr.key = mr->ibmr->rkey;
  mr->reg_wr.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
  call->rkey = cpu_to_be32(mr->ibmr->rkey);
  return ib_post_send(ep->qp, &mr->reg_wr.wr, NULL);
}
