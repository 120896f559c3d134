/*
 * sd_blk_initiator.c - NVMe-oF-like block initiator over RDMA (userspace).
 *
 * I/O buffers are carved out of one arena registered with LOCAL_WRITE |
 * MW_BIND and no remote rights of its own.  Every request owns a type 2
 * memory window: submit binds it over the request's buffer under a new key
 * (ibv_inc_rkey of the last one) and sends the command capsule naming that
 * key, both through the extended QP API.  The target moves the data and
 * answers with SEND_WITH_INV of the key; when the response comes without
 * the invalidation, or with another key, the initiator posts a signaled
 * LOCAL_INV and completes the request from that completion.  A request that
 * times out is invalidated the same way and then resubmitted.
 *
 * Known problems: the send queue is sized for BIND_MW + SEND per request
 * and forgets the LOCAL_INV fallback; a resubmitted request is rebound
 * under the key of the attempt that timed out, and the chunked synchronous
 * read binds every chunk under one key; queue setup leaks the arena
 * MR when the request table cannot be allocated; a window replaced after a
 * bind error is never deallocated.
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
#include <time.h>
#include <sys/queue.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define SDBLK_WRS_PER_REQ	2	/* BIND_MW + capsule SEND */
#define SDBLK_CAPSULE_INLINE	64
#define SDBLK_MAX_DEPTH		1024
#define SDBLK_TIMEOUT_US	(5ull * 1000 * 1000)
#define SDBLK_MAX_RETRIES	3
#define SDBLK_RECV_WRID(i)	((uint64_t)(i) | (1ull << 63))
#define SDBLK_IS_RECV(id)	((id) & (1ull << 63))

#define SDBLK_ERRLOG(fmt, ...) fprintf(stderr, "sdblk: %s: " fmt, __func__, ##__VA_ARGS__)

enum sdblk_opc { SDBLK_OPC_FLUSH = 0x00, SDBLK_OPC_WRITE = 0x01, SDBLK_OPC_READ = 0x02 };

struct sdblk_capsule {
	uint8_t		opc;
	uint8_t		flags;
	uint16_t	cid;
	uint32_t	nsid;
	uint64_t	slba;
	uint32_t	nlb;
	uint32_t	key;
	uint64_t	addr;
	uint32_t	len;
	uint32_t	rsvd[7];
};

struct sdblk_cpl {
	uint16_t	cid;
	uint16_t	status;
	uint32_t	rsvd;
};

enum sdblk_req_state {
	SDBLK_REQ_FREE,
	SDBLK_REQ_OUTSTANDING,
	SDBLK_REQ_INVALIDATING,		/* LOCAL_INV posted, complete on its completion */
	SDBLK_REQ_RETRY_PENDING,	/* LOCAL_INV posted, resubmit on its completion */
};

typedef void (*sdblk_cb)(void *ctx, int status);

struct sdblk_req {
	uint16_t		cid;
	enum sdblk_req_state	state;
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key the window is bound under */
	void			*buf;
	uint32_t		len;
	bool			is_write;
	uint64_t		slba;
	uint32_t		nlb;
	int			status;
	unsigned		retries;
	uint64_t		deadline;
	sdblk_cb		cb;
	void			*cb_arg;
	TAILQ_ENTRY(sdblk_req)	link;
};

struct sdblk_qpair {
	struct rdma_cm_id	*cm_id;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	uint16_t		depth;
	struct sdblk_req	*reqs;
	struct sdblk_capsule	*capsules;
	struct ibv_mr		*capsule_mr;
	struct sdblk_cpl	*cpls;
	struct ibv_mr		*cpl_mr;
	void			*arena;
	size_t			arena_len;
	struct ibv_mr		*arena_mr;
	bool			failed;
	TAILQ_HEAD(, sdblk_req)	free_reqs;
	TAILQ_HEAD(, sdblk_req)	outstanding;
};

int sdblk_poll(struct sdblk_qpair *q);

static uint64_t sdblk_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint32_t sdblk_sq_size(const struct sdblk_qpair *q)
{
	return SDBLK_WRS_PER_REQ * q->depth + 1;
}

