/*
 * ub_ls_conn.c - rdma_cm side of the log shipper: the event loop, replica
 * accept, primary connect, QP sizing and teardown on disconnect.
 *
 * Not right: the QP is sized one send WR per credit although a batch is a
 * WRITE + COMMIT chain; the receive depth is a constant above the portable
 * floor; send buffers get remote write; a failed QP creation on accept
 * leaks the manifest MR.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ub_logship.h"

void *ls_log_base;
size_t ls_log_size;

/* scatter/gather and inline limits; ls_create_qp() reads the granted inline size back */
static void ls_qp_limits(struct ibv_qp_cap *cap)
{
	cap->max_send_sge = LS_MAX_SGE; /* OK: rdma-queue-cap-unchecked -- 4 SGEs is within what every device offers */
	cap->max_recv_sge = 1;
	cap->max_inline_data = LS_INLINE; /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back after creation */
}

int ls_create_qp(struct ls_conn *c)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = LS_CREDITS + 1; // BUG(program): rdma-send-queue-undersized -- each credit is a batch of RDMA WRITE + COMMIT SEND, two WRs, but the queue holds one per credit
	attr.cap.max_recv_wr = LS_RECV_DEPTH; // BUG(program): rdma-queue-cap-unchecked -- 4096 receives requested without comparing with max_qp_wr
	ls_qp_limits(&attr.cap);
	if (rdma_create_qp(c->id, NULL, &attr))
		return -errno;
	c->qp = c->id->qp;
	c->max_inline = attr.cap.max_inline_data;
	return 0;
}

static int ls_on_connect_request(struct rdma_cm_id *id)
{
	struct rdma_conn_param param;
	struct ls_pdata pd;
	struct ls_conn *c;
	int i;

	c = calloc(1, sizeof(*c));
	if (!c)
		goto reject;
	c->id = id;
	c->role = LS_REPLICA;
	c->apply = ls_apply;
	id->context = c;
	if (ls_ring_get(id, &c->ring))
		goto err_free;

	c->recv_msgs = calloc(LS_RECV_DEPTH, sizeof(*c->recv_msgs));
	c->send_msgs = calloc(LS_CREDITS, sizeof(*c->send_msgs));
	c->manifest = calloc(1, sizeof(*c->manifest));
	if (!c->recv_msgs || !c->send_msgs || !c->manifest)
		goto err_ring;
	c->recv_mr = rdma_reg_msgs(id, c->recv_msgs, LS_RECV_DEPTH * sizeof(*c->recv_msgs));
	if (!c->recv_mr)
		goto err_ring;
	c->send_mr = rdma_reg_write(id, c->send_msgs, LS_CREDITS * sizeof(*c->send_msgs)); // BUG(program): rdma-remote-access-overbroad -- send buffers only need local access; this MR's rkey never leaves any file
	if (!c->send_mr)
		goto err_recv;
	/* BUG: rdma-local-mr-management -- the manifest buffer is the sink of the replica's own RDMA READ */
	c->manifest_mr = rdma_reg_msgs(id, c->manifest, sizeof(*c->manifest));
	if (!c->manifest_mr)
		goto err_send;
	if (ls_create_qp(c))
		goto err_send; // BUG: rdma-mr-leak -- err_send skips the manifest MR registered just above

	for (i = 0; i < LS_RECV_DEPTH; i++)
		if (ls_post_recv(c, i))
			goto err_qp;

	pd.addr = (uintptr_t)c->ring->base;
	pd.rkey = c->ring->mr->rkey;
	pd.size = (uint32_t)c->ring->size;
	pd.credits = LS_CREDITS;
	memset(&param, 0, sizeof(param));
	param.private_data = &pd;
	param.private_data_len = sizeof(pd);
	param.responder_resources = 1;
	if (rdma_accept(id, &param))
		goto err_qp;
	return 0;

err_qp:
	rdma_destroy_qp(id);
	rdma_dereg_mr(c->manifest_mr);
err_send:
	rdma_dereg_mr(c->send_mr);
err_recv:
	rdma_dereg_mr(c->recv_mr);
err_ring:
	free(c->manifest);
	free(c->send_msgs);
	free(c->recv_msgs);
	ls_ring_put(c->ring);
err_free:
	free(c);
reject:
	rdma_reject(id, NULL, 0);
	return -1;
}

