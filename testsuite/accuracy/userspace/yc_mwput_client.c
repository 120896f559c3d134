/*
 * ycx_mwput.c - client side of the "mwput" offload transport.
 *
 * A put request exposes its payload slot to the server through a type-2
 * memory window bound on the fly and sends a small inline descriptor that
 * carries the window's rkey.  The server RDMA-READs the payload and replies,
 * normally with SEND_WITH_INV on the window key; when it replies with a
 * plain SEND the client posts the LOCAL_INV itself.  All posting goes
 * through the extended verbs API (ibv_wr_start ... ibv_wr_complete).
 *
 * Send queue budget: one put owns at most BIND_MW + SEND + LOCAL_INV at a
 * time.  The endpoint depth is derived from max_qp_wr and the queue is
 * created with 3 * depth + 1 entries; the SGE count is clamped to the
 * device.  The bind WR is unsignaled, the SEND behind it is signaled.
 *
 * A put that times out is invalidated and, once the LOCAL_INV completed,
 * posted again.  The re-post binds the window under the key of the first
 * attempt, so a late READ of that attempt is accepted by the new binding.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked, rdma-access-flags-invalid,
 *   rdma-access-flags-transport, rdma-remote-access-overbroad,
 *   rdma-registration-in-datapath, rdma-local-mr-management,
 *   rdma-send-queue-manual-factor -- not covered by this file's annotations
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define YCX_MAX_DEPTH		128
#define YCX_WQE_PER_PUT		3	/* BIND_MW, SEND, LOCAL_INV */
#define YCX_PUT_MAX		(256 * 1024)
#define YCX_WANT_SGE		8
#define YCX_MAX_RETRIES		3
#define YCX_TIMEOUT_NS		(2ull * 1000 * 1000 * 1000)
#define YCX_WRID_BIND		((uint64_t)-1)

#define ycx_error(_fmt, ...) \
	fprintf(stderr, "ycx %s:%d " _fmt "\n", __func__, __LINE__, ##__VA_ARGS__)
#define YCX_MIN(_a, _b)	((_a) < (_b) ? (_a) : (_b))

typedef enum {
	YCX_OK = 0, YCX_ERR_NO_RESOURCE = -1, YCX_ERR_IO = -2,
	YCX_ERR_NO_DEVICE = -3, YCX_ERR_TIMED_OUT = -4,
} ycx_status_t;

enum ycx_req_state {
	YCX_REQ_FREE,
	YCX_REQ_POSTED,		/* BIND + SEND posted, waiting for the reply */
	YCX_REQ_INV,		/* LOCAL_INV posted after a plain reply */
	YCX_REQ_INV_RETRY,	/* LOCAL_INV posted after a timeout */
};

struct ycx_put_desc {
	uint32_t	req_id;
	uint32_t	rkey;
	uint64_t	addr;
	uint32_t	length;
	uint32_t	attempt;
} __attribute__((packed));

struct ycx_reply { uint32_t req_id; int32_t status; };

typedef void (*ycx_comp_cb_t)(void *arg, ycx_status_t status);

struct ycx_req {
	struct ycx_req		*next_free;
	enum ycx_req_state	state;
	uint32_t		id;
	char			*buf;
	uint32_t		length;
	struct ibv_mw		*mw;
	uint32_t		rkey;		/* key of the current binding */
	ycx_status_t		status;
	uint64_t		deadline;
	unsigned		retries;
	ycx_comp_cb_t		cb;
	void			*cb_arg;
	struct ycx_put_desc	desc;
};

struct ycx_ep {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct ibv_device_attr	dev_attr;
	struct ibv_mr		*data_mr;	/* LOCAL_WRITE | MW_BIND over the arena */
	char			*arena;
	struct ibv_mr		*reply_mr;
	struct ycx_reply	*replies;
	unsigned		depth;
	struct ycx_req		*free_list;
	struct ycx_req		reqs[YCX_MAX_DEPTH];
};

static uint64_t ycx_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static ycx_status_t ycx_ep_query(struct ycx_ep *ep)
{
	if (ibv_query_device(ep->ctx, &ep->dev_attr)) {
		ycx_error("ibv_query_device: %s", strerror(errno));
		return YCX_ERR_NO_DEVICE;
	}
	if (!(ep->dev_attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) {
		ycx_error("device has no type 2B memory windows");
		return YCX_ERR_NO_DEVICE;
	}
	ep->depth = YCX_MIN(YCX_MAX_DEPTH,
			    ((unsigned)ep->dev_attr.max_qp_wr - 1) / YCX_WQE_PER_PUT);
	return ep->depth ? YCX_OK : YCX_ERR_NO_DEVICE;
}

static ycx_status_t ycx_ep_create_qp(struct ycx_ep *ep)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = ep->cq;
	attr.recv_cq = ep->cq;
	attr.sq_sig_all = 0;
	attr.pd = ep->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			      IBV_QP_EX_WITH_LOCAL_INV;
	/* OK: rdma-send-queue-undersized, rdma-queue-cap-unchecked -- three entries for each of ep->depth puts plus one, and depth was derived from max_qp_wr */
	attr.cap.max_send_wr = ep->depth * YCX_WQE_PER_PUT + 1;
	attr.cap.max_recv_wr = ep->depth; /* OK: rdma-queue-cap-unchecked -- at most YCX_MAX_DEPTH and bounded by max_qp_wr through depth */
	attr.cap.max_send_sge = YCX_MIN(YCX_WANT_SGE, ep->dev_attr.max_sge); /* OK: rdma-queue-cap-unchecked -- 8 SGEs clamped to max_sge */
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct ycx_put_desc);

	ep->qp = ibv_create_qp_ex(ep->ctx, &attr);
	if (!ep->qp) {
		ycx_error("ibv_create_qp_ex: %s", strerror(errno));
		return YCX_ERR_NO_RESOURCE;
	}
	ep->qpx = ibv_qp_to_qp_ex(ep->qp);
	return YCX_OK;
}

