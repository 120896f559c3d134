// SPDX-License-Identifier: GPL-2.0
/*
 * objd_conn.c: QP creation (see objd.h).
 *
 * The QP declares one rdma_rw context per command, sized with
 * rdma_rw_mr_factor(), so the core accounts for registration work requests;
 * the target's own entries are one response SEND (and at most one metadata
 * READ) per command plus the drain. The bug: eight send SGEs are requested
 * without comparing with attrs.max_send_sge.
 */
#include "objd.h"

int objd_create_qp(struct objd_conn *conn)
{
	struct ib_device *dev = conn->cm_id->device;
	struct ib_qp_init_attr attr = { };
	int ret;

	attr.qp_context = conn;
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- responses and metadata READs are signaled, rdma_rw contexts post with a cqe */
	attr.port_num = conn->cm_id->port_num;
	/* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- the metadata READ and the response of a command, plus a drain entry; registration is the core's, through max_rdma_ctxs */
	attr.cap.max_send_wr = 2 * conn->depth + 1;
	attr.cap.max_rdma_ctxs = conn->depth *
		rdma_rw_mr_factor(dev, conn->cm_id->port_num, OBJD_MAX_PAGES);
	attr.cap.max_send_sge = OBJD_MAX_SEND_SGE; /* BUG: rdma-queue-cap-unchecked -- 8 send SGEs, never compared with attrs.max_send_sge */
	/* BUG: rdma-send-queue-undersized -- conn->depth receives stay posted: ib_drain_qp()'s drain receive finds no free entry */
	attr.cap.max_recv_wr = conn->depth;
	attr.cap.max_recv_sge = 1;

	ret = rdma_create_qp(conn->cm_id, conn->pd, &attr);
	if (!ret)
		conn->qp = conn->cm_id->qp;
	return ret;
}

void objd_destroy_qp(struct objd_conn *conn)
{
	ib_drain_qp(conn->qp);
	rdma_destroy_qp(conn->cm_id);
}

int objd_alloc_cq(struct objd_conn *conn)
{
	/* one completion per receive, metadata READ, rw context and response */
	conn->cq_size = 4 * conn->depth + 1;
	conn->cq = ib_cq_pool_get(conn->cm_id->device, conn->cq_size, 0,
				  IB_POLL_WORKQUEUE);
	if (IS_ERR(conn->cq))
		return PTR_ERR(conn->cq);
	return 0;
}

static void objd_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct objd_recv *r = container_of(wc->wr_cqe, struct objd_recv, cqe);

	if (wc->status != IB_WC_SUCCESS)
		return;		/* flushed: the connection is going away */
	objd_handle_cmd(r->conn, r, wc->byte_len);
}

int objd_post_recv(struct objd_conn *conn, struct objd_recv *r)
{
	r->conn = conn;
	r->cqe.done = objd_recv_done;
	r->sge.addr = r->dma;
	r->sge.length = 512;
	r->sge.lkey = conn->pd->local_dma_lkey;
	r->wr.next = NULL;
	r->wr.wr_cqe = &r->cqe;
	r->wr.sg_list = &r->sge;
	r->wr.num_sge = 1;
	return ib_post_recv(conn->qp, &r->wr, NULL);
}

int objd_post_recvs(struct objd_conn *conn)
{
	u32 i;
	int ret;

	for (i = 0; i < conn->depth; i++) {
		ret = objd_post_recv(conn, &conn->recvs[i]);
		if (ret)
			return ret;
	}
	return 0;
}

void objd_free_conn(struct objd_conn *conn)
{
	objd_destroy_qp(conn);
	ib_cq_pool_put(conn->cq, conn->cq_size);
	kfree(conn->recvs);
}
