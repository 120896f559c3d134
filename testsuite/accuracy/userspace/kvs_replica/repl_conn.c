/*
 * repl_conn.c: replica connection setup and post accounting.
 *
 * Correct: queue depth clamped to the device; send queue holds WRITE +
 * SEND per record in flight; the log buffer is the local source of the
 * shipping WRITEs.  repl_account_post() advances the moderation counter
 * that repl_ship.c tests.
 * Not correct: the ack page is registered with REMOTE_WRITE "so replicas
 * can write acknowledgements into it", but acknowledgements arrive as
 * SENDs, and no file of the program ever sends the ack page's key: the
 * right is unused attack surface.  (The MR lives in a struct declared in
 * repl.h, so a one-file view cannot tell.)
 */
#include "repl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int repl_conn_setup(struct repl_conn *c)
{
	struct ibv_device_attr attr;
	struct ibv_qp_init_attr qpa;

	if (ibv_query_device(c->ctx, &attr))
		return -errno;
	c->depth = REPL_DEPTH;
	if (2 * c->depth + 1 > (unsigned int)attr.max_qp_wr)
		c->depth = (attr.max_qp_wr - 1) / 2;

	c->log_mr = ibv_reg_mr(c->pd, c->log, c->log_len, 0); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITEs
	if (!c->log_mr)
		return -errno;
	c->ack_page = aligned_alloc(4096, 4096);
	if (!c->ack_page)
		goto err_log;
	// BUG: rdma-remote-access-overbroad -- REMOTE_WRITE on the ack page; no file of the program sends its key
	c->ack_mr = ibv_reg_mr(c->pd, c->ack_page, 4096,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->ack_mr)
		goto err_ack;

	memset(&qpa, 0, sizeof(qpa));
	qpa.send_cq = c->cq;
	qpa.recv_cq = c->cq;
	qpa.qp_type = IBV_QPT_RC;
	/* OK: rdma-send-queue-undersized -- WRITE + SEND per record, depth records, plus one */
	qpa.cap.max_send_wr = 2 * c->depth + 1;
	qpa.cap.max_recv_wr = c->depth;
	qpa.cap.max_send_sge = 1;
	qpa.cap.max_recv_sge = 1;
	qpa.cap.max_inline_data = sizeof(uint64_t);
	c->qp = ibv_create_qp(c->pd, &qpa);
	if (!c->qp)
		goto err_ack_mr;
	c->unsig = 0;
	return 0;

err_ack_mr:
	ibv_dereg_mr(c->ack_mr);
err_ack:
	free(c->ack_page);
err_log:
	ibv_dereg_mr(c->log_mr);
	return -ENOMEM;
}

void repl_account_post(struct repl_conn *c)
{
	c->unsig++;
	c->posted++;
}
