/*
 * tc_gpu_bufmgr.c - buffer manager of a GPU-direct RDMA transport.
 *
 * Device memory comes from the GPU allocator as a dma-buf and is registered
 * with ibv_reg_dmabuf_mr(); host bounce pools are registered with
 * ibv_reg_mr_iova2() under a zero-based IOVA so that peers address every
 * pool by offset.  Pools hand out fixed-size buffers and exported buffers
 * travel as (iova, rkey, len) wire descriptors.  Completion flags live in
 * device memory that peers write and bump with atomics.  Host pointers
 * handed to gbm_put_host() go through a small pin cache; gbm_put_host_iov()
 * is the uncached path for buffers the caller frees right after the put.
 *
 * Problems: the device scratch area is registered with remote read nobody
 * gets a key for; device pool creation frees a pool with its MR still
 * registered when the pool table is full; flag setup leaks its MR when the
 * descriptor cannot be allocated; the iov path registers (and deregisters)
 * every element per put.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- only registration, its placement and its rights are annotated
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <infiniband/verbs.h>

#define GBM_MAX_POOLS	16
#define GBM_PIN_SLOTS	32
#define GBM_MAX_IOV	8
#define GBM_SCRATCH_LEN	(8u << 20)
#define GBM_FLAGS_LEN	4096

struct gpu_alloc_ops {
	int	(*alloc)(void *gdev, size_t len, int *dmabuf_fd, uint64_t *offset, uint64_t *dev_va);
	void	(*release)(void *gdev, uint64_t dev_va);
};

struct gbm_pool {
	int		on_device;
	size_t		buf_size;
	unsigned int	nbufs;
	int		fd;
	uint64_t	dev_va;
	void		*host;
	struct ibv_mr	*mr;
	unsigned char	*busy;
};

struct gbm_pin {
	uintptr_t	start;
	size_t		len;
	struct ibv_mr	*mr;
	uint64_t	stamp;
	int		refs;
};

struct gbm_wire_desc {
	uint64_t	iova;
	uint32_t	rkey;
	uint32_t	len;
};

struct gbm_put_op {
	int		niov;
	struct ibv_mr	*mrs[GBM_MAX_IOV];
	struct gbm_pin	*pin;
};

struct gbm_mgr {
	struct ibv_pd			*pd;
	struct ibv_cq			*cq;
	struct ibv_qp			*qp;
	const struct gpu_alloc_ops	*gops;
	void				*gdev;
	int				use_odp;
	struct gbm_pool			*pools[GBM_MAX_POOLS];
	int				npools;
	struct gbm_pin			pins[GBM_PIN_SLOTS];
	uint64_t			clock;
	uint64_t			scratch_va;
	struct ibv_mr			*scratch_mr;
	uint64_t			flags_va;
	struct ibv_mr			*flags_mr;
	struct gbm_wire_desc		*flags_desc;
};

/* register a dma-buf range; every pool is zero-based */
static struct ibv_mr *gbm_reg_dmabuf(struct gbm_mgr *m, int fd, uint64_t off,
				     size_t len, int access)
{
	return ibv_reg_dmabuf_mr(m->pd, off, len, 0, fd, access); // BUG: rdma-local-mr-management -- device memory registered by the transport so that its key can be exported
}

static void gbm_pool_destroy(struct gbm_mgr *m, struct gbm_pool *p)
{
	ibv_dereg_mr(p->mr);
	if (p->on_device)
		m->gops->release(m->gdev, p->dev_va);
	else
		free(p->host);
	free(p->busy);
	free(p);
}

struct gbm_pool *gbm_pool_create_device(struct gbm_mgr *m, size_t buf_size,
					unsigned int nbufs, int exported)
{
	size_t total = buf_size * nbufs;
	struct gbm_pool *p;
	uint64_t off;
	int access = IBV_ACCESS_LOCAL_WRITE;

	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->busy = calloc(nbufs, 1);
	if (!p->busy)
		goto out_free;
	if (m->gops->alloc(m->gdev, total, &p->fd, &off, &p->dev_va))
		goto out_free;
	p->on_device = 1;
	p->buf_size = buf_size;
	p->nbufs = nbufs;

	if (exported)
		access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	p->mr = gbm_reg_dmabuf(m, p->fd, off, total, access); // OK: rdma-remote-access-overbroad -- remote rights only for exported pools, whose keys gbm_export() sends
	if (!p->mr)
		goto out_gpu;
	if (m->npools == GBM_MAX_POOLS)
		goto out_gpu; // BUG: rdma-mr-leak -- out_gpu releases the device memory and frees the pool but not p->mr
	m->pools[m->npools++] = p;
	return p;

out_gpu:
	m->gops->release(m->gdev, p->dev_va);
out_free:
	free(p->busy);
	free(p);
	return NULL;
}

