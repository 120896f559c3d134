/*
 * rpcmw.c - request/response RPC client over an RC QP.
 *
 * Every call exposes its result buffer through a type-2 memory window: the
 * server RDMA-WRITEs the result there and answers, normally with
 * SEND_WITH_INV on the window key.  A call posts the two-element chain
 * req->wr[RPC_WR_BIND] (BIND_MW) -> req->wr[RPC_WR_SEND] (SEND, header
 * inline); when the answer comes back without remote invalidation the call
 * posts req->inv_wr (LOCAL_INV, signaled) and is recycled when that
 * completes.  A call that times out is invalidated and then sent again.
 * A status page is exported once per connection through a type-1 window.
 *
 * Known problems in this version:
 *  - max_send_wr reserves two entries per call (BIND, SEND) but a call can
 *    hold three (BIND, SEND, LOCAL_INV);
 *  - the "signal every RPC_SIGNAL_EVERY sends" counter is never advanced;
 *    against a server that always invalidates remotely nothing on the QP
 *    asks for a completion;
 *  - 256 bytes of inline data are requested without any fallback;
 *  - the retry path binds the window again with the key it had before.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-invalidation-leak, rdma-unmap-before-invalidate,
 *   rdma-remote-invalidate-unchecked, rdma-access-flags-invalid,
 *   rdma-access-flags-transport, rdma-remote-access-overbroad,
 *   rdma-registration-in-datapath, rdma-local-mr-management,
 *   rdma-send-queue-manual-factor -- not covered by this file's annotations
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>
#include <infiniband/verbs.h>

#define RPC_DEPTH		64
#define RPC_SIGNAL_EVERY	16
#define RPC_INLINE_MAX		256
#define RPC_RESULT_MAX		(64 * 1024)
#define RPC_STATUS_PAGE		4096
#define RPC_MAX_RETRIES		2
#define RPC_TIMEOUT_SEC		5

#define RPC_WRID_STATUS		((uint64_t)0xffffffff00000001ull)

enum { RPC_WR_BIND, RPC_WR_SEND, RPC_NR_WR };

struct rpc_hdr {
	uint32_t	xid;
	uint16_t	proc;
	uint16_t	arg_len;
	uint64_t	res_addr;
	uint32_t	res_rkey;
	uint32_t	res_len;
	uint8_t		args[];
};

struct rpc_reply {
	uint32_t	xid;
	int32_t		status;
	uint32_t	res_len;
	uint32_t	pad;
};

struct rpc_conn;
typedef void (*rpc_done_fn)(void *ctx, int status, const void *res, uint32_t len);

struct rpc_req {
	TAILQ_ENTRY(rpc_req)	link;
	uint32_t		xid;
	int			busy;
	int			retries;
	int			retry_pending;
	int			status;
	uint32_t		res_len;
	time_t			deadline;
	char			*res_buf;
	struct ibv_mw		*mw;
	uint32_t		mw_key;
	char			hdr_buf[RPC_INLINE_MAX];
	struct ibv_sge		sge;
	struct ibv_send_wr	wr[RPC_NR_WR];
	struct ibv_send_wr	inv_wr;
	rpc_done_fn		done;
	void			*ctx;
};

struct rpc_conn {
	struct ibv_context	*verbs;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_mr		*res_mr;	/* LOCAL_WRITE | MW_BIND */
	char			*res_pool;
	struct ibv_mr		*rx_mr;
	struct rpc_reply	*rx;
	struct ibv_mr		*status_mr;
	void			*status_page;
	struct ibv_mw		*status_mw;	/* type 1 */
	uint32_t		status_rkey;
	unsigned		unsignaled;
	struct {
		uint64_t	tx;
		uint64_t	rx;
		uint64_t	retries;
	} stats;
	uint32_t		next_xid;
	TAILQ_HEAD(, rpc_req)	free_reqs;
	struct rpc_req		reqs[RPC_DEPTH];
};

