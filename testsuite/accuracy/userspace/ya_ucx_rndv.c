/*
 * ya_ucx_rndv.c - rendezvous (RTS / RDMA READ / ATS) protocol of a small
 * UCX-style active-message transport over RC verbs.
 *
 * A large send registers the user buffer (or, when the caller says the buffer
 * cannot be registered, a staging copy) with REMOTE_READ and packs
 * {address, length, rkey, sn} into an RTS active message.  The receiver
 * registers its destination for local write, pulls the payload with RDMA READ
 * and answers with an ATS; on the ATS the sender deregisters and completes.
 * Requests come from a per-worker free list and go back to it from the
 * completion callbacks.  Each worker also exposes one credit word with
 * REMOTE_ATOMIC, its rkey packed into the wireup blob, so that the peer can
 * return flow-control credits with fetch-and-add.
 *
 * Right: the ATS and READ completion paths deregister before the request is
 * recycled; the AM bounce ring and the receive ring are registered for local
 * access only and recycled freely; a failed RTS post deregisters first.
 * Wrong: an RTS that finds no AM bounce slot recycles the request with its
 * REMOTE_READ registration alive; the endpoint timeout reaper recycles send
 * requests whose rkey the peer still holds; worker teardown frees the credit
 * word before deregistering it.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-mr-leak, rdma-queue-cap-unchecked, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

typedef enum {
	UCS_OK              = 0,
	UCS_INPROGRESS      = 1,
	UCS_ERR_NO_RESOURCE = -2,
	UCS_ERR_IO_ERROR    = -3,
	UCS_ERR_NO_MEMORY   = -4,
	UCS_ERR_CANCELED    = -16,
	UCS_ERR_TIMED_OUT   = -20,
} ucs_status_t;

#define RNDV_MAX_REQS        256
#define RNDV_AM_BOUNCE_CNT   64
#define RNDV_RX_CNT          64
#define RNDV_AM_SEG_SIZE     256
#define RNDV_TIMEOUT_NSEC    (2ull * 1000000000ull)

#define RNDV_WRID_TAG_MASK   3ull
#define RNDV_WRID_AM(_i)     (((uint64_t)(_i) << 2) | 1)
#define RNDV_WRID_RX(_i)     (((uint64_t)(_i) << 2) | 2)
#define RNDV_WRID_IDX(_id)   ((unsigned)((_id) >> 2))

#define ucs_error(_fmt, ...) fprintf(stderr, "[rndv] " _fmt "\n", ##__VA_ARGS__)
#define ucs_unlikely(_x)     __builtin_expect(!!(_x), 0)

enum { RNDV_AM_RTS = 1, RNDV_AM_ATS = 2 };

enum {
	RNDV_REQ_FLAG_SEND   = 1u << 0,
	RNDV_REQ_FLAG_RECV   = 1u << 1,
	RNDV_REQ_FLAG_STAGED = 1u << 2,
};

typedef struct rndv_req rndv_req_t;
typedef void (*rndv_cb_t)(rndv_req_t *req, ucs_status_t status);

struct rndv_req {
	rndv_req_t    *next;
	unsigned       flags;
	uint64_t       sn;
	void          *buffer;
	void          *stage;
	size_t         length;
	struct ibv_mr *mr;
	uint64_t       deadline;
	rndv_cb_t      cb;
	void          *user_ctx;
	uint64_t       remote_addr;
	uint32_t       remote_rkey;
	uint64_t       remote_sn;
} __attribute__((aligned(8)));

typedef struct __attribute__((packed)) {
	uint8_t  am_id;
	uint8_t  pad[3];
	uint32_t rkey;
	uint64_t sn;
	uint64_t address;
	uint64_t length;
} rndv_rts_hdr_t;

typedef struct __attribute__((packed)) {
	uint8_t  am_id;
	uint8_t  status;
	uint8_t  pad[6];
	uint64_t sn;
} rndv_ats_hdr_t;

typedef struct {
	uint64_t credit_addr;
	uint32_t credit_rkey;
	uint32_t qpn;
} rndv_wireup_blob_t;

typedef struct {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;

	rndv_req_t    *free_list;
	rndv_req_t     reqs[RNDV_MAX_REQS];
	uint64_t       next_sn;

	void          *am_bounce;
	struct ibv_mr *am_bounce_mr;
	uint8_t        am_busy[RNDV_AM_BOUNCE_CNT];

	void          *rx_ring;
	struct ibv_mr *rx_mr;

	uint64_t      *credit_word;
	struct ibv_mr *credit_mr;
} rndv_worker_t;

static uint64_t rndv_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static rndv_req_t *rndv_req_get(rndv_worker_t *w)
{
	rndv_req_t *req = w->free_list;

	if (req == NULL)
		return NULL;
	w->free_list = req->next;
	memset(req, 0, sizeof(*req));
	return req;
}

static void rndv_req_put(rndv_worker_t *w, rndv_req_t *req)
{
	req->flags = 0;
	req->next  = w->free_list;
	w->free_list = req;
}

static rndv_req_t *rndv_req_lookup(rndv_worker_t *w, uint64_t sn)
{
	unsigned i;

	for (i = 0; i < RNDV_MAX_REQS; i++) {
		if ((w->reqs[i].flags & RNDV_REQ_FLAG_SEND) && w->reqs[i].sn == sn)
			return &w->reqs[i];
	}
	return NULL;
}

/* drop the registration of a request and its staging copy */
static void rndv_mem_dereg(rndv_req_t *req)
{
	if (req->mr != NULL) {
		if (ibv_dereg_mr(req->mr))
			ucs_error("ibv_dereg_mr(%p) failed: %m", req->buffer);
		req->mr = NULL;
	}
	if (req->flags & RNDV_REQ_FLAG_STAGED) {
		free(req->stage); // OK: rdma-invalidation-leak -- the staging registration was dropped just above
		req->stage = NULL;
		req->flags &= ~RNDV_REQ_FLAG_STAGED;
	}
}

