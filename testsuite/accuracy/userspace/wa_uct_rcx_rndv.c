/*
 * uct_rcx_rndv.c - zero-copy rendezvous for the "rcx" RC transport.
 *
 * UCX-style interface code. A small registration cache (a global table)
 * keeps user buffers registered for local access and window binding. Each
 * rendezvous send binds a type-2 memory window over the user buffer (or over
 * a bounce buffer when the cache cannot take the region) and ships the
 * window's rkey to the peer in an RTS header. The peer RDMA-READs the data
 * into its own cached registration and answers with ATS; the sender then
 * invalidates the window with a signaled LOCAL_INV and recycles the request
 * from that completion. Large messages are pipelined: the window slides
 * over the next fragment once the previous one was fetched.
 *
 * Correct: ATS -> LOCAL_INV -> recycle from the completion, borrowed cache
 * registrations, teardown that deallocates windows before their memory.
 * Not correct: the cache leaks a registration when the table is full, the
 * window allocation loop drops the window of the failing slot, the bounce
 * path leaks its MR when the bind cannot be posted, the fragment pipeline
 * re-binds with the key of the previous fragment, the timeout sweep
 * recycles requests whose window is still bound, and cancel recycles right
 * after an unsignaled LOCAL_INV.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-registration-in-datapath, rdma-queue-cap-unchecked, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define UCT_RCX_RCACHE_MAX      64
#define UCT_RCX_RNDV_MAX        128
#define UCT_RCX_RX_DEPTH        256
#define UCT_RCX_RX_SEG          4096
#define UCT_RCX_FRAG_SIZE       (1ul << 20)
#define UCT_RCX_RNDV_TMO_NS     (2ull * 1000 * 1000 * 1000)

#define UCT_RCX_WRID_INV        0x1ull
#define UCT_RCX_WRID_GET        0x2ull
#define UCT_RCX_WRID_PTR(_id)   ((void *)(uintptr_t)((_id) & ~0x3ull))

typedef enum {
	UCS_OK              = 0,
	UCS_ERR_NO_RESOURCE = -2,
	UCS_ERR_IO_ERROR    = -3,
	UCS_ERR_NO_MEMORY   = -4,
	UCS_ERR_TIMED_OUT   = -20,
} ucs_status_t;

#define ucs_error(_fmt, ...) \
	fprintf(stderr, "rcx: " _fmt "\n", ## __VA_ARGS__)

enum {
	UCT_RCX_RNDV_IDLE,
	UCT_RCX_RNDV_EXPOSED,
	UCT_RCX_RNDV_INVALIDATING,
	UCT_RCX_RNDV_FAILED,
};

typedef struct uct_rcx_region {
	void          *start;
	size_t         length;
	struct ibv_mr *mr;
	unsigned       refcount;
} uct_rcx_region_t;

static uct_rcx_region_t uct_rcx_rcache[UCT_RCX_RCACHE_MAX];
static unsigned         uct_rcx_rcache_count;

typedef struct uct_rcx_rts_hdr {
	uint64_t req_id;
	uint64_t address;
	uint64_t length;
	uint32_t rkey;
	uint32_t frag;
} __attribute__((packed)) uct_rcx_rts_hdr_t;

typedef struct uct_rcx_rndv_req uct_rcx_rndv_req_t;
typedef void (*uct_rcx_comp_cb_t)(uct_rcx_rndv_req_t *req, ucs_status_t status);

struct uct_rcx_rndv_req {
	uct_rcx_rndv_req_t  *next;
	struct ibv_mw       *mw;
	uint32_t             rkey;
	int                  state;
	void                *buffer;
	size_t               total;
	size_t               length;
	unsigned             frag;
	uct_rcx_region_t    *region;
	void                *bounce;
	struct ibv_mr       *bounce_mr;
	uint64_t             deadline;
	uct_rcx_rts_hdr_t   *hdr;
	struct ibv_send_wr   inv_wr;
	struct ibv_send_wr   bind_wr;
	uct_rcx_comp_cb_t    comp_cb;
};

typedef struct uct_rcx_iface {
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	void                *rx_ring;
	struct ibv_mr       *rx_mr;
	uct_rcx_rndv_req_t   reqs[UCT_RCX_RNDV_MAX];
	uct_rcx_rndv_req_t  *free_reqs;
	unsigned             inv_pending;
} uct_rcx_iface_t;

static uint64_t uct_rcx_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- registration cache ------------------------------------------------ */