static int rpc_create_qp(struct rpc_conn *c)
{
	struct ibv_qp_init_attr attr = {
		.send_cq	= c->cq,
		.recv_cq	= c->cq,
		.qp_type	= IBV_QPT_RC,
		.sq_sig_all	= 0,
	};

	/* one BIND_MW and one SEND per call */
	attr.cap.max_send_wr = RPC_DEPTH * 2; /* BUG(file): rdma-send-queue-undersized -- a call holds BIND_MW, SEND and LOCAL_INV, three entries, for each of RPC_DEPTH calls */
	attr.cap.max_recv_wr = RPC_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = RPC_INLINE_MAX; /* BUG: rdma-queue-cap-unchecked -- 256 inline bytes asked for without looking at the device or falling back; creation fails where the provider offers less */

	c->qp = ibv_create_qp(c->pd, &attr);
	return c->qp ? 0 : -errno;
}

static int rpc_post_recv(struct rpc_conn *c, unsigned slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->rx[slot], .length = sizeof(c->rx[slot]),
		.lkey = c->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

/* Fill the BIND_MW half of the call's chain; the SEND follows it. */
static void rpc_prep_bind(struct rpc_conn *c, struct rpc_req *req, uint32_t key)
{
	struct ibv_send_wr *wr = &req->wr[RPC_WR_BIND];

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)req;
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = req->mw;
	wr->bind_mw.rkey = key;
	wr->bind_mw.bind_info.mr = c->res_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)req->res_buf;
	wr->bind_mw.bind_info.length = RPC_RESULT_MAX;
	wr->bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	wr->next = &req->wr[RPC_WR_SEND];
	req->mw_key = key;
}

static void rpc_prep_send(struct rpc_conn *c, struct rpc_req *req, uint32_t hdr_len)
{
	struct ibv_send_wr *wr = &req->wr[RPC_WR_SEND];
	struct rpc_hdr *hdr = (struct rpc_hdr *)req->hdr_buf;

	hdr->res_addr = (uintptr_t)req->res_buf;
	hdr->res_rkey = req->mw_key;
	hdr->res_len = RPC_RESULT_MAX;

	req->sge.addr = (uintptr_t)req->hdr_buf;
	req->sge.length = hdr_len;
	req->sge.lkey = 0;			/* inline */

	memset(wr, 0, sizeof(*wr));
	wr->wr_id = (uintptr_t)req;
	wr->opcode = IBV_WR_SEND;
	wr->sg_list = &req->sge;
	wr->num_sge = 1;
	wr->send_flags = IBV_SEND_INLINE;
	if (c->unsignaled >= RPC_SIGNAL_EVERY) { /* BUG(file): rdma-unsignaled-send-starvation -- c->unsignaled is only ever reset, never incremented (stats.tx is), so no SEND is signaled */
		wr->send_flags |= IBV_SEND_SIGNALED;
		c->unsignaled = 0;
	}
	c->stats.tx++;
}

static int rpc_post_inv(struct rpc_conn *c, struct rpc_req *req)
{
	struct ibv_send_wr *bad;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.wr_id = (uintptr_t)req;
	req->inv_wr.opcode = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->mw_key;
	req->inv_wr.send_flags = IBV_SEND_SIGNALED; /* OK: rdma-unsignaled-send-starvation -- the call is recycled from this completion, so it is always requested */
	return ibv_post_send(c->qp, &req->inv_wr, &bad);
}

