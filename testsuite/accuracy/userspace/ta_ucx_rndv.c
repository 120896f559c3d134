/*
 * ta_ucx_rndv.c - zero-copy rendezvous over RC with type 2 memory windows
 *
 * A UCX-flavoured rendezvous transport.  For a large send, the sender binds a
 * type 2 window over the user's buffer (ibv_wr_bind_mw), ships the window's
 * rkey in an RTS active message, and the receiver RDMA-READs the payload and
 * answers with an ATS carried by SEND_WITH_INV naming that rkey.  The
 * receive direction is symmetric: an RTR exposes a writable window over the
 * user's receive buffer, and the peer's ATP (also SEND_WITH_INV) ends it.
 * A request whose window the peer did not kill is invalidated with a
 * signaled LOCAL_INV and returned to the user from that completion.
 *
 * Everything goes through the extended verbs API (ibv_qp_ex / ibv_cq_ex).
 * User buffers come with a memory handle from the registration cache
 * (registered elsewhere with LOCAL_WRITE | MW_BIND).
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- this file is about window lifetime only
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <infiniband/verbs.h>

typedef enum {
	UCS_OK = 0, UCS_INPROGRESS = 1, UCS_ERR_NO_RESOURCE = -2,
	UCS_ERR_IO_ERROR = -3, UCS_ERR_NO_MEMORY = -4, UCS_ERR_CANCELED = -16,
	UCS_ERR_TIMED_OUT = -20,
} ucs_status_t;

#define ucs_error(_fmt, ...) fprintf(stderr, "[rndv] error: " _fmt "\n", ## __VA_ARGS__)
#define ucs_warn(_fmt, ...)  fprintf(stderr, "[rndv] warn: " _fmt "\n", ## __VA_ARGS__)
#define ucs_unlikely(_x)     __builtin_expect(!!(_x), 0)

#define UCT_RNDV_MAX_REQS        128
#define UCT_RNDV_RX_DEPTH        64
#define UCT_RNDV_TIMEOUT_NS      (5ull * 1000000000ull)

#define UCT_RNDV_AM_RTS          0x11
#define UCT_RNDV_AM_RTR          0x12
#define UCT_RNDV_AM_ATS          0x13
#define UCT_RNDV_AM_ATS_FRAG     0x14

/* low bits of wr_id say what the work request was; requests are 8-aligned */
#define UCT_RNDV_WRID_AM         0x0ull
#define UCT_RNDV_WRID_BIND       0x1ull
#define UCT_RNDV_WRID_INV        0x2ull
#define UCT_RNDV_WRID_RECV       0x3ull
#define UCT_RNDV_WRID_MASK       0x7ull
#define UCT_RNDV_WRID(_ptr, _op) ((uint64_t)(uintptr_t)(_ptr) | (_op))
#define UCT_RNDV_WRID_PTR(_wrid) ((void *)(uintptr_t)((_wrid) & ~UCT_RNDV_WRID_MASK))

enum {
	UCT_RNDV_REQ_FLAG_INUSE    = 1 << 0,
	UCT_RNDV_REQ_FLAG_INV_POST = 1 << 1,
	UCT_RNDV_REQ_FLAG_STALE    = 1 << 2,
};

typedef struct uct_rndv_hdr {
	uint8_t  am_id;
	uint8_t  nfrags;
	uint16_t reserved;
	uint32_t req_id;
	uint64_t address;
	uint64_t length;
	uint32_t rkey;
} __attribute__((packed)) uct_rndv_hdr_t;

typedef struct uct_rndv_req uct_rndv_req_t;
typedef void (*uct_rndv_comp_cb_t)(uct_rndv_req_t *req, ucs_status_t status);

struct uct_rndv_req {
	uct_rndv_req_t      *next;
	uint32_t            id;
	unsigned            flags;
	struct ibv_mw       *mw;
	uint32_t            rkey;
	void                *buffer;
	size_t              length;
	struct ibv_mr       *memh;
	unsigned            frags_left;
	uint64_t            deadline;
	ucs_status_t        status;
	uct_rndv_comp_cb_t  cb;
} __attribute__((aligned(8)));

typedef struct uct_rndv_iface {
	struct ibv_pd       *pd;
	struct ibv_cq_ex    *cq;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	uct_rndv_req_t      reqs[UCT_RNDV_MAX_REQS];
	uct_rndv_req_t      *free_reqs;
	uct_rndv_hdr_t      *rx_hdrs;
	struct ibv_mr       *rx_mr;
	unsigned            stale;
} uct_rndv_iface_t;

