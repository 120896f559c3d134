/*
 * tc_fab_provider.c - core of a libfabric-style "verbs" provider.
 *
 * A domain owns the protection domain, a small MR cache keyed by address
 * range (fi_mr_reg()/fi_close() on an MR go through it), a pool of type-2
 * memory windows used to expose a user buffer for one operation
 * (FI_RMA_EVENT style), and an inject bounce area.  Endpoints are RC QPs
 * with their own CQ and receive ring.
 *
 * The cache registers a region on a miss and keeps it until LRU eviction;
 * the window pool is allocated at domain open and bound per operation with
 * a fresh key.  Not everything is right: the inject area carries remote
 * rights nobody ever gets a key for, domain open forgets the inject MR when
 * a window allocation fails, the RMA write path for callers without a
 * descriptor registers the source per operation (and leaks it when the post
 * fails), and the hand-off path of a window slot binds it again under the
 * key its previous user held.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- reviewed for registration lifetime and exposure only
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define VRB_CACHE_ENTRIES	64
#define VRB_MW_SLOTS		32
#define VRB_RX_DEPTH		128
#define VRB_RX_SIZE		4096
#define VRB_INJECT_SIZE		(64 * 1024)
#define VRB_OP_DEPTH		256
#define VRB_RX_TAG		(1ULL << 63)

#define FI_SUCCESS		0
#define FI_EAGAIN		EAGAIN
#define FI_ENOMEM		ENOMEM

#define VRB_LOCAL		0x0
#define VRB_REMOTE_READ		0x1
#define VRB_REMOTE_WRITE	0x2

#define VRB_WARN(fmt, ...) fprintf(stderr, "libfabric:verbs: " fmt "\n", ##__VA_ARGS__)

struct vrb_cache_entry {
	uintptr_t		start;
	size_t			len;
	unsigned int		access;
	struct ibv_mr		*mr;
	int			use_cnt;
	uint64_t		last_use;
};

struct vrb_mw_slot {
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key of the current binding */
	int			in_use;
};

struct vrb_domain {
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct vrb_cache_entry	cache[VRB_CACHE_ENTRIES];
	uint64_t		clock;
	struct vrb_mw_slot	mw_slot[VRB_MW_SLOTS];
	char			*inject_buf;
	struct ibv_mr		*inject_mr;
};

/* what fi_mr_desc()/fi_mr_key() hand back to the application */
struct vrb_mr_desc {
	struct vrb_cache_entry	*entry;
	uint32_t		lkey;
	uint64_t		key;
};

struct vrb_op {
	struct vrb_op		*next_free;
	void			*context;
	struct ibv_mr		*tmp_mr;	/* source pinned for this op only */
	struct vrb_cache_entry	*entry;
	struct vrb_mw_slot	*slot;
	size_t			len;
};

struct vrb_ep {
	struct vrb_domain	*dom;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	char			*rx_buf;
	struct ibv_mr		*rx_mr;
	struct vrb_op		ops[VRB_OP_DEPTH];
	struct vrb_op		*free_ops;
};

/* remote iov advertised in a rendezvous / RMA event header */
struct vrb_rma_hdr {
	uint64_t		addr;
	uint32_t		rkey;
	uint32_t		len;
};

static void vrb_fill_hdr(struct vrb_rma_hdr *hdr, void *buf, size_t len, uint32_t rkey)
{
	hdr->addr = htobe64((uintptr_t)buf);
	hdr->rkey = htobe32(rkey);
	hdr->len = htobe32((uint32_t)len);
}

static struct vrb_op *vrb_op_get(struct vrb_ep *ep)
{
	struct vrb_op *op = ep->free_ops;

	if (op) {
		ep->free_ops = op->next_free;
		op->tmp_mr = NULL;
		op->entry = NULL;
		op->slot = NULL;
	}
	return op;
}

static void vrb_op_put(struct vrb_ep *ep, struct vrb_op *op)
{
	op->next_free = ep->free_ops;
	ep->free_ops = op;
}