static int ycx_post_reply_recv(struct ycx_ep *ep, unsigned slot)
{
	struct ibv_sge sge = {
		.addr	= (uintptr_t)&ep->replies[slot],
		.length	= sizeof(struct ycx_reply),
		.lkey	= ep->reply_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(ep->qp, &wr, &bad);
}

/* Key for the next binding of the request's window. */
static int ycx_req_next_key(struct ycx_ep *ep, struct ycx_req *r, uint32_t *key)
{
	if (!r->mw) {
		r->mw = ibv_alloc_mw(ep->pd, IBV_MW_TYPE_2);
		if (!r->mw)
			return -errno;
		*key = r->mw->rkey;	/* fresh window, never handed out */
		return 0;
	}
	*key = ibv_inc_rkey(r->rkey);
	return 0;
}

static void ycx_req_fill_bind(struct ycx_ep *ep, struct ycx_req *r,
			      struct ibv_mw_bind_info *bi)
{
	bi->mr = ep->data_mr;
	bi->addr = (uintptr_t)r->buf;
	bi->length = r->length;
	bi->mw_access_flags = IBV_ACCESS_REMOTE_READ;
}

static ycx_status_t ycx_req_post(struct ycx_ep *ep, struct ycx_req *r)
{
	struct ibv_qp_ex *qpx = ep->qpx;
	struct ibv_mw_bind_info bi;
	uint32_t key;

	if (ycx_req_next_key(ep, r, &key))
		return YCX_ERR_NO_RESOURCE;

	ycx_req_fill_bind(ep, r, &bi);
	r->rkey = key;
	r->desc.req_id = r->id;
	r->desc.rkey = key;
	r->desc.addr = bi.addr;
	r->desc.length = r->length;
	r->desc.attempt = r->retries;

	ibv_wr_start(qpx);
	qpx->wr_id = YCX_WRID_BIND;
	qpx->wr_flags = 0; /* OK: rdma-unsignaled-send-starvation -- the bind is retired by the signaled SEND posted right behind it */
	ibv_wr_bind_mw(qpx, r->mw, key, &bi); /* OK: rdma-rkey-reuse -- key is the allocation key of a new window or ibv_inc_rkey() of the last one */
	qpx->wr_id = (uintptr_t)r;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, &r->desc, sizeof(r->desc));
	if (ibv_wr_complete(qpx)) {
		ycx_error("post put %u: %s", r->id, strerror(errno));
		return YCX_ERR_IO;
	}
	r->state = YCX_REQ_POSTED;
	r->deadline = ycx_now() + YCX_TIMEOUT_NS;
	return YCX_OK;
}

