/*
 * vrbx_mr.c - memory registration for the "vrbx" verbs provider.
 *
 * libfabric-provider style. An fi_mr_reg() object is backed by a local MR
 * (its desc, used for the local side of RMA) and a type-2 memory window whose
 * key is what fi_mr_key() hands to the application, which sends it to its
 * peer. Windows are bound and invalidated with the extended verbs API on the
 * domain's service QP. Closed objects keep their window on a per-domain
 * cache so that the next registration can skip ibv_alloc_mw(). FI_MR_COPY
 * objects expose a bounce copy of the user buffer instead of the buffer.
 *
 * Correct: the first bind of a new window, the re-bind that rotates the key,
 * close that waits for its LOCAL_INV, the asynchronous close that recycles
 * from the LOCAL_INV completion, unwinding that deallocates the window before
 * the bounce buffer goes.
 * Not correct: an unsupported-atomics exit that skips the window's
 * deallocation, the cached-object path binding with the previous owner's key,
 * re-bind dropping the old MR, the asynchronous close freeing the bounce
 * buffer before its LOCAL_INV completed, and domain teardown freeing bounce
 * buffers while their windows are still bound.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-registration-in-datapath, rdma-queue-cap-unchecked, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define FI_SUCCESS          0
#define FI_EIO              EIO
#define FI_ENOMEM           ENOMEM
#define FI_EBUSY            EBUSY
#define FI_EINVAL           EINVAL
#define FI_EOPNOTSUPP       EOPNOTSUPP

#define FI_REMOTE_READ      (1ULL << 10)
#define FI_REMOTE_WRITE     (1ULL << 11)
#define FI_REMOTE_ATOMIC    (1ULL << 12)
#define VRBX_MR_FLAG_COPY   (1ULL << 0)

#define VRBX_WRID_ASYNC_INV 0x1ull

struct vrbx_mr;

struct vrbx_domain {
	struct ibv_context *verbs;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	pthread_mutex_t     lock;
	struct vrbx_mr     *active;     /* open objects, by key */
	struct vrbx_mr     *mr_cache;   /* closed objects that kept their window */
	void               *rx_buf;
	struct ibv_mr      *rx_mr;
	size_t              rx_size;
	int                 atomic_cap;
};

struct vrbx_mr {
	struct vrbx_mr     *next;
	struct vrbx_domain *dom;
	struct ibv_mr      *mr;
	struct ibv_mw      *mw;
	uint32_t            key;
	void               *buf;
	void               *bounce;
	size_t              len;
	uint64_t            access;
	int                 copy;
};

static int vrbx_domain_init_qp(struct vrbx_domain *dom)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.send_cq          = dom->cq;
	attr.recv_cq          = dom->cq;
	attr.qp_type          = IBV_QPT_RC;
	attr.cap.max_send_wr  = 256;
	attr.cap.max_recv_wr  = 64;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.pd               = dom->pd;
	attr.comp_mask        = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags   = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
				IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;

	dom->qp = ibv_create_qp_ex(dom->verbs, &attr);
	if (!dom->qp)
		return -errno;
	dom->qpx = ibv_qp_to_qp_ex(dom->qp);
	return 0;
}

static int vrbx_domain_init_rx(struct vrbx_domain *dom, size_t size)
{
	dom->rx_buf = aligned_alloc(4096, size);
	if (!dom->rx_buf)
		return -FI_ENOMEM;
	dom->rx_size = size;
	dom->rx_mr = ibv_reg_mr(dom->pd, dom->rx_buf, size, IBV_ACCESS_LOCAL_WRITE); // OK: rdma-local-mr-management -- receive buffers, registered once for local access
	if (!dom->rx_mr) {
		free(dom->rx_buf);
		return -errno;
	}
	return 0;
}

/* The local MR of an object: its lkey is the desc for RMA, and windows bind to it. */
static struct ibv_mr *vrbx_reg_local(struct vrbx_domain *dom, void *buf, size_t len)
{
	return ibv_reg_mr(dom->pd, buf, len,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND); // BUG: rdma-local-mr-management -- its lkey addresses the provider's own RDMA WRITEs and its windows expose the buffer
}

