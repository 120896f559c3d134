/*
 * rc_atomlock.c - lockd: a lock service built on RDMA atomics.
 *
 * The server keeps a table of 64-bit lock words.  A client takes a lock
 * with an RDMA compare-and-swap 0 -> owner and drops it with a
 * fetch-and-add of -owner; the server's CPU is not involved.  A lock that
 * guards a data object comes with a lease: the client asks the server
 * (SEND) for a grant, the server binds a type 2 memory window over the
 * object with remote read/write and replies with the window's rkey; the
 * grant ends with a LOCAL_INV when the client returns it or the lease
 * runs out.  A renewal rebinds the window over the object's current
 * extent (objects may grow while locked).
 *
 * Server and client live in this file (lk_srv_*, lk_cli_*; the client's
 * grant requests ride on the application's own messaging).  Replies are
 * meant to be signaled every LK_SIG_EVERY; binds and invalidations never.
 *
 * Wrong here: the reply counter that should trigger signaling is never
 * incremented; a renewal rebinds the window under the key the client
 * already holds; the client's CAS result buffer asks for remote atomic
 * access; the client's send queue depth is a constant nobody checked.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed here
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <endian.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

typedef enum {
	LK_OK			= 0,
	LK_ERR_NO_RESOURCE	= -1,
	LK_ERR_IO		= -2,
	LK_ERR_BUSY		= -3,
} lk_status_t;

#define LK_NUM_LOCKS		1024
#define LK_OBJ_MAX		(256 * 1024)
#define LK_MAX_GRANTS		64
#define LK_WRS_PER_GRANT	3	/* BIND_MW, reply SEND, LOCAL_INV */
#define LK_SRV_RECV_DEPTH	2048	/* pipelined grant requests per client */
#define LK_SIG_EVERY		8
#define LK_LEASE_MS		500
#define LK_CLI_SQ_DEPTH		4096
#define LK_CLI_SPIN		64

#define lk_log(_fmt, ...)	fprintf(stderr, "lockd: " _fmt "\n", ## __VA_ARGS__)

enum { LK_OP_GRANT = 1, LK_OP_RENEW, LK_OP_RETURN };

struct lk_req  { uint32_t op, lock_id, grant, pad; };
struct lk_rep  { int32_t status; uint32_t rkey, grant, pad; uint64_t addr, len; };
struct lk_hello { uint64_t table_addr; uint32_t table_rkey, nlocks; };

struct lk_grant {
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key the client holds */
	uint32_t		lock_id;
	int			active;
	uint64_t		expires_ms;
	struct ibv_send_wr	bind_wr;
	struct ibv_send_wr	inv_wr;
	struct ibv_send_wr	reply_wr;
	struct ibv_sge		reply_sge;
	struct lk_rep		reply;
};

struct lk_srv {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	uint64_t		*table;
	struct ibv_mr		*table_mr;
	uint8_t			*objects;
	uint64_t		obj_len[LK_NUM_LOCKS];
	struct ibv_mr		*obj_mr;
	uint32_t		max_grants;	/* <= LK_MAX_GRANTS, >= LK_SIG_EVERY */
};

struct lk_srv_conn {
	struct lk_srv		*srv;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	uint32_t		unsig_replies;
	struct lk_grant		grants[LK_MAX_GRANTS];
	struct lk_req		rx[LK_SRV_RECV_DEPTH];
	struct ibv_mr		*rx_mr;
};

static uint64_t lk_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000ull + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ server */

lk_status_t lk_srv_init(struct lk_srv *srv, struct ibv_context *ctx)
{
	srv->ctx = ctx;
	srv->pd = ibv_alloc_pd(ctx);
	srv->table = calloc(LK_NUM_LOCKS, sizeof(uint64_t));
	srv->objects = aligned_alloc(4096, (size_t)LK_NUM_LOCKS * LK_OBJ_MAX);
	if (!srv->pd || !srv->table || !srv->objects)
		return LK_ERR_NO_RESOURCE;

	srv->table_mr = ibv_reg_mr(srv->pd, srv->table, LK_NUM_LOCKS * sizeof(uint64_t),
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC); // OK: rdma-remote-access-overbroad -- the table's rkey is sent to every client in lk_srv_hello()
	/* objects are reached only through per-grant windows */
	srv->obj_mr = ibv_reg_mr(srv->pd, srv->objects, (size_t)LK_NUM_LOCKS * LK_OBJ_MAX,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!srv->table_mr || !srv->obj_mr)
		return LK_ERR_IO;
	return LK_OK;
}