/* Re-issue a timed out put once its window has been invalidated. */
static ycx_status_t ycx_req_repost(struct ycx_ep *ep, struct ycx_req *r)
{
	struct ibv_qp_ex *qpx = ep->qpx;
	struct ibv_mw_bind_info bi;

	ycx_req_fill_bind(ep, r, &bi);
	r->retries++;
	r->desc.attempt = r->retries;

	ibv_wr_start(qpx);
	qpx->wr_id = YCX_WRID_BIND;
	qpx->wr_flags = 0;
	ibv_wr_bind_mw(qpx, r->mw, r->rkey, &bi); /* BUG: rdma-rkey-reuse -- the invalidated window is bound again under the key the server got with the first attempt */
	qpx->wr_id = (uintptr_t)r;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE; /* OK: rdma-unsignaled-send-starvation -- the re-sent descriptor asks for a completion */
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, &r->desc, sizeof(r->desc));
	if (ibv_wr_complete(qpx))
		return YCX_ERR_IO;
	r->state = YCX_REQ_POSTED;
	r->deadline = ycx_now() + YCX_TIMEOUT_NS;
	return YCX_OK;
}

static ycx_status_t ycx_req_invalidate(struct ycx_ep *ep, struct ycx_req *r,
				       enum ycx_req_state next)
{
	struct ibv_qp_ex *qpx = ep->qpx;

	ibv_wr_start(qpx);
	qpx->wr_id = (uintptr_t)r;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qpx, r->rkey);
	if (ibv_wr_complete(qpx))
		return YCX_ERR_IO;
	r->state = next;
	return YCX_OK;
}

static void ycx_req_complete(struct ycx_ep *ep, struct ycx_req *r)
{
	ycx_comp_cb_t cb = r->cb;
	void *arg = r->cb_arg;
	ycx_status_t status = r->status;

	r->state = YCX_REQ_FREE;
	r->cb = NULL;
	r->next_free = ep->free_list;
	ep->free_list = r;
	if (cb)
		cb(arg, status);
}

static void ycx_handle_reply(struct ycx_ep *ep, struct ibv_wc *wc)
{
	struct ycx_reply *rep = &ep->replies[wc->wr_id];
	struct ycx_req *r;

	if (rep->req_id >= ep->depth)
		goto repost;
	r = &ep->reqs[rep->req_id];
	if (r->state != YCX_REQ_POSTED)
		goto repost;		/* answer to an attempt we gave up on */

	r->status = rep->status ? YCX_ERR_IO : YCX_OK;
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == r->rkey)
		ycx_req_complete(ep, r);
	else if (ycx_req_invalidate(ep, r, YCX_REQ_INV) != YCX_OK)
		ycx_error("LOCAL_INV for put %u failed", r->id);
repost:
	if (ycx_post_reply_recv(ep, (unsigned)wc->wr_id))
		ycx_error("reply ring repost failed");
}

static void ycx_check_timeouts(struct ycx_ep *ep)
{
	uint64_t now = ycx_now();
	unsigned i;

	for (i = 0; i < ep->depth; i++) {
		struct ycx_req *r = &ep->reqs[i];

		if (r->state != YCX_REQ_POSTED || now < r->deadline)
			continue;
		if (r->retries >= YCX_MAX_RETRIES) {
			r->status = YCX_ERR_TIMED_OUT;
			ycx_req_invalidate(ep, r, YCX_REQ_INV);
		} else {
			ycx_req_invalidate(ep, r, YCX_REQ_INV_RETRY);
		}
	}
}

/* QP state transitions (INIT, RTR, RTS) live in ycx_wireup.c */
int ycx_wireup_connect(struct ibv_qp *qp, const void *peer_addr, size_t len);

int ycx_ep_connect(struct ycx_ep *ep, const void *peer_addr, size_t len)
{
	unsigned i;

	if (ycx_wireup_connect(ep->qp, peer_addr, len))
		return YCX_ERR_IO;
	for (i = 0; i < ep->depth; i++)
		if (ycx_post_reply_recv(ep, i))
			return YCX_ERR_IO;
	return YCX_OK;
}