static unsigned int vrbx_mw_access(uint64_t access)
{
	unsigned int flags = 0;

	if (access & FI_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	if (access & FI_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	if (access & FI_REMOTE_ATOMIC)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	return flags;
}

static inline uint32_t vrbx_next_key(const struct vrbx_mr *mr)
{
	return ibv_inc_rkey(mr->key);
}

/* Caller holds dom->lock. */
static int vrbx_wait_wr(struct vrbx_domain *dom, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(dom->cq, 1, &wc);
		if (n < 0)
			return -FI_EIO;
		if (n == 0 || wc.wr_id != wr_id)
			continue;
		return wc.status == IBV_WC_SUCCESS ? 0 : -FI_EIO;
	}
}

static int vrbx_key_insert(struct vrbx_domain *dom, struct vrbx_mr *mr)
{
	struct vrbx_mr *it;

	for (it = dom->active; it; it = it->next)
		if (it->key == mr->key)
			return -FI_EBUSY;
	mr->next = dom->active;
	dom->active = mr;
	return 0;
}

static void vrbx_key_remove(struct vrbx_domain *dom, struct vrbx_mr *mr)
{
	struct vrbx_mr **pp;

	for (pp = &dom->active; *pp; pp = &(*pp)->next) {
		if (*pp == mr) {
			*pp = mr->next;
			break;
		}
	}
	mr->next = NULL;
}

int vrbx_mr_reg(struct vrbx_domain *dom, void *buf, size_t len, uint64_t access,
		uint64_t flags, struct vrbx_mr **mr_out)
{
	struct ibv_mw_bind_info info;
	struct vrbx_mr *mr;
	void *reg_buf;
	int ret;

	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return -FI_ENOMEM;
	mr->dom    = dom;
	mr->buf    = buf;
	mr->len    = len;
	mr->access = access;
	mr->copy   = !!(flags & VRBX_MR_FLAG_COPY);
	if (mr->copy) {
		mr->bounce = malloc(len);
		if (!mr->bounce) {
			ret = -FI_ENOMEM;
			goto err_free;
		}
		memcpy(mr->bounce, buf, len);
	}
	reg_buf = mr->copy ? mr->bounce : buf;

	mr->mr = vrbx_reg_local(dom, reg_buf, len);
	if (!mr->mr) {
		ret = -errno;
		goto err_bounce;
	}

	mr->mw = ibv_alloc_mw(dom->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- window allocated to expose the object to the application's peer
	if (!mr->mw) {
		ret = -errno;
		goto err_dereg;
	}

	if ((access & FI_REMOTE_ATOMIC) && !dom->atomic_cap) {
		ret = -FI_EOPNOTSUPP;
		goto err_dereg; // BUG: rdma-mr-leak -- jumps past err_dealloc; the window is freed with the object, never deallocated
	}

	mr->key              = mr->mw->rkey;
	info.mr              = mr->mr;
	info.addr            = (uintptr_t)reg_buf;
	info.length          = len;
	info.mw_access_flags = vrbx_mw_access(access);

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)mr;
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the provider binds the window itself */
	ibv_wr_bind_mw(dom->qpx, mr->mw, mr->key, &info); // OK: rdma-rkey-reuse -- first bind of the window allocated above; no peer has seen its key
	ret = ibv_wr_complete(dom->qpx);
	if (!ret)
		ret = vrbx_wait_wr(dom, (uintptr_t)mr);
	if (!ret)
		ret = vrbx_key_insert(dom, mr);
	pthread_mutex_unlock(&dom->lock);
	if (ret)
		goto err_dealloc;

	*mr_out = mr;
	return FI_SUCCESS;

err_dealloc:
	ibv_dealloc_mw(mr->mw);
err_dereg:
	ibv_dereg_mr(mr->mr);
err_bounce:
	free(mr->bounce); // OK: rdma-invalidation-leak -- a window bound over it was deallocated at err_dealloc, which invalidates it
err_free:
	free(mr);
	return ret;
}

/* Fast path: reuse a closed object's window instead of allocating one. */
int vrbx_mr_reg_cached(struct vrbx_domain *dom, void *buf, size_t len,
		       uint64_t access, struct vrbx_mr **mr_out)
{
	struct ibv_mw_bind_info info;
	struct vrbx_mr *mr;
	int ret;

	pthread_mutex_lock(&dom->lock);
	mr = dom->mr_cache;
	if (mr)
		dom->mr_cache = mr->next;
	pthread_mutex_unlock(&dom->lock);
	if (!mr)
		return vrbx_mr_reg(dom, buf, len, access, 0, mr_out);

	mr->buf    = buf;
	mr->len    = len;
	mr->access = access;
	mr->copy   = 0;
	mr->bounce = NULL;
	mr->mr = vrbx_reg_local(dom, buf, len);
	if (!mr->mr) {
		ret = -errno;
		goto err_recache;
	}

	info.mr              = mr->mr;
	info.addr            = (uintptr_t)buf;
	info.length          = len;
	info.mw_access_flags = vrbx_mw_access(access);

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)mr;
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the provider binds the window itself */
	ibv_wr_bind_mw(dom->qpx, mr->mw, mr->key, &info); // BUG: rdma-rkey-reuse -- the cached window is bound again under the key its previous owner gave out
	ret = ibv_wr_complete(dom->qpx);
	if (!ret)
		ret = vrbx_wait_wr(dom, (uintptr_t)mr);
	if (!ret)
		ret = vrbx_key_insert(dom, mr);
	pthread_mutex_unlock(&dom->lock);
	if (ret) {
		ibv_dereg_mr(mr->mr);
		mr->mr = NULL;
		goto err_recache;
	}

	*mr_out = mr;
	return FI_SUCCESS;

err_recache:
	pthread_mutex_lock(&dom->lock);
	mr->next = dom->mr_cache;
	dom->mr_cache = mr;
	pthread_mutex_unlock(&dom->lock);
	return ret; // OK: rdma-mr-leak -- the local MR was deregistered and the window stays on the domain cache
}

