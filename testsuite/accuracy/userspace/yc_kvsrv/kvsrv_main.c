/*
 * kvsrv_main.c - device and SRQ setup, rdma_cm event handling and the
 * per-connection QPs of kvsrv (see kvsrv.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include "kvsrv.h"

#define kv_log(fmt, ...)	fprintf(stderr, "kvsrv: " fmt "\n", ##__VA_ARGS__)

struct kv_conn *kv_conn_by_qpn(struct kv_server *srv, uint32_t qpn)
{
	int i;

	for (i = 0; i < KV_MAX_CONNS; i++)
		if (srv->conns[i].in_use && srv->conns[i].qp->qp_num == qpn)
			return &srv->conns[i];
	return NULL;
}

static int kv_conn_create_qp(struct kv_server *srv, struct kv_conn *c,
			     struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = srv->cq;
	attr.recv_cq = srv->cq;
	attr.srq = srv->srq;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = KV_SQ_DEPTH; /* OK: rdma-send-queue-undersized -- every post first reserves its work requests from sq_credits, which starts at KV_SQ_DEPTH */
	attr.cap.max_recv_wr = 0;		/* receives come from the SRQ */
	attr.cap.max_send_sge = KV_MAX_SGE; /* BUG: rdma-queue-cap-unchecked -- 8 send SGEs requested; the server only ever compares its SRQ with the device, never max_sge */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct kv_msg);

	if (rdma_create_qp(id, srv->pd, &attr)) {
		kv_log("rdma_create_qp: %s", strerror(errno));
		return -errno;
	}
	c->qp = id->qp;
	c->sq_credits = KV_SQ_DEPTH;
	c->notify_budget = KV_NOTIFY_SIGNAL_EVERY;
	c->notify_unsig = 0;
	return 0;
}

static int kv_on_connect_request(struct kv_server *srv, struct rdma_cm_id *id)
{
	struct rdma_conn_param param = {
		.responder_resources = 1,
		.initiator_depth = 1,
		.rnr_retry_count = 7,
	};
	struct kv_conn *c = NULL;
	int i, j = 0, rc;

	for (i = 0; i < KV_MAX_CONNS; i++) {
		if (!srv->conns[i].in_use) {
			c = &srv->conns[i];
			break;
		}
	}
	if (!c) {
		rdma_reject(id, NULL, 0);
		return -EBUSY;
	}

	memset(c, 0, sizeof(*c));
	c->srv = srv;
	c->id = id;
	id->context = c;

	rc = kv_conn_create_qp(srv, c, id);
	if (rc)
		goto reject;

	for (j = 0; j < KV_NR_WINDOWS; j++) {
		c->wins[j].mw = ibv_alloc_mw(srv->pd, IBV_MW_TYPE_2);
		if (!c->wins[j].mw) {
			rc = -ENOMEM;
			goto err_mw;
		}
		c->wins[j].key = c->wins[j].mw->rkey;
	}
	kv_conn_init_ops(c);

	c->in_use = 1;
	if (rdma_accept(id, &param)) {
		rc = -errno;
		c->in_use = 0;
		goto err_mw;
	}
	return 0;

err_mw:
	while (j--)
		ibv_dealloc_mw(c->wins[j].mw);
	rdma_destroy_qp(id);
reject:
	rdma_reject(id, NULL, 0);
	return rc;
}

static void kv_conn_teardown(struct kv_conn *c)
{
	int j;

	if (!c || !c->in_use)
		return;
	c->in_use = 0;
	rdma_destroy_qp(c->id);
	for (j = 0; j < KV_NR_WINDOWS; j++)
		ibv_dealloc_mw(c->wins[j].mw);
	rdma_destroy_id(c->id);
}

static int kv_handle_cm_event(struct kv_server *srv)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	enum rdma_cm_event_type type;
	int rc = 0;

	if (rdma_get_cm_event(srv->ec, &ev))
		return errno == EAGAIN ? 0 : -errno;
	id = ev->id;
	type = ev->event;

	switch (type) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		rc = kv_on_connect_request(srv, id);
		rdma_ack_cm_event(ev);
		if (rc)
			rdma_destroy_id(id);
		return 0;
	case RDMA_CM_EVENT_ESTABLISHED:
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		rdma_ack_cm_event(ev);
		kv_conn_teardown(id->context);
		return 0;
	default:
		kv_log("cm event %s", rdma_event_str(type));
		break;
	}
	rdma_ack_cm_event(ev);
	return rc;
}

static int kv_server_init(struct kv_server *srv, uint16_t port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct ibv_srq_init_attr sattr;
	uint32_t i;

	srv->ec = rdma_create_event_channel();
	if (!srv->ec)
		return -errno;
	if (rdma_create_id(srv->ec, &srv->listen_id, srv, RDMA_PS_TCP) ||
	    rdma_bind_addr(srv->listen_id, (struct sockaddr *)&sin))
		return -errno;
	srv->verbs = srv->listen_id->verbs;
	if (!srv->verbs) {
		kv_log("bind the listener to an RDMA device address");
		return -ENODEV;
	}
	if (ibv_query_device(srv->verbs, &srv->dev_attr))
		return -errno;

	srv->pd = ibv_alloc_pd(srv->verbs);
	if (!srv->pd)
		return -ENOMEM;
	srv->srq_depth = KV_SRQ_DEPTH < srv->dev_attr.max_srq_wr ?
			 KV_SRQ_DEPTH : (uint32_t)srv->dev_attr.max_srq_wr;
	srv->cq = ibv_create_cq(srv->verbs,
				srv->srq_depth + KV_MAX_CONNS * KV_SQ_DEPTH, NULL, NULL, 0);
	if (!srv->cq)
		return -ENOMEM;

	memset(&sattr, 0, sizeof(sattr));
	sattr.attr.max_wr = srv->srq_depth;
	sattr.attr.max_sge = 1;
	srv->srq = ibv_create_srq(srv->pd, &sattr);
	if (!srv->srq)
		return -errno;

	srv->rx = calloc(srv->srq_depth, sizeof(*srv->rx));
	srv->store = calloc(KV_NR_SLOTS, KV_SLOT_SIZE);
	if (!srv->rx || !srv->store)
		return -ENOMEM;
	srv->rx_mr = ibv_reg_mr(srv->pd, srv->rx, srv->srq_depth * sizeof(*srv->rx),
				IBV_ACCESS_LOCAL_WRITE);
	srv->store_mr = ibv_reg_mr(srv->pd, srv->store, (size_t)KV_NR_SLOTS * KV_SLOT_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!srv->rx_mr || !srv->store_mr)
		return -errno;
	for (i = 0; i < srv->srq_depth; i++)
		if (kv_srq_post(srv, i))
			return -EIO;

	if (rdma_listen(srv->listen_id, KV_MAX_CONNS))
		return -errno;
	return fcntl(srv->ec->fd, F_SETFL, fcntl(srv->ec->fd, F_GETFL) | O_NONBLOCK);
}

int main(int argc, char **argv)
{
	static struct kv_server srv;
	struct pollfd pfd;
	int rc;

	rc = kv_server_init(&srv, argc > 1 ? (uint16_t)atoi(argv[1]) : 7471);
	if (rc < 0) {
		kv_log("init failed: %s", strerror(-rc));
		return 1;
	}
	pfd.fd = srv.ec->fd;
	pfd.events = POLLIN;
	for (;;) {
		if (poll(&pfd, 1, 0) > 0 && kv_handle_cm_event(&srv) < 0)
			break;
		if (kv_process_cq(&srv) < 0)
			break;
	}
	return 1;
}