struct gbm_pool *gbm_pool_create_host(struct gbm_mgr *m, size_t buf_size, unsigned int nbufs)
{
	size_t total = buf_size * nbufs;
	unsigned int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			      IBV_ACCESS_RELAXED_ORDERING;
	struct gbm_pool *p;

	if (m->npools == GBM_MAX_POOLS)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->busy = calloc(nbufs, 1);
	p->host = aligned_alloc(4096, total);
	if (!p->busy || !p->host)
		goto out;
	p->buf_size = buf_size;
	p->nbufs = nbufs;
	if (m->use_odp)
		access |= IBV_ACCESS_ON_DEMAND;

	/* BUG: rdma-local-mr-management -- bounce pool that peers write into with the exported key */
	p->mr = ibv_reg_mr_iova2(m->pd, p->host, total, 0, access); // OK: rdma-remote-access-overbroad -- peers write bounce buffers with the key from gbm_export(); ODP, when on, covers this one pool
	if (!p->mr)
		goto out;
	m->pools[m->npools++] = p;
	return p;

out:
	free(p->host);
	free(p->busy);
	free(p);
	return NULL;
}

int gbm_export(struct gbm_pool *p, unsigned int idx, struct gbm_wire_desc *d)
{
	if (idx >= p->nbufs || !p->busy[idx])
		return -EINVAL;
	d->iova = htobe64((uint64_t)idx * p->buf_size);
	d->rkey = htobe32(p->mr->rkey);
	d->len = htobe32((uint32_t)p->buf_size);
	return 0;
}

int gbm_scratch_init(struct gbm_mgr *m)
{
	uint64_t off;
	int fd;

	if (m->gops->alloc(m->gdev, GBM_SCRATCH_LEN, &fd, &off, &m->scratch_va))
		return -ENOMEM;
	/* reductions are staged here before they are sent */
	/* OK: rdma-local-mr-management -- registered once; its lkey only sources sends */
	m->scratch_mr = ibv_reg_dmabuf_mr(m->pd, off, GBM_SCRATCH_LEN, m->scratch_va, fd, // BUG: rdma-remote-access-overbroad -- remote read on the scratch area, whose rkey never leaves the manager
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!m->scratch_mr) {
		m->gops->release(m->gdev, m->scratch_va);
		return -errno;
	}
	return 0;
}

int gbm_send_scratch(struct gbm_mgr *m, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = {
		.addr = m->scratch_va + off,
		.length = len,
		.lkey = m->scratch_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad;

	if (off + len > GBM_SCRATCH_LEN)
		return -EINVAL;
	return ibv_post_send(m->qp, &wr, &bad);
}

int gbm_flags_init(struct gbm_mgr *m)
{
	struct gbm_wire_desc *desc;
	struct ibv_mr *mr;
	uint64_t off;
	int fd;

	if (m->gops->alloc(m->gdev, GBM_FLAGS_LEN, &fd, &off, &m->flags_va))
		return -ENOMEM;
	/* OK: rdma-remote-access-overbroad -- peers signal through these flags with the key in flags_desc */
	mr = gbm_reg_dmabuf(m, fd, off, GBM_FLAGS_LEN,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr) {
		m->gops->release(m->gdev, m->flags_va);
		return -errno;
	}
	desc = calloc(1, sizeof(*desc));
	if (!desc) {
		m->gops->release(m->gdev, m->flags_va);
		return -ENOMEM; // BUG: rdma-mr-leak -- the flags MR returned by gbm_reg_dmabuf() is still registered
	}
	desc->iova = 0;
	desc->rkey = htobe32(mr->rkey);
	desc->len = htobe32(GBM_FLAGS_LEN);
	m->flags_mr = mr;
	m->flags_desc = desc;
	return 0;
}

static struct gbm_pin *gbm_pin_get(struct gbm_mgr *m, void *ptr, size_t len)
{
	uintptr_t s = (uintptr_t)ptr;
	struct gbm_pin *e, *victim = NULL;
	struct ibv_mr *mr;
	int i;

	for (i = 0; i < GBM_PIN_SLOTS; i++) {
		e = &m->pins[i];
		if (e->mr && e->start <= s && s + len <= e->start + e->len) {
			e->refs++;
			e->stamp = ++m->clock;
			return e;
		}
		if (!e->refs && (!victim || e->stamp < victim->stamp))
			victim = e;
	}
	if (!victim)
		return NULL;
	/* BUG: rdma-local-mr-management -- the pinned lkey addresses the source of the transport's RDMA WRITE */
	mr = ibv_reg_mr_iova2(m->pd, ptr, len, s, IBV_ACCESS_LOCAL_WRITE); // OK: rdma-registration-in-datapath -- registers on a miss of the pin cache only
	if (!mr)
		return NULL;
	if (victim->mr)
		ibv_dereg_mr(victim->mr); // OK: rdma-mr-leak, rdma-registration-in-datapath -- the evicted pin is released before its slot is refilled, on a miss only
	victim->mr = mr;
	victim->start = s;
	victim->len = len;
	victim->refs = 1;
	victim->stamp = ++m->clock;
	return victim;
}

static int gbm_post_write(struct gbm_mgr *m, struct gbm_put_op *op, struct ibv_sge *sgl,
			  int nsge, const struct gbm_wire_desc *dst)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)op;
	wr.sg_list = sgl;
	wr.num_sge = nsge;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = be64toh(dst->iova);
	wr.wr.rdma.rkey = be32toh(dst->rkey);
	return ibv_post_send(m->qp, &wr, &bad);
}