void lk_srv_hello(struct lk_srv *srv, struct lk_hello *h)
{
	h->table_addr = htobe64((uintptr_t)srv->table);
	h->table_rkey = htobe32(srv->table_mr->rkey);
	h->nlocks = htobe32(LK_NUM_LOCKS);
}

lk_status_t lk_srv_conn_create(struct lk_srv *srv, struct lk_srv_conn *sc)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr attr;
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	int i;

	if (ibv_query_device(srv->ctx, &da))
		return LK_ERR_IO;
	if (LK_SRV_RECV_DEPTH > da.max_qp_wr) {
		lk_log("%s: max_qp_wr %d is below the request ring",
		       ibv_get_device_name(srv->ctx->device), da.max_qp_wr);
		return LK_ERR_NO_RESOURCE;
	}
	sc->srv = srv;
	sc->cq = ibv_create_cq(srv->ctx, LK_SRV_RECV_DEPTH + LK_MAX_GRANTS, NULL, NULL, 0);
	sc->rx_mr = ibv_reg_mr(srv->pd, sc->rx, sizeof(sc->rx), IBV_ACCESS_LOCAL_WRITE);
	if (!sc->cq || !sc->rx_mr)
		return LK_ERR_NO_RESOURCE;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = sc->cq;
	attr.recv_cq = sc->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- a grant posts one BIND_MW, one reply SEND and one LOCAL_INV: three per grant, plus one */
	attr.cap.max_send_wr = LK_WRS_PER_GRANT * srv->max_grants + 1; // BUG: rdma-send-queue-manual-factor -- hand-made factor for the per-grant bind and invalidation times max_grants
	attr.cap.max_recv_wr = LK_SRV_RECV_DEPTH; // OK: rdma-queue-cap-unchecked -- compared with max_qp_wr above
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct lk_rep);
	sc->qp = ibv_create_qp(srv->pd, &attr);
	if (!sc->qp)
		return LK_ERR_IO;

	for (i = 0; i < LK_SRV_RECV_DEPTH; i++) {
		sge = (struct ibv_sge){ (uintptr_t)&sc->rx[i], sizeof(sc->rx[i]), sc->rx_mr->lkey };
		wr = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &sge, .num_sge = 1 };
		if (ibv_post_recv(sc->qp, &wr, &bad))
			return LK_ERR_IO;
	}
	return LK_OK;
}

static int lk_srv_post_bind(struct lk_srv_conn *sc, struct lk_grant *g,
			    uint32_t key, unsigned int access)
{
	struct lk_srv *srv = sc->srv;
	struct ibv_send_wr *bad;

	memset(&g->bind_wr, 0, sizeof(g->bind_wr));
	g->bind_wr.wr_id = (uintptr_t)g;
	g->bind_wr.opcode = IBV_WR_BIND_MW;
	g->bind_wr.bind_mw.mw = g->mw;
	g->bind_wr.bind_mw.rkey = key;
	g->bind_wr.bind_mw.bind_info.mr = srv->obj_mr;
	g->bind_wr.bind_mw.bind_info.addr =
		(uintptr_t)(srv->objects + (size_t)g->lock_id * LK_OBJ_MAX);
	g->bind_wr.bind_mw.bind_info.length = srv->obj_len[g->lock_id];
	g->bind_wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(sc->qp, &g->bind_wr, &bad);
}

static int lk_srv_post_inv(struct lk_srv_conn *sc, struct lk_grant *g)
{
	struct ibv_send_wr *bad;

	memset(&g->inv_wr, 0, sizeof(g->inv_wr));
	g->inv_wr.wr_id = (uintptr_t)g;
	g->inv_wr.opcode = IBV_WR_LOCAL_INV;
	g->inv_wr.invalidate_rkey = g->rkey;
	return ibv_post_send(sc->qp, &g->inv_wr, &bad);
}

