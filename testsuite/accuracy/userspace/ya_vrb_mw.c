/*
 * ya_vrb_mw.c - window-based remote keys for a libfabric-style verbs provider.
 *
 * Applications register a region once (vrb_mr: LOCAL_WRITE | MW_BIND, no
 * remote rights on the MR itself) and expose a range of it to the peer per
 * operation: a type-2 memory window is taken from the domain's window cache,
 * bound over the range with an IBV_WR_BIND_MW under a fresh key, and the
 * {addr, len, key} triple goes out in a KEY control message.  The peer ends
 * the operation with a DONE message: either a plain SEND, after which the
 * provider revokes the window itself (signaled LOCAL_INV, waited for), or a
 * SEND_WITH_INV of the window's key, which is checked against the key the
 * provider handed out.  Unregistered user memory is staged through chunks of
 * the endpoint's bounce region.
 *
 * Right: key rotation lives in vrb_mw_next_key() and is done per exposure;
 * a bind that failed to post recycles the descriptor directly; endpoint close
 * waits for every LOCAL_INV before recycling.  Wrong: the pipelined transfer
 * rotates the key once for all of its chunks; the MR-cache re-exposure keeps
 * the previous key for an unchanged range; the ATOMIC_DONE path trusts
 * IBV_WC_WITH_INV without comparing the key; fi_cancel recycles the window
 * and its bounce chunk right after an unsignaled LOCAL_INV; the timeout
 * reaper recycles windows whose key the peer holds.
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

#define FI_SUCCESS    0
#define FI_EAGAIN     EAGAIN
#define FI_EIO        EIO
#define FI_ETIMEDOUT  ETIMEDOUT
#define FI_ECANCELED  ECANCELED

#define VRB_WARN(fmt, ...)  fprintf(stderr, "libfabric:verbs:warn: " fmt "\n", ##__VA_ARGS__)

#define VRB_MAX_OPS        128
#define VRB_BOUNCE_CHUNK   (64 * 1024)
#define VRB_BOUNCE_CNT     32
#define VRB_OP_TIMEOUT_MS  5000

#define VRB_WRID_BIND      0x1000000000000000ull
#define VRB_WRID_INV       0x2000000000000000ull
#define VRB_WRID_CTRL      0x3000000000000000ull

enum vrb_ctrl_type { VRB_CTRL_KEY = 1, VRB_CTRL_DONE, VRB_CTRL_ATOMIC_DONE };

struct vrb_ctrl_msg {
	uint8_t  type;
	uint8_t  pad[3];
	uint32_t op_id;
	uint64_t addr;
	uint64_t len;
	uint32_t key;
	int32_t  status;
};

struct vrb_mr {
	struct ibv_mr *mr;
	void          *buf;
	size_t         len;
};

struct vrb_mw_desc {
	struct vrb_mw_desc *next;      /* domain free list */
	struct ibv_mw      *mw;
	uint32_t            rkey;      /* key of the current / last binding */
	int                 bounce_idx;
	uint32_t            op_id;
	uint64_t            deadline_ms;
};

struct vrb_domain {
	struct ibv_pd      *pd;
	struct vrb_mw_desc *mw_free;
};

struct vrb_ep {
	struct vrb_domain   *domain;
	struct ibv_qp       *qp;
	struct ibv_cq       *scq;
	struct ibv_cq       *rcq;
	struct vrb_mr        bounce;
	uint8_t              bounce_busy[VRB_BOUNCE_CNT];
	struct vrb_mw_desc  *ops[VRB_MAX_OPS];
	struct vrb_ctrl_msg  ctrl_tx;
	struct ibv_mr       *ctrl_mr;
	void               (*report_err)(struct vrb_ep *ep, uint32_t op_id, int err);
};

static uint64_t vrb_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint32_t vrb_mw_next_key(const struct vrb_mw_desc *desc)
{
	return ibv_inc_rkey(desc->rkey);
}

static struct vrb_mw_desc *vrb_desc_get(struct vrb_domain *dom)
{
	struct vrb_mw_desc *desc = dom->mw_free;

	if (desc) {
		dom->mw_free = desc->next;
		desc->next = NULL;
		desc->bounce_idx = -1;
	}
	return desc;
}

/* give the window and its staging chunk back to the caches */
static void vrb_desc_free(struct vrb_ep *ep, struct vrb_mw_desc *desc)
{
	if (desc->bounce_idx >= 0)
		ep->bounce_busy[desc->bounce_idx] = 0;
	desc->bounce_idx = -1;
	if (desc->op_id < VRB_MAX_OPS)
		ep->ops[desc->op_id] = NULL;
	desc->next = ep->domain->mw_free;
	ep->domain->mw_free = desc;
}

