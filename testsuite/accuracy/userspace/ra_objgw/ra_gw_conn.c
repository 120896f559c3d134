/*
 * ra_gw_conn.c -- rdma_cm front end of the object gateway.
 *
 * PUT: the client sends PUT_REQ, the gateway lends it a wire chunk (or a
 * jumbo buffer) and answers GRANT {addr, rkey}; the client RDMA-WRITEs the
 * payload and sends PUT_DONE; the gateway stores the object, replicates it
 * through a local-only log chunk and releases the request.  GET works the
 * other way round with RDMA READ.  Releasing a request re-keys its chunk
 * (objgw_chunk_put) or deregisters its jumbo buffer (objgw_jumbo_free).
 * Every connection exposes a progress page (REMOTE_READ) whose address and
 * rkey travel in the accept private data.
 *
 * Right: connection setup unwinding, request release after PUT_DONE /
 * GET_DONE and on a failed grant, log chunks recycled from the replication
 * completion, in-flight requests released at disconnect.
 * Wrong: a GET whose backend read fails drops the jumbo buffer's MR; the
 * connection teardown frees the progress page while its rkey is still live.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include "ra_objgw.h"

#define GW_RECV_DEPTH	64
#define GW_SEND_DEPTH	64
#define GW_MAX_REQS	64
#define GW_WIRE_CHUNK	(1UL << 20)
#define GW_LOG_CHUNK	(1UL << 20)

struct gw_conn;

struct gw_req {
	TAILQ_ENTRY(gw_req)	link;
	struct gw_conn		*conn;
	uint16_t		id;
	uint16_t		op;
	uint64_t		obj_id;
	uint64_t		len;
	struct objgw_chunk	*ch;
	bool			jumbo;
};

struct gw_conn {
	struct rdma_cm_id	*cm_id;
	struct ibv_mr		*msg_mr;
	struct objgw_msg	*msgs;		/* GW_RECV_DEPTH recvs, then sends */
	unsigned int		send_idx;
	struct ibv_mr		*progress_mr;
	uint64_t		*progress;	/* bytes, objects committed */
	struct gw_req		reqs[GW_MAX_REQS];
	TAILQ_HEAD(, gw_req)	free_reqs;
};

static struct ibv_pd *gw_pd;
static struct ibv_cq *gw_cq;
static struct objgw_slab_class gw_wire, gw_log;
static struct rdma_cm_id *gw_replica;
static struct gw_conn *gw_conns[32];

struct rdma_cm_id *gw_replica_connect(struct ibv_pd *pd, struct ibv_cq *cq);

#define GW_WRID_RECV	1ULL
#define GW_WRID_SEND	2ULL

