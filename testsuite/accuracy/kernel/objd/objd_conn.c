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
