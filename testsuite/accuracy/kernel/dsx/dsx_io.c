// SPDX-License-Identifier: GPL-2.0
/*
 * dsx_io.c - command submission and memory registration of the DSX client.
 *
 * The command's buffer is registered with an MR from the connection's
 * pool; the REG_MR is chained, unsignaled, in front of the command SEND
 * and the wire request carries the MR's address, key and length.  The MR
 * goes back to the pool from the completion of its LOCAL_INV, or from the
 * response path when the server invalidated the key itself.
 */
#include <linux/mm.h>
#include <linux/jiffies.h>
#include <asm/byteorder.h>
#include "dsx.h"

static void dsx_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("dsx: command SEND failed: %s\n", ib_wc_status_msg(wc->status));
}

static void dsx_reg_done(struct ib_cq *cq, struct ib_wc *wc)
{
	if (unlikely(wc->status != IB_WC_SUCCESS))
		pr_err("dsx: REG_MR failed: %s\n", ib_wc_status_msg(wc->status));
}

void dsx_req_complete(struct dsx_req *req, int status)
{
	spin_lock(&req->conn->lock);
	list_del_init(&req->entry);
	spin_unlock(&req->conn->lock);
	req->done(req, status);
}

void dsx_io_release(struct dsx_req *req)
{
	struct dsx_conn *conn = req->conn;

	if (req->mr) {
		/* BUG: rdma-local-mr-management -- pool put by the ULP */
		ib_mr_pool_put(conn->qp, &conn->qp->rdma_mrs, req->mr);
		req->mr = NULL;
	}
	if (req->nents) {
		ib_dma_unmap_sg(conn->dev, req->sg, req->nents, req->dir);
		req->nents = 0;
	}
}

static void dsx_inv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct dsx_req *req = container_of(wc->wr_cqe, struct dsx_req, inv_cqe);

	if (unlikely(wc->status != IB_WC_SUCCESS)) {
		pr_err("dsx: LOCAL_INV failed: %s\n", ib_wc_status_msg(wc->status));
		return;
	}
	/* OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the MR goes back from its LOCAL_INV completion */
	dsx_io_release(req);
	dsx_req_complete(req, req->status);
}

int dsx_io_invalidate(struct dsx_req *req)
{
	struct ib_send_wr *wr = &req->inv_wr;

	req->inv_cqe.done = dsx_inv_done;
	wr->next = NULL;
	wr->wr_cqe = &req->inv_cqe;
	wr->num_sge = 0;
	wr->opcode = IB_WR_LOCAL_INV;
	wr->send_flags = IB_SEND_SIGNALED;
	wr->ex.invalidate_rkey = req->mr->rkey;
	return ib_post_send(req->conn->qp, wr, NULL);
}

static int dsx_map_data(struct dsx_req *req)
{
	struct dsx_conn *conn = req->conn;
	int count, n;

	/* BUG: rdma-local-mr-management -- pool MR taken by the ULP */
	req->mr = ib_mr_pool_get(conn->qp, &conn->qp->rdma_mrs);
	if (!req->mr)
		return -EAGAIN;
	count = ib_dma_map_sg(conn->dev, req->sg, req->nents, req->dir);
	if (unlikely(!count))
		return -EIO; // BUG: rdma-mr-leak -- the MR taken from the pool above is never put back
	/* BUG: rdma-local-mr-management -- page list mapped by the ULP */
	n = ib_map_mr_sg(req->mr, req->sg, count, NULL, PAGE_SIZE);
	if (unlikely(n != count)) {
		dsx_io_release(req); /* OK: rdma-mr-leak -- MR and mapping released on the short mapping */
		return -EINVAL;
	}

	ib_update_fast_reg_key(req->mr, ib_inc_rkey(req->mr->rkey));
	req->reg_cqe.done = dsx_reg_done;
	req->reg_wr.wr.opcode = IB_WR_REG_MR; // BUG: rdma-local-mr-management -- REG_MR built by the ULP
	req->reg_wr.wr.wr_cqe = &req->reg_cqe;
	req->reg_wr.wr.num_sge = 0;
	req->reg_wr.wr.send_flags = 0;
	req->reg_wr.mr = req->mr; /* OK: rdma-rkey-reuse -- ib_inc_rkey() rotated the key just above */
	req->reg_wr.key = req->mr->rkey;
	/* OK: rdma-access-flags-invalid -- the server's RDMA WRITE target also gets local write */
	req->reg_wr.access = req->dir == DMA_FROM_DEVICE ?
		IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE : IB_ACCESS_REMOTE_READ;

	req->wire->addr = cpu_to_le64(req->mr->iova);
	req->wire->rkey = cpu_to_le32(req->mr->rkey);
	req->wire->length = cpu_to_le32(req->mr->length);
	return 0;
}

/* The caller was interrupted: forget the command. */
void dsx_abort(struct dsx_req *req)
{
	spin_lock(&req->conn->lock);
	list_del_init(&req->entry);
	spin_unlock(&req->conn->lock);
	/* BUG: rdma-invalidation-leak -- the server may still RDMA into the buffer with the key it was sent; the MR and pages are released without a LOCAL_INV */
	dsx_io_release(req);
}

int dsx_submit(struct dsx_req *req)
{
	struct dsx_conn *conn = req->conn;
	struct ib_send_wr *first = &req->send_wr;
	int ret;

	if (req->op != DSX_OP_STAT) {
		ret = dsx_map_data(req);
		if (ret)
			return ret;
		req->reg_wr.wr.next = &req->send_wr;
		first = &req->reg_wr.wr;
	}

	req->send_sge.addr = req->wire_dma;
	req->send_sge.length = sizeof(*req->wire);
	req->send_sge.lkey = conn->pd->local_dma_lkey;
	req->send_cqe.done = dsx_send_done;
	req->send_wr.next = NULL;
	req->send_wr.wr_cqe = &req->send_cqe;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;
	req->send_wr.opcode = IB_WR_SEND;
	req->send_wr.send_flags = IB_SEND_SIGNALED;

	req->deadline = jiffies + msecs_to_jiffies(DSX_TIMEOUT_MS);
	spin_lock(&conn->lock);
	list_add_tail(&req->entry, &conn->inflight);
	spin_unlock(&conn->lock);

	ret = ib_post_send(conn->qp, first, NULL);
	if (unlikely(ret)) {
		spin_lock(&conn->lock);
		list_del_init(&req->entry);
		spin_unlock(&conn->lock);
		/* OK: rdma-invalidation-leak -- the chain was not posted, no key reached the server */
		dsx_io_release(req);
	}
	return ret;
}
