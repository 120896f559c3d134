/*
 * td_kv_client.c - client qpair of a small RDMA key-value store, written
 * against librdmacm's synchronous API (rdma_create_ep + rdma_post_*).
 *
 *   PUT  RDMA WRITE of the value into the server's landing slot for the
 *        request (unsignaled), then a signaled SEND of the header
 *   GET  SEND of the header; the response names where the value lives and
 *        the client RDMA READs it - large values into the value pool, tiny
 *        ones straight into the tail of the request's header slot
 *   DEL  inline SEND, signaled every KVC_SIG_EVERY-th post
 * The server writes lease renewals into a client page and may read the
 * client's counters.  A second connection carries one-way heartbeats.
 *
 * Problems: tiny GETs READ into memory registered by rdma_reg_msgs() (no
 * remote write: fails on iWARP); the lease page asks for remote write
 * without local write; the receive depth is a constant nobody compares
 * with the device; heartbeats are never signaled.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-unmap-before-invalidate -- not part of this review
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define KVC_MAX_QD		128
#define KVC_RECV_DEPTH		2048	/* the server also pushes unsolicited watch events */
#define KVC_HDR_SIZE		256
#define KVC_SMALL_VAL		(KVC_HDR_SIZE - 64)
#define KVC_VAL_MAX		(64 * 1024)
#define KVC_INLINE		128
#define KVC_SIG_EVERY		32
#define KVC_HB_DEPTH		8

#define KVC_ERRLOG(fmt, ...)	fprintf(stderr, "kvc: " fmt, ##__VA_ARGS__)

enum kvc_op { KVC_OP_PUT = 1, KVC_OP_GET, KVC_OP_DEL, KVC_OP_HB };

struct kvc_wire_hdr {
	uint8_t		op;
	uint8_t		status;
	uint16_t	klen;
	uint32_t	vlen;
	uint32_t	id;
	uint32_t	rkey;
	uint64_t	raddr;
	char		key[];
};

struct kvc_conn_priv {
	uint64_t	lease_addr;
	uint32_t	lease_rkey;
	uint32_t	stats_rkey;
	uint64_t	stats_addr;
};

struct kvc_accept_priv {
	uint64_t	slot_base;
	uint32_t	slot_rkey;
	uint32_t	slot_size;
};

typedef void (*kvc_cb)(void *arg, int status, const void *val, uint32_t vlen);

struct kvc_request {
	uint32_t		id;
	enum kvc_op		op;
	char			*hdr;
	char			*val;
	uint32_t		vlen;
	kvc_cb			cb;
	void			*cb_arg;
	STAILQ_ENTRY(kvc_request) link;
};

struct kvc_qpair {
	struct rdma_cm_id	*cm_id;
	struct rdma_cm_id	*hb_id;
	uint16_t		max_queue_depth;
	uint32_t		max_inline;
	uint32_t		num_posted;
	struct kvc_accept_priv	srv;

	char			*hdr_pool;
	struct ibv_mr		*hdr_mr;
	char			*val_pool;
	struct ibv_mr		*val_mr;
	char			*rsp_pool;
	struct ibv_mr		*rsp_mr;
	uint64_t		*lease;
	struct ibv_mr		*lease_mr;
	uint64_t		*stats;
	struct ibv_mr		*stats_mr;
	char			hb_buf[16];

	struct kvc_request	*reqs;
	STAILQ_HEAD(, kvc_request) free_reqs;
};

static int kvc_qpair_create_qp(struct kvc_qpair *qp)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* WRITE+SEND (PUT) or SEND+READ (GET) per request, plus the DELs that
	 * wait for the next signaled WR to be retired */
	attr.cap.max_send_wr = 2 * qp->max_queue_depth + KVC_SIG_EVERY; // OK: rdma-send-queue-undersized, rdma-send-queue-manual-factor -- two data WRs per request, no registration WRs in this client
	attr.cap.max_recv_wr = KVC_RECV_DEPTH; // BUG: rdma-queue-cap-unchecked -- 2048 receives, the device's max_qp_wr is never queried
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = KVC_INLINE; // OK: rdma-queue-cap-unchecked -- the granted inline size is read back below
	if (rdma_create_qp(qp->cm_id, NULL, &attr)) {
		KVC_ERRLOG("rdma_create_qp: %s\n", strerror(errno));
		return -errno;
	}
	qp->max_inline = attr.cap.max_inline_data;
	return 0;
}