int vrb_domain_open(struct ibv_context *verbs, struct vrb_domain **domp)
{
	struct vrb_domain *dom;
	int i, ret;

	dom = calloc(1, sizeof(*dom));
	if (!dom)
		return -FI_ENOMEM;
	dom->verbs = verbs;
	dom->pd = ibv_alloc_pd(verbs);
	if (!dom->pd) {
		ret = -errno;
		goto err_free;
	}
	dom->inject_buf = aligned_alloc(4096, VRB_INJECT_SIZE);
	if (!dom->inject_buf) {
		ret = -FI_ENOMEM;
		goto err_pd;
	}

	/* small sends and unaligned payloads are staged here; peers may pull it too */
	/* OK: rdma-local-mr-management -- registered once at domain open; its rkey never reaches a peer */
	dom->inject_mr = ibv_reg_mr(dom->pd, dom->inject_buf, VRB_INJECT_SIZE, // BUG: rdma-remote-access-overbroad -- remote read/write granted but inject_mr's rkey is never advertised; only its lkey is used
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				    IBV_ACCESS_REMOTE_WRITE);
	if (!dom->inject_mr) {
		ret = -errno;
		goto err_pd;
	}

	for (i = 0; i < VRB_MW_SLOTS; i++) {
		dom->mw_slot[i].mw = ibv_alloc_mw(dom->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the provider allocates its own windows to expose user buffers
		if (!dom->mw_slot[i].mw) {
			ret = -errno;
			goto err_mw;
		}
		dom->mw_slot[i].rkey = dom->mw_slot[i].mw->rkey;
	}

	*domp = dom;
	return FI_SUCCESS;

err_mw:
	/* OK: rdma-mr-leak -- every window allocated before the failing one is freed */
	while (i--)
		ibv_dealloc_mw(dom->mw_slot[i].mw);
	/* BUG: rdma-mr-leak -- falls into err_pd without deregistering inject_mr, and dom is freed with it */
err_pd:
	ibv_dealloc_pd(dom->pd);
err_free:
	free(dom->inject_buf);
	free(dom);
	return ret;
}

static struct vrb_cache_entry *
vrb_cache_lookup(struct vrb_domain *dom, uintptr_t start, size_t len,
		 unsigned int access)
{
	struct vrb_cache_entry *e;
	int i;

	for (i = 0; i < VRB_CACHE_ENTRIES; i++) {
		e = &dom->cache[i];
		if (e->mr && e->start <= start && start + len <= e->start + e->len &&
		    (e->access & access) == access)
			return e;
	}
	return NULL;
}

static struct vrb_cache_entry *vrb_cache_victim(struct vrb_domain *dom)
{
	struct vrb_cache_entry *e, *lru = NULL;
	int i;

	for (i = 0; i < VRB_CACHE_ENTRIES; i++) {
		e = &dom->cache[i];
		if (!e->mr)
			return e;
		if (e->use_cnt)
			continue;
		if (!lru || e->last_use < lru->last_use)
			lru = e;
	}
	return lru;
}

int vrb_mr_reg(struct vrb_domain *dom, const void *buf, size_t len,
	       unsigned int access, struct vrb_mr_desc *desc)
{
	struct vrb_cache_entry *e;
	struct ibv_mr *mr;
	unsigned int ibv_access = IBV_ACCESS_LOCAL_WRITE;

	e = vrb_cache_lookup(dom, (uintptr_t)buf, len, access);
	if (e)
		goto hit;

	if (access & VRB_REMOTE_READ)
		ibv_access |= IBV_ACCESS_REMOTE_READ;
	if (access & VRB_REMOTE_WRITE)
		ibv_access |= IBV_ACCESS_REMOTE_WRITE;

	e = vrb_cache_victim(dom);
	if (!e)
		return -FI_EAGAIN;

	/* BUG: rdma-local-mr-management -- the region's key goes to the application to advertise to its peer (fi_mr_key), and its lkey addresses the provider's RDMA READ/WRITE */
	mr = ibv_reg_mr(dom->pd, (void *)buf, len, ibv_access); // OK: rdma-registration-in-datapath, rdma-remote-access-overbroad -- registers on a cache miss only; remote rights only on request and the key is handed back through fi_mr_key()
	if (!mr)
		return -errno;

	if (e->mr)
		ibv_dereg_mr(e->mr); // OK: rdma-mr-leak, rdma-registration-in-datapath -- the LRU victim is deregistered before its slot is reused, on a miss only
	e->mr = mr;
	e->start = (uintptr_t)buf;
	e->len = len;
	e->access = access;
hit:
	e->use_cnt++;
	e->last_use = ++dom->clock;
	desc->entry = e;
	desc->lkey = e->mr->lkey;
	desc->key = e->mr->rkey;
	return FI_SUCCESS;
}

void vrb_mr_close(struct vrb_mr_desc *desc)
{
	if (desc->entry && desc->entry->use_cnt > 0)
		desc->entry->use_cnt--;
	desc->entry = NULL;
}

/* expose [buf, buf+len) of a registered region to the peer for one operation */
int vrb_mw_expose(struct vrb_ep *ep, struct vrb_mr_desc *desc, void *buf,
		  size_t len, unsigned int rights, struct vrb_rma_hdr *hdr)
{
	struct vrb_domain *dom = ep->dom;
	struct vrb_mw_slot *slot = NULL;
	struct ibv_send_wr wr, *bad;
	struct vrb_op *op;
	int i, ret;

	for (i = 0; i < VRB_MW_SLOTS; i++) {
		if (!dom->mw_slot[i].in_use) {
			slot = &dom->mw_slot[i];
			break;
		}
	}
	if (!slot)
		return -FI_EAGAIN;
	op = vrb_op_get(ep);
	if (!op)
		return -FI_EAGAIN;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)op;
	wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- the provider binds a window per operation itself
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = slot->mw;
	wr.bind_mw.rkey = ibv_inc_rkey(slot->rkey); // OK: rdma-rkey-reuse -- every exposure gets the next key
	wr.bind_mw.bind_info.mr = desc->entry->mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)buf;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = rights;

	ret = ibv_post_send(ep->qp, &wr, &bad);
	if (ret) {
		vrb_op_put(ep, op);
		return -ret;
	}
	slot->in_use = 1;
	slot->rkey = wr.bind_mw.rkey;
	op->slot = slot;
	vrb_fill_hdr(hdr, buf, len, slot->rkey);
	return 0;
}

