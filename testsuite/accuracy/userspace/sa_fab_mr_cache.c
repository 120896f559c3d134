/*
 * sa_fab_mr_cache.c - memory registration cache and RMA window pool of a
 * verbs fabric provider (libfabric "verbs" provider style, vrb_* names).
 *
 * fi_mr_reg() requests go through a small direct-mapped registration cache
 * kept in a process-wide table; descriptors handed to the application borrow
 * the cached MR, and only regions too large for the cache get a private
 * registration.  RMA targets that are exposed per operation use a pool of
 * type-2 memory windows bound with the extended QP API (ibv_wr_bind_mw) and
 * revoked with ibv_wr_local_inv; the peer reports the end of its RMA with a
 * zero-length SEND_WITH_IMM carrying the window index.  Each domain also has
 * a bounce buffer with remote access for unaligned RMA.
 *
 * Wrong: an uncached registration dropped when the descriptor allocation
 * fails; a growing cache entry that loses its old MR; the bounce buffer
 * freed before its MR is deregistered at close; the RMA timeout and the
 * asynchronous release recycling windows that are still (or maybe still)
 * bound; a window slid under the key the peer already has.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- not reviewed for this provider
 */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define VRB_CACHE_SLOTS		64
#define VRB_CACHE_MAX_REGION	(64UL << 20)
#define VRB_MW_POOL		32
#define VRB_BOUNCE_SIZE		(256 * 1024)
#define VRB_WAIT_SPINS		1000000L
#define VRB_RMA_TIMEOUT_S	2
#define VRB_PAGE_MASK		(~(uintptr_t)4095)

#define VRB_ACCESS_RMA	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | \
			 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND)

#define FI_REMOTE_READ	(1ULL << 0)
#define FI_REMOTE_WRITE	(1ULL << 1)

#define vrb_warn(fmt, ...) fprintf(stderr, "vrb: " fmt "\n", ##__VA_ARGS__)

struct vrb_cache_entry {
	uintptr_t	 base;
	size_t		 len;
	struct ibv_mr	*mr;
	int		 refcnt;
	uint64_t	 lru;
};

/* process-wide: every domain of the process shares one PD in this provider */
static struct vrb_cache_entry vrb_mr_cache[VRB_CACHE_SLOTS];
static uint64_t vrb_cache_tick;

struct vrb_domain {
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	void			*bounce;
	struct ibv_mr		*bounce_mr;
	void			*scratch;	/* inject staging, local only */
	struct ibv_mr		*scratch_mr;
};

struct vrb_mem_desc {
	struct ibv_mr		*mr;
	struct vrb_cache_entry	*entry;		/* NULL: private registration */
};

struct vrb_rma_iov {
	uint64_t	addr;
	uint64_t	len;
	uint32_t	key;
	uint32_t	index;
};

struct vrb_mw {
	struct ibv_mw	*mw;
	uint32_t	 rkey;
	uint64_t	 addr;
	size_t		 len;
	bool		 active;
	uint64_t	 deadline;
	struct vrb_mw	*next;
};

struct vrb_ep {
	struct vrb_domain	*domain;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct vrb_mw		 mw_pool[VRB_MW_POOL];
	struct vrb_mw		*mw_free;
	uint64_t		 next_wr_id;
};

static void vrb_mw_release(struct vrb_ep *ep, struct vrb_mw *w);

static inline struct vrb_cache_entry *vrb_cache_slot(uintptr_t base)
{
	return &vrb_mr_cache[(base >> 12) % VRB_CACHE_SLOTS];
}

int vrb_domain_open(struct ibv_context *verbs, struct vrb_domain *dom)
{
	int ret;

	memset(dom, 0, sizeof(*dom));
	dom->verbs = verbs;
	dom->pd = ibv_alloc_pd(verbs);
	if (!dom->pd)
		return -ENOMEM;

	if (posix_memalign(&dom->bounce, 4096, VRB_BOUNCE_SIZE)) {
		ret = -ENOMEM;
		goto err_pd;
	}
	dom->bounce_mr = ibv_reg_mr(dom->pd, dom->bounce, VRB_BOUNCE_SIZE,
				    VRB_ACCESS_RMA);
	if (!dom->bounce_mr) {
		ret = -errno;
		goto err_bounce;
	}
	dom->scratch = malloc(4096);
	if (!dom->scratch) {
		ret = -ENOMEM;
		goto err_bounce_mr;
	}
	dom->scratch_mr = ibv_reg_mr(dom->pd, dom->scratch, 4096,
				     IBV_ACCESS_LOCAL_WRITE);
	if (!dom->scratch_mr) {
		ret = -errno;
		goto err_scratch;
	}
	return 0;

err_scratch:
	free(dom->scratch);
err_bounce_mr:
	ibv_dereg_mr(dom->bounce_mr);
err_bounce:
	free(dom->bounce);	/* OK: rdma-invalidation-leak -- bounce_mr is deregistered before the buffer goes */
err_pd:
	ibv_dealloc_pd(dom->pd);
	return ret;
}