static int kvc_qpair_reg_buffers(struct kvc_qpair *qp)
{
	struct rdma_cm_id *id = qp->cm_id;
	size_t qd = qp->max_queue_depth;

	qp->hdr_pool = calloc(qd, KVC_HDR_SIZE);
	qp->val_pool = calloc(qd, KVC_VAL_MAX);
	qp->rsp_pool = calloc(KVC_RECV_DEPTH, KVC_HDR_SIZE);
	qp->lease = calloc(8, sizeof(uint64_t));
	qp->stats = calloc(64, sizeof(uint64_t));
	if (!qp->hdr_pool || !qp->val_pool || !qp->rsp_pool || !qp->lease || !qp->stats)
		return -ENOMEM;

	qp->hdr_mr = rdma_reg_msgs(id, qp->hdr_pool, qd * KVC_HDR_SIZE);
	if (!qp->hdr_mr)
		goto err;
	/* GET responses are pulled here with RDMA READ */
	qp->val_mr = rdma_reg_write(id, qp->val_pool, qd * KVC_VAL_MAX);
	if (!qp->val_mr)
		goto err_hdr;
	qp->rsp_mr = rdma_reg_msgs(id, qp->rsp_pool, (size_t)KVC_RECV_DEPTH * KVC_HDR_SIZE);
	if (!qp->rsp_mr)
		goto err_val;
	/* the server renews our lease by writing the epoch into this page */
	qp->lease_mr = ibv_reg_mr(id->pd, qp->lease, 8 * sizeof(uint64_t),
				  IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ); // BUG: rdma-access-flags-invalid -- REMOTE_WRITE without LOCAL_WRITE, ibv_reg_mr fails with EINVAL
	if (!qp->lease_mr)
		goto err_rsp;
	/* admission control on the server reads our counters */
	qp->stats_mr = ibv_reg_mr(id->pd, qp->stats, 64 * sizeof(uint64_t),
				  IBV_ACCESS_REMOTE_READ); // OK: rdma-access-flags-invalid -- remote read alone needs no local write
	if (!qp->stats_mr)
		goto err_lease;
	return 0;

err_lease:
	ibv_dereg_mr(qp->lease_mr);
err_rsp:
	rdma_dereg_mr(qp->rsp_mr);
err_val:
	rdma_dereg_mr(qp->val_mr);
err_hdr:
	rdma_dereg_mr(qp->hdr_mr);
err:
	return -ENOMEM;
}

static int kvc_send_hdr(struct kvc_qpair *qp, struct kvc_request *req, size_t len, int force)
{
	int flags = 0;

	if (len <= qp->max_inline)
		flags |= IBV_SEND_INLINE;
	/* OK: rdma-unsignaled-send-starvation -- num_posted advances on every header SEND */
	if (force || ++qp->num_posted % KVC_SIG_EVERY == 0)
		flags |= IBV_SEND_SIGNALED;
	return rdma_post_send(qp->cm_id, req, req->hdr, len, qp->hdr_mr, flags);
}

static struct kvc_request *kvc_req_get(struct kvc_qpair *qp, enum kvc_op op, const char *key,
				       kvc_cb cb, void *cb_arg)
{
	struct kvc_request *req = STAILQ_FIRST(&qp->free_reqs);
	struct kvc_wire_hdr *h;
	size_t klen = strlen(key);

	if (!req || klen > KVC_HDR_SIZE - sizeof(*h) - KVC_SMALL_VAL)
		return NULL;
	STAILQ_REMOVE_HEAD(&qp->free_reqs, link);
	req->op = op;
	req->cb = cb;
	req->cb_arg = cb_arg;
	h = (struct kvc_wire_hdr *)req->hdr;
	memset(h, 0, sizeof(*h));
	h->op = op;
	h->id = req->id;
	h->klen = (uint16_t)klen;
	memcpy(h->key, key, klen);
	return req;
}