static uct_rcx_region_t *
uct_rcx_rcache_get(uct_rcx_iface_t *iface, void *address, size_t length)
{
	struct ibv_mr *mr;
	unsigned i;

	for (i = 0; i < uct_rcx_rcache_count; i++) {
		uct_rcx_region_t *region = &uct_rcx_rcache[i];

		if ((char *)address >= (char *)region->start &&
		    (char *)address + length <=
		    (char *)region->start + region->length) {
			region->refcount++;
			return region;
		}
	}

	/* RDMA READ sink on the get side, window target on the put side */
	mr = ibv_reg_mr(iface->pd, address, length,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND); // BUG: rdma-local-mr-management -- the transport registers the memory its own RDMA READs land in and its windows expose
	if (mr == NULL) {
		ucs_error("ibv_reg_mr(%p, %zu) failed: %m", address, length);
		return NULL;
	}

	if (uct_rcx_rcache_count == UCT_RCX_RCACHE_MAX) {
		ucs_error("registration cache is full");
		return NULL; // BUG: rdma-mr-leak -- the new registration is neither cached nor deregistered
	}

	uct_rcx_rcache[uct_rcx_rcache_count].start    = address;
	uct_rcx_rcache[uct_rcx_rcache_count].length   = length;
	uct_rcx_rcache[uct_rcx_rcache_count].mr       = mr;
	uct_rcx_rcache[uct_rcx_rcache_count].refcount = 1;
	return &uct_rcx_rcache[uct_rcx_rcache_count++];
}

static void uct_rcx_rcache_put(uct_rcx_region_t *region)
{
	if (region != NULL && region->refcount > 0)
		region->refcount--;
}

static void uct_rcx_rcache_cleanup(void)
{
	unsigned i;

	for (i = 0; i < uct_rcx_rcache_count; i++) {
		if (uct_rcx_rcache[i].mr != NULL) {
			ibv_dereg_mr(uct_rcx_rcache[i].mr);
			uct_rcx_rcache[i].mr = NULL;
		}
	}
	uct_rcx_rcache_count = 0;
}

/* ---- interface resources ----------------------------------------------- */

ucs_status_t uct_rcx_iface_init_rx(uct_rcx_iface_t *iface)
{
	size_t size = (size_t)UCT_RCX_RX_DEPTH * UCT_RCX_RX_SEG;

	iface->rx_ring = aligned_alloc(4096, size);
	if (iface->rx_ring == NULL)
		return UCS_ERR_NO_MEMORY;

	iface->rx_mr = ibv_reg_mr(iface->pd, iface->rx_ring, size,
				  IBV_ACCESS_LOCAL_WRITE); // OK: rdma-local-mr-management -- receive ring, registered once at setup for local access
	if (iface->rx_mr == NULL) {
		free(iface->rx_ring);
		iface->rx_ring = NULL;
		return UCS_ERR_IO_ERROR;
	}
	return UCS_OK;
}