/* primary: route is known, set up the connection and offer our log */
static int ls_on_route_resolved(struct ls_conn *c)
{
	struct rdma_conn_param param;
	struct ls_pdata pd;
	int i;

	c->recv_msgs = calloc(LS_RECV_DEPTH, sizeof(*c->recv_msgs));
	c->send_msgs = calloc(LS_CREDITS, sizeof(*c->send_msgs));
	if (!c->recv_msgs || !c->send_msgs)
		return -ENOMEM;
	c->recv_mr = rdma_reg_msgs(c->id, c->recv_msgs, LS_RECV_DEPTH * sizeof(*c->recv_msgs));
	c->send_mr = rdma_reg_msgs(c->id, c->send_msgs, LS_CREDITS * sizeof(*c->send_msgs));
	/* BUG: rdma-local-mr-management -- the primary's log is exposed for remote read and its rkey is sent to the replica */
	c->plog_mr = rdma_reg_read(c->id, ls_log_base, ls_log_size);
	if (!c->recv_mr || !c->send_mr || !c->plog_mr || ls_create_qp(c))
		return -errno; /* OK: rdma-mr-leak -- the caller tears the connection down, which deregisters whatever was registered */
	for (i = 0; i < LS_RECV_DEPTH; i++)
		ls_post_recv(c, i);

	pd.addr = (uintptr_t)ls_log_base;
	pd.rkey = c->plog_mr->rkey; /* OK: rdma-remote-access-overbroad -- the read right is what the replica uses with this key */
	pd.size = (uint32_t)ls_log_size;
	pd.credits = 0;
	memset(&param, 0, sizeof(param));
	param.private_data = &pd;
	param.private_data_len = sizeof(pd);
	param.initiator_depth = 1;
	param.retry_count = 7;
	return rdma_connect(c->id, &param) ? -errno : 0;
}

static void ls_on_established(struct ls_conn *c, const struct rdma_cm_event *ev)
{
	const struct ls_pdata *pd = ev->param.conn.private_data;

	if (!pd || ev->param.conn.private_data_len < sizeof(*pd))
		return;
	c->remote_addr = pd->addr;
	c->remote_rkey = pd->rkey;
	c->remote_size = pd->size;
	if (c->role == LS_PRIMARY)
		c->credits = pd->credits;
}

void ls_conn_teardown(struct ls_conn *c)
{
	int i;

	if (c->qp)
		rdma_destroy_qp(c->id);
	for (i = 0; i < LS_CREDITS; i++) {
		if (c->batches[i].big_mr)
			rdma_dereg_mr(c->batches[i].big_mr); /* OK: rdma-mr-leak -- oversized records still in flight are deregistered before the connection goes */
	}
	if (c->recv_mr)
		rdma_dereg_mr(c->recv_mr);
	if (c->send_mr)
		rdma_dereg_mr(c->send_mr);
	if (c->manifest_mr)
		rdma_dereg_mr(c->manifest_mr);
	if (c->plog_mr)
		rdma_dereg_mr(c->plog_mr);
	if (c->stage_mr)
		rdma_dereg_mr(c->stage_mr);
	free(c->stage);
	if (c->ring)
		ls_ring_put(c->ring);
	free(c->manifest);
	free(c->send_msgs);
	free(c->recv_msgs);
	rdma_destroy_id(c->id);
	free(c);
}

int ls_event_loop(struct rdma_event_channel *ec, enum ls_role role)
{
	struct rdma_cm_event *ev;
	struct ls_conn *c;
	int ret = 0;

	while (!ret && rdma_get_cm_event(ec, &ev) == 0) {
		c = ev->id->context;
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			ls_on_connect_request(ev->id);
			break;
		case RDMA_CM_EVENT_ADDR_RESOLVED:
			ret = rdma_resolve_route(ev->id, 2000);
			break;
		case RDMA_CM_EVENT_ROUTE_RESOLVED:
			if (ls_on_route_resolved(c)) {
				rdma_ack_cm_event(ev);
				ls_conn_teardown(c);
				continue;
			}
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
			ls_on_established(c, ev);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_UNREACHABLE:
			rdma_ack_cm_event(ev);
			if (c)
				ls_conn_teardown(c);
			if (role == LS_PRIMARY)
				ret = -ECONNRESET;
			continue;
		default:
			fprintf(stderr, "logship: unexpected event %s\n", rdma_event_str(ev->event));
			break;
		}
		rdma_ack_cm_event(ev);
	}
	return ret;
}