static int rndv_am_slot_get(rndv_worker_t *w)
{
	int i;

	for (i = 0; i < RNDV_AM_BOUNCE_CNT; i++) {
		if (!w->am_busy[i]) {
			w->am_busy[i] = 1;
			return i;
		}
	}
	return -1;
}

static inline void *rndv_am_slot_ptr(rndv_worker_t *w, int slot)
{
	return (char *)w->am_bounce + (size_t)slot * RNDV_AM_SEG_SIZE;
}

static int rndv_am_post(rndv_worker_t *w, int slot, size_t len)
{
	struct ibv_send_wr wr, *bad_wr;
	struct ibv_sge sge;

	sge.addr   = (uintptr_t)rndv_am_slot_ptr(w, slot);
	sge.length = (uint32_t)len;
	sge.lkey   = w->am_bounce_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id      = RNDV_WRID_AM(slot);
	wr.sg_list    = &sge;
	wr.num_sge    = 1;
	wr.opcode     = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(w->qp, &wr, &bad_wr);
}

static void rndv_send_ats(rndv_worker_t *w, uint64_t sn, ucs_status_t status)
{
	rndv_ats_hdr_t *ats;
	int slot;

	slot = rndv_am_slot_get(w);
	if (slot < 0) {
		ucs_error("no AM slot for ATS sn %llu", (unsigned long long)sn);
		return;
	}
	ats = rndv_am_slot_ptr(w, slot);
	memset(ats, 0, sizeof(*ats));
	ats->am_id  = RNDV_AM_ATS;
	ats->status = status != UCS_OK;
	ats->sn     = sn;
	if (rndv_am_post(w, slot, sizeof(*ats)))
		w->am_busy[slot] = 0;
}