int ycx_ep_progress(struct ycx_ep *ep)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(ep->cq, 16, wc);
	if (n < 0)
		return YCX_ERR_IO;

	for (i = 0; i < n; i++) {
		struct ycx_req *r;

		if (wc[i].status != IBV_WC_SUCCESS) {
			ycx_error("wc %s", ibv_wc_status_str(wc[i].status));
			return YCX_ERR_IO;
		}
		if (wc[i].opcode == IBV_WC_RECV) {
			ycx_handle_reply(ep, &wc[i]);
			continue;
		}
		if (wc[i].wr_id == YCX_WRID_BIND)
			continue;
		r = (struct ycx_req *)(uintptr_t)wc[i].wr_id;
		if (wc[i].opcode != IBV_WC_LOCAL_INV)
			continue;	/* SEND completion only frees its entry */
		if (r->state == YCX_REQ_INV_RETRY) {
			if (ycx_req_repost(ep, r) != YCX_OK) {
				r->status = YCX_ERR_IO;
				ycx_req_complete(ep, r);
			}
		} else {
			ycx_req_complete(ep, r);
		}
	}
	ycx_check_timeouts(ep);
	return n;
}

ycx_status_t ycx_put(struct ycx_ep *ep, const void *data, uint32_t len,
		     ycx_comp_cb_t cb, void *arg)
{
	struct ycx_req *r = ep->free_list;

	if (!r)
		return YCX_ERR_NO_RESOURCE;
	if (len > YCX_PUT_MAX)
		return YCX_ERR_IO;
	ep->free_list = r->next_free;

	memcpy(r->buf, data, len);
	r->length = len;
	r->retries = 0;
	r->status = YCX_OK;
	r->cb = cb;
	r->cb_arg = arg;
	if (ycx_req_post(ep, r) != YCX_OK) {
		r->next_free = ep->free_list;
		ep->free_list = r;
		return YCX_ERR_IO;
	}
	return YCX_OK;
}

struct ycx_ep *ycx_ep_open(struct ibv_context *ctx)
{
	struct ycx_ep *ep;
	unsigned i;

	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return NULL;
	ep->ctx = ctx;
	if (ycx_ep_query(ep) != YCX_OK)
		goto err_free;

	ep->pd = ibv_alloc_pd(ctx);
	if (!ep->pd)
		goto err_free;
	ep->cq = ibv_create_cq(ctx, ep->depth * (YCX_WQE_PER_PUT + 1) + 1, NULL, NULL, 0);
	if (!ep->cq)
		goto err_pd;

	ep->arena = aligned_alloc(4096, (size_t)ep->depth * YCX_PUT_MAX);
	if (!ep->arena)
		goto err_cq;
	ep->data_mr = ibv_reg_mr(ep->pd, ep->arena, (size_t)ep->depth * YCX_PUT_MAX,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!ep->data_mr)
		goto err_arena;
	ep->replies = calloc(ep->depth, sizeof(*ep->replies));
	if (!ep->replies)
		goto err_data_mr;
	ep->reply_mr = ibv_reg_mr(ep->pd, ep->replies,
				  ep->depth * sizeof(*ep->replies),
				  IBV_ACCESS_LOCAL_WRITE);
	if (!ep->reply_mr)
		goto err_replies;

	if (ycx_ep_create_qp(ep) != YCX_OK)
		goto err_reply_mr;

	for (i = 0; i < ep->depth; i++) {
		struct ycx_req *r = &ep->reqs[i];

		r->id = i;
		r->buf = ep->arena + (size_t)i * YCX_PUT_MAX;
		r->next_free = ep->free_list;
		ep->free_list = r;
	}
	return ep;

err_reply_mr:
	ibv_dereg_mr(ep->reply_mr);
err_replies:
	free(ep->replies);
err_data_mr:
	ibv_dereg_mr(ep->data_mr);
err_arena:
	free(ep->arena);
err_cq:
	ibv_destroy_cq(ep->cq);
err_pd:
	ibv_dealloc_pd(ep->pd);
err_free:
	free(ep);
	return NULL;
}