ucs_status_t uct_rcx_iface_init_rndv(uct_rcx_iface_t *iface)
{
	uct_rcx_rndv_req_t *req;
	int i, j;

	iface->free_reqs = NULL;
	for (i = 0; i < UCT_RCX_RNDV_MAX; i++) {
		req = &iface->reqs[i];
		memset(req, 0, sizeof(*req));

		req->mw = ibv_alloc_mw(iface->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- per-request window the transport binds to expose user buffers
		if (req->mw == NULL)
			goto err;
		req->rkey = req->mw->rkey;

		req->hdr = calloc(1, sizeof(*req->hdr));
		if (req->hdr == NULL)
			goto err; // BUG: rdma-mr-leak -- the window of slot i is not released by the j < i unwinding

		req->next        = iface->free_reqs;
		iface->free_reqs = req;
	}
	return UCS_OK;

err:
	for (j = 0; j < i; j++) {
		ibv_dealloc_mw(iface->reqs[j].mw);
		free(iface->reqs[j].hdr);
	}
	iface->free_reqs = NULL;
	return UCS_ERR_NO_MEMORY;
}

/* ---- rendezvous send side ---------------------------------------------- */

static inline uint32_t uct_rcx_mw_next_key(const uct_rcx_rndv_req_t *req)
{
	return ibv_inc_rkey(req->rkey);
}

static ucs_status_t
uct_rcx_post_bind(uct_rcx_iface_t *iface, uct_rcx_rndv_req_t *req,
		  struct ibv_mr *mr, void *addr, size_t length)
{
	struct ibv_send_wr *bad_wr;

	memset(&req->bind_wr, 0, sizeof(req->bind_wr));
	req->bind_wr.wr_id      = (uintptr_t)req;
	req->bind_wr.opcode     = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the transport binds a window to hand a user buffer to the peer
	req->bind_wr.send_flags = 0;
	req->bind_wr.bind_mw.mw = req->mw;
	req->bind_wr.bind_mw.rkey = req->rkey; // OK: rdma-rkey-reuse -- the only caller stores uct_rcx_mw_next_key() in req->rkey first
	req->bind_wr.bind_mw.bind_info.mr     = mr;
	req->bind_wr.bind_mw.bind_info.addr   = (uintptr_t)addr;
	req->bind_wr.bind_mw.bind_info.length = length;
	req->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	if (ibv_post_send(iface->qp, &req->bind_wr, &bad_wr))
		return UCS_ERR_IO_ERROR;
	return UCS_OK;
}

static ucs_status_t
uct_rcx_send_rts(uct_rcx_iface_t *iface, uct_rcx_rndv_req_t *req, void *addr)
{
	struct ibv_send_wr wr, *bad_wr;
	struct ibv_sge sge;

	req->hdr->req_id  = (uintptr_t)req;
	req->hdr->address = (uintptr_t)addr;
	req->hdr->length  = req->length;
	memcpy(&req->hdr->rkey, &req->rkey, sizeof(req->hdr->rkey));
	req->hdr->frag    = req->frag;

	sge.addr   = (uintptr_t)req->hdr;
	sge.length = sizeof(*req->hdr);
	sge.lkey   = 0;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id      = (uintptr_t)req;
	wr.sg_list    = &sge;
	wr.num_sge    = 1;
	wr.opcode     = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_INLINE;

	return ibv_post_send(iface->qp, &wr, &bad_wr) ? UCS_ERR_IO_ERROR : UCS_OK;
}

ucs_status_t
uct_rcx_rndv_expose(uct_rcx_iface_t *iface, uct_rcx_rndv_req_t *req,
		    void *buffer, size_t length)
{
	struct ibv_mr *mr;
	void *addr = buffer;
	ucs_status_t status;

	req->buffer = buffer;
	req->total  = length;
	req->length = length < UCT_RCX_FRAG_SIZE ? length : UCT_RCX_FRAG_SIZE;
	req->frag   = 0;

	req->region = uct_rcx_rcache_get(iface, buffer, length);
	if (req->region != NULL) {
		mr = req->region->mr;
	} else {
		req->bounce = malloc(req->length);
		if (req->bounce == NULL)
			return UCS_ERR_NO_MEMORY;
		memcpy(req->bounce, buffer, req->length);
		req->bounce_mr = ibv_reg_mr(iface->pd, req->bounce, req->length,
					    IBV_ACCESS_LOCAL_WRITE |
					    IBV_ACCESS_MW_BIND); // BUG: rdma-local-mr-management -- per-message registration of a bounce buffer that a window exposes
		if (req->bounce_mr == NULL) {
			free(req->bounce);
			req->bounce = NULL;
			return UCS_ERR_IO_ERROR;
		}
		mr   = req->bounce_mr;
		addr = req->bounce;
	}

	req->rkey = uct_rcx_mw_next_key(req);
	status = uct_rcx_post_bind(iface, req, mr, addr, req->length);
	if (status != UCS_OK) {
		uct_rcx_rcache_put(req->region);
		req->region = NULL;
		return status; // BUG: rdma-mr-leak -- on the bounce path req->bounce_mr stays registered and is overwritten by the next send
	}

	req->state    = UCT_RCX_RNDV_EXPOSED;
	req->deadline = uct_rcx_now() + UCT_RCX_RNDV_TMO_NS;
	return uct_rcx_send_rts(iface, req, addr);
}

/*
 * ATS for fragment N arrived and more data is left: retire the window from
 * the fetched fragment and slide it over the next one.
 */
static ucs_status_t
uct_rcx_rndv_next_frag(uct_rcx_iface_t *iface, uct_rcx_rndv_req_t *req)
{
	struct ibv_send_wr *bad_wr;
	size_t offset = (size_t)(req->frag + 1) * UCT_RCX_FRAG_SIZE;
	char *base = req->buffer;

	if (req->region == NULL || offset >= req->total)
		return UCS_ERR_NO_RESOURCE;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->rkey;
	req->inv_wr.next            = &req->bind_wr;

	memset(&req->bind_wr, 0, sizeof(req->bind_wr));
	req->bind_wr.wr_id      = (uintptr_t)req;
	req->bind_wr.opcode     = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the window is bound again to expose the next fragment
	req->bind_wr.send_flags = IBV_SEND_FENCE;
	req->bind_wr.bind_mw.mw   = req->mw;
	req->bind_wr.bind_mw.rkey = req->rkey; // BUG: rdma-rkey-reuse -- the peer already holds this key from the previous fragment
	req->bind_wr.bind_mw.bind_info.mr     = req->region->mr;
	req->bind_wr.bind_mw.bind_info.addr   = (uintptr_t)(base + offset);
	req->bind_wr.bind_mw.bind_info.length =
		req->total - offset < UCT_RCX_FRAG_SIZE ? req->total - offset : UCT_RCX_FRAG_SIZE;
	req->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	if (ibv_post_send(iface->qp, &req->inv_wr, &bad_wr))
		return UCS_ERR_IO_ERROR;

	req->frag++;
	req->length   = req->bind_wr.bind_mw.bind_info.length;
	req->deadline = uct_rcx_now() + UCT_RCX_RNDV_TMO_NS;
	return uct_rcx_send_rts(iface, req, base + offset);
}

static ucs_status_t uct_rcx_rndv_ats(uct_rcx_iface_t *iface,
				     uct_rcx_rndv_req_t *req)
{
	struct ibv_send_wr *bad_wr;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.wr_id           = (uintptr_t)req | UCT_RCX_WRID_INV;
	req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
	req->inv_wr.send_flags      = IBV_SEND_SIGNALED;
	req->inv_wr.invalidate_rkey = req->rkey;

	if (ibv_post_send(iface->qp, &req->inv_wr, &bad_wr))
		return UCS_ERR_IO_ERROR;

	req->state = UCT_RCX_RNDV_INVALIDATING;
	iface->inv_pending++;
	return UCS_OK;
}

/* ---- rendezvous receive side ------------------------------------------- */

ucs_status_t
uct_rcx_rndv_get(uct_rcx_iface_t *iface, const uct_rcx_rts_hdr_t *rts,
		 void *dest)
{
	struct ibv_send_wr wr, *bad_wr;
	uct_rcx_region_t *region;
	struct ibv_sge sge;
	uint32_t rkey;

	region = uct_rcx_rcache_get(iface, dest, rts->length);
	if (region == NULL)
		return UCS_ERR_NO_RESOURCE;

	memcpy(&rkey, &rts->rkey, sizeof(rkey));
	sge.addr   = (uintptr_t)dest;
	sge.length = (uint32_t)rts->length;
	sge.lkey   = region->mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id               = (uintptr_t)region | UCT_RCX_WRID_GET;
	wr.sg_list             = &sge;
	wr.num_sge             = 1;
	wr.opcode              = IBV_WR_RDMA_READ;
	wr.send_flags          = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = rts->address;
	wr.wr.rdma.rkey        = rkey;

	if (ibv_post_send(iface->qp, &wr, &bad_wr)) {
		uct_rcx_rcache_put(region);
		return UCS_ERR_IO_ERROR; // OK: rdma-mr-leak -- the MR lives in the global cache; the lookup only borrowed it
	}
	return UCS_OK;
}

/* ---- completions, timeouts, cancel ------------------------------------- */

static void uct_rcx_handle_inv_comp(uct_rcx_iface_t *iface, struct ibv_wc *wc)
{
	uct_rcx_rndv_req_t *req = UCT_RCX_WRID_PTR(wc->wr_id);

	iface->inv_pending--;
	if (wc->status != IBV_WC_SUCCESS) {
		ucs_error("LOCAL_INV failed: %s", ibv_wc_status_str(wc->status));
		req->state = UCT_RCX_RNDV_FAILED; /* torn down with the iface */
		return;
	}

	if (req->bounce_mr != NULL) {
		ibv_dereg_mr(req->bounce_mr);
		req->bounce_mr = NULL;
		free(req->bounce); // OK: rdma-unmap-before-invalidate -- runs from the successful completion of the LOCAL_INV itself
		req->bounce = NULL;
	}
	uct_rcx_rcache_put(req->region);
	req->region = NULL;
	req->state  = UCT_RCX_RNDV_IDLE;
	req->comp_cb(req, UCS_OK);
	req->next        = iface->free_reqs;
	iface->free_reqs = req; // OK: rdma-invalidation-leak -- the window died with the LOCAL_INV this completion reports
}

unsigned uct_rcx_iface_progress(uct_rcx_iface_t *iface)
{
	struct ibv_wc wc[16];
	int i, n;

	n = ibv_poll_cq(iface->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].wr_id & UCT_RCX_WRID_INV)
			uct_rcx_handle_inv_comp(iface, &wc[i]);
		else if (wc[i].wr_id & UCT_RCX_WRID_GET)
			uct_rcx_rcache_put(UCT_RCX_WRID_PTR(wc[i].wr_id));
	}
	return n > 0 ? (unsigned)n : 0;
}