ucs_status_t rndv_send(rndv_worker_t *w, void *buffer, size_t length,
		       int registrable, rndv_cb_t cb, void *user_ctx)
{
	rndv_rts_hdr_t *rts;
	ucs_status_t status;
	rndv_req_t *req;
	void *reg_buf;
	int slot;

	req = rndv_req_get(w);
	if (req == NULL)
		return UCS_ERR_NO_RESOURCE;

	req->flags    = RNDV_REQ_FLAG_SEND;
	req->buffer   = buffer;
	req->length   = length;
	req->cb       = cb;
	req->user_ctx = user_ctx;
	req->sn       = w->next_sn++;
	req->deadline = rndv_now() + RNDV_TIMEOUT_NSEC;

	reg_buf = buffer;
	if (!registrable) {
		req->stage = malloc(length);
		if (req->stage == NULL) {
			status = UCS_ERR_NO_MEMORY;
			goto err_put;
		}
		memcpy(req->stage, buffer, length);
		req->flags |= RNDV_REQ_FLAG_STAGED;
		reg_buf = req->stage;
	}

	req->mr = ibv_reg_mr(w->pd, reg_buf, length, IBV_ACCESS_REMOTE_READ);
	if (req->mr == NULL) {
		ucs_error("failed to register %zu bytes: %m", length);
		status = UCS_ERR_IO_ERROR;
		goto err_free_stage;
	}

	slot = rndv_am_slot_get(w);
	if (slot < 0) {
		status = UCS_ERR_NO_RESOURCE;
		goto err_put; // BUG: rdma-invalidation-leak -- request recycled with its REMOTE_READ registration still live (skips err_dereg)
	}

	rts = rndv_am_slot_ptr(w, slot);
	memset(rts, 0, sizeof(*rts));
	rts->am_id   = RNDV_AM_RTS;
	rts->rkey    = req->mr->rkey;
	rts->sn      = req->sn;
	rts->address = (uintptr_t)reg_buf;
	rts->length  = length;

	if (rndv_am_post(w, slot, sizeof(*rts))) {
		ucs_error("failed to post RTS sn %llu", (unsigned long long)req->sn);
		w->am_busy[slot] = 0; // OK: rdma-invalidation-leak -- the AM bounce ring is registered for local access only
		status = UCS_ERR_IO_ERROR;
		goto err_dereg;
	}
	return UCS_INPROGRESS;

err_dereg:
	rndv_mem_dereg(req);
	goto err_put;
err_free_stage:
	free(req->stage); // OK: rdma-invalidation-leak -- registration failed, no key exists
err_put:
	rndv_req_put(w, req);
	return status;
}

/* sender: the receiver pulled the data */
static void rndv_ats_handler(rndv_worker_t *w, const rndv_ats_hdr_t *ats)
{
	rndv_req_t *req;

	req = rndv_req_lookup(w, ats->sn);
	if (ucs_unlikely(req == NULL)) {
		ucs_error("ATS for unknown sn %llu", (unsigned long long)ats->sn);
		return;
	}

	rndv_mem_dereg(req);
	req->cb(req, ats->status ? UCS_ERR_IO_ERROR : UCS_OK);
	rndv_req_put(w, req); // OK: rdma-invalidation-leak -- deregistered in rndv_mem_dereg() before the recycle
}