static int sdblk_qpair_init_bufs(struct sdblk_qpair *q)
{
	uint16_t i, j;

	q->capsules = calloc(q->depth, sizeof(*q->capsules));
	q->cpls = calloc(q->depth, sizeof(*q->cpls));
	if (!q->capsules || !q->cpls)
		goto err_free;
	q->capsule_mr = ibv_reg_mr(q->pd, q->capsules, q->depth * sizeof(*q->capsules), 0);
	if (!q->capsule_mr)
		goto err_free;
	q->cpl_mr = ibv_reg_mr(q->pd, q->cpls, q->depth * sizeof(*q->cpls), IBV_ACCESS_LOCAL_WRITE);
	if (!q->cpl_mr)
		goto err_capsule_mr;
	q->arena_mr = ibv_reg_mr(q->pd, q->arena, q->arena_len,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!q->arena_mr)
		goto err_cpl_mr;

	q->reqs = calloc(q->depth, sizeof(*q->reqs));
	if (!q->reqs)
		goto err_cpl_mr;	/* BUG: rdma-mr-leak -- arena_mr is registered at this point and err_cpl_mr does not release it */
	TAILQ_INIT(&q->free_reqs);
	TAILQ_INIT(&q->outstanding);
	for (i = 0; i < q->depth; i++) {
		struct sdblk_req *req = &q->reqs[i];

		req->mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2);
		if (!req->mw)
			goto err_mw;	/* OK: rdma-mr-leak -- the window of slot i was never allocated; the loop below frees 0..i-1 */
		req->cid = i;
		req->rkey = req->mw->rkey;
		TAILQ_INSERT_TAIL(&q->free_reqs, req, link);
	}
	return 0;

err_mw:
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(q->reqs[j].mw);
	free(q->reqs);
	ibv_dereg_mr(q->arena_mr);
err_cpl_mr:
	ibv_dereg_mr(q->cpl_mr);
err_capsule_mr:
	ibv_dereg_mr(q->capsule_mr);
err_free:
	free(q->cpls);
	free(q->capsules);
	return -ENOMEM;
}

static void sdblk_qpair_free_bufs(struct sdblk_qpair *q)
{
	uint16_t i;

	for (i = 0; i < q->depth; i++)
		if (q->reqs[i].mw)
			ibv_dealloc_mw(q->reqs[i].mw);
	free(q->reqs);
	ibv_dereg_mr(q->arena_mr);
	ibv_dereg_mr(q->cpl_mr);
	ibv_dereg_mr(q->capsule_mr);
	free(q->cpls);
	free(q->capsules);
}

static int sdblk_qpair_create_qp(struct sdblk_qpair *q)
{
	struct ibv_qp_init_attr_ex attr;

	q->cq = ibv_create_cq(q->cm_id->verbs, sdblk_sq_size(q) + q->depth, q, NULL, 0);
	if (!q->cq)
		return -errno;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.pd = q->pd;
	attr.sq_sig_all = 0;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	/* BUG(file): rdma-send-queue-manual-factor -- a hand-made per-request factor over q->depth for a queue that carries BIND_MW and LOCAL_INV */
	attr.cap.max_send_wr = sdblk_sq_size(q);	/* BUG(file): rdma-send-queue-undersized -- BIND_MW + SEND are reserved per request but a response without remote invalidation adds a LOCAL_INV: three WRs */
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = SDBLK_CAPSULE_INLINE;	/* OK: rdma-queue-cap-unchecked -- 64 bytes is within what every device offers */
	if (rdma_create_qp_ex(q->cm_id, &attr)) {
		int err = errno;

		ibv_destroy_cq(q->cq);
		return -err;
	}
	q->qp = q->cm_id->qp;
	q->qpx = ibv_qp_to_qp_ex(q->qp);
	return 0;
}