static int vrb_bounce_get(struct vrb_ep *ep)
{
	int i;

	for (i = 0; i < VRB_BOUNCE_CNT; i++) {
		if (!ep->bounce_busy[i]) {
			ep->bounce_busy[i] = 1;
			return i;
		}
	}
	return -1;
}

static int vrb_post_bind(struct vrb_ep *ep, struct vrb_mw_desc *desc, uint32_t key,
			 struct ibv_mr *mr, uint64_t addr, size_t len, unsigned access)
{
	struct ibv_send_wr wr, *bad_wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id                       = VRB_WRID_BIND | desc->op_id;
	wr.opcode                      = IBV_WR_BIND_MW;
	wr.send_flags                  = 0;    /* ordered before the KEY send */
	wr.bind_mw.mw                  = desc->mw;
	wr.bind_mw.rkey                = key;
	wr.bind_mw.bind_info.mr        = mr;
	wr.bind_mw.bind_info.addr      = addr;
	wr.bind_mw.bind_info.length    = len;
	wr.bind_mw.bind_info.mw_access_flags = access;
	return ibv_post_send(ep->qp, &wr, &bad_wr);
}

static int vrb_send_ctrl(struct vrb_ep *ep, uint8_t type, uint32_t op_id,
			 uint64_t addr, uint64_t len, uint32_t key)
{
	struct ibv_send_wr wr, *bad_wr;
	struct ibv_sge sge;

	ep->ctrl_tx.type  = type;
	ep->ctrl_tx.op_id = op_id;
	ep->ctrl_tx.addr  = addr;
	ep->ctrl_tx.len   = len;
	ep->ctrl_tx.key   = key;

	sge.addr   = (uintptr_t)&ep->ctrl_tx;
	sge.length = sizeof(ep->ctrl_tx);
	sge.lkey   = ep->ctrl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id      = VRB_WRID_CTRL | op_id;
	wr.sg_list    = &sge;
	wr.num_sge    = 1;
	wr.opcode     = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	return ibv_post_send(ep->qp, &wr, &bad_wr);
}

static int vrb_poll_wr(struct vrb_ep *ep, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(ep->scq, 1, &wc);
		if (n < 0)
			return -FI_EIO;
		if (n == 0 || wc.wr_id != wr_id)
			continue;
		return wc.status == IBV_WC_SUCCESS ? 0 : -FI_EIO;
	}
}

/* revoke the window and wait until the device has done it */
static int vrb_mw_revoke(struct vrb_ep *ep, struct vrb_mw_desc *desc)
{
	struct ibv_send_wr wr, *bad_wr;
	int ret;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id           = VRB_WRID_INV | desc->op_id;
	wr.opcode          = IBV_WR_LOCAL_INV;
	wr.send_flags      = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = desc->rkey;
	ret = ibv_post_send(ep->qp, &wr, &bad_wr);
	if (ret)
		return -ret;
	return vrb_poll_wr(ep, wr.wr_id);
}

/* fast path: the LOCAL_INV retires with the next signaled send */
static int vrb_mw_revoke_nowait(struct vrb_ep *ep, struct vrb_mw_desc *desc)
{
	struct ibv_send_wr wr, *bad_wr;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id           = VRB_WRID_INV | desc->op_id;
	wr.opcode          = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = desc->rkey;
	return ibv_post_send(ep->qp, &wr, &bad_wr);
}

int vrb_domain_mw_cache_init(struct vrb_domain *dom, struct vrb_mw_desc *descs, int cnt)
{
	int i;

	dom->mw_free = NULL;
	for (i = 0; i < cnt; i++) {
		descs[i].mw = ibv_alloc_mw(dom->pd, IBV_MW_TYPE_2);
		if (!descs[i].mw)
			goto err;
		descs[i].rkey       = descs[i].mw->rkey;
		descs[i].op_id      = VRB_MAX_OPS;
		descs[i].bounce_idx = -1;
		descs[i].next = dom->mw_free; // OK: rdma-invalidation-leak -- a freshly allocated window, never bound
		dom->mw_free  = &descs[i];
	}
	return 0;
err:
	while (i--)
		ibv_dealloc_mw(descs[i].mw);
	dom->mw_free = NULL;
	return -ENOMEM;
}

/* deallocation kills whatever key a window still carries */
void vrb_domain_mw_cache_fini(struct vrb_domain *dom, struct vrb_mw_desc *descs, int cnt)
{
	int i;

	for (i = 0; i < cnt; i++)
		ibv_dealloc_mw(descs[i].mw);
	dom->mw_free = NULL;
}