void uct_rcx_rndv_sweep(uct_rcx_iface_t *iface)
{
	uint64_t now = uct_rcx_now();
	uct_rcx_rndv_req_t *req;
	int i;

	for (i = 0; i < UCT_RCX_RNDV_MAX; i++) {
		req = &iface->reqs[i];
		if (req->state != UCT_RCX_RNDV_EXPOSED || now < req->deadline)
			continue;

		ucs_error("rndv %p: no ATS after %llu ns", (void *)req,
			  (unsigned long long)UCT_RCX_RNDV_TMO_NS);
		if (req->bounce_mr != NULL) {
			ibv_dereg_mr(req->bounce_mr);
			req->bounce_mr = NULL;
			free(req->bounce); // BUG: rdma-invalidation-leak -- the window is still bound over the bounce buffer with the key sent in the RTS
			req->bounce = NULL;
		}
		uct_rcx_rcache_put(req->region);
		req->region = NULL;
		req->state  = UCT_RCX_RNDV_IDLE;
		req->comp_cb(req, UCS_ERR_TIMED_OUT);
		req->next        = iface->free_reqs;
		iface->free_reqs = req; // BUG: rdma-invalidation-leak -- recycled while its window still exposes the user buffer
	}
}

ucs_status_t uct_rcx_rndv_cancel(uct_rcx_iface_t *iface, uct_rcx_rndv_req_t *req)
{
	struct ibv_send_wr *bad_wr;

	if (req->state != UCT_RCX_RNDV_EXPOSED)
		return UCS_OK;
	if (req->bounce_mr != NULL)
		return UCS_ERR_NO_RESOURCE; /* bounced sends run to completion */

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.opcode          = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->rkey;
	if (ibv_post_send(iface->qp, &req->inv_wr, &bad_wr))
		return UCS_ERR_IO_ERROR;

	uct_rcx_rcache_put(req->region);
	req->region = NULL;
	req->state  = UCT_RCX_RNDV_IDLE;
	req->next        = iface->free_reqs;
	iface->free_reqs = req; // BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is unsignaled and never waited for: the user gets the buffer back and the request is reused while the peer's key may still read it
	return UCS_OK;
}