/* receiver: start pulling the payload */
static void rndv_rts_handler(rndv_worker_t *w, const rndv_rts_hdr_t *rts)
{
	struct ibv_send_wr wr, *bad_wr;
	struct ibv_sge sge;
	rndv_req_t *req;

	req = rndv_req_get(w);
	if (req == NULL) {
		rndv_send_ats(w, rts->sn, UCS_ERR_NO_RESOURCE);
		return;
	}

	req->flags       = RNDV_REQ_FLAG_RECV;
	req->length      = rts->length;
	req->remote_addr = rts->address;
	req->remote_rkey = rts->rkey;
	req->remote_sn   = rts->sn;
	req->deadline    = rndv_now() + RNDV_TIMEOUT_NSEC;

	req->buffer = malloc(req->length);
	if (req->buffer == NULL)
		goto err_ats;

	/* sink of our own READ: local write is all it needs */
	req->mr = ibv_reg_mr(w->pd, req->buffer, req->length, IBV_ACCESS_LOCAL_WRITE);
	if (req->mr == NULL)
		goto err_free;

	sge.addr   = (uintptr_t)req->buffer;
	sge.length = (uint32_t)req->length;
	sge.lkey   = req->mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id               = (uintptr_t)req;
	wr.sg_list             = &sge;
	wr.num_sge             = 1;
	wr.opcode              = IBV_WR_RDMA_READ;
	wr.send_flags          = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = req->remote_addr;
	wr.wr.rdma.rkey        = req->remote_rkey;
	if (ibv_post_send(w->qp, &wr, &bad_wr) == 0)
		return;

	ucs_error("failed to post READ for sn %llu", (unsigned long long)rts->sn);
	free(req->buffer); // OK: rdma-invalidation-leak -- the sink registration is local-only, no key went out
	ibv_dereg_mr(req->mr);
	req->mr = NULL;
	goto err_ats;
err_free:
	free(req->buffer);
err_ats:
	rndv_send_ats(w, rts->sn, UCS_ERR_IO_ERROR);
	rndv_req_put(w, req);
}

static void rndv_read_done(rndv_worker_t *w, rndv_req_t *req, enum ibv_wc_status wc_status)
{
	ucs_status_t status = wc_status == IBV_WC_SUCCESS ? UCS_OK : UCS_ERR_IO_ERROR;

	rndv_mem_dereg(req);
	rndv_send_ats(w, req->remote_sn, status);
	if (req->cb)
		req->cb(req, status);
	rndv_req_put(w, req); // OK: rdma-invalidation-leak -- local-only sink, and deregistered anyway
}

static void rndv_rx_repost(rndv_worker_t *w, unsigned idx)
{
	struct ibv_recv_wr wr, *bad_wr;
	struct ibv_sge sge;

	sge.addr   = (uintptr_t)w->rx_ring + (size_t)idx * RNDV_AM_SEG_SIZE;
	sge.length = RNDV_AM_SEG_SIZE;
	sge.lkey   = w->rx_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id   = RNDV_WRID_RX(idx);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(w->qp, &wr, &bad_wr))
		ucs_error("failed to repost rx %u", idx);
}

ucs_status_t rndv_progress(rndv_worker_t *w)
{
	struct ibv_wc wc[16];
	const uint8_t *am;
	unsigned idx;
	int i, n;

	n = ibv_poll_cq(w->cq, 16, wc);
	if (n < 0)
		return UCS_ERR_IO_ERROR;

	for (i = 0; i < n; i++) {
		switch (wc[i].wr_id & RNDV_WRID_TAG_MASK) {
		case 1:
			w->am_busy[RNDV_WRID_IDX(wc[i].wr_id)] = 0;
			break;
		case 2:
			idx = RNDV_WRID_IDX(wc[i].wr_id);
			if (wc[i].status != IBV_WC_SUCCESS)
				break;
			if (wc[i].wc_flags & IBV_WC_WITH_INV) { // OK: rdma-remote-invalidate-unchecked -- refused: none of our keys may be invalidated by the peer
				ucs_error("unexpected SEND_WITH_INV (rkey 0x%x)", wc[i].invalidated_rkey);
				return UCS_ERR_IO_ERROR;
			}
			am = (const uint8_t *)w->rx_ring + (size_t)idx * RNDV_AM_SEG_SIZE;
			if (am[0] == RNDV_AM_RTS)
				rndv_rts_handler(w, (const rndv_rts_hdr_t *)am);
			else if (am[0] == RNDV_AM_ATS)
				rndv_ats_handler(w, (const rndv_ats_hdr_t *)am);
			rndv_rx_repost(w, idx);
			break;
		default:
			rndv_read_done(w, (rndv_req_t *)(uintptr_t)wc[i].wr_id, wc[i].status);
			break;
		}
	}
	return UCS_OK;
}

