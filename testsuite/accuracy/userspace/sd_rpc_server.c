/*
 * sd_rpc_server.c -- key/value RPC server over RDMA (rdma_cm + verbs).
 *
 * The client passes its reply ring (addr/rkey/len) and its request depth in
 * the connect private data.  Requests are SENDs into a receive ring; every
 * request gets one reply: small values as one SEND gathering the header and
 * up to five values from the value arena (RPC_REPLY_SGES entries), large
 * values as an RDMA WRITE into the reply ring -- two WRITEs when the value
 * wraps around the ring -- followed by the header SEND.  PUT with
 * RPC_F_ECHO pushes the stored value back (WRITE + SEND_WITH_IMM).
 * sq_sig_all = 0: replies are signaled every -s posts, pushes when the push
 * credit runs low.
 *
 * Known problems: two SQ entries per request although a wrapped reply posts
 * three; max_send_sge is a fixed 6 never compared with the device; the push
 * credit is never consumed, so pushes are never signaled; a failed
 * send-slot registration and a refused arena resize leak MRs.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad -- not the subject of this file
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked -- not the subject of this file
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath -- not the subject of this file
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define RPC_MSG_SIZE		256
#define RPC_RECV_RING		2048
#define RPC_REPLY_SGES		6
#define RPC_INLINE		256
#define RPC_SMALL_MAX		4096
#define RPC_MAX_OBJS		4096
#define RPC_BULK_DEFAULT	(4u << 20)
#define RPC_BULK_MAX		(256u << 20)
#define RPC_DEF_INFLIGHT	128
#define RPC_DEF_SIG_EVERY	16
#define RPC_PUSH_LOW		4

#define RPC_WRID_RECV		(1ull << 63)
#define RPC_WRID_PUSH		(1ull << 62)
#define RPC_WRID_SEQ(x)		((x) & ~(RPC_WRID_RECV | RPC_WRID_PUSH))

#define RPC_F_ECHO		0x1

#define rpc_err(fmt, ...)	fprintf(stderr, "rpc: " fmt "\n", ##__VA_ARGS__)

enum rpc_op { RPC_GET = 1, RPC_PUT, RPC_PING };

struct rpc_req_hdr {
	uint32_t op, id;
	uint64_t key[RPC_REPLY_SGES - 1];	/* GET: up to five keys */
	uint32_t nkeys, len, flags, pad;
};

struct rpc_rep_hdr {
	uint32_t id;
	int32_t status;
	uint32_t len;
	uint32_t ring_off;	/* where a bulk value landed, or ~0 */
};

struct rpc_conn_priv {
	uint64_t ring_addr;
	uint32_t ring_rkey, ring_len, max_inflight;
};

struct rpc_opts {
	uint16_t port;
	uint32_t max_inflight, sig_every;
	size_t bulk_len;
};

/* direct-mapped value cache: a PUT evicts whatever shared the slot */
struct rpc_obj {
	uint64_t key;
	uint32_t off, len;
	bool used;
};

struct rpc_conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	const struct rpc_opts *opts;

	char *recv_buf;
	struct ibv_mr *recv_mr;
	uint32_t recv_depth;
	char *send_buf;			/* one header slot per in-flight request */
	struct ibv_mr *send_mr;
	uint32_t send_slot;
	char *bulk_buf;			/* value arena */
	struct ibv_mr *bulk_mr;
	size_t bulk_len, bulk_used;
	unsigned bulk_inflight;		/* WRITEs out of the arena not known complete */
	uint64_t bulk_last_seq;
	struct rpc_obj *objs;

	uint64_t ring_addr;
	uint32_t ring_rkey, ring_len, ring_head;
	uint32_t max_inflight, max_inline;

	unsigned unsig_cnt;		/* reply posts since the last signaled one */
	unsigned push_credits;
	uint64_t post_seq;
	bool closing;
};