int vrb_mw_expose(struct vrb_ep *ep, struct vrb_mr *vmr, void *buf, size_t len,
		  unsigned access, uint32_t op_id, int copy)
{
	struct vrb_mw_desc *desc;
	struct ibv_mr *mr = vmr->mr;
	uint64_t addr = (uintptr_t)buf;
	uint32_t key;
	int ret;

	if (op_id >= VRB_MAX_OPS || len > VRB_BOUNCE_CHUNK)
		return -EINVAL;
	desc = vrb_desc_get(ep->domain);
	if (!desc)
		return -FI_EAGAIN;
	desc->op_id = op_id;

	if (copy) {
		desc->bounce_idx = vrb_bounce_get(ep);
		if (desc->bounce_idx < 0) {
			vrb_desc_free(ep, desc);
			return -FI_EAGAIN;
		}
		addr = (uintptr_t)ep->bounce.buf + (size_t)desc->bounce_idx * VRB_BOUNCE_CHUNK;
		memcpy((void *)(uintptr_t)addr, buf, len);
		mr = ep->bounce.mr;
	}

	key = vrb_mw_next_key(desc);
	ret = vrb_post_bind(ep, desc, key, mr, addr, len, access); // OK: rdma-rkey-reuse -- key rotated by vrb_mw_next_key() for this exposure
	if (ret) {
		VRB_WARN("bind_mw failed: %d", ret);
		vrb_desc_free(ep, desc); // OK: rdma-invalidation-leak -- the bind never reached the queue, nothing is bound
		return -FI_EAGAIN;
	}
	desc->rkey = key;
	desc->deadline_ms = vrb_now_ms() + VRB_OP_TIMEOUT_MS;

	ret = vrb_send_ctrl(ep, VRB_CTRL_KEY, op_id, addr, len, key);
	if (ret) {
		VRB_WARN("KEY send failed: %d", ret);
		if (vrb_mw_revoke(ep, desc) == 0)
			vrb_desc_free(ep, desc); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- revoked and waited for first
		return -FI_EAGAIN;
	}
	ep->ops[op_id] = desc;
	return FI_SUCCESS;
}

/* peer finished the transfer on a window */
int vrb_handle_done(struct vrb_ep *ep, const struct ibv_wc *wc, const struct vrb_ctrl_msg *msg)
{
	struct vrb_mw_desc *desc;
	int ret;

	if (msg->op_id >= VRB_MAX_OPS || !(desc = ep->ops[msg->op_id]))
		return -EINVAL;

	if (wc->wc_flags & IBV_WC_WITH_INV) { // OK: rdma-remote-invalidate-unchecked -- compared with the key handed out below
		if (wc->invalidated_rkey != desc->rkey) {
			VRB_WARN("op %u: peer invalidated 0x%x, expected 0x%x",
				 msg->op_id, wc->invalidated_rkey, desc->rkey);
			ret = vrb_mw_revoke(ep, desc);
			if (ret)
				return ret;
		}
	} else {
		ret = vrb_mw_revoke(ep, desc);
		if (ret)
			return ret;
	}
	vrb_desc_free(ep, desc); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- checked remote invalidation or a completed LOCAL_INV on every path here
	return msg->status;
}

/* atomics complete with a separate message that may carry the invalidation */
int vrb_handle_atomic_done(struct vrb_ep *ep, const struct ibv_wc *wc,
			   const struct vrb_ctrl_msg *msg)
{
	struct vrb_mw_desc *desc;
	int ret;

	if (msg->op_id >= VRB_MAX_OPS || !(desc = ep->ops[msg->op_id]))
		return -EINVAL;

	if (wc->wc_flags & IBV_WC_WITH_INV) { // BUG: rdma-remote-invalidate-unchecked -- wc->invalidated_rkey is never compared with desc->rkey
		vrb_desc_free(ep, desc); // OK: rdma-invalidation-leak -- the remote invalidation is accepted here (blindly, see above)
		return msg->status;
	}

	ret = vrb_mw_revoke(ep, desc);
	if (ret)
		return ret;
	vrb_desc_free(ep, desc);
	return msg->status;
}

/* pipelined write-target: the peer pulls `total` bytes through one window */
int vrb_rma_pipeline(struct vrb_ep *ep, struct vrb_mw_desc *desc, struct vrb_mr *vmr,
		     size_t total, size_t chunk,
		     int (*wait_done)(struct vrb_ep *, uint32_t op_id))
{
	size_t off, len;
	uint32_t key;
	int ret = 0;

	key = vrb_mw_next_key(desc);
	for (off = 0; off < total; off += chunk) {
		len = total - off < chunk ? total - off : chunk;
		ret = vrb_post_bind(ep, desc, key, vmr->mr, // BUG(file): rdma-rkey-reuse -- every chunk is bound (in vrb_post_bind) under the one key made before the loop
				    (uintptr_t)vmr->buf + off, len,
				    IBV_ACCESS_REMOTE_READ);
		if (ret)
			break;
		desc->rkey = key;
		ret = vrb_send_ctrl(ep, VRB_CTRL_KEY, desc->op_id,
				    (uintptr_t)vmr->buf + off, len, key);
		if (!ret)
			ret = wait_done(ep, desc->op_id);
		if (vrb_mw_revoke(ep, desc) || ret)
			break;
	}
	return ret;
}