/* ---- teardown --------------------------------------------------------- */

void uct_rcx_iface_cleanup(uct_rcx_iface_t *iface)
{
	uct_rcx_rndv_req_t *req;
	int i;

	for (i = 0; i < UCT_RCX_RNDV_MAX; i++) {
		req = &iface->reqs[i];
		if (req->mw != NULL) {
			ibv_dealloc_mw(req->mw);
			req->mw = NULL;
		}
		if (req->bounce_mr != NULL) {
			ibv_dereg_mr(req->bounce_mr);
			req->bounce_mr = NULL;
			free(req->bounce); // OK: rdma-invalidation-leak -- the window bound over it was deallocated just above, which invalidates it
			req->bounce = NULL;
		}
		free(req->hdr);
		req->hdr = NULL;
	}
	iface->free_reqs = NULL;

	ibv_dereg_mr(iface->rx_mr);
	free(iface->rx_ring);
	uct_rcx_rcache_cleanup();
}

/* entry point used by the AM layer */
ucs_status_t uct_rcx_ep_handle_ats(uct_rcx_iface_t *iface, uint64_t req_id)
{
	uct_rcx_rndv_req_t *req = (uct_rcx_rndv_req_t *)(uintptr_t)req_id;

	if (req->region != NULL &&
	    (size_t)(req->frag + 1) * UCT_RCX_FRAG_SIZE < req->total)
		return uct_rcx_rndv_next_frag(iface, req);
	return uct_rcx_rndv_ats(iface, req);
}