static int rpc_conn_alloc_bufs(struct rpc_conn *c)
{
	size_t recv_len = (size_t)RPC_RECV_RING * RPC_MSG_SIZE;
	size_t send_len = (size_t)c->max_inflight * RPC_MSG_SIZE;

	c->bulk_len = c->opts->bulk_len;
	c->recv_buf = calloc(1, recv_len);
	c->send_buf = calloc(1, send_len);
	c->bulk_buf = calloc(1, c->bulk_len);
	if (!c->recv_buf || !c->send_buf || !c->bulk_buf)
		goto err_free;

	c->recv_mr = ibv_reg_mr(c->pd, c->recv_buf, recv_len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->recv_mr)
		goto err_free;
	c->bulk_mr = ibv_reg_mr(c->pd, c->bulk_buf, c->bulk_len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->bulk_mr)
		goto err_recv_mr;	/* OK: rdma-mr-leak -- only recv_mr is held here and err_recv_mr releases it */
	c->send_mr = ibv_reg_mr(c->pd, c->send_buf, send_len, 0);
	if (!c->send_mr)
		goto err_recv_mr;	/* BUG: rdma-mr-leak -- bulk_mr was registered above and err_recv_mr does not deregister it */
	c->objs = calloc(RPC_MAX_OBJS, sizeof(*c->objs));
	if (!c->objs)
		goto err_send_mr;	/* OK: rdma-mr-leak -- err_send_mr releases send_mr and bulk_mr, then falls through to recv_mr */
	return 0;

err_send_mr:
	ibv_dereg_mr(c->send_mr);
	ibv_dereg_mr(c->bulk_mr);
err_recv_mr:
	ibv_dereg_mr(c->recv_mr);
err_free:
	free(c->bulk_buf);
	free(c->send_buf);
	free(c->recv_buf);
	return -ENOMEM;
}

static void rpc_conn_free_bufs(struct rpc_conn *c)
{
	ibv_dereg_mr(c->send_mr);
	ibv_dereg_mr(c->bulk_mr);
	ibv_dereg_mr(c->recv_mr);
	free(c->objs);
	free(c->bulk_buf);
	free(c->send_buf);
	free(c->recv_buf);
}

/* Grow the value arena; the old one may only go once no WRITE reads it. */
static int rpc_conn_grow_bulk(struct rpc_conn *c, size_t need)
{
	size_t nlen = c->bulk_len;
	struct ibv_mr *nmr;
	char *nbuf;

	while (nlen < need)
		nlen *= 2;
	if (nlen > RPC_BULK_MAX)
		return -E2BIG;

	nbuf = malloc(nlen);
	if (!nbuf)
		return -ENOMEM;
	nmr = ibv_reg_mr(c->pd, nbuf, nlen, IBV_ACCESS_LOCAL_WRITE);
	if (!nmr) {
		free(nbuf);
		return -ENOMEM;
	}
	if (c->bulk_inflight) {
		free(nbuf);
		return -EAGAIN;		/* BUG: rdma-mr-leak -- nmr is dropped without ibv_dereg_mr() */
	}
	memcpy(nbuf, c->bulk_buf, c->bulk_used);
	ibv_dereg_mr(c->bulk_mr);
	free(c->bulk_buf);
	c->bulk_buf = nbuf;
	c->bulk_mr = nmr;		/* OK: rdma-mr-leak -- the old arena MR was deregistered just above */
	c->bulk_len = nlen;
	return 0;
}

/* one WRITE and one SEND per in-flight reply, one spare for pushes */
static uint32_t rpc_sq_depth(const struct rpc_conn *c)
{
	return 2 * c->max_inflight + 1;
}

static int rpc_conn_create_qp(struct rpc_conn *c)
{
	struct ibv_device_attr dattr;
	struct ibv_qp_init_attr qa;
	int cqe;

	if (ibv_query_device(c->id->verbs, &dattr))
		return -errno;

	c->recv_depth = RPC_RECV_RING;
	if (c->recv_depth > (uint32_t)dattr.max_qp_wr)
		c->recv_depth = dattr.max_qp_wr;

	cqe = rpc_sq_depth(c) + c->recv_depth;
	if (cqe > dattr.max_cqe)
		cqe = dattr.max_cqe;
	c->cq = ibv_create_cq(c->id->verbs, cqe, c, NULL, 0);
	if (!c->cq)
		return -errno;

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 0;
	/* OK: rdma-send-queue-manual-factor -- the factor counts data WRs only; nothing in this server posts REG_MR, BIND_MW or LOCAL_INV */
	qa.cap.max_send_wr = rpc_sq_depth(c);	/* BUG(file): rdma-send-queue-undersized -- a wrapped bulk reply posts WRITE, WRITE, SEND: three WRs per request against two reserved */
	qa.cap.max_recv_wr = c->recv_depth;	/* OK: rdma-queue-cap-unchecked -- RPC_RECV_RING was clamped to dattr.max_qp_wr above */
	qa.cap.max_send_sge = RPC_REPLY_SGES;	/* BUG: rdma-queue-cap-unchecked -- six SGEs requested, the device's max_sge is never consulted */
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = RPC_INLINE;	/* OK: rdma-queue-cap-unchecked -- the granted inline size is read back after creation */
	if (rdma_create_qp(c->id, c->pd, &qa)) {
		int err = errno;

		rpc_err("rdma_create_qp: %s", strerror(err));
		ibv_destroy_cq(c->cq);
		return -err;
	}
	c->qp = c->id->qp;
	c->max_inline = qa.cap.max_inline_data;
	return 0;
}