static uint64_t ucs_get_time_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uct_rndv_req_t *uct_rndv_req_get(uct_rndv_iface_t *iface)
{
	uct_rndv_req_t *req = iface->free_reqs;

	if (req == NULL)
		return NULL;
	iface->free_reqs = req->next;
	req->next  = NULL;
	req->flags = UCT_RNDV_REQ_FLAG_INUSE;
	return req;
}

static void uct_rndv_req_put(uct_rndv_iface_t *iface, uct_rndv_req_t *req)
{
	req->flags       = 0;
	req->buffer      = NULL;
	req->next        = iface->free_reqs;
	iface->free_reqs = req;
}

/* hands the user buffer back and recycles the request */
static void uct_rndv_req_complete(uct_rndv_iface_t *iface, uct_rndv_req_t *req,
				  ucs_status_t status)
{
	if (req->cb != NULL)
		req->cb(req, status);
	uct_rndv_req_put(iface, req);
}

static void uct_rndv_am_hdr(uct_rndv_iface_t *iface, uct_rndv_req_t *req,
			    uint8_t am_id)
{
	uct_rndv_hdr_t hdr = {
		.am_id   = am_id,
		.req_id  = req->id,
		.address = (uintptr_t)req->buffer,
		.length  = req->length,
		.rkey    = req->rkey,
	};

	iface->qpx->wr_id    = UCT_RNDV_WRID(req, UCT_RNDV_WRID_AM);
	iface->qpx->wr_flags = IBV_SEND_INLINE;
	ibv_wr_send(iface->qpx);
	ibv_wr_set_inline_data(iface->qpx, &hdr, sizeof(hdr));
}

static ucs_status_t uct_rndv_local_inv(uct_rndv_iface_t *iface,
				       uct_rndv_req_t *req)
{
	ibv_wr_start(iface->qpx);
	iface->qpx->wr_id    = UCT_RNDV_WRID(req, UCT_RNDV_WRID_INV);
	iface->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(iface->qpx, req->rkey);
	if (ibv_wr_complete(iface->qpx))
		return UCS_ERR_IO_ERROR;

	req->flags |= UCT_RNDV_REQ_FLAG_INV_POST;
	return UCS_OK;
}

ucs_status_t uct_rndv_put_zcopy(uct_rndv_iface_t *iface, void *buffer,
				size_t length, struct ibv_mr *memh,
				uct_rndv_comp_cb_t cb)
{
	struct ibv_mw_bind_info bind;
	uct_rndv_req_t *req;
	uint32_t key;

	req = uct_rndv_req_get(iface);
	if (req == NULL)
		return UCS_ERR_NO_RESOURCE;

	if (req->mw == NULL) {
		req->mw = ibv_alloc_mw(iface->pd, IBV_MW_TYPE_2);
		if (req->mw == NULL) {
			uct_rndv_req_put(iface, req);
			return UCS_ERR_NO_MEMORY;
		}
		key = req->mw->rkey;
	} else {
		key = ibv_inc_rkey(req->rkey);
	}

	req->rkey     = key;
	req->buffer   = buffer;
	req->length   = length;
	req->memh     = memh;
	req->cb       = cb;
	req->deadline = ucs_get_time_ns() + UCT_RNDV_TIMEOUT_NS;

	bind.mr              = memh;
	bind.addr            = (uintptr_t)buffer;
	bind.length          = length;
	bind.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	ibv_wr_start(iface->qpx);
	iface->qpx->wr_id    = UCT_RNDV_WRID(req, UCT_RNDV_WRID_BIND);
	iface->qpx->wr_flags = 0;
	ibv_wr_bind_mw(iface->qpx, req->mw, req->rkey, &bind); /* OK: rdma-rkey-reuse -- allocation key on first use, rotated key afterwards */
	uct_rndv_am_hdr(iface, req, UCT_RNDV_AM_RTS);
	if (ibv_wr_complete(iface->qpx)) {
		ucs_error("failed to post RTS for req %u", req->id);
		uct_rndv_req_put(iface, req); /* OK: rdma-invalidation-leak -- the batch with the bind was not posted */
		return UCS_ERR_IO_ERROR;
	}

	return UCS_INPROGRESS;
}

