/*
 * sc_gpu_bufmgr.c - gbm: GPU-direct buffer manager for a tensor exchange
 * service.
 *
 * Device buffers are allocated by the GPU runtime, exported as dma-buf file
 * descriptors and registered with ibv_reg_dmabuf_mr(); when the kernel or
 * provider lacks dma-buf support the manager falls back to a peer-memory
 * registration of the device pointer. A buffer's descriptor (address, rkey)
 * is handed to peers, who RDMA WRITE/READ it directly. Outgoing tensors are
 * written with RDMA WRITE from a small registration cache; small control
 * messages are sent from host memory through the implicit ODP MR when the
 * device has one. Only InfiniBand/RoCE devices are used (GPUDirect RDMA).
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-rkey-reuse,
 *   rdma-send-queue-undersized, rdma-send-queue-manual-factor,
 *   rdma-unsignaled-send-starvation, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked -- not reviewed for this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define GBM_SQ_DEPTH     2048
#define GBM_RQ_DEPTH     256
#define GBM_INLINE       256
#define GBM_CACHE_SLOTS  128
#define GBM_STAGING_LEN  (4u << 20)

enum { GBM_F_RECV = 1, GBM_F_WRITABLE = 2, GBM_F_ATOMIC = 4 };

/* GPU runtime shim */
int gpu_mem_alloc(size_t len, uint64_t *handle, void **dptr);
int gpu_mem_export_dmabuf(uint64_t handle, int *fd, uint64_t *offset);
void gpu_mem_free(uint64_t handle);

struct gbm_desc {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

struct gbm_buf {
	uint64_t         handle;
	void            *dptr;
	size_t           len;
	unsigned         flags;
	struct ibv_mr   *mr;
	struct gbm_desc *desc;
};

struct gbm_cache_ent {
	void          *ptr;
	size_t         len;
	struct ibv_mr *mr;
	unsigned long  last_use;
};

struct gbm_mgr {
	struct ibv_context    *ctx;
	struct ibv_pd         *pd;
	struct ibv_cq         *cq;
	struct ibv_qp         *qp;
	struct ibv_device_attr dattr;
	struct ibv_mr         *odp_mr;
	void                  *staging;
	struct ibv_mr         *staging_mr;
	unsigned long          tick;
	struct gbm_cache_ent   cache[GBM_CACHE_SLOTS];
};

struct ibv_context *gbm_open_device(const char *want)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list)
		return NULL;
	for (i = 0; i < n; i++) {
		if (list[i]->transport_type != IBV_TRANSPORT_IB)
			continue;	/* no GPUDirect over iWARP */
		if (want && strcmp(ibv_get_device_name(list[i]), want))
			continue;
		ctx = ibv_open_device(list[i]);
		if (ctx)
			break;
	}
	ibv_free_device_list(list);
	return ctx;
}

struct gbm_buf *gbm_buf_alloc(struct gbm_mgr *m, size_t len, unsigned flags)
{
	struct gbm_buf *b;
	uint64_t off;
	int fd, access;

	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	if (gpu_mem_alloc(len, &b->handle, &b->dptr))
		goto err_free;
	b->len = len;
	b->flags = flags;

	access = IBV_ACCESS_REMOTE_READ;
	if (flags & GBM_F_RECV)
		access |= IBV_ACCESS_LOCAL_WRITE;
	if (flags & GBM_F_WRITABLE)
		access |= IBV_ACCESS_REMOTE_WRITE;
	if (flags & GBM_F_ATOMIC)
		access |= IBV_ACCESS_REMOTE_ATOMIC;