void vrb_rma_iov_bounce(struct vrb_domain *dom, struct vrb_rma_iov *iov)
{
	iov->addr = (uintptr_t)dom->bounce;
	iov->len = VRB_BOUNCE_SIZE;
	iov->key = dom->bounce_mr->rkey;
	iov->index = UINT32_MAX;
}

static int vrb_mr_cache_add_region(struct vrb_domain *dom,
				   struct vrb_cache_entry *e,
				   uintptr_t base, size_t len)
{
	e->mr = ibv_reg_mr(dom->pd, (void *)base, len, VRB_ACCESS_RMA);
	if (!e->mr)
		return -errno;
	e->base = base;
	e->len = len;
	e->refcnt = 0;
	e->lru = ++vrb_cache_tick;
	return 0;
}

static void vrb_mr_cache_delete_region(struct vrb_cache_entry *e)
{
	ibv_dereg_mr(e->mr);
	e->mr = NULL;		/* OK: rdma-mr-leak -- deregistered on the line above */
	e->base = 0;
	e->len = 0;
}

/* Slot hit on the same first page, but the request runs further: extend. */
static int vrb_mr_cache_grow(struct vrb_domain *dom, struct vrb_cache_entry *e,
			     uintptr_t base, size_t len)
{
	uintptr_t end = base + len;
	struct ibv_mr *mr;

	if (e->refcnt)
		return -EAGAIN;
	if (e->base + e->len > end)
		end = e->base + e->len;

	mr = ibv_reg_mr(dom->pd, (void *)e->base, end - e->base, VRB_ACCESS_RMA);
	if (!mr)
		return -errno;
	e->mr = mr;		/* BUG: rdma-mr-leak -- the entry's previous registration is overwritten, never deregistered */
	e->len = end - e->base;
	e->lru = ++vrb_cache_tick;
	return 0;
}

void vrb_mr_cache_flush(bool all)
{
	int i;

	for (i = 0; i < VRB_CACHE_SLOTS; i++) {
		struct vrb_cache_entry *e = &vrb_mr_cache[i];

		if (!e->mr)
			continue;
		if (e->refcnt && !all)
			continue;
		vrb_mr_cache_delete_region(e);
	}
}

int vrb_mr_reg(struct vrb_domain *dom, const void *buf, size_t len,
	       uint64_t access, struct vrb_mem_desc **desc_out)
{
	uintptr_t base = (uintptr_t)buf;
	struct vrb_cache_entry *e;
	struct vrb_mem_desc *desc;
	struct ibv_mr *mr;
	int ret = 0;

	(void)access;
	if (len > VRB_CACHE_MAX_REGION) {
		mr = ibv_reg_mr(dom->pd, (void *)buf, len, VRB_ACCESS_RMA);
		if (!mr)
			return -errno;
		desc = calloc(1, sizeof(*desc));
		if (!desc)
			return -ENOMEM;	/* BUG: rdma-mr-leak -- the private registration in 'mr' is lost */
		desc->mr = mr;
		*desc_out = desc;
		return 0;
	}

	e = vrb_cache_slot(base);
	if (!e->mr) {
		ret = vrb_mr_cache_add_region(dom, e, base, len);
	} else if (e->base == (base & VRB_PAGE_MASK) &&
		   base + len > e->base + e->len) {
		ret = vrb_mr_cache_grow(dom, e, base, len);
	} else if (base < e->base || base + len > e->base + e->len) {
		if (e->refcnt)
			return -EAGAIN;
		vrb_mr_cache_delete_region(e);
		ret = vrb_mr_cache_add_region(dom, e, base, len);
	}
	if (ret)
		return ret;

	desc = calloc(1, sizeof(*desc));
	if (!desc)
		return -ENOMEM;	/* OK: rdma-mr-leak -- the MR lives in the global cache; vrb_mr_cache_flush() releases it */
	e->refcnt++;
	e->lru = ++vrb_cache_tick;
	desc->mr = e->mr;
	desc->entry = e;
	*desc_out = desc;
	return 0;
}

