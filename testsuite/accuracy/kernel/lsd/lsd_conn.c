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

int lsd_alloc_cq(struct lsd_conn *c)
{
	c->cq = ib_alloc_cq(c->cm_id->device, c, 2 * c->depth + 1 + LSD_NR_ACKS,
			    0, IB_POLL_WORKQUEUE);
	if (IS_ERR(c->cq))
		return PTR_ERR(c->cq);
	return 0;
}

static void lsd_ack_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct lsd_ack *ack = container_of(wc->wr_cqe, struct lsd_ack, cqe);
	struct lsd_conn *c = ack->conn;

	if (wc->status != IB_WC_SUCCESS)
		return;
	/* the standby acknowledges records it has made durable */
	c->credits += be32_to_cpu(ack->acked);
	ib_post_recv(c->cm_id->qp, &ack->wr, NULL);
}

int lsd_post_acks(struct lsd_conn *c)
{
	int i, ret;

	for (i = 0; i < LSD_NR_ACKS; i++) {
		struct lsd_ack *ack = &c->acks[i];

		ack->conn = c;
		ack->cqe.done = lsd_ack_done;
		ack->sge.addr = c->acks_dma + i * sizeof(__be32);
		ack->sge.length = sizeof(__be32);
		ack->sge.lkey = c->pd->local_dma_lkey;
		ack->wr.next = NULL;
		ack->wr.wr_cqe = &ack->cqe;
		ack->wr.sg_list = &ack->sge;
		ack->wr.num_sge = 1;
		ret = ib_post_recv(c->cm_id->qp, &ack->wr, NULL);
		if (ret)
			return ret;
	}
	c->credits = c->depth;
	return 0;
}

void lsd_destroy(struct lsd_conn *c)
{
	rdma_disconnect(c->cm_id);
	ib_drain_qp(c->cm_id->qp);
	rdma_destroy_qp(c->cm_id);
	ib_free_cq(c->cq);
}