int kvc_put(struct kvc_qpair *qp, const char *key, const void *val, uint32_t vlen,
	    kvc_cb cb, void *cb_arg)
{
	struct kvc_request *req;
	struct kvc_wire_hdr *h;
	int rc;

	if (vlen > KVC_VAL_MAX || vlen > qp->srv.slot_size)
		return -EINVAL;
	req = kvc_req_get(qp, KVC_OP_PUT, key, cb, cb_arg);
	if (!req)
		return -EAGAIN;
	h = (struct kvc_wire_hdr *)req->hdr;
	h->vlen = vlen;
	memcpy(req->val, val, vlen);

	/* retired by the completion of the SEND behind it */
	rc = rdma_post_write(qp->cm_id, req, req->val, vlen, qp->val_mr, 0,
			     qp->srv.slot_base + (uint64_t)req->id * qp->srv.slot_size,
			     qp->srv.slot_rkey);
	if (rc)
		goto err;
	rc = kvc_send_hdr(qp, req, sizeof(*h) + h->klen, 1);
	if (rc)
		goto err;
	return 0;
err:
	STAILQ_INSERT_HEAD(&qp->free_reqs, req, link);
	return rc;
}

int kvc_get(struct kvc_qpair *qp, const char *key, kvc_cb cb, void *cb_arg)
{
	struct kvc_request *req = kvc_req_get(qp, KVC_OP_GET, key, cb, cb_arg);
	struct kvc_wire_hdr *h;

	if (!req)
		return -EAGAIN;
	h = (struct kvc_wire_hdr *)req->hdr;
	return kvc_send_hdr(qp, req, sizeof(*h) + h->klen, 0);
}

int kvc_del(struct kvc_qpair *qp, const char *key)
{
	struct kvc_request *req = kvc_req_get(qp, KVC_OP_DEL, key, NULL, NULL);
	struct kvc_wire_hdr *h;

	if (!req)
		return -EAGAIN;
	h = (struct kvc_wire_hdr *)req->hdr;
	return kvc_send_hdr(qp, req, sizeof(*h) + h->klen, 0);
}

/* GET response: the server tells us where the value is */
static int kvc_fetch_value(struct kvc_qpair *qp, struct kvc_request *req,
			   const struct kvc_wire_hdr *rsp)
{
	req->vlen = rsp->vlen;
	if (rsp->vlen <= KVC_SMALL_VAL) {
		/* tiny values land behind the header; saves a value-pool cache miss */
		return rdma_post_read(qp->cm_id, req, req->hdr + 64, rsp->vlen, qp->hdr_mr,
				      IBV_SEND_SIGNALED, rsp->raddr, rsp->rkey); // BUG: rdma-access-flags-transport -- READ sink in hdr_mr, registered by rdma_reg_msgs() with local write only
	}
	return rdma_post_read(qp->cm_id, req, req->val, rsp->vlen, qp->val_mr,
			      IBV_SEND_SIGNALED, rsp->raddr, rsp->rkey); // OK: rdma-access-flags-transport -- val_mr comes from rdma_reg_write(), which grants remote write
}

static void kvc_complete(struct kvc_qpair *qp, struct kvc_request *req, int status)
{
	const void *val = req->vlen <= KVC_SMALL_VAL ? (const void *)(req->hdr + 64) : req->val;

	if (req->cb)
		req->cb(req->cb_arg, status, req->op == KVC_OP_GET ? val : NULL, req->vlen);
	STAILQ_INSERT_TAIL(&qp->free_reqs, req, link);
}

int kvc_qpair_process_completions(struct kvc_qpair *qp)
{
	struct ibv_wc wc[32];
	int i, n, total = 0;

	n = ibv_poll_cq(qp->cm_id->recv_cq, 32, wc);
	for (i = 0; i < n; i++) {
		const struct kvc_wire_hdr *rsp = (const void *)(uintptr_t)wc[i].wr_id;
		struct kvc_request *req;

		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		if (rsp->id >= qp->max_queue_depth)
			goto repost;
		req = &qp->reqs[rsp->id];
		if (req->op == KVC_OP_GET && rsp->status == 0) {
			if (kvc_fetch_value(qp, req, rsp))
				kvc_complete(qp, req, -EIO);
		} else {
			kvc_complete(qp, req, rsp->status ? -ENOENT : 0);
		}
repost:
		rdma_post_recv(qp->cm_id, (void *)rsp, (void *)rsp, KVC_HDR_SIZE, qp->rsp_mr);
		total++;
	}

	n = ibv_poll_cq(qp->cm_id->send_cq, 32, wc);
	for (i = 0; i < n; i++) {
		struct kvc_request *req = (struct kvc_request *)(uintptr_t)wc[i].wr_id;

		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		if (wc[i].opcode == IBV_WC_RDMA_READ)
			kvc_complete(qp, req, 0);
		total++;
	}
	return total;
}