static int sdblk_post_cpl_recv(struct sdblk_qpair *q, uint16_t i)
{
	struct ibv_sge sge = { (uintptr_t)&q->cpls[i], sizeof(q->cpls[i]), q->cpl_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = SDBLK_RECV_WRID(i), .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

/* Make sure this QP really binds type 2 windows before relying on them. */
static int sdblk_probe_mw(struct sdblk_qpair *q)
{
	struct ibv_mw_bind_info bind = {
		.mr = q->arena_mr,
		.addr = (uintptr_t)q->arena,
		.length = 4096,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ,
	};
	struct ibv_mw *mw;
	struct ibv_wc wc;
	int rc, n, spins = 0;

	mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2);
	if (!mw)
		return -errno;
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = 0;
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(q->qpx, mw, mw->rkey, &bind);	/* OK: rdma-rkey-reuse -- first bind of the window allocated just above; no peer has seen its key */
	rc = ibv_wr_complete(q->qpx);
	if (rc) {
		ibv_dealloc_mw(mw);	/* OK: rdma-mr-leak -- the probe window is released on the failed post */
		return -rc;
	}
	do {
		n = ibv_poll_cq(q->cq, 1, &wc);
	} while (n == 0 && ++spins < 1000000);
	rc = (n == 1 && wc.status == IBV_WC_SUCCESS) ? 0 : -ENOTSUP;
	ibv_dealloc_mw(mw);		/* deallocation invalidates the window */
	return rc;
}

static int sdblk_bind_and_send(struct sdblk_qpair *q, struct sdblk_req *req)
{
	struct sdblk_capsule *cap = &q->capsules[req->cid];
	struct ibv_mw_bind_info bind = {
		.mr = q->arena_mr,
		.addr = (uintptr_t)req->buf,
		.length = req->len,
		.mw_access_flags = req->is_write ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE,
	};

	memset(cap, 0, sizeof(*cap));
	cap->opc = req->is_write ? SDBLK_OPC_WRITE : SDBLK_OPC_READ;
	cap->cid = req->cid;
	cap->nsid = 1;
	cap->slba = req->slba;
	cap->nlb = req->nlb;
	cap->addr = (uintptr_t)req->buf;
	cap->len = req->len;
	cap->key = req->rkey;

	ibv_wr_start(q->qpx);
	q->qpx->wr_id = (uintptr_t)req;
	q->qpx->wr_flags = 0;	/* OK: rdma-unsignaled-send-starvation -- the bind is retired by the signaled capsule SEND right behind it */
	ibv_wr_bind_mw(q->qpx, req->mw, req->rkey, &bind);
	q->qpx->wr_id = (uintptr_t)req;
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(q->qpx);
	ibv_wr_set_sge(q->qpx, q->capsule_mr->lkey, (uintptr_t)cap, sizeof(*cap));
	return ibv_wr_complete(q->qpx);
}

static int sdblk_local_inv(struct sdblk_qpair *q, struct sdblk_req *req, enum sdblk_req_state next)
{
	req->state = next;
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = (uintptr_t)req;
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(q->qpx, req->rkey);
	return ibv_wr_complete(q->qpx);
}

static void sdblk_complete(struct sdblk_qpair *q, struct sdblk_req *req, int status)
{
	TAILQ_REMOVE(&q->outstanding, req, link);
	req->state = SDBLK_REQ_FREE;
	TAILQ_INSERT_TAIL(&q->free_reqs, req, link);
	if (req->cb)
		req->cb(req->cb_arg, status);
}

int sdblk_submit(struct sdblk_qpair *q, void *buf, uint32_t len, uint64_t slba, bool is_write,
		 sdblk_cb cb, void *cb_arg)
{
	struct sdblk_req *req;
	int rc;

	if (q->failed)
		return -ENXIO;
	if ((char *)buf < (char *)q->arena || (char *)buf + len > (char *)q->arena + q->arena_len)
		return -EINVAL;
	req = TAILQ_FIRST(&q->free_reqs);
	if (!req)
		return -EAGAIN;
	TAILQ_REMOVE(&q->free_reqs, req, link);

	req->buf = buf;
	req->len = len;
	req->slba = slba;
	req->nlb = len / 512;
	req->is_write = is_write;
	req->cb = cb;
	req->cb_arg = cb_arg;
	req->retries = 0;
	req->rkey = ibv_inc_rkey(req->rkey);	/* OK: rdma-rkey-reuse -- every submission binds under a new key */
	rc = sdblk_bind_and_send(q, req);
	if (rc) {
		TAILQ_INSERT_HEAD(&q->free_reqs, req, link);
		return -rc;
	}
	req->state = SDBLK_REQ_OUTSTANDING;
	req->deadline = sdblk_now_us() + SDBLK_TIMEOUT_US;
	TAILQ_INSERT_TAIL(&q->outstanding, req, link);
	return 0;
}

static void sdblk_sync_done(void *ctx, int status)
{
	*(int *)ctx = status ? status : 1;
}

/* Synchronous chunked read for admin data (log pages), one request reused. */
int sdblk_read_sync(struct sdblk_qpair *q, void *buf, uint32_t len, uint32_t chunk)
{
	struct sdblk_req *req = TAILQ_FIRST(&q->free_reqs);
	uint32_t off;
	int done;

	if (!req || !chunk)
		return -EAGAIN;
	req->rkey = ibv_inc_rkey(req->rkey);
	for (off = 0; off < len; off += chunk) {
		TAILQ_REMOVE(&q->free_reqs, req, link);
		req->buf = (char *)buf + off;
		req->len = len - off < chunk ? len - off : chunk;
		req->slba = off / 512;
		req->nlb = req->len / 512;
		req->is_write = false;
		req->cb = sdblk_sync_done;
		req->cb_arg = &done;
		req->retries = SDBLK_MAX_RETRIES;
		req->state = SDBLK_REQ_OUTSTANDING;
		req->deadline = sdblk_now_us() + SDBLK_TIMEOUT_US;
		TAILQ_INSERT_TAIL(&q->outstanding, req, link);
		done = 0;
		if (sdblk_bind_and_send(q, req)) {	/* BUG(file): rdma-rkey-reuse -- the key is rotated once before the loop, so every chunk is bound under the same rkey */
			sdblk_complete(q, req, -EIO);
			return -EIO;
		}
		while (!done && !q->failed)
			sdblk_poll(q);
		if (done <= 0)
			return done ? done : -ENXIO;
	}
	return 0;
}

static void sdblk_retry(struct sdblk_qpair *q, struct sdblk_req *req)
{
	if (++req->retries > SDBLK_MAX_RETRIES) {
		sdblk_complete(q, req, -ETIMEDOUT);
		return;
	}
	/* the window was invalidated when the request timed out: bind it
	 * over the same buffer again and resend the capsule */
	req->state = SDBLK_REQ_OUTSTANDING;
	req->deadline = sdblk_now_us() + SDBLK_TIMEOUT_US;
	if (sdblk_bind_and_send(q, req))	/* BUG(file): rdma-rkey-reuse -- rebinds under req->rkey, the key the timed-out attempt handed to the target; a late transfer of that attempt still reaches the buffer */
		sdblk_complete(q, req, -EIO);
}

/* A failed bind leaves the window in an undefined state: take a fresh one. */
static int sdblk_replace_mw(struct sdblk_qpair *q, struct sdblk_req *req)
{
	struct ibv_mw *mw;

	SDBLK_ERRLOG("cid %u: window %#x unusable, replacing it\n", req->cid, req->mw->rkey);
	mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2);
	if (!mw)
		return -ENOMEM;
	req->mw = mw;		/* BUG: rdma-mr-leak -- the old window is overwritten without ibv_dealloc_mw() */
	req->rkey = mw->rkey;
	return 0;
}