/* endpoint keepalive: fail requests that made no progress */
void rndv_ep_timeout(rndv_worker_t *w)
{
	uint64_t now = rndv_now();
	rndv_req_t *req;
	unsigned i;

	for (i = 0; i < RNDV_MAX_REQS; i++) {
		req = &w->reqs[i];
		/* receive requests always get their READ completion back */
		if (!(req->flags & RNDV_REQ_FLAG_SEND))
			continue;
		if (req->deadline > now)
			continue;

		ucs_error("rndv sn %llu: no ATS after %llu ns, failing request",
			  (unsigned long long)req->sn,
			  (unsigned long long)RNDV_TIMEOUT_NSEC);
		req->cb(req, UCS_ERR_TIMED_OUT);
		rndv_req_put(w, req); // BUG: rdma-invalidation-leak -- a timed-out send request still holds the REMOTE_READ rkey the peer got in the RTS
	}
}

void rndv_wireup_pack(rndv_worker_t *w, rndv_wireup_blob_t *blob)
{
	blob->credit_addr = (uintptr_t)w->credit_word;
	blob->credit_rkey = w->credit_mr->rkey;
	blob->qpn         = w->qp->qp_num;
}

int rndv_worker_mem_init(rndv_worker_t *w)
{
	unsigned i;

	if (posix_memalign((void **)&w->credit_word, 64, 64))
		return -ENOMEM;
	*w->credit_word = 0;
	w->credit_mr = ibv_reg_mr(w->pd, w->credit_word, 64,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (w->credit_mr == NULL)
		goto err_free_credit;

	w->am_bounce = calloc(RNDV_AM_BOUNCE_CNT, RNDV_AM_SEG_SIZE);
	if (w->am_bounce == NULL)
		goto err_dereg_credit;
	w->am_bounce_mr = ibv_reg_mr(w->pd, w->am_bounce,
				     RNDV_AM_BOUNCE_CNT * RNDV_AM_SEG_SIZE, 0);
	if (w->am_bounce_mr == NULL)
		goto err_free_bounce;

	w->rx_ring = calloc(RNDV_RX_CNT, RNDV_AM_SEG_SIZE);
	if (w->rx_ring == NULL)
		goto err_dereg_bounce;
	w->rx_mr = ibv_reg_mr(w->pd, w->rx_ring, RNDV_RX_CNT * RNDV_AM_SEG_SIZE,
			      IBV_ACCESS_LOCAL_WRITE);
	if (w->rx_mr == NULL)
		goto err_free_rx;

	w->free_list = NULL;
	for (i = RNDV_MAX_REQS; i-- > 0;)
		rndv_req_put(w, &w->reqs[i]);
	for (i = 0; i < RNDV_RX_CNT; i++)
		rndv_rx_repost(w, i);
	return 0;

err_free_rx:
	free(w->rx_ring);
err_dereg_bounce:
	ibv_dereg_mr(w->am_bounce_mr);
err_free_bounce:
	free(w->am_bounce);
err_dereg_credit:
	ibv_dereg_mr(w->credit_mr);
err_free_credit:
	free(w->credit_word); // OK: rdma-invalidation-leak -- reached only after the credit MR was deregistered or never registered
	return -ENOMEM;
}

void rndv_worker_mem_cleanup(rndv_worker_t *w)
{
	unsigned i;

	for (i = 0; i < RNDV_MAX_REQS; i++) {
		if (w->reqs[i].flags & (RNDV_REQ_FLAG_SEND | RNDV_REQ_FLAG_RECV))
			rndv_mem_dereg(&w->reqs[i]);
	}

	free(w->rx_ring); // OK: rdma-invalidation-leak -- receive ring is local-only, freeing before dereg exposes nothing
	ibv_dereg_mr(w->rx_mr);
	free(w->am_bounce);
	ibv_dereg_mr(w->am_bounce_mr);
	free(w->credit_word); // BUG: rdma-invalidation-leak -- the peer's REMOTE_ATOMIC key on the credit word is still valid here
	ibv_dereg_mr(w->credit_mr);
}
