/*
 * cbrpc: a bulk-RPC client whose request kinds are described by ops
 * tables (struct cbrpc_ops: the window rights and the completion
 * callback).  A request binds its slot's type-2 window over the bulk
 * buffer (BIND_MW chained to the call SEND through fields of the request)
 * and the server moves the bulk data: FETCH calls let the server
 * RDMA-WRITE into the buffer, STORE calls let it RDMA-READ from it.  The
 * server's reply is a SEND_WITH_INV on the window's key; the reply
 * handler is called through r->ops->done.  When the reply carries no
 * usable remote invalidation, a signaled LOCAL_INV is posted and the
 * request is released from its completion.  Calls that find the send
 * queue full are parked on a backlog and re-posted later.
 *
 * Correct: each call rotates its window's key with ibv_inc_rkey(); a
 * re-post from the backlog keeps that new key (the failed post exposed
 * nothing); FETCH replies compare the invalidated key with the request's;
 * the release waits for the LOCAL_INV completion; the send queue holds
 * BIND_MW + SEND + LOCAL_INV per request (migration note: by a hand-made
 * factor).
 *
 * Not correct: the STORE reply handler only checks that *some* key was
 * invalidated (invalidated_rkey != 0) before skipping the LOCAL_INV.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CBRPC_WRS_PER_REQ	3	/* BIND_MW + SEND + LOCAL_INV */
#define CBRPC_INV		1ULL

struct cbrpc_queue;
struct cbrpc_req;

struct cbrpc_ops {
	const char *name;
	unsigned int access;
	void (*done)(struct cbrpc_queue *q, struct cbrpc_req *r, const struct ibv_wc *wc);
};

struct cbrpc_call_msg {
	uint32_t proc;
	uint32_t xid;
	uint64_t va;
	uint32_t rkey;
	uint32_t len;
};

struct cbrpc_req {
	struct cbrpc_req       *next;
	const struct cbrpc_ops *ops;
	uint32_t                xid;
	struct ibv_mw          *mw;
	uint32_t                rkey;
	char                   *buf;
	uint32_t                len;
	struct cbrpc_call_msg   msg;
	struct ibv_sge          sge;
	struct ibv_send_wr      bind_wr;
	struct ibv_send_wr      send_wr;
	struct ibv_send_wr      inv_wr;
	int                     status;
	void                  (*complete)(void *ctx, int status);
	void                   *ctx;
} __attribute__((aligned(8)));

struct cbrpc_queue {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_mr      *data_mr;	/* LOCAL_WRITE | MW_BIND over the bulk buffers */
	struct ibv_mr      *msg_mr;	/* covers reqs[] */
	struct cbrpc_req   *reqs;
	struct cbrpc_req   *free;
	struct cbrpc_req   *backlog;
	unsigned int        depth;
};

int cbrpc_queue_create(struct cbrpc_queue *q)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	/* OK: rdma-send-queue-undersized -- three entries per request, the most one request posts */
	attr.cap.max_send_wr = CBRPC_WRS_PER_REQ * q->depth; // BUG: rdma-send-queue-manual-factor -- depth times the ULP's own factor for BIND_MW/SEND/LOCAL_INV
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	q->qp = ibv_create_qp(q->pd, &attr);
	return q->qp ? 0 : -errno;
}

static void cbrpc_put(struct cbrpc_queue *q, struct cbrpc_req *r)
{
	r->next = q->free;
	q->free = r;
}

static void cbrpc_build(struct cbrpc_queue *q, struct cbrpc_req *r)
{
	memset(&r->bind_wr, 0, sizeof(r->bind_wr));
	r->bind_wr.wr_id = (uintptr_t)r;
	r->bind_wr.opcode = IBV_WR_BIND_MW; // BUG: rdma-local-mr-management -- per-call window bind done by the ULP
	r->bind_wr.bind_mw.mw = r->mw;
	/* OK: rdma-rkey-reuse -- r->rkey is rotated with ibv_inc_rkey() by cbrpc_call() for every call */
	r->bind_wr.bind_mw.rkey = r->rkey;
	r->bind_wr.bind_mw.bind_info.mr = q->data_mr;
	r->bind_wr.bind_mw.bind_info.addr = (uintptr_t)r->buf;
	r->bind_wr.bind_mw.bind_info.length = r->len;
	r->bind_wr.bind_mw.bind_info.mw_access_flags = r->ops->access;
	r->bind_wr.next = &r->send_wr;

	r->msg.xid = htobe32(r->xid);
	r->msg.va = htobe64((uintptr_t)r->buf);
	r->msg.rkey = htobe32(r->rkey);
	r->msg.len = htobe32(r->len);
	r->sge.addr = (uintptr_t)&r->msg;
	r->sge.length = sizeof(r->msg);
	r->sge.lkey = q->msg_mr->lkey;
	memset(&r->send_wr, 0, sizeof(r->send_wr));
	r->send_wr.wr_id = (uintptr_t)r;
	r->send_wr.opcode = IBV_WR_SEND;
	r->send_wr.send_flags = IBV_SEND_SIGNALED;
	r->send_wr.sg_list = &r->sge;
	r->send_wr.num_sge = 1;
}