void vrb_mr_close(struct vrb_mem_desc *desc)
{
	if (desc->entry)
		desc->entry->refcnt--;
	else
		ibv_dereg_mr(desc->mr);
	free(desc);	/* OK: rdma-mr-leak, rdma-invalidation-leak -- a cached desc only borrows the entry's MR, a private one was deregistered */
}

static void vrb_handle_wc(struct vrb_ep *ep, const struct ibv_wc *wc)
{
	struct vrb_mw *w;
	uint32_t idx;

	if (wc->opcode != IBV_WC_RECV || !(wc->wc_flags & IBV_WC_WITH_IMM))
		return;
	idx = be32toh(wc->imm_data);
	if (idx >= VRB_MW_POOL)
		return;
	w = &ep->mw_pool[idx];
	if (w->active)
		vrb_mw_release(ep, w);	/* the RMA completion is then reported to the app */
}

static int vrb_wait_wr(struct vrb_ep *ep, uint64_t wr_id)
{
	struct ibv_wc wc[8];
	long spins = VRB_WAIT_SPINS;
	int n, k;

	while (spins-- > 0) {
		n = ibv_poll_cq(ep->cq, 8, wc);
		if (n < 0)
			return -EIO;
		for (k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS) {
				vrb_warn("wr %llu failed: %s",
					 (unsigned long long)wc[k].wr_id,
					 ibv_wc_status_str(wc[k].status));
				if (wc[k].wr_id == wr_id)
					return -EIO;
				continue;
			}
			if (wc[k].wr_id == wr_id)
				return 0;
			vrb_handle_wc(ep, &wc[k]);
		}
	}
	return -ETIMEDOUT;
}

/* called by the endpoint code once the QP (BIND_MW | LOCAL_INV send ops) exists */
int vrb_ep_mw_init(struct vrb_ep *ep)
{
	int i, j;

	ep->mw_free = NULL;
	for (i = 0; i < VRB_MW_POOL; i++) {
		struct vrb_mw *w = &ep->mw_pool[i];

		w->mw = ibv_alloc_mw(ep->domain->pd, IBV_MW_TYPE_2);
		if (!w->mw)
			goto unwind;
		w->rkey = w->mw->rkey;
		w->active = false;
		w->next = ep->mw_free;
		ep->mw_free = w;
	}
	return 0;

unwind:
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(ep->mw_pool[j].mw);
	ep->mw_free = NULL;
	return -ENOMEM;		/* OK: rdma-mr-leak -- slot i never got a window; 0..i-1 are deallocated above */
}

/* endpoint close, before the QP is destroyed */
void vrb_ep_mw_fini(struct vrb_ep *ep)
{
	int i;

	for (i = VRB_MW_POOL; i-- > 0;)
		ibv_dealloc_mw(ep->mw_pool[i].mw);
	ep->mw_free = NULL;
}

static int vrb_send_rma_iov(struct vrb_ep *ep, const struct vrb_rma_iov *iov)
{
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = ++ep->next_wr_id;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(ep->qpx);
	ibv_wr_set_inline_data(ep->qpx, (void *)iov, sizeof(*iov));
	return ibv_wr_complete(ep->qpx);
}

static int vrb_mw_release_sync(struct vrb_ep *ep, struct vrb_mw *w)
{
	uint64_t id = ++ep->next_wr_id;
	int ret;

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = id;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(ep->qpx, w->rkey);
	ret = ibv_wr_complete(ep->qpx);
	if (ret)
		return -ret;
	ret = vrb_wait_wr(ep, id);
	if (ret)
		return ret;
	w->active = false;
	w->next = ep->mw_free;	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV completed before the window is recycled */
	ep->mw_free = w;
	return 0;
}

/* Revoke a window whose RMA the peer reported done, and recycle it. */
static void vrb_mw_release(struct vrb_ep *ep, struct vrb_mw *w)
{
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = 0;
	ep->qpx->wr_flags = 0;
	ibv_wr_local_inv(ep->qpx, w->rkey);
	if (ibv_wr_complete(ep->qpx)) {
		vrb_warn("local invalidate of %#x failed", w->rkey);
		return;
	}
	w->active = false;
	w->next = ep->mw_free;	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed; the window and its buffer are handed back now */
	ep->mw_free = w;
}