static int lk_srv_reply(struct lk_srv_conn *sc, struct lk_grant *g, int32_t status)
{
	struct lk_srv *srv = sc->srv;
	struct ibv_send_wr *bad;

	g->reply.status = htobe32(status);
	g->reply.rkey = htobe32(g->rkey);
	g->reply.grant = htobe32(g - sc->grants);
	g->reply.addr = htobe64((uintptr_t)(srv->objects + (size_t)g->lock_id * LK_OBJ_MAX));
	g->reply.len = htobe64(srv->obj_len[g->lock_id]);
	g->reply_sge = (struct ibv_sge){ (uintptr_t)&g->reply, sizeof(g->reply), 0 };

	memset(&g->reply_wr, 0, sizeof(g->reply_wr));
	g->reply_wr.wr_id = (uintptr_t)g;
	g->reply_wr.opcode = IBV_WR_SEND;
	g->reply_wr.sg_list = &g->reply_sge;
	g->reply_wr.num_sge = 1;
	g->reply_wr.send_flags = IBV_SEND_INLINE;
	/* one reply in LK_SIG_EVERY retires the binds and invalidations before it */
	if (sc->unsig_replies >= LK_SIG_EVERY) { // BUG: rdma-unsignaled-send-starvation -- unsig_replies is reset here but never incremented, so nothing on this QP is ever signaled
		g->reply_wr.send_flags |= IBV_SEND_SIGNALED;
		sc->unsig_replies = 0;
	}
	return ibv_post_send(sc->qp, &g->reply_wr, &bad);
}

static lk_status_t lk_srv_grant(struct lk_srv_conn *sc, uint32_t lock_id)
{
	struct lk_grant *g = NULL;
	uint32_t key, i;

	for (i = 0; i < sc->srv->max_grants; i++) {
		if (!sc->grants[i].active) {
			g = &sc->grants[i];
			break;
		}
	}
	if (!g)
		return LK_ERR_BUSY;
	if (!g->mw) {
		g->mw = ibv_alloc_mw(sc->srv->pd, IBV_MW_TYPE_2);
		if (!g->mw)
			return LK_ERR_NO_RESOURCE;
		key = g->mw->rkey;		/* fresh window, key never seen */
	} else {
		key = ibv_inc_rkey(g->rkey);
	}
	g->lock_id = lock_id;
	if (lk_srv_post_bind(sc, g, key, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) // OK: rdma-rkey-reuse -- a fresh window's own key, else one past the key of the last grant
		return LK_ERR_IO;
	g->rkey = key;
	g->active = 1;
	g->expires_ms = lk_now_ms() + LK_LEASE_MS;
	return lk_srv_reply(sc, g, LK_OK) ? LK_ERR_IO : LK_OK;
}

static lk_status_t lk_srv_renew(struct lk_srv_conn *sc, struct lk_grant *g)
{
	/*
	 * Rebind over the object's current length.  Keep the key: the
	 * client keeps using the one it has and never needs to refetch it.
	 */
	if (lk_srv_post_inv(sc, g))
		return LK_ERR_IO;
	if (lk_srv_post_bind(sc, g, g->rkey, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) // BUG: rdma-rkey-reuse -- the window is bound again under the key it had before the LOCAL_INV
		return LK_ERR_IO;
	g->expires_ms = lk_now_ms() + LK_LEASE_MS;
	return lk_srv_reply(sc, g, LK_OK) ? LK_ERR_IO : LK_OK;
}

static void lk_srv_end(struct lk_srv_conn *sc, struct lk_grant *g)
{
	if (lk_srv_post_inv(sc, g) == 0)
		g->active = 0;
}

void lk_srv_progress(struct lk_srv_conn *sc)
{
	struct ibv_wc wc[16];
	uint64_t now = lk_now_ms();
	int i, n;

	n = ibv_poll_cq(sc->cq, 16, wc);
	for (i = 0; i < n; i++) {
		struct lk_req *req;

		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV)
			continue;
		req = &sc->rx[wc[i].wr_id];
		switch (req->op) {
		case LK_OP_GRANT:
			lk_srv_grant(sc, req->lock_id);
			break;
		case LK_OP_RENEW:
		case LK_OP_RETURN: {
			struct lk_grant *g = &sc->grants[req->grant % LK_MAX_GRANTS];

			if (!g->active || g->lock_id != req->lock_id)
				break;
			if (req->op == LK_OP_RENEW)
				lk_srv_renew(sc, g);
			else
				lk_srv_end(sc, g);
			break;
		}
		}
	}
	for (i = 0; i < (int)sc->srv->max_grants; i++)
		if (sc->grants[i].active && now > sc->grants[i].expires_ms)
			lk_srv_end(sc, &sc->grants[i]);
}

/* ------------------------------------------------------------ client */

struct lk_cli {
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	uint64_t		table_addr;
	uint32_t		table_rkey;
	uint64_t		owner;
	uint64_t		*result;	/* [0] CAS result, [1] FAA scratch */
	struct ibv_mr		*result_mr;
};

lk_status_t lk_cli_create(struct lk_cli *cl, struct ibv_context *ctx,
			  const struct lk_hello *h, uint64_t owner)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = LK_CLI_SQ_DEPTH, // BUG: rdma-queue-cap-unchecked -- 4096 send WRs requested without looking at max_qp_wr
			.max_recv_wr = 16,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};

	cl->pd = ibv_alloc_pd(ctx);
	cl->cq = ibv_create_cq(ctx, LK_CLI_SQ_DEPTH, NULL, NULL, 0);
	cl->result = aligned_alloc(64, 2 * sizeof(uint64_t));
	if (!cl->pd || !cl->cq || !cl->result)
		return LK_ERR_NO_RESOURCE;
	/* the CAS result lands here */
	cl->result_mr = ibv_reg_mr(cl->pd, cl->result, 2 * sizeof(uint64_t),
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC); // BUG: rdma-remote-access-overbroad -- an atomic's result buffer needs only local write; this MR's rkey never leaves
	if (!cl->result_mr)
		return LK_ERR_IO;

	attr.send_cq = cl->cq;
	attr.recv_cq = cl->cq;
	cl->qp = ibv_create_qp(cl->pd, &attr);
	if (!cl->qp)
		return LK_ERR_IO;
	cl->table_addr = be64toh(h->table_addr);
	cl->table_rkey = be32toh(h->table_rkey);
	cl->owner = owner;
	return LK_OK;
}