/* receive-side rendezvous: expose the user's buffer for the peer's PUT */
ucs_status_t uct_rndv_get_rtr(uct_rndv_iface_t *iface, void *buffer,
			      size_t length, struct ibv_mr *memh,
			      unsigned nfrags, uct_rndv_comp_cb_t cb)
{
	struct ibv_mw_bind_info bind;
	uct_rndv_req_t *req;

	req = uct_rndv_req_get(iface);
	if (req == NULL)
		return UCS_ERR_NO_RESOURCE;

	if (req->mw == NULL) {
		req->mw = ibv_alloc_mw(iface->pd, IBV_MW_TYPE_2);
		if (req->mw == NULL) {
			uct_rndv_req_put(iface, req);
			return UCS_ERR_NO_MEMORY;
		}
	}

	req->rkey       = req->mw->rkey;
	req->buffer     = buffer;
	req->length     = length;
	req->memh       = memh;
	req->cb         = cb;
	req->frags_left = nfrags ? nfrags : 1;
	req->deadline   = ucs_get_time_ns() + UCT_RNDV_TIMEOUT_NS;

	bind.mr              = memh;
	bind.addr            = (uintptr_t)buffer;
	bind.length          = length;
	bind.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(iface->qpx);
	iface->qpx->wr_id    = UCT_RNDV_WRID(req, UCT_RNDV_WRID_BIND);
	iface->qpx->wr_flags = 0;
	ibv_wr_bind_mw(iface->qpx, req->mw, req->rkey, &bind); /* BUG: rdma-rkey-reuse -- a recycled window is bound again under its allocation key, which earlier peers already saw */
	uct_rndv_am_hdr(iface, req, UCT_RNDV_AM_RTR);
	if (ibv_wr_complete(iface->qpx)) {
		uct_rndv_req_put(iface, req); /* OK: rdma-invalidation-leak -- the whole batch, bind included, was dropped */
		return UCS_ERR_IO_ERROR;
	}
	return UCS_INPROGRESS;
}

static void uct_rndv_mark_stale(uct_rndv_iface_t *iface, uct_rndv_req_t *req)
{
	/* window may still be bound: keep the request out of the pool,
	 * iface cleanup deallocates the window */
	req->flags |= UCT_RNDV_REQ_FLAG_STALE;
	iface->stale++;
}

static void uct_rndv_handle_ats(uct_rndv_iface_t *iface, uct_rndv_req_t *req,
				unsigned wc_flags, uint32_t inv_rkey)
{
	req->status = UCS_OK;

	if (wc_flags & IBV_WC_WITH_INV) {
		if (ucs_unlikely(inv_rkey != req->rkey)) {
			ucs_error("peer invalidated rkey 0x%x, req %u holds 0x%x",
				  inv_rkey, req->id, req->rkey);
			goto local_inv;
		}
		uct_rndv_req_complete(iface, req, UCS_OK); /* OK: rdma-remote-invalidate-unchecked, rdma-invalidation-leak -- the invalidated rkey was compared with the window's */
		return;
	}

local_inv:
	if (uct_rndv_local_inv(iface, req) != UCS_OK)
		uct_rndv_mark_stale(iface, req);
}

static void uct_rndv_handle_ats_frag(uct_rndv_iface_t *iface,
				     uct_rndv_req_t *req, unsigned wc_flags)
{
	if (--req->frags_left > 0)
		return;

	/* the ATS of the last fragment carries the invalidation */
	req->status = UCS_OK;
	if (wc_flags & IBV_WC_WITH_INV) {
		uct_rndv_req_complete(iface, req, UCS_OK); /* BUG: rdma-remote-invalidate-unchecked -- whatever rkey the peer invalidated is taken as this window's */
		return;
	}

	if (uct_rndv_local_inv(iface, req) != UCS_OK)
		uct_rndv_mark_stale(iface, req);
}

static void uct_rndv_handle_am(uct_rndv_iface_t *iface, uct_rndv_hdr_t *hdr,
			       unsigned wc_flags, uint32_t inv_rkey)
{
	uct_rndv_req_t *req;

	if (hdr->req_id >= UCT_RNDV_MAX_REQS) {
		ucs_error("bad request id %u in AM 0x%x", hdr->req_id, hdr->am_id);
		return;
	}
	req = &iface->reqs[hdr->req_id];
	if (!(req->flags & UCT_RNDV_REQ_FLAG_INUSE)) {
		ucs_warn("AM 0x%x for idle request %u", hdr->am_id, hdr->req_id);
		return;
	}

	switch (hdr->am_id) {
	case UCT_RNDV_AM_ATS:
		uct_rndv_handle_ats(iface, req, wc_flags, inv_rkey);
		break;
	case UCT_RNDV_AM_ATS_FRAG:
		uct_rndv_handle_ats_frag(iface, req, wc_flags);
		break;
	default:
		ucs_warn("unexpected AM id 0x%x", hdr->am_id);
		break;
	}
}