static int gw_send(struct gw_conn *c, uint16_t op, uint16_t req_id, uint32_t rkey,
		   uint64_t addr, uint64_t len)
{
	struct objgw_msg *m = &c->msgs[GW_RECV_DEPTH + c->send_idx++ % GW_SEND_DEPTH];
	struct ibv_sge sge = { (uintptr_t)m, sizeof(*m), c->msg_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = GW_WRID_SEND, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	m->op = op;
	m->req_id = req_id;
	m->rkey = rkey;
	m->addr = addr;
	m->len = len;
	return ibv_post_send(c->cm_id->qp, &wr, &bad);
}

static int gw_post_recv(struct gw_conn *c, struct objgw_msg *m)
{
	struct ibv_sge sge = { (uintptr_t)m, sizeof(*m), c->msg_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uintptr_t)m | GW_WRID_RECV,
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(c->cm_id->qp, &wr, &bad);
}

static struct gw_req *gw_req_get(struct gw_conn *c)
{
	struct gw_req *req = TAILQ_FIRST(&c->free_reqs);

	if (req)
		TAILQ_REMOVE(&c->free_reqs, req, link);
	return req;
}

static void gw_req_release(struct gw_conn *c, struct gw_req *req)
{
	if (req->jumbo)
		objgw_jumbo_free(req->ch);
	else
		objgw_chunk_put(req->ch);
	req->ch = NULL;
	req->jumbo = false;
	TAILQ_INSERT_HEAD(&c->free_reqs, req, link);
}

static int gw_start(struct gw_conn *c, const struct objgw_msg *m)
{
	struct gw_req *req;
	struct objgw_chunk *ch;
	ssize_t size = m->op == OBJGW_GET_REQ ? backend_size(m->obj_id) : (ssize_t)m->len;

	if (size <= 0 || !(req = gw_req_get(c)))
		return gw_send(c, OBJGW_NACK, m->req_id, 0, 0, 0);

	if ((size_t)size > GW_WIRE_CHUNK) {
		if (objgw_jumbo_alloc(gw_pd, size, &ch))
			goto nack;
		if (m->op == OBJGW_GET_REQ && backend_load(m->obj_id, ch->buf, size) != size)
			return -EIO;	// BUG: rdma-mr-leak -- the jumbo buffer and its MR from objgw_jumbo_alloc() are dropped with 'ch'
		req->jumbo = true;
	} else {
		ch = objgw_chunk_get(&gw_wire);
		if (!ch)
			goto nack;
		if (m->op == OBJGW_GET_REQ && backend_load(m->obj_id, ch->buf, size) != size) {
			objgw_chunk_put(ch);	// OK: rdma-invalidation-leak -- the chunk was not lent yet; its current key never left the gateway
			goto nack;
		}
	}
	ch->exposed = true;
	req->ch = ch;
	req->op = m->op;
	req->obj_id = m->obj_id;
	req->len = size;
	if (gw_send(c, OBJGW_GRANT, req->id, ch->mr->rkey, (uintptr_t)ch->buf, size)) {
		gw_req_release(c, req);	// OK: rdma-mr-leak, rdma-invalidation-leak -- the grant never left; release deregisters or re-keys the buffer
		return -EIO;
	}
	return 0;

nack:
	TAILQ_INSERT_HEAD(&c->free_reqs, req, link);
	return gw_send(c, OBJGW_NACK, m->req_id, 0, 0, 0);
}

static void gw_replicate(struct gw_req *req)
{
	struct objgw_chunk *log;
	struct ibv_sge sge;
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	if (!gw_replica || req->len > GW_LOG_CHUNK || !(log = objgw_chunk_get(&gw_log)))
		return;
	memcpy(log->buf, req->ch->buf, req->len);
	sge.addr = (uintptr_t)log->buf;
	sge.length = (uint32_t)req->len;
	sge.lkey = log->mr->lkey;
	wr.wr_id = (uintptr_t)log;
	if (ibv_post_send(gw_replica->qp, &wr, &bad))
		objgw_chunk_put(log);	// OK: rdma-invalidation-leak -- log chunks are registered for local access only
}

static void gw_finish(struct gw_conn *c, const struct objgw_msg *m)
{
	struct gw_req *req;

	if (m->req_id >= GW_MAX_REQS || !(req = &c->reqs[m->req_id])->ch)
		return;
	if (req->op == OBJGW_PUT_REQ) {
		if (backend_store(req->obj_id, req->ch->buf, req->len) == 0) {
			gw_replicate(req);
			c->progress[0] += req->len;
			c->progress[1]++;
		}
	}
	gw_req_release(c, req);	// OK: rdma-invalidation-leak -- the client's rkey dies when release re-keys the chunk or deregisters the jumbo buffer
}

static void gw_handle_msg(struct gw_conn *c, struct objgw_msg *m)
{
	switch (m->op) {
	case OBJGW_PUT_REQ:
	case OBJGW_GET_REQ:
		gw_start(c, m);
		break;
	case OBJGW_PUT_DONE:
	case OBJGW_GET_DONE:
		gw_finish(c, m);
		break;
	}
	if (gw_post_recv(c, m))
		rdma_disconnect(c->cm_id);
}

static void gw_poll(void)
{
	struct ibv_wc wc[32];
	int i, k, n = ibv_poll_cq(gw_cq, 32, wc);

	for (i = 0; i < n; i++) {
		if (wc[i].wr_id & GW_WRID_RECV) {
			struct objgw_msg *m = (void *)(uintptr_t)(wc[i].wr_id & ~GW_WRID_RECV);

			for (k = 0; wc[i].status == IBV_WC_SUCCESS && k < 32; k++)
				if (gw_conns[k] && gw_conns[k]->cm_id->qp->qp_num == wc[i].qp_num)
					gw_handle_msg(gw_conns[k], m);
		} else if (wc[i].wr_id != GW_WRID_SEND) {
			/* replication send of a log chunk */
			objgw_chunk_put((struct objgw_chunk *)(uintptr_t)wc[i].wr_id);	// OK: rdma-invalidation-leak -- a log chunk is local-only and never lent to a client
		}
	}
}

static int gw_conn_accept(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = gw_cq, .recv_cq = gw_cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = GW_SEND_DEPTH, .max_recv_wr = GW_RECV_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct objgw_accept_data pd;
	struct rdma_conn_param param;
	struct gw_conn *c;
	int i, slot;

	for (slot = 0; slot < 32 && gw_conns[slot]; slot++)
		;
	if (slot == 32 || !(c = calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->cm_id = id;
	c->msgs = calloc(GW_RECV_DEPTH + GW_SEND_DEPTH, sizeof(*c->msgs));
	if (!c->msgs)
		goto err_conn;
	c->msg_mr = ibv_reg_mr(gw_pd, c->msgs, (GW_RECV_DEPTH + GW_SEND_DEPTH) * sizeof(*c->msgs),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!c->msg_mr)
		goto err_msgs;
	c->progress = aligned_alloc(64, 64);
	if (!c->progress)
		goto err_msg_mr;
	memset(c->progress, 0, 64);
	c->progress_mr = ibv_reg_mr(gw_pd, c->progress, 64, IBV_ACCESS_REMOTE_READ);
	if (!c->progress_mr)
		goto err_progress;
	if (rdma_create_qp(id, gw_pd, &qa))
		goto err_progress_mr;	// OK: rdma-mr-leak -- the unwinding below deregisters both MRs
	for (i = 0; i < GW_RECV_DEPTH; i++)
		if (gw_post_recv(c, &c->msgs[i]))
			goto err_qp;

	TAILQ_INIT(&c->free_reqs);
	for (i = GW_MAX_REQS - 1; i >= 0; i--) {
		c->reqs[i].id = i;
		c->reqs[i].conn = c;
		TAILQ_INSERT_HEAD(&c->free_reqs, &c->reqs[i], link);
	}

	pd.progress_addr = (uintptr_t)c->progress;
	pd.progress_rkey = c->progress_mr->rkey;
	pd.max_inline_obj = GW_WIRE_CHUNK;
	memset(&param, 0, sizeof(param));
	param.private_data = &pd;
	param.private_data_len = sizeof(pd);
	param.responder_resources = 1;
	param.rnr_retry_count = 7;
	id->context = c;
	gw_conns[slot] = c;
	return rdma_accept(id, &param) ? -EIO : 0;

err_qp:
	rdma_destroy_qp(id);
err_progress_mr:
	ibv_dereg_mr(c->progress_mr);
err_progress:
	free(c->progress);	// OK: rdma-invalidation-leak -- deregistered above, and the key was never sent
err_msg_mr:
	ibv_dereg_mr(c->msg_mr);
err_msgs:
	free(c->msgs);
err_conn:
	free(c);
	return -ENOMEM;
}

static void gw_conn_destroy(struct gw_conn *c)
{
	int i;

	for (i = 0; i < GW_MAX_REQS; i++)
		if (c->reqs[i].ch)
			gw_req_release(c, &c->reqs[i]);	// OK: rdma-invalidation-leak -- in-flight buffers are re-keyed or deregistered by the release
	for (i = 0; i < 32; i++)
		if (gw_conns[i] == c)
			gw_conns[i] = NULL;
	rdma_destroy_qp(c->cm_id);
	free(c->progress);	// BUG: rdma-invalidation-leak -- the progress page is freed while its rkey (sent in the accept data) is still registered
	ibv_dereg_mr(c->progress_mr);
	ibv_dereg_mr(c->msg_mr);
	free(c->msgs);
	free(c);
}

int gw_run(struct rdma_cm_id *listen_id)
{
	struct rdma_event_channel *ch = listen_id->channel;
	struct rdma_cm_event *ev;
	int i, ret = -1;

	if (!(gw_pd = ibv_alloc_pd(listen_id->verbs)))
		return -1;
	if (!(gw_cq = ibv_create_cq(listen_id->verbs, 1024, NULL, NULL, 0)))
		goto out_pd;
	if (objgw_slab_class_init(&gw_wire, "wire", gw_pd, GW_WIRE_CHUNK, 32, OBJGW_WIRE_ACCESS))
		goto out_cq;
	if (objgw_slab_class_init(&gw_log, "log", gw_pd, GW_LOG_CHUNK, 16, OBJGW_LOG_ACCESS))
		goto out_wire;
	gw_replica = gw_replica_connect(gw_pd, gw_cq);

	while (rdma_get_cm_event(ch, &ev) == 0) {
		struct rdma_cm_id *id = ev->id;
		enum rdma_cm_event_type type = ev->event;

		rdma_ack_cm_event(ev);
		if (type == RDMA_CM_EVENT_CONNECT_REQUEST && gw_conn_accept(id))
			rdma_reject(id, NULL, 0);
		else if (type == RDMA_CM_EVENT_DISCONNECTED && id->context)
			gw_conn_destroy(id->context);
		gw_poll();
		objgw_slab_trim(&gw_wire);
	}
	ret = 0;

	for (i = 0; i < 32; i++)
		if (gw_conns[i])
			gw_conn_destroy(gw_conns[i]);
	objgw_slab_class_destroy(&gw_log);
out_wire:
	objgw_slab_class_destroy(&gw_wire);
out_cq:
	ibv_destroy_cq(gw_cq);
out_pd:
	ibv_dealloc_pd(gw_pd);
	return ret;
}