	if (gpu_mem_export_dmabuf(b->handle, &fd, &off) == 0) {
		/* OK: rdma-remote-access-overbroad -- the rkey goes into the buffer's descriptor for peers */
		b->mr = ibv_reg_dmabuf_mr(m->pd, off, len, (uintptr_t)b->dptr, fd, access); /* BUG: rdma-access-flags-invalid, rdma-local-mr-management -- REMOTE_WRITE/ATOMIC without LOCAL_WRITE unless GBM_F_RECV; key exposed to peers */
		close(fd);
	}
	if (!b->mr) {
		/* no dma-buf support: register the device pointer via peer memory */
		/* OK: rdma-access-flags-invalid, rdma-mr-leak -- LOCAL_WRITE added; b->mr held nothing here */
		b->mr = ibv_reg_mr(m->pd, b->dptr, len, access | IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- key exposed to peers */
		if (!b->mr)
			goto err_gpu;
	}

	b->desc = calloc(1, sizeof(*b->desc));
	if (!b->desc)
		goto err_gpu; /* BUG: rdma-mr-leak -- the registration is dropped with b */
	b->desc->addr = htobe64((uintptr_t)b->dptr);
	b->desc->rkey = htobe32(b->mr->rkey);
	b->desc->len = htobe32((uint32_t)len);
	return b;

err_gpu:
	gpu_mem_free(b->handle);
err_free:
	free(b);
	return NULL;
}

int gbm_buf_resize(struct gbm_mgr *m, struct gbm_buf *b, size_t len)
{
	struct ibv_mr *nmr;
	uint64_t handle, off;
	void *dptr;
	int fd;

	if (len <= b->len)
		return 0;
	if (gpu_mem_alloc(len, &handle, &dptr))
		return -ENOMEM;
	if (gpu_mem_export_dmabuf(handle, &fd, &off)) {
		gpu_mem_free(handle);
		return -EOPNOTSUPP;
	}
	nmr = ibv_reg_dmabuf_mr(m->pd, off, len, (uintptr_t)dptr, fd,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_WRITE); /* BUG: rdma-local-mr-management -- the new key replaces the one in the peer descriptor */
	close(fd);
	if (!nmr) {
		gpu_mem_free(handle);
		return -errno;
	}
	gpu_mem_free(b->handle);
	b->handle = handle;
	b->dptr = dptr;
	b->len = len;
	b->mr = nmr; /* BUG: rdma-mr-leak -- the old registration is overwritten without ibv_dereg_mr */
	b->desc->addr = htobe64((uintptr_t)dptr);
	b->desc->rkey = htobe32(nmr->rkey);
	b->desc->len = htobe32((uint32_t)len);
	return 0;
}

void gbm_buf_free(struct gbm_buf *b)
{
	ibv_dereg_mr(b->mr);
	gpu_mem_free(b->handle);
	free(b->desc);
	free(b);
}

static struct ibv_mr *gbm_cache_get(struct gbm_mgr *m, void *ptr, size_t len)
{
	struct gbm_cache_ent *e, *victim = &m->cache[0];
	int i;

	for (i = 0; i < GBM_CACHE_SLOTS; i++) {
		e = &m->cache[i];
		if (e->mr && e->ptr == ptr && e->len >= len) {
			e->last_use = ++m->tick;
			return e->mr;
		}
		if (!e->mr || e->last_use < victim->last_use)
			victim = e;
	}
	if (victim->mr)
		ibv_dereg_mr(victim->mr); /* OK: rdma-registration-in-datapath -- cache eviction on a miss */
	/* OK: rdma-registration-in-datapath -- registered only on a cache miss */
	victim->mr = ibv_reg_mr(m->pd, ptr, len, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- source of the manager's own RDMA WRITEs */
	if (!victim->mr)
		return NULL;
	victim->ptr = ptr;
	victim->len = len;
	victim->last_use = ++m->tick;
	return victim->mr;
}

int gbm_send_tensor(struct gbm_mgr *m, void *dptr, size_t len,
		    uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge;
	struct ibv_mr *mr;

	mr = gbm_cache_get(m, dptr, len);
	if (!mr)
		return -ENOMEM;
	sge.addr = (uintptr_t)dptr;
	sge.length = (uint32_t)len;
	sge.lkey = mr->lkey;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(m->qp, &wr, &bad);
}

static int gbm_wait_one(struct gbm_mgr *m)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(m->cq, 1, &wc);
	} while (n == 0);
	return (n < 0 || wc.status != IBV_WC_SUCCESS) ? -EIO : 0;
}

int gbm_send_small(struct gbm_mgr *m, void *msg, size_t len)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_mr *mr = NULL;
	struct ibv_sge sge;
	int rc;

	if (m->odp_mr) {
		sge.lkey = m->odp_mr->lkey;
	} else {
		mr = ibv_reg_mr(m->pd, msg, len, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-registration-in-datapath, rdma-local-mr-management -- registers the caller's message for every send */
		if (!mr)
			return -errno;
		sge.lkey = mr->lkey;
	}
	sge.addr = (uintptr_t)msg;
	sge.length = (uint32_t)len;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(m->qp, &wr, &bad))
		return -errno; /* BUG: rdma-mr-leak -- the per-message MR is not deregistered when the post fails */
	rc = gbm_wait_one(m);
	if (mr)
		ibv_dereg_mr(mr); /* BUG: rdma-registration-in-datapath -- deregistered after every send */
	return rc;
}

