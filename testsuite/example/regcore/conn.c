/* blkrdma on regcore: the core sizes the send queue from declared contexts. */
#include "blkrdma.h"

#include <stdlib.h>
#include <string.h>

void *blk_msg_slot(struct blk_conn *conn, unsigned int index)
{
	return conn->msgs + (size_t)index * BLK_MSG_SIZE;
}

static int blk_open_core(struct blk_conn *conn)
{
	struct regcore_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.max_ctxs = conn->depth; /* one rw or reg context per request */
	return regcore_open(conn->pd, &attr, &conn->core);
}

int blk_conn_create(struct blk_conn *conn, struct ibv_context *ctx,
		    unsigned int depth)
{
	struct ibv_qp_init_attr attr;
	size_t msg_bytes = (size_t)depth * 2 * BLK_MSG_SIZE;
	uint32_t send_entries;

	memset(conn, 0, sizeof(*conn));
	conn->ctx = ctx;
	conn->depth = depth;
	conn->pd = ibv_alloc_pd(ctx);
	if (!conn->pd)
		return -1;
	if (blk_open_core(conn))
		goto err_pd;
	/* Our own WRs: one command or response per request. */
	if (regcore_max_send_wr(conn->core, depth, depth, &send_entries))
		goto err_core;
	conn->cq = ibv_create_cq(ctx, (int)(send_entries + depth), NULL, NULL, 0);
	if (!conn->cq)
		goto err_core;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = conn->cq;
	attr.recv_cq = conn->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = depth;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	if (regcore_qp_create(conn->core, &attr, depth, &conn->qp))
		goto err_cq;

	conn->msgs = calloc(1, msg_bytes);
	if (!conn->msgs)
		goto err_qp;
	if (regcore_mr_get(conn->core, conn->msgs, msg_bytes,
			   regcore_access_flags(conn->core,
						REGCORE_ROLE_SEND_SOURCE |
						REGCORE_ROLE_RECV_SINK),
			   &conn->msg_mr))
		goto err_msgs;
	return 0;

err_msgs:
	free(conn->msgs);
err_qp:
	regcore_qp_destroy(conn->core, conn->qp);
err_cq:
	ibv_destroy_cq(conn->cq);
err_core:
	regcore_close(conn->core);
err_pd:
	ibv_dealloc_pd(conn->pd);
	return -1;
}

void blk_conn_destroy(struct blk_conn *conn)
{
	regcore_mr_put(conn->core, conn->msg_mr);
	regcore_mr_invalidate_range(conn->core, conn->msgs, (size_t)conn->depth * 2 * BLK_MSG_SIZE);
	free(conn->msgs);
	regcore_qp_destroy(conn->core, conn->qp);
	ibv_destroy_cq(conn->cq);
	regcore_close(conn->core);
	ibv_dealloc_pd(conn->pd);
}

int blk_conn_post_recv(struct blk_conn *conn, unsigned int slot)
{
	struct ibv_recv_wr *bad;

	conn->recv_sge.addr = (uintptr_t)blk_msg_slot(conn, conn->depth + slot);
	conn->recv_sge.length = BLK_MSG_SIZE;
	conn->recv_sge.lkey = conn->msg_mr->lkey;
	memset(&conn->recv_wr, 0, sizeof(conn->recv_wr));
	conn->recv_wr.wr_id = slot;
	conn->recv_wr.sg_list = &conn->recv_sge;
	conn->recv_wr.num_sge = 1;
	return ibv_post_recv(conn->qp, &conn->recv_wr, &bad);
}

/* Every completion of a regcore QP goes through regcore_poll_cq, which
 * consumes the core's internal ones. */
int blk_conn_poll(struct blk_conn *conn, struct ibv_wc *wc, int n)
{
	return regcore_poll_cq(conn->core, conn->cq, n, wc);
}
