// SPDX-License-Identifier: GPL-2.0
/*
 * lsd_conn.c: QP creation (see lsd.h).
 *
 * Two records' worth of work requests per slot (the body WRITE and the
 * inline header SEND) plus one: enough, and a data-only factor. But the QP
 * only generates requested completions and lsd_ship.c never requests one,
 * so the send queue is never reclaimed; and 512 bytes of inline data are
 * requested without reading back what the device granted.
 */
#include "lsd.h"

int lsd_create_qp(struct lsd_conn *c)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = c;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* BUG(program): rdma-unsignaled-send-starvation -- nothing lsd_ship.c posts is ever signaled */
	attr.cap.max_send_wr = 2 * c->depth + 1; /* OK: rdma-send-queue-manual-factor, rdma-send-queue-undersized -- a WRITE and a SEND per record, plus one; no registration anywhere */
	attr.cap.max_recv_wr = 8;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = LSD_INLINE_HDR; /* BUG: rdma-queue-cap-unchecked -- 512 inline bytes, and the granted size is never read back */
	return rdma_create_qp(c->cm_id, c->pd, &attr);
}