static int rpc_post_recv(struct rpc_conn *c, uint32_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->recv_buf + (size_t)slot * RPC_MSG_SIZE),
		.length = RPC_MSG_SIZE,
		.lkey = c->recv_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = RPC_WRID_RECV | slot,
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

static struct rpc_obj *rpc_slot(struct rpc_conn *c, uint64_t key)
{
	return &c->objs[(key * 0x9e3779b97f4a7c15ull >> 40) % RPC_MAX_OBJS];
}

static uint32_t rpc_ring_reserve(struct rpc_conn *c, uint32_t len, bool contig)
{
	uint32_t off = c->ring_head;

	if (contig && off + len > c->ring_len)
		off = 0;
	c->ring_head = (off + len) % c->ring_len;
	return off;
}

static void rpc_set_write(struct ibv_send_wr *wr, struct ibv_sge *sge, struct rpc_conn *c,
			  uint32_t src_off, uint32_t len, uint32_t ring_off)
{
	*sge = (struct ibv_sge){ (uintptr_t)(c->bulk_buf + src_off), len, c->bulk_mr->lkey };
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->wr.rdma.remote_addr = c->ring_addr + ring_off;
	wr->wr.rdma.rkey = c->ring_rkey;
	wr->next = wr + 1;
}

static int rpc_post_reply(struct rpc_conn *c, uint32_t id, int status,
			  struct rpc_obj **vals, unsigned nvals)
{
	struct ibv_send_wr wr[3], *bad;
	struct ibv_sge sge[RPC_REPLY_SGES], wsge[2];
	struct rpc_rep_hdr *hdr;
	uint32_t total = 0, off, first;
	unsigned i, n = 0, nsge = 1;

	hdr = (struct rpc_rep_hdr *)(c->send_buf + (size_t)c->send_slot * RPC_MSG_SIZE);
	c->send_slot = (c->send_slot + 1) % c->max_inflight;
	for (i = 0; i < nvals; i++)
		total += vals[i]->len;
	*hdr = (struct rpc_rep_hdr){ id, status, total, UINT32_MAX };

	memset(wr, 0, sizeof(wr));
	sge[0] = (struct ibv_sge){ (uintptr_t)hdr, sizeof(*hdr), c->send_mr->lkey };

	if (nvals == 1 && total > RPC_SMALL_MAX) {
		const struct rpc_obj *o = vals[0];

		if (total > c->ring_len)
			return -EMSGSIZE;
		off = rpc_ring_reserve(c, total, false);
		first = c->ring_len - off < total ? c->ring_len - off : total;
		rpc_set_write(&wr[n], &wsge[n], c, o->off, first, off);
		n++;
		if (first < total) {
			/* wrapped: the tail goes to the start of the ring */
			rpc_set_write(&wr[n], &wsge[n], c, o->off + first, total - first, 0);
			n++;
		}
		hdr->ring_off = off;
		c->bulk_inflight++;
	} else {
		for (i = 0; i < nvals; i++, nsge++)
			sge[nsge] = (struct ibv_sge){ (uintptr_t)(c->bulk_buf + vals[i]->off),
						      vals[i]->len, c->bulk_mr->lkey };
	}