/*
 * FI_MR_CACHE re-exposure: a revoked window kept on its region is bound over
 * the same range again for the next operation.
 */
static uint32_t vrb_mw_cached_key(const struct vrb_mw_desc *desc, uint64_t addr,
				  uint64_t cached_addr)
{
	if (addr == cached_addr)
		return desc->rkey;	/* same range: the peer's key cache still hits */
	return ibv_inc_rkey(desc->rkey);
}

int vrb_mw_reexpose(struct vrb_ep *ep, struct vrb_mw_desc *desc, struct vrb_mr *vmr,
		    uint64_t addr, size_t len, uint64_t cached_addr, uint32_t op_id)
{
	uint32_t key = vrb_mw_cached_key(desc, addr, cached_addr);
	int ret;

	desc->op_id = op_id;
	ret = vrb_post_bind(ep, desc, key, vmr->mr, addr, len, // BUG(file): rdma-rkey-reuse -- vrb_mw_cached_key() hands back the previous key for an unchanged range
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (ret)
		return -FI_EAGAIN;
	desc->rkey = key;
	desc->deadline_ms = vrb_now_ms() + VRB_OP_TIMEOUT_MS;
	ep->ops[op_id] = desc;
	return vrb_send_ctrl(ep, VRB_CTRL_KEY, op_id, addr, len, key);
}

/* fi_cancel() */
int vrb_op_cancel(struct vrb_ep *ep, uint32_t op_id)
{
	struct vrb_mw_desc *desc;
	int ret;

	if (op_id >= VRB_MAX_OPS || !(desc = ep->ops[op_id]))
		return -EINVAL;

	ret = vrb_mw_revoke_nowait(ep, desc);
	if (ret)
		return -FI_EAGAIN;
	vrb_desc_free(ep, desc); // BUG: rdma-unmap-before-invalidate -- window and bounce chunk recycled while the unsignaled LOCAL_INV may not have executed
	return -FI_ECANCELED;
}

/* called from the endpoint progress loop */
void vrb_ep_check_timeouts(struct vrb_ep *ep)
{
	uint64_t now = vrb_now_ms();
	struct vrb_mw_desc *desc;
	uint32_t i;

	for (i = 0; i < VRB_MAX_OPS; i++) {
		desc = ep->ops[i];
		if (!desc || desc->deadline_ms > now)
			continue;
		VRB_WARN("op %u timed out, key 0x%x", i, desc->rkey);
		ep->report_err(ep, i, -FI_ETIMEDOUT);
		vrb_desc_free(ep, desc); // BUG: rdma-invalidation-leak -- the peer still holds this window's key; no LOCAL_INV on the timeout path
	}
}

/* endpoint close: revoke everything still exposed, then recycle */
int vrb_ep_flush_windows(struct vrb_ep *ep)
{
	struct ibv_send_wr wr, *bad_wr;
	struct ibv_wc wc[16];
	int pending = 0, failed = 0, n, i;
	uint32_t id;

	for (id = 0; id < VRB_MAX_OPS; id++) {
		if (!ep->ops[id])
			continue;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id           = VRB_WRID_INV | id;
		wr.opcode          = IBV_WR_LOCAL_INV;
		wr.send_flags      = IBV_SEND_SIGNALED;
		wr.invalidate_rkey = ep->ops[id]->rkey;
		if (ibv_post_send(ep->qp, &wr, &bad_wr))
			return -FI_EIO;
		pending++;
	}

	while (pending > 0) {
		n = ibv_poll_cq(ep->scq, 16, wc);
		if (n < 0)
			return -FI_EIO;
		for (i = 0; i < n; i++) {
			if ((wc[i].wr_id & ~0xffffffffull) != VRB_WRID_INV)
				continue;
			if (wc[i].status != IBV_WC_SUCCESS)
				failed++;
			pending--;
		}
	}
	if (failed) {
		/* keys may still be live: leave them to vrb_domain_mw_cache_fini() */
		VRB_WARN("%d window invalidations failed", failed);
		return -FI_EIO;
	}

	for (id = 0; id < VRB_MAX_OPS; id++) {
		if (ep->ops[id])
			vrb_desc_free(ep, ep->ops[id]); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV above has completed
	}
	return 0;
}
