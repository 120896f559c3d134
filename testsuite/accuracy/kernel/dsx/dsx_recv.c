// SPDX-License-Identifier: GPL-2.0
/*
 * dsx_recv.c - response handling of the DSX storage client.
 *
 * Responses arrive in the receive ring.  Servers that support it invalidate
 * the command's key with SEND_WITH_INVALIDATE; the client then returns the
 * MR to the pool at once.  Otherwise the client posts a LOCAL_INV and the
 * command completes from its completion (dsx_io.c).
 */
#include <asm/byteorder.h>
#include "dsx.h"

struct dsx_recv_buf {
	struct dsx_conn		*conn;
	struct ib_cqe		cqe;
	struct ib_recv_wr	wr;
	struct ib_sge		sge;
	struct dsx_wire_rsp	*rsp;
};

static int dsx_post_recv(struct dsx_recv_buf *rb)
{
	rb->cqe.done = dsx_recv_done;
	rb->wr.next = NULL;
	rb->wr.wr_cqe = &rb->cqe;
	rb->wr.sg_list = &rb->sge;
	rb->wr.num_sge = 1;
	return ib_post_recv(rb->conn->qp, &rb->wr, NULL);
}

static void dsx_handle_rsp(struct dsx_req *req, int status)
{
	struct dsx_conn *conn = req->conn;

	if (!req->mr) {
		dsx_req_complete(req, status);
		return;
	}

	if (req->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (req->op == DSX_OP_LIST) {
			/* BUG: rdma-remote-invalidate-unchecked -- a listing reply is trusted to have killed its buffer's key, whichever key it named */
			dsx_io_release(req);
			dsx_req_complete(req, status);
			return;
		}
		/* OK: rdma-remote-invalidate-unchecked -- the invalidated key must be the command's own */
		if (unlikely(req->inv_rkey != req->mr->rkey)) {
			pr_err("dsx: server invalidated rkey %#x, expected %#x\n",
			       req->inv_rkey, req->mr->rkey);
			status = -EPROTO;
			goto local_inv;
		}
		dsx_io_release(req); /* OK: rdma-invalidation-leak -- the server invalidated exactly this key */
		dsx_req_complete(req, status);
		return;
	}

	if (status) {
		/* The server failed the command without touching the buffer. */
		/* BUG: rdma-invalidation-leak -- a failed command does not make the key dead; the MR returns to the pool still registered */
		dsx_io_release(req);
		dsx_req_complete(req, status);
		return;
	}

local_inv:
	req->status = status;
	if (dsx_io_invalidate(req)) {
		pr_err("dsx: cannot post LOCAL_INV\n");
		return;
	}
	/* BUG: rdma-unmap-before-invalidate -- the pages are unmapped while the LOCAL_INV may still be queued; only the MR waits for its completion */
	ib_dma_unmap_sg(conn->dev, req->sg, req->nents, req->dir);
	req->nents = 0;
}

void dsx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct dsx_recv_buf *rb = container_of(wc->wr_cqe, struct dsx_recv_buf, cqe);
	struct dsx_req *req;

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		if (wc->status != IB_WC_WR_FLUSH_ERR)
			pr_err("dsx: receive failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	req = (struct dsx_req *)(uintptr_t)le64_to_cpu(rb->rsp->tag);
	req->wc_flags = wc->wc_flags;
	req->inv_rkey = wc->ex.invalidate_rkey;
	dsx_handle_rsp(req, le32_to_cpu(rb->rsp->status));
	dsx_post_recv(rb);
}

int dsx_recv_ring_init(struct dsx_conn *conn, struct dsx_recv_buf *ring,
		       struct dsx_wire_rsp *bufs, u64 dma, int n)
{
	int i, ret;

	for (i = 0; i < n; i++) {
		ring[i].conn = conn;
		ring[i].rsp = &bufs[i];
		ring[i].sge.addr = dma + i * sizeof(*bufs);
		ring[i].sge.length = sizeof(*bufs);
		ring[i].sge.lkey = conn->pd->local_dma_lkey;
		ret = dsx_post_recv(&ring[i]);
		if (ret)
			return ret;
	}
	return 0;
}