int cbrpc_call(struct cbrpc_queue *q, const struct cbrpc_ops *ops, uint32_t proc,
	       uint32_t len, void (*complete)(void *, int), void *ctx)
{
	struct ibv_send_wr *bad;
	struct cbrpc_req *r = q->free;
	int ret;

	if (!r)
		return -EAGAIN;
	q->free = r->next;
	r->ops = ops;
	r->len = len;
	r->msg.proc = htobe32(proc);
	r->complete = complete;
	r->ctx = ctx;
	r->status = 0;
	r->xid++;
	r->rkey = ibv_inc_rkey(r->rkey);
	cbrpc_build(q, r);

	ret = ibv_post_send(q->qp, &r->bind_wr, &bad);
	if (ret == ENOMEM && bad == &r->bind_wr) {
		/* send queue full: nothing was posted, retry from the backlog */
		r->next = q->backlog;
		q->backlog = r;
		return 0;
	}
	if (ret)
		return -EIO;	/* the queue is being reset; the request stays out */
	return 0;
}

/* called after completions freed send-queue entries */
void cbrpc_flush_backlog(struct cbrpc_queue *q)
{
	struct ibv_send_wr *bad;
	struct cbrpc_req *r;

	while ((r = q->backlog)) {
		/* OK: rdma-rkey-reuse -- same key as the failed post, which bound nothing and sent nothing */
		cbrpc_build(q, r);
		if (ibv_post_send(q->qp, &r->bind_wr, &bad))
			return;
		q->backlog = r->next;
	}
}

static void cbrpc_local_inv(struct cbrpc_queue *q, struct cbrpc_req *r)
{
	struct ibv_send_wr *bad;

	memset(&r->inv_wr, 0, sizeof(r->inv_wr));
	r->inv_wr.wr_id = (uintptr_t)r | CBRPC_INV;
	r->inv_wr.opcode = IBV_WR_LOCAL_INV;
	r->inv_wr.invalidate_rkey = r->rkey;
	r->inv_wr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(q->qp, &r->inv_wr, &bad))
		r->complete(r->ctx, -EIO);	/* request stays out: the queue is being reset */
}

static void cbrpc_finish(struct cbrpc_queue *q, struct cbrpc_req *r)
{
	r->complete(r->ctx, r->status);
	cbrpc_put(q, r);
}

static void cbrpc_fetch_done(struct cbrpc_queue *q, struct cbrpc_req *r, const struct ibv_wc *wc)
{
	/* OK: rdma-remote-invalidate-unchecked -- the invalidated key must be this request's */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == r->rkey) {
		cbrpc_finish(q, r);
		return;
	}
	cbrpc_local_inv(q, r);
}

static void cbrpc_store_done(struct cbrpc_queue *q, struct cbrpc_req *r, const struct ibv_wc *wc)
{
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey) { // BUG: rdma-remote-invalidate-unchecked -- a non-zero key is accepted, not compared with r->rkey
		cbrpc_finish(q, r);
		return;
	}
	cbrpc_local_inv(q, r);
}

const struct cbrpc_ops cbrpc_fetch_ops = {
	.name = "fetch",
	.access = IBV_ACCESS_REMOTE_WRITE,
	.done = cbrpc_fetch_done,
};

const struct cbrpc_ops cbrpc_store_ops = {
	.name = "store",
	.access = IBV_ACCESS_REMOTE_READ,
	.done = cbrpc_store_done,
};

int cbrpc_poll(struct cbrpc_queue *q, struct cbrpc_req *(*lookup)(struct cbrpc_queue *, uint64_t))
{
	struct ibv_wc wc[16];
	int n, k;

	n = ibv_poll_cq(q->cq, 16, wc);
	for (k = 0; k < n; k++) {
		struct cbrpc_req *r;

		if (wc[k].opcode == IBV_WC_RECV) {
			/* the reply's wr_id names the receive buffer; lookup() maps it to the call by xid */
			r = lookup(q, wc[k].wr_id);
			if (r && wc[k].status == IBV_WC_SUCCESS)
				r->ops->done(q, r, &wc[k]);
			continue;
		}
		if (wc[k].wr_id & CBRPC_INV) {
			r = (struct cbrpc_req *)(uintptr_t)(wc[k].wr_id & ~CBRPC_INV);
			if (wc[k].status != IBV_WC_SUCCESS)
				continue;	/* keep the request out; the queue is reset */
			cbrpc_finish(q, r); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released from the LOCAL_INV's own completion
		}
	}
	cbrpc_flush_backlog(q);
	return n;
}