static void uct_rndv_handle_send_comp(uct_rndv_iface_t *iface, uint64_t wr_id,
				      enum ibv_wc_status status)
{
	uct_rndv_req_t *req = UCT_RNDV_WRID_PTR(wr_id);

	switch (wr_id & UCT_RNDV_WRID_MASK) {
	case UCT_RNDV_WRID_INV:
		req->flags &= ~UCT_RNDV_REQ_FLAG_INV_POST;
		if (ucs_unlikely(status != IBV_WC_SUCCESS)) {
			ucs_error("LOCAL_INV of rkey 0x%x failed: %s", req->rkey,
				  ibv_wc_status_str(status));
			uct_rndv_mark_stale(iface, req);
			return;
		}
		uct_rndv_req_complete(iface, req, req->status); /* OK: rdma-invalidation-leak -- released from the LOCAL_INV's successful completion */
		break;
	case UCT_RNDV_WRID_BIND:
	case UCT_RNDV_WRID_AM:
		if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR)
			ucs_error("send wr 0x%llx failed: %s",
				  (unsigned long long)wr_id, ibv_wc_status_str(status));
		break;
	}
}

static int uct_rndv_post_recv(uct_rndv_iface_t *iface, unsigned idx)
{
	struct ibv_sge sge = {
		.addr   = (uintptr_t)&iface->rx_hdrs[idx],
		.length = sizeof(uct_rndv_hdr_t),
		.lkey   = iface->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id   = ((uint64_t)idx << 3) | UCT_RNDV_WRID_RECV,
		.sg_list = &sge,
		.num_sge = 1,
	};
	struct ibv_recv_wr *bad;

	return ibv_post_recv(iface->qp, &wr, &bad);
}

unsigned uct_rndv_iface_progress(uct_rndv_iface_t *iface)
{
	struct ibv_poll_cq_attr attr = {};
	struct ibv_cq_ex *cq = iface->cq;
	unsigned count = 0;

	if (ibv_start_poll(cq, &attr) != 0)
		return 0;

	do {
		uint64_t wr_id = cq->wr_id;

		if ((wr_id & UCT_RNDV_WRID_MASK) == UCT_RNDV_WRID_RECV) {
			unsigned idx = wr_id >> 3;
			unsigned wc_flags;
			uint32_t inv_rkey = 0;

			if (cq->status == IBV_WC_SUCCESS) {
				wc_flags = ibv_wc_read_wc_flags(cq);
				if (wc_flags & IBV_WC_WITH_INV)
					inv_rkey = ibv_wc_read_invalidated_rkey(cq); /* OK: rdma-remote-invalidate-unchecked -- only picks up the key, the AM handler compares it */
				uct_rndv_handle_am(iface, &iface->rx_hdrs[idx],
						   wc_flags, inv_rkey);
				uct_rndv_post_recv(iface, idx);
			}
		} else {
			uct_rndv_handle_send_comp(iface, wr_id, cq->status);
		}
		count++;
	} while (ibv_next_poll(cq) == 0);

	ibv_end_poll(cq);
	return count;
}

void uct_rndv_iface_check_timeouts(uct_rndv_iface_t *iface)
{
	uint64_t now = ucs_get_time_ns();
	uct_rndv_req_t *req;
	unsigned i;

	for (i = 0; i < UCT_RNDV_MAX_REQS; i++) {
		req = &iface->reqs[i];
		if (!(req->flags & UCT_RNDV_REQ_FLAG_INUSE) ||
		    (req->flags & (UCT_RNDV_REQ_FLAG_INV_POST | UCT_RNDV_REQ_FLAG_STALE)) ||
		    req->deadline > now)
			continue;

		ucs_warn("rndv request %u (rkey 0x%x) timed out", req->id, req->rkey);
		uct_rndv_req_complete(iface, req, UCS_ERR_TIMED_OUT); /* BUG: rdma-invalidation-leak -- the window over the user buffer is still bound, the peer keeps access after the buffer is handed back */
	}
}

void uct_rndv_req_cancel(uct_rndv_iface_t *iface, uct_rndv_req_t *req)
{
	if (!(req->flags & UCT_RNDV_REQ_FLAG_INUSE))
		return;

	ibv_wr_start(iface->qpx);
	iface->qpx->wr_id    = UCT_RNDV_WRID(req, UCT_RNDV_WRID_INV);
	iface->qpx->wr_flags = 0;
	ibv_wr_local_inv(iface->qpx, req->rkey);
	if (ibv_wr_complete(iface->qpx)) {
		uct_rndv_mark_stale(iface, req);
		return;
	}

	uct_rndv_req_complete(iface, req, UCS_ERR_CANCELED); /* BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is unsignaled and not waited for; the buffer goes back to the user while the window may still be live */
}