int rpc_call(struct rpc_conn *c, uint16_t proc, const void *args, uint16_t len,
	     rpc_done_fn done, void *ctx)
{
	struct rpc_req *req = TAILQ_FIRST(&c->free_reqs);
	struct rpc_hdr *hdr;
	struct ibv_send_wr *bad;
	int ret;

	if (!req)
		return -EAGAIN;
	if (sizeof(*hdr) + len > RPC_INLINE_MAX)
		return -EMSGSIZE;
	TAILQ_REMOVE(&c->free_reqs, req, link);

	hdr = (struct rpc_hdr *)req->hdr_buf;
	hdr->xid = req->xid = c->next_xid++ * RPC_DEPTH + (uint32_t)(req - c->reqs);
	hdr->proc = proc;
	hdr->arg_len = len;
	memcpy(hdr->args, args, len);
	req->busy = 1;
	req->retries = 0;
	req->retry_pending = 0;
	req->done = done;
	req->ctx = ctx;
	req->deadline = time(NULL) + RPC_TIMEOUT_SEC;

	rpc_prep_bind(c, req, ibv_inc_rkey(req->mw_key)); /* OK: rdma-rkey-reuse -- each call binds the window under a rotated key */
	rpc_prep_send(c, req, sizeof(*hdr) + len);
	ret = ibv_post_send(c->qp, &req->wr[RPC_WR_BIND], &bad);
	if (ret) {
		req->busy = 0;
		TAILQ_INSERT_HEAD(&c->free_reqs, req, link);
		return -ret;
	}
	return 0;
}

/* Send a timed out call again; its window was invalidated first. */
static int rpc_retry(struct rpc_conn *c, struct rpc_req *req)
{
	struct rpc_hdr *hdr = (struct rpc_hdr *)req->hdr_buf;
	struct ibv_send_wr *bad;

	req->retry_pending = 0;
	req->retries++;
	req->deadline = time(NULL) + RPC_TIMEOUT_SEC;
	c->stats.retries++;

	rpc_prep_bind(c, req, req->mw_key); /* BUG(file): rdma-rkey-reuse -- the window is bound again under the key the server (and the late write of the first attempt) already holds */
	rpc_prep_send(c, req, sizeof(*hdr) + hdr->arg_len);
	return ibv_post_send(c->qp, &req->wr[RPC_WR_BIND], &bad);
}

static void rpc_finish(struct rpc_conn *c, struct rpc_req *req)
{
	req->busy = 0;
	TAILQ_INSERT_TAIL(&c->free_reqs, req, link);
	if (req->done)
		req->done(req->ctx, req->status, req->res_buf, req->res_len);
}

static void rpc_handle_reply(struct rpc_conn *c, struct ibv_wc *wc)
{
	struct rpc_reply *rep = &c->rx[wc->wr_id];
	struct rpc_req *req = &c->reqs[rep->xid % RPC_DEPTH];

	c->stats.rx++;
	if (!req->busy || req->xid != rep->xid || req->retry_pending)
		goto repost;

	req->status = rep->status;
	req->res_len = rep->res_len < RPC_RESULT_MAX ? rep->res_len : RPC_RESULT_MAX;
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == req->mw_key)
		rpc_finish(c, req);
	else if (rpc_post_inv(c, req))
		fprintf(stderr, "rpc: LOCAL_INV for xid %u failed\n", req->xid);
repost:
	rpc_post_recv(c, (unsigned)wc->wr_id);
}

/* Export (or re-export after a server restart) the status page. */
int rpc_export_status(struct rpc_conn *c)
{
	struct ibv_mw_bind mwb = {
		.wr_id		= RPC_WRID_STATUS,
		.send_flags	= IBV_SEND_SIGNALED,
		.bind_info	= {
			.mr		 = c->status_mr,
			.addr		 = (uintptr_t)c->status_page,
			.length		 = RPC_STATUS_PAGE,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ,
		},
	};
	int ret;

	ret = ibv_bind_mw(c->qp, c->status_mw, &mwb); /* OK: rdma-rkey-reuse -- type-1 bind: the library hands the window a new rkey on every bind */
	if (ret)
		return -ret;
	c->status_rkey = c->status_mw->rkey;
	return 0;
}