/* The application moved its data: point the object at the new buffer. */
int vrbx_mr_rebind(struct vrbx_mr *mr, void *buf)
{
	struct vrbx_domain *dom = mr->dom;
	struct ibv_mw_bind_info info;
	struct ibv_mr *new_mr;
	uint32_t new_key;
	int ret;

	if (mr->copy)
		return -FI_EINVAL;

	new_mr = vrbx_reg_local(dom, buf, mr->len);
	if (!new_mr)
		return -errno;

	new_key              = vrbx_next_key(mr);
	info.mr              = new_mr;
	info.addr            = (uintptr_t)buf;
	info.length          = mr->len;
	info.mw_access_flags = vrbx_mw_access(mr->access);

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)mr;
	dom->qpx->wr_flags = 0;
	ibv_wr_local_inv(dom->qpx, mr->key);
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the provider binds the window itself */
	ibv_wr_bind_mw(dom->qpx, mr->mw, new_key, &info); // OK: rdma-rkey-reuse -- vrbx_next_key() returns ibv_inc_rkey() of the current key
	ret = ibv_wr_complete(dom->qpx);
	if (!ret)
		ret = vrbx_wait_wr(dom, (uintptr_t)mr);
	pthread_mutex_unlock(&dom->lock);
	if (ret) {
		ibv_dereg_mr(new_mr);
		return ret;
	}

	mr->key = new_key;
	mr->buf = buf;
	mr->mr  = new_mr; // BUG: rdma-mr-leak -- the MR of the previous buffer is overwritten without ibv_dereg_mr()
	return FI_SUCCESS;
}

/* fi_write(): the object's desc is the local side of the transfer. */
int vrbx_rma_write(struct vrbx_domain *dom, struct vrbx_mr *desc, size_t off,
		   size_t len, uint64_t raddr, uint32_t rkey, void *ctx)
{
	int ret;

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)ctx;
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(dom->qpx, rkey, raddr);
	ibv_wr_set_sge(dom->qpx, desc->mr->lkey,
		       (uintptr_t)desc->buf + off, (uint32_t)len);
	ret = ibv_wr_complete(dom->qpx);
	pthread_mutex_unlock(&dom->lock);
	return ret ? -FI_EIO : FI_SUCCESS;
}