static void sdblk_process_cpl(struct sdblk_qpair *q, const struct sdblk_cpl *cpl, const struct ibv_wc *wc)
{
	struct sdblk_req *req;

	if (cpl->cid >= q->depth)
		return;
	req = &q->reqs[cpl->cid];
	if (req->state != SDBLK_REQ_OUTSTANDING)
		return;		/* late answer to an attempt already invalidated */
	req->status = cpl->status ? -EIO : 0;
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == req->rkey) {
		sdblk_complete(q, req, req->status);
		return;
	}
	if (wc->wc_flags & IBV_WC_WITH_INV)
		SDBLK_ERRLOG("cid %u: target invalidated %#x, expected %#x\n",
			     req->cid, wc->invalidated_rkey, req->rkey);
	if (sdblk_local_inv(q, req, SDBLK_REQ_INVALIDATING)) {
		SDBLK_ERRLOG("cid %u: LOCAL_INV post failed, qpair unusable\n", req->cid);
		q->failed = true;
	}
}

int sdblk_poll(struct sdblk_qpair *q)
{
	struct ibv_wc wc[32];
	struct sdblk_req *req;
	int n, i;

	n = ibv_poll_cq(q->cq, 32, wc);
	for (i = 0; i < n; i++) {
		if (SDBLK_IS_RECV(wc[i].wr_id)) {
			uint16_t idx = (uint16_t)wc[i].wr_id;

			if (wc[i].status != IBV_WC_SUCCESS) {
				q->failed = true;
				continue;
			}
			sdblk_process_cpl(q, &q->cpls[idx], &wc[i]);
			if (sdblk_post_cpl_recv(q, idx))
				q->failed = true;
			continue;
		}
		req = (struct sdblk_req *)(uintptr_t)wc[i].wr_id;
		if (wc[i].status != IBV_WC_SUCCESS) {
			q->failed = true;
			if (req && wc[i].status == IBV_WC_MW_BIND_ERR && !sdblk_replace_mw(q, req))
				sdblk_complete(q, req, -EIO);
			continue;
		}
		if (wc[i].opcode != IBV_WC_LOCAL_INV)
			continue;
		if (req->state == SDBLK_REQ_RETRY_PENDING)
			sdblk_retry(q, req);
		else if (req->state == SDBLK_REQ_INVALIDATING)
			sdblk_complete(q, req, req->status);
	}
	return n;
}