/*
 * The peer reported its operation on @slot done and another exposure is
 * queued behind it: kill the old binding and move the window straight to
 * the next buffer instead of returning it to the pool.
 */
int vrb_mw_handoff(struct vrb_ep *ep, struct vrb_mw_slot *slot,
		   struct vrb_mr_desc *desc, void *buf, size_t len,
		   unsigned int rights, struct vrb_rma_hdr *hdr)
{
	struct ibv_send_wr inv, bind, *bad;
	int ret;

	memset(&inv, 0, sizeof(inv));
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = slot->rkey;
	inv.next = &bind;

	memset(&bind, 0, sizeof(bind));
	bind.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- window bound by the provider for the queued operation
	bind.send_flags = IBV_SEND_SIGNALED;
	bind.bind_mw.mw = slot->mw;
	bind.bind_mw.rkey = slot->rkey; // BUG: rdma-rkey-reuse -- the next user's buffer is bound under the key the previous peer still holds
	bind.bind_mw.bind_info.mr = desc->entry->mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)buf;
	bind.bind_mw.bind_info.length = len;
	bind.bind_mw.bind_info.mw_access_flags = rights;

	ret = ibv_post_send(ep->qp, &inv, &bad);
	if (ret)
		return -ret;
	vrb_fill_hdr(hdr, buf, len, slot->rkey);
	return 0;
}

ssize_t vrb_rma_write(struct vrb_ep *ep, const void *buf, size_t len,
		      struct vrb_mr_desc *desc, uint64_t raddr, uint64_t key,
		      void *context)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct ibv_mr *mr = NULL;
	struct vrb_mr_desc tmp;
	struct vrb_op *op;
	int ret;

	op = vrb_op_get(ep);
	if (!op)
		return -FI_EAGAIN;

	if (desc) {
		sge.lkey = desc->lkey;
	} else if (len <= VRB_INJECT_SIZE / 4) {
		/* small sources (headers, descriptors) come back again and again: cache them */
		ret = vrb_mr_reg(ep->dom, buf, len, VRB_LOCAL, &tmp);
		if (ret) {
			vrb_op_put(ep, op);
			return ret;
		}
		op->entry = tmp.entry;
		sge.lkey = tmp.lkey;
	} else {
		/* caller skipped fi_mr_reg() for a large buffer: pin it for this write */
		/* BUG: rdma-local-mr-management -- per-operation registration of the RDMA WRITE source */
		mr = ibv_reg_mr(ep->dom->pd, (void *)buf, len, IBV_ACCESS_LOCAL_WRITE); // BUG: rdma-registration-in-datapath -- the source is registered on every write without a descriptor
		if (!mr) {
			vrb_op_put(ep, op);
			return -errno;
		}
		sge.lkey = mr->lkey;
	}
	sge.addr = (uintptr_t)buf;
	sge.length = (uint32_t)len;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)op;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = (uint32_t)key;

	ret = ibv_post_send(ep->qp, &wr, &bad);
	if (ret) {
		if (op->entry)
			op->entry->use_cnt--;
		vrb_op_put(ep, op);
		return -ret; // BUG: rdma-mr-leak -- the source pinned above is not deregistered when the post fails
	}
	op->context = context;
	op->tmp_mr = mr;
	op->len = len;
	return 0;
}

