// SPDX-License-Identifier: GPL-2.0
/*
 * nbdx_main.c: queue setup (see nbdx.h).
 *
 * Half as many MRs as tags are allocated up front (nbdx_io.c allocates more
 * on demand) and unwound correctly. The QP is
 * created with IB_SIGNAL_REQ_WR, but nbdx_io.c never sets IB_SEND_SIGNALED
 * on anything it posts (the driver learns about I/O completion from the
 * server's responses on the receive queue), so nothing ever retires
 * send-queue entries and posts start failing after max_send_wr of them.
 * The queue size itself covers REG_MR, SEND and LOCAL_INV per request, by
 * the hand-made factor rdma-send-queue-manual-factor is about (its doc
 * speaks of depths in fields or globals; a macro depth is the same
 * arithmetic, so it is annotated as a finding).
 */
#include "nbdx.h"

int nbdx_create_qp(struct nbdx_queue *q)
{
	struct ib_qp_init_attr attr = { };

	attr.qp_context = q;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IB_QPT_RC;
	attr.sq_sig_type = IB_SIGNAL_REQ_WR; /* BUG(program): rdma-unsignaled-send-starvation -- nbdx_io.c and nbdx_cq.c never post a signaled work request */
	/* BUG: rdma-send-queue-manual-factor -- the tag depth times a hand-made REG+SEND+INV factor; the depth is a macro rather than a field, which changes nothing for the migration */
	attr.cap.max_send_wr = 3 * NBDX_QUEUE_DEPTH + 1; /* OK: rdma-send-queue-undersized -- REG_MR, SEND and LOCAL_INV for each of the NBDX_QUEUE_DEPTH tags, plus one */
	attr.cap.max_recv_wr = NBDX_QUEUE_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	return rdma_create_qp(q->cm_id, q->pd, &attr);
}

int nbdx_alloc_mrs(struct nbdx_queue *q)
{
	int i;

	q->mrs = kcalloc(NBDX_NR_MRS, sizeof(*q->mrs), GFP_KERNEL);
	if (!q->mrs)
		return -ENOMEM;
	INIT_LIST_HEAD(&q->free_mrs);
	spin_lock_init(&q->lock);
	for (i = 0; i < NBDX_NR_MRS; i++) {
		/* BUG: rdma-local-mr-management -- the driver allocates its own FR MRs */
		q->mrs[i].mr = ib_alloc_mr(q->pd, IB_MR_TYPE_MEM_REG,
					   NBDX_MAX_PAGES); /* OK: rdma-registration-in-datapath -- queue setup */
		if (IS_ERR(q->mrs[i].mr))
			goto unwind;
		list_add_tail(&q->mrs[i].entry, &q->free_mrs);
	}
	return 0;

unwind:
	while (--i >= 0)
		/* BUG: rdma-local-mr-management -- the driver deregisters its MRs */
		ib_dereg_mr(q->mrs[i].mr); /* OK: rdma-mr-leak -- unwinds exactly the MRs allocated */
	kfree(q->mrs);
	return -ENOMEM;
}

void nbdx_free_queue(struct nbdx_queue *q)
{
	int i;

	rdma_destroy_qp(q->cm_id);
	for (i = 0; i < NBDX_NR_MRS; i++)
		/* BUG: rdma-local-mr-management -- the driver deregisters its MRs */
		ib_dereg_mr(q->mrs[i].mr);
	kfree(q->mrs);
}

int nbdx_init_queue(struct nbdx_queue *q, struct rdma_cm_id *cm_id,
		    struct ib_pd *pd)
{
	int ret;

	q->cm_id = cm_id;
	q->pd = pd;
	q->cq = ib_alloc_cq(cm_id->device, q, 4 * NBDX_QUEUE_DEPTH + 1, 0,
			    IB_POLL_SOFTIRQ);
	if (IS_ERR(q->cq))
		return PTR_ERR(q->cq);
	ret = nbdx_create_qp(q);
	if (ret)
		goto out_free_cq;
	ret = nbdx_alloc_mrs(q);
	if (ret)
		goto out_destroy_qp;
	return 0;

out_destroy_qp:
	rdma_destroy_qp(cm_id);
out_free_cq:
	ib_free_cq(q->cq);
	return ret;
}