int gbm_put_host(struct gbm_mgr *m, struct gbm_put_op *op, void *ptr, size_t len,
		 const struct gbm_wire_desc *dst)
{
	struct ibv_sge sge;

	op->pin = gbm_pin_get(m, ptr, len);
	if (!op->pin)
		return -ENOMEM;
	op->niov = 0;
	sge.addr = (uintptr_t)ptr;
	sge.length = (uint32_t)len;
	sge.lkey = op->pin->mr->lkey;
	if (gbm_post_write(m, op, &sge, 1, dst)) {
		op->pin->refs--;
		return -EIO;
	}
	return 0;
}

/* uncached put for buffers the caller releases right after completion */
int gbm_put_host_iov(struct gbm_mgr *m, struct gbm_put_op *op, const struct iovec *iov,
		     int iovcnt, const struct gbm_wire_desc *dst)
{
	struct ibv_sge sgl[GBM_MAX_IOV];
	int i, ret = -ENOMEM;

	if (iovcnt > GBM_MAX_IOV)
		return -E2BIG;
	op->pin = NULL;
	for (i = 0; i < iovcnt; i++) {
		/* BUG: rdma-local-mr-management -- each element is registered for this put only */
		op->mrs[i] = ibv_reg_mr_iova2(m->pd, iov[i].iov_base, iov[i].iov_len, // BUG: rdma-registration-in-datapath -- one registration per scatter element per put
					      (uintptr_t)iov[i].iov_base, IBV_ACCESS_LOCAL_WRITE);
		if (!op->mrs[i])
			goto unwind;
		sgl[i].addr = (uintptr_t)iov[i].iov_base;
		sgl[i].length = (uint32_t)iov[i].iov_len;
		sgl[i].lkey = op->mrs[i]->lkey;
	}
	op->niov = iovcnt;
	if (gbm_post_write(m, op, sgl, iovcnt, dst) == 0)
		return 0;
	ret = -EIO;

unwind:
	while (i--) {
		/* OK: rdma-mr-leak -- releases every element registered so far, all of them after a failed post */
		ibv_dereg_mr(op->mrs[i]); // BUG: rdma-registration-in-datapath -- per-put deregistration on the unwinding path
	}
	op->niov = 0;
	return ret;
}

void gbm_handle_wc(struct gbm_mgr *m, struct ibv_wc *wc)
{
	struct gbm_put_op *op = (struct gbm_put_op *)(uintptr_t)wc->wr_id;
	int i;

	(void)m;
	if (!op)
		return;		/* scratch sends carry no op */
	if (op->pin) {
		op->pin->refs--;
		op->pin = NULL;
	}
	for (i = 0; i < op->niov; i++)
		ibv_dereg_mr(op->mrs[i]); // BUG: rdma-registration-in-datapath -- the per-put registrations are released in the completion handler
	op->niov = 0;
}

void gbm_mgr_destroy(struct gbm_mgr *m)
{
	int i;

	for (i = 0; i < m->npools; i++)
		gbm_pool_destroy(m, m->pools[i]);
	for (i = 0; i < GBM_PIN_SLOTS; i++)
		if (m->pins[i].mr)
			ibv_dereg_mr(m->pins[i].mr);
	if (m->flags_mr) {
		ibv_dereg_mr(m->flags_mr);
		m->gops->release(m->gdev, m->flags_va);
	}
	free(m->flags_desc);
	if (m->scratch_mr) {
		ibv_dereg_mr(m->scratch_mr);
		m->gops->release(m->gdev, m->scratch_va);
	}
}