lk_status_t lk_cli_lock(struct lk_cli *cl, uint32_t lock_id)
{
	struct ibv_sge sge = { (uintptr_t)&cl->result[0], sizeof(uint64_t), cl->result_mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int spin, n;

	for (spin = 0; spin < LK_CLI_SPIN; spin++) {
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.send_flags = IBV_SEND_SIGNALED;	/* we need the old value */
		wr.wr.atomic.remote_addr = cl->table_addr + lock_id * sizeof(uint64_t);
		wr.wr.atomic.rkey = cl->table_rkey;
		wr.wr.atomic.compare_add = 0;
		wr.wr.atomic.swap = cl->owner;
		if (ibv_post_send(cl->qp, &wr, &bad))
			return LK_ERR_IO;
		while ((n = ibv_poll_cq(cl->cq, 1, &wc)) == 0)
			;
		if (n < 0 || wc.status != IBV_WC_SUCCESS)
			return LK_ERR_IO;
		if (cl->result[0] == 0)
			return LK_OK;
		usleep(1u << (spin < 10 ? spin : 10));
	}
	return LK_ERR_BUSY;
}

lk_status_t lk_cli_unlock(struct lk_cli *cl, uint32_t lock_id)
{
	struct ibv_sge sge = { (uintptr_t)&cl->result[1], sizeof(uint64_t), cl->result_mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.atomic.remote_addr = cl->table_addr + lock_id * sizeof(uint64_t);
	wr.wr.atomic.rkey = cl->table_rkey;
	wr.wr.atomic.compare_add = -cl->owner;
	/* fire and forget: the next lock's signaled CAS retires this entry */
	wr.send_flags = 0;
	return ibv_post_send(cl->qp, &wr, &bad) ? LK_ERR_IO : LK_OK; // OK: rdma-unsignaled-send-starvation -- the client's CAS posts on the same QP are always signaled
}