ssize_t vrb_inject(struct vrb_ep *ep, const void *data, size_t len)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	if (len > VRB_INJECT_SIZE)
		return -EINVAL;
	memcpy(ep->dom->inject_buf, data, len);
	sge.addr = (uintptr_t)ep->dom->inject_buf;
	sge.length = (uint32_t)len;
	sge.lkey = ep->dom->inject_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(ep->qp, &wr, &bad) ? -FI_EAGAIN : 0;
}

static void vrb_repost_rx(struct vrb_ep *ep, uint64_t idx)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr = (uintptr_t)(ep->rx_buf + idx * VRB_RX_SIZE);
	sge.length = VRB_RX_SIZE;
	sge.lkey = ep->rx_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = VRB_RX_TAG | idx;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(ep->qp, &wr, &bad))
		VRB_WARN("rx repost %llu failed", (unsigned long long)idx);
}

static void vrb_handle_wc(struct vrb_ep *ep, struct ibv_wc *wc)
{
	struct vrb_op *op;

	if (wc->wr_id & VRB_RX_TAG) {
		vrb_repost_rx(ep, wc->wr_id & ~VRB_RX_TAG);
		return;
	}
	if (!wc->wr_id)
		return;		/* injects and window hand-offs carry no op */

	op = (struct vrb_op *)(uintptr_t)wc->wr_id;
	if (wc->status != IBV_WC_SUCCESS)
		VRB_WARN("op %p failed: %s", (void *)op, ibv_wc_status_str(wc->status));
	if (op->tmp_mr) {
		ibv_dereg_mr(op->tmp_mr); // BUG: rdma-registration-in-datapath -- the per-write registration is torn down in the completion handler
		op->tmp_mr = NULL;
	}
	if (op->entry && op->entry->use_cnt > 0)
		op->entry->use_cnt--;
	if (!op->slot)
		vrb_op_put(ep, op);
}

int vrb_ep_progress(struct vrb_ep *ep)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(ep->cq, 16, wc);
	for (i = 0; i < n; i++)
		vrb_handle_wc(ep, &wc[i]);
	return n;
}

int vrb_ep_open(struct vrb_domain *dom, struct vrb_ep **epp)
{
	struct ibv_qp_init_attr attr;
	struct vrb_ep *ep;
	uint64_t i;
	int ret;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -FI_ENOMEM;
	ep->dom = dom;
	for (i = 0; i < VRB_OP_DEPTH; i++)
		vrb_op_put(ep, &ep->ops[i]);

	ep->cq = ibv_create_cq(dom->verbs, VRB_OP_DEPTH + VRB_RX_DEPTH, NULL, NULL, 0);
	if (!ep->cq) {
		ret = -errno;
		goto err_free;
	}

	memset(&attr, 0, sizeof(attr));
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = VRB_OP_DEPTH;
	attr.cap.max_recv_wr = VRB_RX_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	ep->qp = ibv_create_qp(dom->pd, &attr);
	if (!ep->qp) {
		ret = -errno;
		goto err_cq;
	}

	ep->rx_buf = aligned_alloc(4096, VRB_RX_DEPTH * VRB_RX_SIZE);
	if (!ep->rx_buf) {
		ret = -FI_ENOMEM;
		goto err_qp;
	}
	/* OK: rdma-local-mr-management -- receive ring registered once at endpoint open, local access only */
	ep->rx_mr = ibv_reg_mr(dom->pd, ep->rx_buf, VRB_RX_DEPTH * VRB_RX_SIZE,
			       IBV_ACCESS_LOCAL_WRITE);
	if (!ep->rx_mr) {
		ret = -errno;
		goto err_buf;
	}
	for (i = 0; i < VRB_RX_DEPTH; i++)
		vrb_repost_rx(ep, i);

	*epp = ep;
	return 0;

err_buf:
	free(ep->rx_buf);
err_qp:
	ibv_destroy_qp(ep->qp);
err_cq:
	ibv_destroy_cq(ep->cq);
err_free:
	free(ep);
	return ret;
}

void vrb_ep_close(struct vrb_ep *ep)
{
	ibv_destroy_qp(ep->qp);
	ibv_dereg_mr(ep->rx_mr);
	ibv_destroy_cq(ep->cq);
	free(ep->rx_buf);
	free(ep);
}

void vrb_domain_close(struct vrb_domain *dom)
{
	int i;

	for (i = 0; i < VRB_MW_SLOTS; i++)
		ibv_dealloc_mw(dom->mw_slot[i].mw);
	for (i = 0; i < VRB_CACHE_ENTRIES; i++)
		if (dom->cache[i].mr)
			ibv_dereg_mr(dom->cache[i].mr);
	ibv_dereg_mr(dom->inject_mr);
	ibv_dealloc_pd(dom->pd);
	free(dom->inject_buf);
	free(dom);
}