	wr[n].wr_id = ++c->post_seq;
	wr[n].opcode = IBV_WR_SEND;
	wr[n].sg_list = sge;
	wr[n].num_sge = nsge;
	if (nsge == 1 && sizeof(*hdr) <= c->max_inline)
		wr[n].send_flags = IBV_SEND_INLINE;
	if (n)
		c->bulk_last_seq = c->post_seq;
	if (++c->unsig_cnt >= c->opts->sig_every) {	/* OK: rdma-unsignaled-send-starvation -- unsig_cnt advances with every reply and is reset when one is signaled */
		wr[n].send_flags |= IBV_SEND_SIGNALED;
		c->unsig_cnt = 0;
	}
	return ibv_post_send(c->qp, wr, &bad);
}

static int rpc_push_value(struct rpc_conn *c, const struct rpc_obj *o)
{
	struct ibv_send_wr wr[2], *bad;
	struct ibv_sge sge;
	uint32_t off;

	if (o->len > c->ring_len / 2)
		return -EMSGSIZE;
	off = rpc_ring_reserve(c, o->len, true);

	memset(wr, 0, sizeof(wr));
	rpc_set_write(&wr[0], &sge, c, o->off, o->len, off);
	wr[1].wr_id = RPC_WRID_PUSH | ++c->post_seq;
	wr[1].opcode = IBV_WR_SEND_WITH_IMM;
	wr[1].imm_data = htonl(off);
	if (c->push_credits < RPC_PUSH_LOW)	/* BUG: rdma-unsignaled-send-starvation -- push_credits is only ever set back to max_inflight, no push takes from it: pushes are never signaled */
		wr[1].send_flags = IBV_SEND_SIGNALED;
	c->bulk_inflight++;
	c->bulk_last_seq = c->post_seq;
	return ibv_post_send(c->qp, wr, &bad);
}

static void rpc_handle_request(struct rpc_conn *c, uint32_t slot, uint32_t byte_len)
{
	struct rpc_req_hdr *rq = (struct rpc_req_hdr *)(c->recv_buf + (size_t)slot * RPC_MSG_SIZE);
	struct rpc_obj *vals[RPC_REPLY_SGES - 1], *o;
	unsigned i, n = 0;
	int rc;

	if (byte_len < sizeof(*rq))
		return;
	if (rq->op == RPC_GET) {
		for (i = 0; i < rq->nkeys && i < RPC_REPLY_SGES - 1; i++) {
			o = rpc_slot(c, rq->key[i]);
			if (!o->used || o->key != rq->key[i])
				break;
			vals[n++] = o;
		}
		rc = rpc_post_reply(c, rq->id, n == rq->nkeys ? 0 : -ENOENT, vals, n);
	} else if (rq->op == RPC_PUT) {
		rc = rq->len > byte_len - sizeof(*rq) ? -EINVAL : 0;
		if (!rc && c->bulk_used + rq->len > c->bulk_len)
			rc = rpc_conn_grow_bulk(c, c->bulk_used + rq->len);
		if (rc) {
			rc = rpc_post_reply(c, rq->id, rc, NULL, 0);
			goto out;
		}
		o = rpc_slot(c, rq->key[0]);
		memcpy(c->bulk_buf + c->bulk_used, rq + 1, rq->len);
		o->key = rq->key[0];
		o->off = c->bulk_used;
		o->len = rq->len;
		o->used = true;
		c->bulk_used += rq->len;
		rc = rpc_post_reply(c, rq->id, 0, NULL, 0);
		if (!rc && (rq->flags & RPC_F_ECHO))
			rc = rpc_push_value(c, o);
	} else {
		rc = rpc_post_reply(c, rq->id, rq->op == RPC_PING ? 0 : -EOPNOTSUPP, NULL, 0);
	}
out:
	if (rc)
		rpc_err("reply to %u failed: %d", rq->id, rc);
}

static int rpc_poll(struct rpc_conn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(c->cq, 16, wc);
	if (n < 0)
		return -EIO;
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS) {
			if (wc[i].status != IBV_WC_WR_FLUSH_ERR)
				rpc_err("wc %s (wr_id %#llx)", ibv_wc_status_str(wc[i].status),
					(unsigned long long)wc[i].wr_id);
			c->closing = true;
			continue;
		}
		if (wc[i].wr_id & RPC_WRID_RECV) {
			uint32_t slot = (uint32_t)RPC_WRID_SEQ(wc[i].wr_id);

			rpc_handle_request(c, slot, wc[i].byte_len);
			if (rpc_post_recv(c, slot))
				c->closing = true;
			continue;
		}
		/* a signaled send retires everything posted before it */
		if (RPC_WRID_SEQ(wc[i].wr_id) >= c->bulk_last_seq)
			c->bulk_inflight = 0;
		if (wc[i].wr_id & RPC_WRID_PUSH)
			c->push_credits = c->max_inflight;
	}
	return 0;
}