int vrb_rma_target_open(struct vrb_ep *ep, struct vrb_mem_desc *desc,
			void *addr, size_t len, uint64_t access,
			struct vrb_mw **out)
{
	struct vrb_mw *w = ep->mw_free;
	struct ibv_mw_bind_info info;
	struct vrb_rma_iov iov;
	uint64_t id;
	int ret;

	if (!w)
		return -EAGAIN;
	ep->mw_free = w->next;

	info.mr = desc->mr;
	info.addr = (uintptr_t)addr;
	info.length = len;
	info.mw_access_flags = (access & FI_REMOTE_READ ? IBV_ACCESS_REMOTE_READ : 0) |
			       (access & FI_REMOTE_WRITE ? IBV_ACCESS_REMOTE_WRITE : 0);

	w->rkey = ibv_inc_rkey(w->rkey);
	w->addr = info.addr;
	w->len = len;
	id = ++ep->next_wr_id;

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = id;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(ep->qpx, w->mw, w->rkey, &info);	/* OK: rdma-rkey-reuse -- fresh key from ibv_inc_rkey() above */
	ret = ibv_wr_complete(ep->qpx);
	if (ret) {
		w->next = ep->mw_free;	/* OK: rdma-invalidation-leak -- the bind was never posted, nothing is exposed */
		ep->mw_free = w;
		return -ret;
	}
	ret = vrb_wait_wr(ep, id);
	if (ret)
		return ret;	/* QP is broken; the window is dropped with the endpoint */

	w->active = true;
	w->deadline = (uint64_t)time(NULL) + VRB_RMA_TIMEOUT_S;
	iov.addr = w->addr;
	iov.len = w->len;
	iov.key = w->rkey;
	iov.index = (uint32_t)(w - ep->mw_pool);
	ret = vrb_send_rma_iov(ep, &iov);
	if (ret) {
		vrb_mw_release_sync(ep, w);
		return -ret;
	}
	*out = w;
	return 0;
}

/* Move an exposed window over the next part of a pipelined transfer. */
int vrb_mw_slide(struct vrb_ep *ep, struct vrb_mw *w, struct ibv_mr *mr,
		 size_t step)
{
	struct ibv_mw_bind_info info;
	uint64_t id = ++ep->next_wr_id;
	int ret;

	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = id;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(ep->qpx, w->rkey);
	ret = ibv_wr_complete(ep->qpx);
	if (ret)
		return -ret;
	ret = vrb_wait_wr(ep, id);
	if (ret)
		return ret;

	/* keep the key so the peer can continue without a new rma_iov */
	info.mr = mr;
	info.addr = w->addr + step;
	info.length = w->len;
	info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	id = ++ep->next_wr_id;
	ibv_wr_start(ep->qpx);
	ep->qpx->wr_id = id;
	ep->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(ep->qpx, w->mw, w->rkey, &info);	/* BUG: rdma-rkey-reuse -- the window is bound again under the key the peer already holds */
	ret = ibv_wr_complete(ep->qpx);
	if (ret)
		return -ret;
	w->addr = info.addr;
	return vrb_wait_wr(ep, id);
}

/* A window whose RMA did not finish in time. */
static void vrb_rma_timeout(struct vrb_ep *ep, struct vrb_mw *w)
{
	vrb_warn("rma on window %#x timed out, dropping", w->rkey);
	w->active = false;
	w->len = 0;
	w->next = ep->mw_free;	/* BUG: rdma-invalidation-leak -- still bound, its key is with the peer; recycled with no LOCAL_INV */
	ep->mw_free = w;
}

/* timer tick of the progress thread */
void vrb_ep_check_timeouts(struct vrb_ep *ep)
{
	uint64_t now = (uint64_t)time(NULL);
	int i;

	for (i = 0; i < VRB_MW_POOL; i++) {
		struct vrb_mw *w = &ep->mw_pool[i];

		if (w->active && now > w->deadline)
			vrb_rma_timeout(ep, w);
	}
}

void vrb_domain_close(struct vrb_domain *dom)
{
	vrb_mr_cache_flush(true);

	free(dom->scratch);	/* OK: rdma-invalidation-leak -- scratch_mr is local only, no key was ever handed out */
	ibv_dereg_mr(dom->scratch_mr);

	free(dom->bounce);	/* BUG: rdma-invalidation-leak -- bounce_mr (remote read/write, key in rma iovs) still registered when the buffer is freed */
	ibv_dereg_mr(dom->bounce_mr);

	ibv_dealloc_pd(dom->pd);
}