int rpc_poll(struct rpc_conn *c)
{
	struct ibv_wc wc[8];
	time_t now = time(NULL);
	int n, i;

	n = ibv_poll_cq(c->cq, 8, wc);
	for (i = 0; i < n; i++) {
		struct rpc_req *req = (struct rpc_req *)(uintptr_t)wc[i].wr_id;

		if (wc[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "rpc: %s\n", ibv_wc_status_str(wc[i].status));
			return -EIO;
		}
		switch (wc[i].opcode) {
		case IBV_WC_RECV:
			rpc_handle_reply(c, &wc[i]);
			break;
		case IBV_WC_LOCAL_INV:
			if (req->retry_pending && req->retries < RPC_MAX_RETRIES) {
				if (rpc_retry(c, req) == 0)
					break;
				req->status = -EIO;
			}
			rpc_finish(c, req);
			break;
		default:	/* SEND, BIND_MW of the status page */
			break;
		}
	}

	for (i = 0; i < RPC_DEPTH; i++) {
		struct rpc_req *req = &c->reqs[i];

		if (!req->busy || req->retry_pending || now < req->deadline)
			continue;
		req->retry_pending = 1;
		req->status = -ETIMEDOUT;
		if (rpc_post_inv(c, req))
			return -EIO;
	}
	return n;
}

int rpc_conn_init(struct rpc_conn *c, struct ibv_context *verbs)
{
	int i, ret = -ENOMEM;

	c->verbs = verbs;
	c->pd = ibv_alloc_pd(verbs);
	if (!c->pd)
		return -ENOMEM;
	c->cq = ibv_create_cq(verbs, RPC_DEPTH * 4, NULL, NULL, 0);
	if (!c->cq)
		goto err_pd;
	c->res_pool = calloc(RPC_DEPTH, RPC_RESULT_MAX);
	c->rx = calloc(RPC_DEPTH, sizeof(*c->rx));
	c->status_page = calloc(1, RPC_STATUS_PAGE);
	if (!c->res_pool || !c->rx || !c->status_page)
		goto err_mem;
	c->res_mr = ibv_reg_mr(c->pd, c->res_pool, (size_t)RPC_DEPTH * RPC_RESULT_MAX,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!c->res_mr)
		goto err_mem;
	c->rx_mr = ibv_reg_mr(c->pd, c->rx, RPC_DEPTH * sizeof(*c->rx),
			      IBV_ACCESS_LOCAL_WRITE);
	if (!c->rx_mr)
		goto err_res_mr;
	c->status_mr = ibv_reg_mr(c->pd, c->status_page, RPC_STATUS_PAGE,
				  IBV_ACCESS_MW_BIND);
	if (!c->status_mr)
		goto err_rx_mr;
	c->status_mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_1);
	if (!c->status_mw)
		goto err_status_mr;

	TAILQ_INIT(&c->free_reqs);
	for (i = 0; i < RPC_DEPTH; i++) {
		struct rpc_req *req = &c->reqs[i];

		req->res_buf = c->res_pool + (size_t)i * RPC_RESULT_MAX;
		req->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!req->mw)
			goto err_mws;
		req->mw_key = req->mw->rkey;
		TAILQ_INSERT_TAIL(&c->free_reqs, req, link);
	}

	ret = rpc_create_qp(c);
	if (ret)
		goto err_mws;
	return 0;

err_mws:
	while (i--)
		ibv_dealloc_mw(c->reqs[i].mw);
	ibv_dealloc_mw(c->status_mw);
err_status_mr:
	ibv_dereg_mr(c->status_mr);
err_rx_mr:
	ibv_dereg_mr(c->rx_mr);
err_res_mr:
	ibv_dereg_mr(c->res_mr);
err_mem:
	free(c->status_page);
	free(c->rx);
	free(c->res_pool);
	ibv_destroy_cq(c->cq);
err_pd:
	ibv_dealloc_pd(c->pd);
	return ret;
}

/* Called once the QP is in RTS (see rpc_wireup.c). */
int rpc_conn_start(struct rpc_conn *c)
{
	unsigned i;

	for (i = 0; i < RPC_DEPTH; i++)
		if (rpc_post_recv(c, i))
			return -EIO;
	return rpc_export_status(c);
}
