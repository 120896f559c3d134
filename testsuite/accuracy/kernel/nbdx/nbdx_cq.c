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
#include <asm/byteorder.h>

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

static void nbdx_rsp_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct nbdx_rsp *rsp = container_of(wc->wr_cqe, struct nbdx_rsp, cqe);
	struct nbdx_queue *q = rsp->q;
	struct nbdx_req *req;
	u32 tag, status;

	if (wc->status != IB_WC_SUCCESS) {
		pr_err("nbdx: receive failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	tag = be32_to_cpu(rsp->buf[0]);
	status = be32_to_cpu(rsp->buf[1]);
	req = nbdx_tag_to_req(q, tag);
	if (req)
		nbdx_handle_rsp(req, status, wc);
	ib_post_recv(q->cm_id->qp, &rsp->wr, NULL);
}

int nbdx_post_rsp_buf(struct nbdx_queue *q, struct nbdx_rsp *rsp)
{
	rsp->q = q;
	rsp->cqe.done = nbdx_rsp_done;
	rsp->sge.addr = rsp->dma;
	rsp->sge.length = 2 * sizeof(__be32);
	rsp->sge.lkey = q->pd->local_dma_lkey;
	rsp->wr.next = NULL;
	rsp->wr.wr_cqe = &rsp->cqe;
	rsp->wr.sg_list = &rsp->sge;
	rsp->wr.num_sge = 1;
	return ib_post_recv(q->cm_id->qp, &rsp->wr, NULL);
}