static int kvc_hb_connect(struct kvc_qpair *qp, struct rdma_addrinfo *res)
{
	struct ibv_qp_init_attr attr = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
		.cap = { .max_send_wr = KVC_HB_DEPTH, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = sizeof(qp->hb_buf) },
	};

	if (rdma_create_ep(&qp->hb_id, res, NULL, &attr))
		return -errno;
	return rdma_connect(qp->hb_id, NULL);
}

void kvc_heartbeat(struct kvc_qpair *qp, uint64_t now)
{
	memcpy(qp->hb_buf, &now, sizeof(now));
	qp->hb_buf[8] = KVC_OP_HB;
	/* one-way and inline: nothing to wait for */
	if (rdma_post_send(qp->hb_id, NULL, qp->hb_buf, sizeof(qp->hb_buf), NULL, IBV_SEND_INLINE)) // BUG(file): rdma-unsignaled-send-starvation -- heartbeat QP is sq_sig_all=0 and no post on it is signaled; it fails after 8 beats
		KVC_ERRLOG("heartbeat: %s\n", strerror(errno));
}

struct kvc_qpair *kvc_qpair_connect(const char *host, const char *port, uint16_t qd)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
	struct kvc_conn_priv priv;
	struct rdma_conn_param param = { .private_data = &priv, .private_data_len = sizeof(priv),
					 .initiator_depth = 4, .responder_resources = 4,
					 .retry_count = 7, .rnr_retry_count = 7 };
	struct kvc_qpair *qp;
	uint32_t i;

	qp = calloc(1, sizeof(*qp));
	if (!qp || rdma_getaddrinfo(host, port, &hints, &res))
		goto err;
	qp->max_queue_depth = qd > KVC_MAX_QD ? KVC_MAX_QD : qd;
	STAILQ_INIT(&qp->free_reqs);
	if (rdma_create_ep(&qp->cm_id, res, NULL, NULL))
		goto err_ai;
	if (kvc_qpair_create_qp(qp) || kvc_qpair_reg_buffers(qp))
		goto err_ep;

	qp->reqs = calloc(qp->max_queue_depth, sizeof(*qp->reqs));
	if (!qp->reqs)
		goto err_ep;
	for (i = 0; i < qp->max_queue_depth; i++) {
		qp->reqs[i].id = i;
		qp->reqs[i].hdr = qp->hdr_pool + (size_t)i * KVC_HDR_SIZE;
		qp->reqs[i].val = qp->val_pool + (size_t)i * KVC_VAL_MAX;
		STAILQ_INSERT_TAIL(&qp->free_reqs, &qp->reqs[i], link);
	}
	for (i = 0; i < KVC_RECV_DEPTH; i++) {
		char *buf = qp->rsp_pool + (size_t)i * KVC_HDR_SIZE;

		if (rdma_post_recv(qp->cm_id, buf, buf, KVC_HDR_SIZE, qp->rsp_mr))
			goto err_ep;
	}

	priv.lease_addr = (uintptr_t)qp->lease;
	priv.lease_rkey = qp->lease_mr->rkey;
	priv.stats_addr = (uintptr_t)qp->stats;
	priv.stats_rkey = qp->stats_mr->rkey;
	if (rdma_connect(qp->cm_id, &param))
		goto err_ep;
	if (qp->cm_id->event && qp->cm_id->event->param.conn.private_data_len >= sizeof(qp->srv))
		memcpy(&qp->srv, qp->cm_id->event->param.conn.private_data, sizeof(qp->srv));
	if (kvc_hb_connect(qp, res))
		goto err_ep;
	rdma_freeaddrinfo(res);
	return qp;

err_ep:
	rdma_destroy_ep(qp->cm_id);
err_ai:
	rdma_freeaddrinfo(res);
err:
	free(qp);
	return NULL;
}