static struct rpc_conn *rpc_accept_conn(struct rdma_cm_id *id, const struct rdma_cm_event *ev,
					const struct rpc_opts *o)
{
	const struct rpc_conn_priv *priv = ev->param.conn.private_data;
	struct rdma_conn_param cp;
	struct rpc_conn *c;
	uint32_t i;

	if (!priv || ev->param.conn.private_data_len < sizeof(*priv) || !priv->ring_len)
		goto reject;
	c = calloc(1, sizeof(*c));
	if (!c)
		goto reject;
	c->id = id;
	c->opts = o;
	c->ring_addr = priv->ring_addr;
	c->ring_rkey = priv->ring_rkey;
	c->ring_len = priv->ring_len;
	c->max_inflight = priv->max_inflight && priv->max_inflight < o->max_inflight ?
			  priv->max_inflight : o->max_inflight;
	id->context = c;

	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		goto err_free;
	if (rpc_conn_alloc_bufs(c))
		goto err_pd;
	if (rpc_conn_create_qp(c))
		goto err_bufs;
	for (i = 0; i < c->recv_depth; i++)
		if (rpc_post_recv(c, i))
			goto err_qp;
	c->push_credits = c->max_inflight;

	memset(&cp, 0, sizeof(cp));
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	cp.rnr_retry_count = 7;
	if (rdma_accept(id, &cp))
		goto err_qp;
	return c;

err_qp:
	rdma_destroy_qp(id);
	ibv_destroy_cq(c->cq);
err_bufs:
	rpc_conn_free_bufs(c);
err_pd:
	ibv_dealloc_pd(c->pd);
err_free:
	free(c);
reject:
	rdma_reject(id, NULL, 0);
	return NULL;
}

static void rpc_conn_destroy(struct rpc_conn *c)
{
	rdma_destroy_qp(c->id);
	ibv_destroy_cq(c->cq);
	rpc_conn_free_bufs(c);
	ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	free(c);
}

int main(int argc, char **argv)
{
	struct rpc_opts opts = { 18515, RPC_DEF_INFLIGHT, RPC_DEF_SIG_EVERY, RPC_BULK_DEFAULT };
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct rdma_event_channel *ec;
	struct rdma_cm_id *listen_id;
	struct rdma_cm_event *ev;
	struct rpc_conn *c = NULL;
	int opt;

	while ((opt = getopt(argc, argv, "p:n:s:b:")) != -1) {
		if (opt == 'p')
			opts.port = (uint16_t)atoi(optarg);
		else if (opt == 'n')
			opts.max_inflight = (uint32_t)atoi(optarg);
		else if (opt == 's')
			opts.sig_every = (uint32_t)atoi(optarg);
		else if (opt == 'b')
			opts.bulk_len = strtoull(optarg, NULL, 0);
		else
			return 1;
	}
	if (!opts.max_inflight)
		opts.max_inflight = RPC_DEF_INFLIGHT;
	if (!opts.sig_every || opts.sig_every > opts.max_inflight)
		opts.sig_every = opts.max_inflight;

	ec = rdma_create_event_channel();
	if (!ec || rdma_create_id(ec, &listen_id, NULL, RDMA_PS_TCP))
		return 1;
	sin.sin_port = htons(opts.port);
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || rdma_listen(listen_id, 8))
		return 1;
	fcntl(ec->fd, F_SETFL, fcntl(ec->fd, F_GETFL) | O_NONBLOCK);

	for (;;) {
		if (c && !c->closing && rpc_poll(c))
			c->closing = true;
		if (rdma_get_cm_event(ec, &ev))
			continue;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			if (c)
				rdma_reject(ev->id, NULL, 0);
			else
				c = rpc_accept_conn(ev->id, ev, &opts);
		} else if (ev->event == RDMA_CM_EVENT_DISCONNECTED && c && ev->id == c->id) {
			rdma_ack_cm_event(ev);
			rpc_conn_destroy(c);
			c = NULL;
			continue;
		}
		rdma_ack_cm_event(ev);
	}
	return 0;
}
