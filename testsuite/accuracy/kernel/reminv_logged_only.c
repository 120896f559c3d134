// SPDX-License-Identifier: GPL-2.0
/*
 * rbc: the completion side of an invented remote block client ("rbc"). The
 * server may answer a command with SEND_WITH_INV naming the rkey of the
 * command's MR; otherwise the client posts a signaled LOCAL_INV and ends the
 * request from its completion. The MR goes back to the pool when the request
 * ends.
 *
 * The bug: the I/O queue's handler compares the invalidated rkey with the
 * request's, but on a mismatch it only logs and then treats the request's
 * key as invalidated anyway: the MR returns to the pool with a key that is
 * still valid. The check in the doc is worded as "compares"; judged by the
 * check's purpose (accept the remote invalidation only if it named this key)
 * a comparison whose result is ignored is no check, so this is annotated as
 * a finding. The admin queue hands the completion to a helper that compares
 * and refuses, which is right.
 */
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/blk-mq.h>
#include <rdma/ib_verbs.h>
#include <rdma/mr_pool.h>

struct rbc_queue {
	struct ib_qp		*qp;
	struct ib_device	*ibdev;
	void			*sess;
};

struct rbc_req {
	struct rbc_queue	*q;
	struct ib_mr		*mr;
	bool			need_inv;
	struct ib_send_wr	inv_wr;
	struct ib_cqe		inv_cqe;
	struct scatterlist	*sgl;
	int			nents;
	enum dma_data_direction	dir;
	blk_status_t		status;
};

void rbc_reconnect(void *sess);
struct rbc_req *rbc_tag_to_req(struct rbc_queue *q, u32 tag);

static void rbc_end_req(struct rbc_req *req)
{
	struct rbc_queue *q = req->q;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- the client returns MRs to its own pool */
		ib_mr_pool_put(q->qp, &q->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	ib_dma_unmap_sg(q->ibdev, req->sgl, req->nents, req->dir);
	blk_mq_end_request(blk_mq_rq_from_pdu(req), req->status);
}

static void rbc_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct rbc_req *req = container_of(wc->wr_cqe, struct rbc_req, inv_cqe);

	if (wc->status != IB_WC_SUCCESS) {
		rbc_reconnect(req->q->sess);
		return;
	}
	req->need_inv = false;
	rbc_end_req(req);
}

static void rbc_local_inv(struct rbc_req *req)
{
	req->inv_wr.opcode = IB_WR_LOCAL_INV;
	req->inv_wr.next = NULL;
	req->inv_wr.num_sge = 0;
	req->inv_wr.send_flags = IB_SEND_SIGNALED;
	req->inv_wr.ex.invalidate_rkey = req->mr->rkey;
	req->inv_cqe.done = rbc_inv_done;
	req->inv_wr.wr_cqe = &req->inv_cqe;
	if (ib_post_send(req->q->qp, &req->inv_wr, NULL))
		rbc_reconnect(req->q->sess);
}

void rbc_io_rsp(struct rbc_queue *q, u32 tag, blk_status_t status,
		struct ib_wc *wc)
{
	struct rbc_req *req = rbc_tag_to_req(q, tag);

	req->status = status;
	/* BUG: rdma-remote-invalidate-unchecked -- a mismatching invalidated rkey is only logged; the request's own key is then taken as dead */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (req->mr && wc->ex.invalidate_rkey != req->mr->rkey)
			pr_warn_ratelimited("rbc: server invalidated rkey %#x, expected %#x\n",
					    wc->ex.invalidate_rkey,
					    req->mr->rkey);
		req->need_inv = false;
	}

	if (req->need_inv) {
		rbc_local_inv(req);
		return;
	}
	rbc_end_req(req);
}

static int rbc_accept_remote_inv(struct rbc_req *req, struct ib_wc *wc)
{
	if (!(wc->wc_flags & IB_WC_WITH_INVALIDATE))
		return 0;
	if (!req->mr || wc->ex.invalidate_rkey != req->mr->rkey) {
		pr_err("rbc: bogus remote invalidation of %#x\n",
		       wc->ex.invalidate_rkey);
		return -EINVAL;
	}
	req->need_inv = false;
	return 0;
}

void rbc_admin_rsp(struct rbc_queue *q, u32 tag, blk_status_t status,
		   struct ib_wc *wc)
{
	struct rbc_req *req = rbc_tag_to_req(q, tag);

	req->status = status;
	/* OK: rdma-remote-invalidate-unchecked -- the completion goes to rbc_accept_remote_inv(), which compares the key and refuses a mismatch */
	if (rbc_accept_remote_inv(req, wc)) {
		rbc_reconnect(q->sess);
		return;
	}
	if (req->need_inv) {
		rbc_local_inv(req);
		return;
	}
	rbc_end_req(req);
}