int vrbx_mr_close(struct vrbx_mr *mr)
{
	struct vrbx_domain *dom = mr->dom;
	int ret;

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)mr;
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(dom->qpx, mr->key);
	ret = ibv_wr_complete(dom->qpx);
	if (!ret)
		ret = vrbx_wait_wr(dom, (uintptr_t)mr);
	if (ret) {
		pthread_mutex_unlock(&dom->lock);
		return ret;	/* key state unknown: keep everything */
	}
	vrbx_key_remove(dom, mr);

	ibv_dereg_mr(mr->mr);
	mr->mr = NULL;
	if (mr->copy) {
		memcpy(mr->buf, mr->bounce, mr->len);
		free(mr->bounce); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- freed after the signaled LOCAL_INV completed
		mr->bounce = NULL;
	}
	mr->next = dom->mr_cache;
	dom->mr_cache = mr; // OK: rdma-invalidation-leak -- the window was invalidated; only its allocation is cached
	pthread_mutex_unlock(&dom->lock);
	return FI_SUCCESS;
}

/* Close from the progress thread, which must not block on the CQ. */
int vrbx_mr_close_nowait(struct vrbx_mr *mr)
{
	struct vrbx_domain *dom = mr->dom;
	int ret;

	pthread_mutex_lock(&dom->lock);
	ibv_wr_start(dom->qpx);
	dom->qpx->wr_id    = (uintptr_t)mr | VRBX_WRID_ASYNC_INV;
	dom->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(dom->qpx, mr->key);
	ret = ibv_wr_complete(dom->qpx);
	if (!ret)
		vrbx_key_remove(dom, mr);
	pthread_mutex_unlock(&dom->lock);
	if (ret)
		return -FI_EIO;

	if (mr->copy) {
		memcpy(mr->buf, mr->bounce, mr->len);
		free(mr->bounce); // BUG: rdma-unmap-before-invalidate -- the LOCAL_INV was only posted; its completion is handled later by vrbx_mr_inv_done()
		mr->bounce = NULL;
	}
	return FI_SUCCESS;
}

/* Progress: completion of a LOCAL_INV posted by vrbx_mr_close_nowait(). */
void vrbx_mr_inv_done(struct vrbx_domain *dom, const struct ibv_wc *wc)
{
	struct vrbx_mr *mr = (struct vrbx_mr *)(uintptr_t)(wc->wr_id & ~VRBX_WRID_ASYNC_INV);

	if (wc->status != IBV_WC_SUCCESS) {
		/* key state unknown: park it where domain teardown deallocates it */
		pthread_mutex_lock(&dom->lock);
		mr->next = dom->active;
		dom->active = mr;
		pthread_mutex_unlock(&dom->lock);
		return;
	}

	ibv_dereg_mr(mr->mr);
	mr->mr = NULL;
	pthread_mutex_lock(&dom->lock);
	mr->next = dom->mr_cache;
	dom->mr_cache = mr; // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- recycled from the successful completion of its LOCAL_INV
	pthread_mutex_unlock(&dom->lock);
}

void vrbx_domain_close(struct vrbx_domain *dom)
{
	struct vrbx_mr *mr, *next;

	for (mr = dom->active; mr; mr = next) {
		next = mr->next;
		if (mr->copy)
			free(mr->bounce); // BUG: rdma-invalidation-leak -- the window over the bounce buffer is still bound; it is deallocated only below
		ibv_dealloc_mw(mr->mw);
		ibv_dereg_mr(mr->mr);
		free(mr);
	}
	dom->active = NULL;

	for (mr = dom->mr_cache; mr; mr = next) {
		next = mr->next;
		ibv_dealloc_mw(mr->mw);
		free(mr);
	}
	dom->mr_cache = NULL;

	free(dom->rx_buf); // OK: rdma-invalidation-leak -- local-only registration, no key was ever handed out
	ibv_dereg_mr(dom->rx_mr);
	ibv_destroy_qp(dom->qp);
}

int vrbx_domain_open(struct vrbx_domain *dom, int atomic_cap)
{
	int ret;

	pthread_mutex_init(&dom->lock, NULL);
	dom->active = dom->mr_cache = NULL;
	dom->atomic_cap = atomic_cap;
	ret = vrbx_domain_init_qp(dom);
	if (ret)
		return ret;
	ret = vrbx_domain_init_rx(dom, 64 * 4096);
	if (ret)
		ibv_destroy_qp(dom->qp);
	return ret;
}