/* Pull a peer's tensor straight into device memory. */
int gbm_pull(struct gbm_mgr *m, struct gbm_buf *dst, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge = { (uintptr_t)dst->dptr, (uint32_t)dst->len, dst->mr->lkey };

	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(m->qp, &wr, &bad); /* OK: rdma-access-flags-transport -- gbm_open_device() only opens InfiniBand/RoCE devices */
}

int gbm_pull_host(struct gbm_mgr *m, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_sge sge = { (uintptr_t)m->staging, len, m->staging_mr->lkey };

	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(m->qp, &wr, &bad)) /* OK: rdma-access-flags-transport -- InfiniBand-only manager */
		return -errno;
	return gbm_wait_one(m);
}

int gbm_mgr_init(struct gbm_mgr *m, struct ibv_context *ctx)
{
	struct ibv_device_attr_ex ex = {0};
	struct ibv_qp_init_attr init = {0};
	int sflags = IBV_ACCESS_LOCAL_WRITE;

	memset(m, 0, sizeof(*m));
	m->ctx = ctx;
	if (ibv_query_device_ex(ctx, NULL, &ex))
		return -errno;
	m->dattr = ex.orig_attr;
	m->pd = ibv_alloc_pd(ctx);
	if (!m->pd)
		return -ENOMEM;

	if (ex.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT) {
		/* BUG: rdma-remote-access-overbroad -- implicit ODP MR with remote rights covers the whole address space */
		m->odp_mr = ibv_reg_mr(m->pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE); /* OK: rdma-local-mr-management -- registered once; only its lkey is used, for SENDs */
		if (!m->odp_mr)
			goto err_pd;
	}

	m->staging = aligned_alloc(4096, GBM_STAGING_LEN);
	if (!m->staging)
		goto err_odp;
	if (ctx->device->node_type == IBV_NODE_RNIC)
		sflags |= IBV_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-transport -- iWARP rule for the READ sink repeated inline */
	/* OK: rdma-remote-access-overbroad -- REMOTE_WRITE only for an RDMA READ sink */
	m->staging_mr = ibv_reg_mr(m->pd, m->staging, GBM_STAGING_LEN, sflags); /* BUG: rdma-local-mr-management -- sink of the manager's own RDMA READ */
	if (!m->staging_mr)
		goto err_staging;

	m->cq = ibv_create_cq(ctx, GBM_SQ_DEPTH + GBM_RQ_DEPTH, NULL, NULL, 0);
	if (!m->cq)
		goto err_smr;
	init.send_cq = m->cq;
	init.recv_cq = m->cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = GBM_SQ_DEPTH > m->dattr.max_qp_wr ? m->dattr.max_qp_wr : GBM_SQ_DEPTH; /* OK: rdma-queue-cap-unchecked -- clamped to max_qp_wr */
	init.cap.max_recv_wr = GBM_RQ_DEPTH;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = GBM_INLINE; /* BUG: rdma-queue-cap-unchecked -- 256 bytes of inline data, never checked or read back */
	m->qp = ibv_create_qp(m->pd, &init);
	if (!m->qp)
		goto err_cq;
	return 0;

err_cq:
	ibv_destroy_cq(m->cq);
err_smr:
	ibv_dereg_mr(m->staging_mr);
err_staging:
	free(m->staging);
err_odp:
	if (m->odp_mr)
		ibv_dereg_mr(m->odp_mr);
err_pd:
	ibv_dealloc_pd(m->pd);
	return -ENOMEM; /* OK: rdma-mr-leak -- the unwinding releases the staging and ODP MRs */
}

void gbm_mgr_destroy(struct gbm_mgr *m)
{
	int i;

	ibv_destroy_qp(m->qp);
	ibv_destroy_cq(m->cq);
	for (i = 0; i < GBM_CACHE_SLOTS; i++)
		if (m->cache[i].mr)
			ibv_dereg_mr(m->cache[i].mr);
	ibv_dereg_mr(m->staging_mr);
	free(m->staging);
	if (m->odp_mr)
		ibv_dereg_mr(m->odp_mr);
	ibv_dealloc_pd(m->pd);
}
