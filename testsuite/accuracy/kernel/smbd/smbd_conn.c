// SPDX-License-Identifier: GPL-2.0
/*
 * sdx smbd_conn.c: QP creation and the receive path (see smbdx.h).
 *
 * The send queue holds one SEND per send credit; the credit target and the
 * SGE counts are checked against the device. But smbd_mr.c posts a REG_MR
 * and a LOCAL_INV for every RDMA-channel READ/WRITE on the same QP, up to
 * responder_resources of them at a time, and nothing reserves entries for
 * them, so with all credits in use the registration post fails.
 *
 * The receive handler trusts IB_WC_WITH_INVALIDATE: it marks the most
 * recently registered MR invalidated without comparing the invalidated rkey
 * with that MR's.
 */
#include "smbdx.h"

int sdx_create_qp(struct sdx_conn *conn)
{
	struct ib_device *dev = conn->id->device;
	struct ib_qp_init_attr qp_attr;

	if (conn->send_credit_target > dev->attrs.max_cqe ||
	    conn->send_credit_target > dev->attrs.max_qp_wr) {
		pr_err("sdx: send_credit_target %d exceeds device limits\n",
		       conn->send_credit_target);
		return -EINVAL;
	}
	if (dev->attrs.max_send_sge < SDX_MAX_SEND_SGE) {
		pr_err("sdx: device max_send_sge %d too small\n",
		       dev->attrs.max_send_sge);
		return -EINVAL;
	}

	memset(&qp_attr, 0, sizeof(qp_attr));
	qp_attr.qp_context = conn;
	qp_attr.send_cq = conn->send_cq;
	qp_attr.recv_cq = conn->recv_cq;
	/* BUG(program): rdma-send-queue-undersized -- the REG_MR and LOCAL_INV work requests of smbd_mr.c share this queue but get no entries */
	qp_attr.cap.max_send_wr = conn->send_credit_target; /* OK: rdma-queue-cap-unchecked -- compared with max_qp_wr above */
	qp_attr.cap.max_recv_wr = conn->receive_credit_max;
	qp_attr.cap.max_send_sge = SDX_MAX_SEND_SGE; /* OK: rdma-queue-cap-unchecked -- six SGEs, checked against attrs.max_send_sge above */
	qp_attr.cap.max_recv_sge = SDX_MAX_RECV_SGE;
	qp_attr.cap.max_inline_data = 0;
	qp_attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* OK: rdma-unsignaled-send-starvation -- data SENDs are signaled */
	qp_attr.qp_type = IB_QPT_RC;
	return rdma_create_qp(conn->id, conn->pd, &qp_attr);
}

int sdx_post_send(struct sdx_conn *conn, struct ib_send_wr *wr,
		  struct ib_cqe *cqe)
{
	wr->wr_cqe = cqe;
	wr->opcode = IB_WR_SEND;
	wr->send_flags = IB_SEND_SIGNALED;
	return ib_post_send(conn->id->qp, wr, NULL);
}

struct sdx_response {
	struct ib_cqe		cqe;
	struct sdx_conn		*conn;
	struct ib_sge		sge;
};

void sdx_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct sdx_response *resp = container_of(wc->wr_cqe,
						 struct sdx_response, cqe);
	struct sdx_conn *conn = resp->conn;

	if (wc->status != IB_WC_SUCCESS)
		return;
	/* BUG: rdma-remote-invalidate-unchecked -- the last registered MR is taken as the invalidated one without comparing wc->ex.invalidate_rkey */
	if (wc->wc_flags & IB_WC_WITH_INVALIDATE) {
		if (conn->last_registered) {
			conn->last_registered->need_invalidate = false;
			conn->last_registered->state = SDX_MR_INVALIDATED;
		}
	}
}

void sdx_destroy_qp(struct sdx_conn *conn)
{
	ib_drain_qp(conn->id->qp);
	sdx_destroy_mr_list(conn);
	rdma_destroy_qp(conn->id);
}
