/*
 * vrb_mr_cache.c - memory registration of a verbs fabric provider.
 *
 * fi_mr_reg() registrations are translated from FI_* access bits to verbs
 * access flags; the rkey is returned to the application through
 * fi_mr_key() and exchanged out of band.  When the domain has a
 * registration cache, cached regions are registered once with every right
 * and stay registered until eviction.  Device (HMEM) buffers that the NIC
 * cannot reach directly are staged through a registered host bounce
 * buffer.  Send and RMA paths accept a NULL descriptor and look the
 * buffer up in the cache.
 *
 * The endpoint uses selective completions: a work request is signaled when
 * the application asked for a completion or when too many unsignaled ones
 * have accumulated.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

/* subset of rdma/fabric.h used here */
#define FI_READ             (1ULL << 8)
#define FI_WRITE            (1ULL << 9)
#define FI_RECV             (1ULL << 10)
#define FI_SEND             (1ULL << 11)
#define FI_REMOTE_READ      (1ULL << 12)
#define FI_REMOTE_WRITE     (1ULL << 13)
#define FI_COMPLETION       (1ULL << 24)
#define FI_EAGAIN           EAGAIN
#define FI_HMEM_SYSTEM      0

struct ofi_mr_entry {
	void               *iov_base;
	size_t              iov_len;
	int                 iface;
	char                data[];     /* struct vrb_mem_desc */
};

struct vrb_domain {
	struct ibv_context *verbs;
	struct ibv_pd      *pd;
	void               *cache;      /* NULL when FI_MR_CACHE_MAX_COUNT=0 */
};

struct vrb_mem_desc {
	struct vrb_domain  *domain;
	struct ibv_mr      *mr;
	void               *bounce;     /* HMEM staging buffer */
	uint64_t            mr_key;
};

struct vrb_context {
	struct ibv_mr      *tmp_mr;     /* per-operation registration */
	void               *app_ctx;
};

struct vrb_ep {
	struct vrb_domain  *domain;
	struct ibv_qp      *qp;
	uint32_t            inject_size;
	uint32_t            unsignaled_cnt;
	uint32_t            max_unsignaled;
};

struct ofi_mr_entry *ofi_mr_cache_search(void *cache, const void *buf, size_t len);
int ofi_mr_map_insert(struct vrb_domain *domain, struct vrb_mem_desc *md, uint64_t *key);
int vrb_hmem_copy_from(int iface, void *dst, const void *src, size_t len);
int vrb_hmem_monitor(struct vrb_domain *domain, struct ofi_mr_entry *entry);

static int vrb_mr_ofi2ibv_access(uint64_t ofi_access, struct vrb_domain *domain)
{
	int ibv_access = 0;

	if (ofi_access & FI_RECV)
		ibv_access |= IBV_ACCESS_LOCAL_WRITE;
	/* iWARP requires remote write on the sink of an RDMA read */
	if (ofi_access & FI_READ) {
		ibv_access |= IBV_ACCESS_LOCAL_WRITE;
		if (domain->verbs->device->transport_type == IBV_TRANSPORT_IWARP)
			ibv_access |= IBV_ACCESS_REMOTE_WRITE;
	}
	if (ofi_access & FI_REMOTE_READ)
		ibv_access |= IBV_ACCESS_REMOTE_READ;
	if (ofi_access & FI_REMOTE_WRITE)
		ibv_access |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
	return ibv_access;
}

int vrb_mr_reg_common(struct vrb_domain *domain, const void *buf, size_t len,
		      uint64_t access, int iface, struct vrb_mem_desc **out)
{
	struct vrb_mem_desc *md;
	void *reg_buf = (void *)buf;
	int ibv_access = vrb_mr_ofi2ibv_access(access, domain);
	int ret;

	md = calloc(1, sizeof(*md));
	if (!md)
		return -ENOMEM;
	md->domain = domain;
	if (iface != FI_HMEM_SYSTEM) {
		md->bounce = aligned_alloc(4096, len);
		if (!md->bounce) {
			free(md);
			return -ENOMEM;
		}
		vrb_hmem_copy_from(iface, md->bounce, buf, len);
		reg_buf = md->bounce;
	}

	// BUG: rdma-local-mr-management -- application memory registered by hand; its rkey goes out through fi_mr_key()
	md->mr = ibv_reg_mr(domain->pd, reg_buf, len, ibv_access);	// BUG: rdma-access-flags-invalid, rdma-access-flags-transport -- FI_REMOTE_WRITE alone yields REMOTE_WRITE|REMOTE_ATOMIC without LOCAL_WRITE; iWARP rights picked inline
	if (!md->mr) {
		ret = -errno;
		free(md->bounce);
		free(md);
		return ret;
	}

	ret = ofi_mr_map_insert(domain, md, &md->mr_key);
	if (ret) {
		/* OK: rdma-mr-leak, rdma-invalidation-leak -- deregistered before the descriptor and the bounce buffer go */
		ibv_dereg_mr(md->mr);
		free(md->bounce);
		free(md);
		return ret;
	}
	*out = md;
	return 0;
}

uint64_t vrb_mr_key(const struct vrb_mem_desc *md)
{
	return md->mr->rkey;
}