void sdblk_check_timeouts(struct sdblk_qpair *q)
{
	uint64_t now = sdblk_now_us();
	struct sdblk_req *req, *next;

	for (req = TAILQ_FIRST(&q->outstanding); req; req = next) {
		next = TAILQ_NEXT(req, link);
		if (req->state != SDBLK_REQ_OUTSTANDING || now < req->deadline)
			continue;
		SDBLK_ERRLOG("cid %u timed out, retry %u\n", req->cid, req->retries + 1);
		if (sdblk_local_inv(q, req, SDBLK_REQ_RETRY_PENDING))
			q->failed = true;
	}
}

static int sdblk_wait_event(struct rdma_event_channel *ec, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	int ok;

	if (rdma_get_cm_event(ec, &ev))
		return -errno;
	ok = ev->event == want;
	rdma_ack_cm_event(ev);
	return ok ? 0 : -ECONNREFUSED;
}

int sdblk_qpair_connect(struct sdblk_qpair *q, struct rdma_event_channel *ec,
			struct sockaddr *dst, void *arena, size_t arena_len, uint16_t depth)
{
	struct rdma_conn_param cp = { .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	struct ibv_device_attr dattr;
	uint16_t i;
	int rc;

	q->depth = depth > SDBLK_MAX_DEPTH ? SDBLK_MAX_DEPTH : depth;
	q->arena = arena;
	q->arena_len = arena_len;
	if (rdma_create_id(ec, &q->cm_id, q, RDMA_PS_TCP))
		return -errno;
	if (rdma_resolve_addr(q->cm_id, NULL, dst, 2000) ||
	    sdblk_wait_event(ec, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(q->cm_id, 2000) ||
	    sdblk_wait_event(ec, RDMA_CM_EVENT_ROUTE_RESOLVED)) {
		rc = -EHOSTUNREACH;
		goto err_id;
	}
	q->pd = ibv_alloc_pd(q->cm_id->verbs);
	if (!q->pd) {
		rc = -ENOMEM;
		goto err_id;
	}
	if (ibv_query_device(q->cm_id->verbs, &dattr)) {
		rc = -errno;
		goto err_pd;
	}
	while (q->depth > 1 && sdblk_sq_size(q) > (uint32_t)dattr.max_qp_wr)
		q->depth /= 2;
	rc = sdblk_qpair_init_bufs(q);
	if (rc)
		goto err_pd;
	rc = sdblk_qpair_create_qp(q);
	if (rc)
		goto err_bufs;
	for (i = 0; i < q->depth; i++)
		if ((rc = -sdblk_post_cpl_recv(q, i)))
			goto err_qp;
	if (rdma_connect(q->cm_id, &cp) || sdblk_wait_event(ec, RDMA_CM_EVENT_ESTABLISHED)) {
		rc = -ECONNREFUSED;
		goto err_qp;
	}
	rc = sdblk_probe_mw(q);
	if (rc) {
		rdma_disconnect(q->cm_id);
		goto err_qp;
	}
	return 0;

err_qp:
	rdma_destroy_qp(q->cm_id);
	ibv_destroy_cq(q->cq);
err_bufs:
	sdblk_qpair_free_bufs(q);
err_pd:
	ibv_dealloc_pd(q->pd);
err_id:
	rdma_destroy_id(q->cm_id);
	return rc;
}

void sdblk_qpair_destroy(struct sdblk_qpair *q)
{
	uint16_t i;

	rdma_disconnect(q->cm_id);
	rdma_destroy_qp(q->cm_id);
	ibv_destroy_cq(q->cq);
	/* deallocating a window invalidates it; only then do buffers go back */
	for (i = 0; i < q->depth; i++) {
		ibv_dealloc_mw(q->reqs[i].mw);
		q->reqs[i].mw = NULL;
	}
	while (!TAILQ_EMPTY(&q->outstanding))
		sdblk_complete(q, TAILQ_FIRST(&q->outstanding), -ECANCELED);
	sdblk_qpair_free_bufs(q);
	ibv_dealloc_pd(q->pd);
	rdma_destroy_id(q->cm_id);
}
