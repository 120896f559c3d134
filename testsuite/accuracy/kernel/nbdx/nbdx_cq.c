// SPDX-License-Identifier: GPL-2.0
/*
 * nbdx_cq.c: response handling (see nbdx.h).
 *
 * The server may invalidate the request's key with SEND_WITH_INV; the
 * handler only checks that the request has an MR, not that the invalidated
 * rkey is that MR's. When the server answers "busy", the request is
 * requeued and its MR goes back to the free list at once, without any
 * invalidation, although the server saw its key. Overflow MRs are
 * deregistered in the completion path, once per I/O.
 */
#include "nbdx.h"

#define NBDX_RSP_BUSY	0x2

static void nbdx_release_mr(struct nbdx_req *req)
{
	struct nbdx_mr *nmr = req->nmr;

	req->nmr = NULL;
	if (nmr->overflow) {
		/* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- an overflow MR is deregistered in the completion path of every I/O that used one */
		ib_dereg_mr(nmr->mr);
		kfree(nmr);
		return;
	}
	nbdx_put_mr(req->q, nmr);
}

static void nbdx_local_inv(struct nbdx_req *req)
{
	struct ib_send_wr wr = {
		.opcode = IB_WR_LOCAL_INV,
		.ex.invalidate_rkey = req->nmr->mr->rkey,
	};

	ib_post_send(req->q->cm_id->qp, &wr, NULL);
}

void nbdx_handle_rsp(struct nbdx_req *req, u32 rsp_status, struct ib_wc *wc)
{
	if (rsp_status == NBDX_RSP_BUSY) {
		nbdx_release_mr(req); /* BUG: rdma-invalidation-leak -- the server saw this key; the MR is recycled for the retry without LOCAL_INV */
		nbdx_queue_rq(req);
		return;
	}

	/* BUG: rdma-remote-invalidate-unchecked -- only the presence of an MR is checked, not that the invalidated rkey is its key */
	if ((wc->wc_flags & IB_WC_WITH_INVALIDATE) && req->nmr) {
		nbdx_release_mr(req);
	} else if (req->nmr) {
		nbdx_local_inv(req);
		return;		/* released when the server's next credit arrives */
	}
	blk_mq_end_request(blk_mq_rq_from_pdu(req),
			   rsp_status ? BLK_STS_IOERR : BLK_STS_OK);
}
