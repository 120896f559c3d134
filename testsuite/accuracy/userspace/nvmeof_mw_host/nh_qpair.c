/*
 * nh_qpair.c: queue pair and buffer setup of the nh host.
 *
 * The send queue holds BIND_MW + SEND + LOCAL_INV for every request, plus
 * one; the depth is clamped to the device first.  That is correct, but the
 * factor is the ULP's own arithmetic for its registration work requests
 * (migration note).  The data MR grants no remote rights itself: windows
 * carry them.
 */
#include "nh.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int nh_qpair_create(struct nh_qpair *q, unsigned int depth)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr attr;

	if (ibv_query_device(q->ctx, &dattr))
		return -errno;
	q->depth = depth;
	if (NH_WRS_PER_REQ * q->depth + 1 > (unsigned int)dattr.max_qp_wr)
		q->depth = (dattr.max_qp_wr - 1) / NH_WRS_PER_REQ;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- BIND_MW + SEND + LOCAL_INV per request, plus one */
	attr.cap.max_send_wr = NH_WRS_PER_REQ * q->depth + 1; // BUG: rdma-send-queue-manual-factor -- depth times the ULP's own factor for its BIND/INV work requests
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &attr);
	return q->qp ? 0 : -errno;
}

int nh_qpair_buffers(struct nh_qpair *q, void *arena, size_t arena_len)
{
	/* OK: rdma-access-flags-invalid -- LOCAL_WRITE and MW_BIND, as window binds need */
	/* OK: rdma-remote-access-overbroad -- no remote rights on the MR itself */
	/* OK: rdma-local-mr-management -- the MR under the windows; the window sites (nh_mw.c) are the ones reported */
	q->data_mr = ibv_reg_mr(q->pd, arena, arena_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!q->data_mr)
		return -errno;
	q->reqs = calloc(q->depth, sizeof(*q->reqs));
	if (!q->reqs)
		goto err_data;
	/* OK: rdma-local-mr-management -- command capsules, local access, once */
	q->cmd_mr = ibv_reg_mr(q->pd, q->reqs, q->depth * sizeof(*q->reqs), 0);
	if (!q->cmd_mr)
		goto err_reqs;
	if (nh_mw_alloc_all(q))
		goto err_cmd;
	return 0;

err_cmd:
	ibv_dereg_mr(q->cmd_mr);
err_reqs:
	free(q->reqs);
err_data:
	/* OK: rdma-mr-leak -- the data MR is released on every failure after it */
	ibv_dereg_mr(q->data_mr);
	return -ENOMEM;
}