int vrb_mr_close(struct vrb_mem_desc *md)
{
	int ret;

	if (md->bounce) {
		free(md->bounce);	// BUG: rdma-invalidation-leak -- the bounce buffer is freed while its registration, with remote rights, is still alive
		md->bounce = NULL;
	}
	ret = ibv_dereg_mr(md->mr);
	if (ret)
		return -ret;
	free(md);	/* OK: rdma-mr-leak -- the descriptor goes only after its MR is deregistered */
	return 0;
}

/* ofi_mr_cache add_region callback: entry->data is the descriptor */
int vrb_mr_cache_add_region(struct vrb_domain *domain, struct ofi_mr_entry *entry)
{
	struct vrb_mem_desc *md = (struct vrb_mem_desc *)entry->data;

	md->domain = domain;
	/* OK: rdma-remote-access-overbroad, rdma-access-flags-invalid -- cached keys are handed out by fi_mr_key(); LOCAL_WRITE is included */
	md->mr = ibv_reg_mr(domain->pd, entry->iov_base, entry->iov_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ); // BUG: rdma-local-mr-management -- cache regions are exposed to peers with every right
	if (!md->mr)
		return -errno;
	if (entry->iface != FI_HMEM_SYSTEM && vrb_hmem_monitor(domain, entry))
		return -EINVAL;		// BUG: rdma-mr-leak -- md->mr was just registered and the cache drops the entry on this error
	md->mr_key = md->mr->rkey;
	return 0;
}

void vrb_mr_cache_delete_region(struct vrb_domain *domain, struct ofi_mr_entry *entry)
{
	struct vrb_mem_desc *md = (struct vrb_mem_desc *)entry->data;

	(void)domain;
	if (md->mr)
		ibv_dereg_mr(md->mr);
	md->mr = NULL;
}

static inline unsigned int vrb_send_flags(struct vrb_ep *ep, uint64_t flags)
{
	/* OK: rdma-unsignaled-send-starvation -- the unsignaled count advances on every post */
	if ((flags & FI_COMPLETION) || ++ep->unsignaled_cnt >= ep->max_unsignaled) {
		ep->unsignaled_cnt = 0;
		return IBV_SEND_SIGNALED;
	}
	return 0;
}

ssize_t vrb_send_buf(struct vrb_ep *ep, const void *buf, size_t len, void *desc,
		     struct vrb_context *ctx, uint64_t flags)
{
	struct vrb_mem_desc *md = desc;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len };
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ofi_mr_entry *entry;
	int ret;

	ctx->tmp_mr = NULL;
	if (len <= ep->inject_size) {
		sge.lkey = 0;
		wr.send_flags = IBV_SEND_INLINE;
	} else if (md) {
		sge.lkey = md->mr->lkey;
	} else if (ep->domain->cache &&
		   (entry = ofi_mr_cache_search(ep->domain->cache, buf, len))) {
		/* OK: rdma-registration-in-datapath -- the cache registers on a miss and keeps the region */
		sge.lkey = ((struct vrb_mem_desc *)entry->data)->mr->lkey;
	} else {
		// BUG: rdma-registration-in-datapath, rdma-local-mr-management -- without a cache every send registers its buffer
		ctx->tmp_mr = ibv_reg_mr(ep->domain->pd, (void *)buf, len, IBV_ACCESS_LOCAL_WRITE);
		if (!ctx->tmp_mr)
			return -errno;
		sge.lkey = ctx->tmp_mr->lkey;
	}

	wr.wr_id = (uintptr_t)ctx;
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags |= vrb_send_flags(ep, flags | (ctx->tmp_mr ? FI_COMPLETION : 0));
	ret = ibv_post_send(ep->qp, &wr, &bad);
	if (ret) {
		if (ctx->tmp_mr)
			ibv_dereg_mr(ctx->tmp_mr);	// BUG: rdma-registration-in-datapath -- the per-send registration is also undone here
		ctx->tmp_mr = NULL;
		return ret == ENOMEM ? -FI_EAGAIN : -ret;
	}
	return 0;
}

void vrb_handle_send_comp(struct vrb_ep *ep, struct ibv_wc *wc)
{
	struct vrb_context *ctx = (struct vrb_context *)(uintptr_t)wc->wr_id;

	(void)ep;
	if (ctx->tmp_mr) {
		ibv_dereg_mr(ctx->tmp_mr);	// BUG: rdma-registration-in-datapath -- deregistration on every send completion
		ctx->tmp_mr = NULL;
	}
}

int vrb_ep_create_qp(struct vrb_ep *ep, struct ibv_cq *cq, uint32_t tx_size,
		     uint32_t rx_size, uint32_t tx_iov, uint32_t rx_iov)
{
	struct ibv_qp_init_attr attr = { 0 };

	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	/* OK: rdma-queue-cap-unchecked -- sizes come from fi_info, already limited to the device at getinfo time */
	attr.cap.max_send_wr = tx_size;
	attr.cap.max_recv_wr = rx_size;
	attr.cap.max_send_sge = tx_iov;
	attr.cap.max_recv_sge = rx_iov;
	/* OK: rdma-queue-cap-unchecked -- the granted inline size becomes the inject size */
	attr.cap.max_inline_data = 256;
	ep->qp = ibv_create_qp(ep->domain->pd, &attr);
	if (!ep->qp)
		return -errno;
	ep->inject_size = attr.cap.max_inline_data;
	ep->max_unsignaled = tx_size / 2;
	return 0;
}