static void uct_rndv_iface_flush(uct_rndv_iface_t *iface)
{
	struct ibv_poll_cq_attr attr = {};
	uct_rndv_req_t *req;
	unsigned pending = 0;
	unsigned i;

	for (i = 0; i < UCT_RNDV_MAX_REQS; i++) {
		req = &iface->reqs[i];
		if ((req->flags & (UCT_RNDV_REQ_FLAG_INUSE | UCT_RNDV_REQ_FLAG_STALE)) !=
		    UCT_RNDV_REQ_FLAG_INUSE)
			continue;
		if (req->flags & UCT_RNDV_REQ_FLAG_INV_POST) {
			pending++;
			continue;
		}
		req->status = UCS_ERR_CANCELED;
		if (uct_rndv_local_inv(iface, req) == UCS_OK)
			pending++;
		else
			req->flags |= UCT_RNDV_REQ_FLAG_STALE;
	}

	while (pending > 0) {
		if (ibv_start_poll(iface->cq, &attr) != 0)
			continue;
		do {
			uint64_t wr_id = iface->cq->wr_id;

			if ((wr_id & UCT_RNDV_WRID_MASK) != UCT_RNDV_WRID_INV)
				continue;
			req = UCT_RNDV_WRID_PTR(wr_id);
			req->flags &= ~UCT_RNDV_REQ_FLAG_INV_POST;
			if (iface->cq->status != IBV_WC_SUCCESS)
				req->flags |= UCT_RNDV_REQ_FLAG_STALE;
			pending--;
		} while (ibv_next_poll(iface->cq) == 0);
		ibv_end_poll(iface->cq);
	}

	for (i = 0; i < UCT_RNDV_MAX_REQS; i++) {
		req = &iface->reqs[i];
		if (!(req->flags & UCT_RNDV_REQ_FLAG_INUSE))
			continue;
		if (req->flags & UCT_RNDV_REQ_FLAG_STALE) {
			ibv_dealloc_mw(req->mw);
			req->mw = NULL;
		}
		uct_rndv_req_complete(iface, req, UCS_ERR_CANCELED); /* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV was reaped above, windows whose invalidation failed were deallocated */
	}
}

/* pd, cq and the RC QP (created with SEND | BIND_MW | LOCAL_INV send ops)
 * come from the connection manager */
int uct_rndv_iface_init(uct_rndv_iface_t *iface, struct ibv_pd *pd,
			struct ibv_cq_ex *cq, struct ibv_qp *qp)
{
	unsigned i;

	memset(iface, 0, sizeof(*iface));
	iface->pd  = pd;
	iface->cq  = cq;
	iface->qp  = qp;
	iface->qpx = ibv_qp_to_qp_ex(qp);

	iface->rx_hdrs = calloc(UCT_RNDV_RX_DEPTH, sizeof(uct_rndv_hdr_t));
	if (iface->rx_hdrs == NULL)
		return -ENOMEM;
	iface->rx_mr = ibv_reg_mr(pd, iface->rx_hdrs,
				  UCT_RNDV_RX_DEPTH * sizeof(uct_rndv_hdr_t),
				  IBV_ACCESS_LOCAL_WRITE);
	if (iface->rx_mr == NULL) {
		free(iface->rx_hdrs);
		return -ENOMEM;
	}

	for (i = 0; i < UCT_RNDV_MAX_REQS; i++) {
		iface->reqs[i].id = i;
		uct_rndv_req_put(iface, &iface->reqs[i]);
	}
	for (i = 0; i < UCT_RNDV_RX_DEPTH; i++)
		if (uct_rndv_post_recv(iface, i))
			return -EIO;
	return 0;
}

void uct_rndv_iface_cleanup(uct_rndv_iface_t *iface)
{
	unsigned i;

	uct_rndv_iface_flush(iface);

	for (i = 0; i < UCT_RNDV_MAX_REQS; i++) {
		if (iface->reqs[i].mw != NULL)
			ibv_dealloc_mw(iface->reqs[i].mw);
	}

	ibv_dereg_mr(iface->rx_mr);
	free(iface->rx_hdrs);
	free(iface); /* OK: rdma-invalidation-leak -- every window was deallocated above */
}
