/* blkrdma: connection setup with a hand-sized send queue. */
#include "blkrdma.h"

#include <stdlib.h>
#include <string.h>

void *blk_msg_slot(struct blk_conn *conn, unsigned int index)
{
	return conn->msgs + (size_t)index * BLK_MSG_SIZE;
}

int blk_conn_create(struct blk_conn *conn, struct ibv_context *ctx,
		    unsigned int depth)
{
	struct ibv_qp_init_attr attr;
	size_t msg_bytes = (size_t)depth * 2 * BLK_MSG_SIZE;

	memset(conn, 0, sizeof(*conn));
	conn->ctx = ctx;
	conn->depth = depth;
	conn->pd = ibv_alloc_pd(ctx);
	if (!conn->pd)
		return -1;
	conn->cq = ibv_create_cq(ctx, depth * 4, NULL, NULL, 0);
	if (!conn->cq)
		goto err_pd;

	/* Each I/O sends a command and, when the target did not invalidate
	 * the rkey for us, a LOCAL_INV: two send-queue entries per I/O. */
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 2 * depth;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 0;
	conn->qp = ibv_create_qp(conn->pd, &attr);
	if (!conn->qp)
		goto err_cq;

	conn->msgs = calloc(1, msg_bytes);
	if (!conn->msgs)
		goto err_qp;
	conn->msg_mr = ibv_reg_mr(conn->pd, conn->msgs, msg_bytes,
				  IBV_ACCESS_LOCAL_WRITE);
	if (!conn->msg_mr)
		goto err_msgs;
	return 0;

err_msgs:
	free(conn->msgs);
err_qp:
	ibv_destroy_qp(conn->qp);
err_cq:
	ibv_destroy_cq(conn->cq);
err_pd:
	ibv_dealloc_pd(conn->pd);
	return -1;
}

void blk_conn_destroy(struct blk_conn *conn)
{
	ibv_dereg_mr(conn->msg_mr);
	free(conn->msgs);
	ibv_destroy_qp(conn->qp);
	ibv_destroy_cq(conn->cq);
	ibv_dealloc_pd(conn->pd);
}
