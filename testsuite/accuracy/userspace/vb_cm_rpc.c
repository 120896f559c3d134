/*
 * vb_cm_rpc.c - RPC-over-RDMA client transport on librdmacm, in the style
 * of xprtrdma (rpcrdma_* names, a credit-limited request table, chunk lists
 * exposed to the server through type-2 memory windows).
 *
 * A call with chunks binds one window per segment and posts
 * BIND_MW x nsegs -> SEND as one chain.  A write chunk receives the result
 * (the server RDMA-writes it), a read chunk carries a large argument (the
 * server RDMA-reads it).  When the reply arrives every window is killed with
 * a chain of LOCAL_INVs whose last one is signaled; the call completes on
 * that completion.  Large arguments are normally copied into the read-chunk
 * pool; rpc_call_zc() exposes the caller's buffer directly instead.
 *
 * Connection private data carries the rkey of a small log area the server
 * may write error text into (RPC_OPT_SERVER_LOG).
 *
 * Known problems: the setup ladder jumps to the wrong label when the write
 * chunk pool fails to register; the header MR grants remote read for no
 * one; the write-chunk pool is registered without MW_BIND; rpc_post()'s
 * signal batching counter is a local that restarts at zero on every call;
 * rpc_call_zc() registers (and its completion deregisters) the caller's
 * buffer on every call and leaks it when the post fails.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-rkey-reuse, rdma-remote-invalidate-unchecked, rdma-access-flags-transport, rdma-send-queue-manual-factor -- not the subject of this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define RPC_MAX_SEGS		4
#define RPC_MAX_REQS		128
#define RPC_NMW			(RPC_MAX_REQS * RPC_MAX_SEGS)
#define RPC_SEG_SIZE		(64 * 1024)
#define RPC_POOL_SIZE		((size_t)RPC_NMW * RPC_SEG_SIZE)
#define RPC_HDR_SIZE		1024
#define RPC_LOG_SIZE		4096
#define RPC_MAX_SEND_SGE	4
#define RPC_INLINE		64
#define RPC_SIGNAL_BATCH	8

#define RPC_OPT_SERVER_LOG	0x1

#define RPC_WRID_PING		(~0ULL)

struct rpc_pdata {
	uint64_t log_addr;
	uint32_t log_rkey;
	uint32_t credits;
};

struct rpc_seg {
	struct ibv_mw *mw;
	uint32_t rkey;
	uint64_t addr;
	uint32_t len;
	struct ibv_send_wr bind_wr;
	struct ibv_send_wr inv_wr;
};

struct rpc_req {
	uint32_t xid;
	int nsegs;
	int write_chunk;
	struct rpc_seg segs[RPC_MAX_SEGS];
	struct ibv_send_wr send_wr;
	struct ibv_sge send_sge;
	struct ibv_mr *arg_mr;		/* rpc_call_zc() only */
	void *reply_dst;
	size_t reply_len;
	int done;
	struct rpc_req *next;
};

struct rpc_conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned int credits;
	unsigned int opts;
	unsigned int ping_unsig;
	unsigned int inflight;

	char *hdr_buf;
	struct ibv_mr *hdr_mr;
	char *rep_buf;
	struct ibv_mr *rep_mr;
	char *log_buf;
	struct ibv_mr *log_mr;
	char *rchunk_pool;
	struct ibv_mr *rchunk_mr;
	char *wchunk_pool;
	struct ibv_mr *wchunk_mr;
	struct ibv_mw *mws[RPC_NMW];

	struct rpc_req reqs[RPC_MAX_REQS];
	struct rpc_req *free_reqs;
};

static int rpc_create_qp(struct rpc_conn *c)
{
	struct ibv_qp_init_attr init;

	if (c->credits > RPC_MAX_REQS)
		c->credits = RPC_MAX_REQS;
	memset(&init, 0, sizeof(init));
	init.send_cq = c->cq;
	init.recv_cq = c->cq;
	init.qp_type = IBV_QPT_RC;
	init.sq_sig_all = 0;
	/* OK: rdma-send-queue-undersized -- a call keeps up to RPC_MAX_SEGS binds, its SEND and RPC_MAX_SEGS invalidations, plus room for a batch of pings */
	init.cap.max_send_wr = (2 * RPC_MAX_SEGS + 1) * c->credits + RPC_SIGNAL_BATCH;
	init.cap.max_recv_wr = c->credits;
	init.cap.max_send_sge = RPC_MAX_SEND_SGE;	// OK: rdma-queue-cap-unchecked -- 4 SGEs is within what every device offers
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = RPC_INLINE;		// OK: rdma-queue-cap-unchecked -- 64 bytes of inline data is within what every device offers

	if (rdma_create_qp(c->id, c->pd, &init))
		return -errno;
	c->qp = c->id->qp;
	return 0;
}

static int rpc_conn_setup(struct rpc_conn *c)
{
	int acc, i, j, ret = -ENOMEM;

	c->hdr_buf = calloc(RPC_MAX_REQS, RPC_HDR_SIZE);
	c->rep_buf = calloc(RPC_MAX_REQS, RPC_HDR_SIZE);
	c->log_buf = calloc(1, RPC_LOG_SIZE);
	c->rchunk_pool = aligned_alloc(4096, RPC_POOL_SIZE);
	c->wchunk_pool = aligned_alloc(4096, RPC_POOL_SIZE);
	if (!c->hdr_buf || !c->rep_buf || !c->log_buf || !c->rchunk_pool || !c->wchunk_pool)
		goto err_hdr;

	/* long headers could be pulled by the server */
	c->hdr_mr = ibv_reg_mr(c->pd, c->hdr_buf, RPC_MAX_REQS * RPC_HDR_SIZE,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);	// BUG: rdma-remote-access-overbroad -- the header rkey is never sent; only hdr_mr->lkey is used
	if (!c->hdr_mr)
		goto err_hdr;
	c->rep_mr = ibv_reg_mr(c->pd, c->rep_buf, RPC_MAX_REQS * RPC_HDR_SIZE,
			       IBV_ACCESS_LOCAL_WRITE);
	if (!c->rep_mr)
		goto err_rep;

	acc = IBV_ACCESS_LOCAL_WRITE;
	if (c->opts & RPC_OPT_SERVER_LOG)
		acc |= IBV_ACCESS_REMOTE_WRITE;
	c->log_mr = ibv_reg_mr(c->pd, c->log_buf, RPC_LOG_SIZE, acc);	// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- LOCAL_WRITE is always set; the rkey goes out in the connection private data
	if (!c->log_mr)
		goto err_log;

	c->rchunk_mr = ibv_reg_mr(c->pd, c->rchunk_pool, RPC_POOL_SIZE, IBV_ACCESS_MW_BIND);
	if (!c->rchunk_mr)
		goto err_rchunk;
	c->wchunk_mr = ibv_reg_mr(c->pd, c->wchunk_pool, RPC_POOL_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!c->wchunk_mr)
		goto err_rchunk;	// BUG: rdma-mr-leak -- should unwind from err_wchunk; c->rchunk_mr stays registered

	for (i = 0; i < RPC_NMW; i++) {
		c->mws[i] = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!c->mws[i])
			goto err_mw;	// OK: rdma-mr-leak -- window i failed; the forward loop releases 0..i-1
	}
	for (i = 0; i < RPC_MAX_REQS; i++) {
		struct rpc_req *rq = &c->reqs[i];

		for (j = 0; j < RPC_MAX_SEGS; j++) {
			rq->segs[j].mw = c->mws[i * RPC_MAX_SEGS + j];
			rq->segs[j].rkey = rq->segs[j].mw->rkey;
		}
		rq->next = c->free_reqs;
		c->free_reqs = rq;
	}

	ret = rpc_create_qp(c);
	if (ret)
		goto err_qp;
	return 0;

err_qp:
	i = RPC_NMW;
err_mw:
	for (j = 0; j < i; j++)
		ibv_dealloc_mw(c->mws[j]);
	ibv_dereg_mr(c->wchunk_mr);
err_wchunk:
	ibv_dereg_mr(c->rchunk_mr);
err_rchunk:
	ibv_dereg_mr(c->log_mr);
err_log:
	ibv_dereg_mr(c->rep_mr);
err_rep:
	ibv_dereg_mr(c->hdr_mr);
err_hdr:
	free(c->wchunk_pool);
	free(c->rchunk_pool);
	free(c->log_buf);
	free(c->rep_buf);
	free(c->hdr_buf);
	return ret;
}

static int rpc_post_recv(struct rpc_conn *c, unsigned int slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->rep_buf + (size_t)slot * RPC_HDR_SIZE),
		.length = RPC_HDR_SIZE,
		.lkey = c->rep_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(c->qp, &wr, &bad);
}

void rpc_conn_destroy(struct rpc_conn *c)
{
	int i;

	if (c->qp)
		rdma_destroy_qp(c->id);
	c->qp = NULL;
	for (i = 0; i < RPC_NMW; i++)
		ibv_dealloc_mw(c->mws[i]);
	ibv_dereg_mr(c->wchunk_mr);
	ibv_dereg_mr(c->rchunk_mr);
	ibv_dereg_mr(c->log_mr);
	ibv_dereg_mr(c->rep_mr);
	ibv_dereg_mr(c->hdr_mr);
	free(c->wchunk_pool);
	free(c->rchunk_pool);
	free(c->log_buf);
	free(c->rep_buf);
	free(c->hdr_buf);
}

int rpc_connect(struct rpc_conn *c)
{
	struct rdma_conn_param param;
	struct rpc_pdata pdata;
	struct rdma_cm_event *ev;
	unsigned int i;
	int ret;

	ret = rpc_conn_setup(c);
	if (ret)
		return ret;
	for (i = 0; i < c->credits; i++) {
		if (rpc_post_recv(c, i)) {
			ret = -errno;
			goto err;
		}
	}

	pdata.log_addr = htobe64((uintptr_t)c->log_buf);
	pdata.log_rkey = htobe32(c->log_mr->rkey);
	pdata.credits = htobe32(c->credits);
	memset(&param, 0, sizeof(param));
	param.private_data = &pdata;
	param.private_data_len = sizeof(pdata);
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	if (rdma_connect(c->id, &param) || rdma_get_cm_event(c->id->channel, &ev)) {
		ret = -errno;
		goto err;
	}
	ret = ev->event == RDMA_CM_EVENT_ESTABLISHED ? 0 : -ECONNREFUSED;
	rdma_ack_cm_event(ev);
	if (!ret)
		return 0;
err:
	rpc_conn_destroy(c);
	return ret;
}

static int rpc_post(struct rpc_conn *c, struct ibv_send_wr *first, struct ibv_send_wr *last)
{
	unsigned int unsignaled = 0;
	struct ibv_send_wr *bad;

	/* ask for a completion every RPC_SIGNAL_BATCH calls so the SQ drains */
	if (++unsignaled >= RPC_SIGNAL_BATCH) {
		last->send_flags |= IBV_SEND_SIGNALED;	// BUG(file): rdma-unsignaled-send-starvation -- 'unsignaled' restarts at 0 on every call and never reaches the batch; chunkless calls are never signaled
		unsignaled = 0;
	}
	return ibv_post_send(c->qp, first, &bad) ? -errno : 0;
}

static void rpc_bind_write_chunk(struct rpc_conn *c, struct rpc_seg *sg)
{
	memset(&sg->bind_wr, 0, sizeof(sg->bind_wr));
	sg->rkey = ibv_inc_rkey(sg->rkey);
	sg->bind_wr.opcode = IBV_WR_BIND_MW;
	sg->bind_wr.bind_mw.mw = sg->mw;
	sg->bind_wr.bind_mw.rkey = sg->rkey;
	sg->bind_wr.bind_mw.bind_info.mr = c->wchunk_mr;
	sg->bind_wr.bind_mw.bind_info.addr = sg->addr;
	sg->bind_wr.bind_mw.bind_info.length = sg->len;
	sg->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;	// BUG: rdma-access-flags-invalid -- wchunk_mr was registered without IBV_ACCESS_MW_BIND
}

static void rpc_bind_read_chunk(struct rpc_seg *sg, struct ibv_mr *mr)
{
	memset(&sg->bind_wr, 0, sizeof(sg->bind_wr));
	sg->rkey = ibv_inc_rkey(sg->rkey);
	sg->bind_wr.opcode = IBV_WR_BIND_MW;
	sg->bind_wr.bind_mw.mw = sg->mw;
	sg->bind_wr.bind_mw.rkey = sg->rkey;
	sg->bind_wr.bind_mw.bind_info.mr = mr;
	sg->bind_wr.bind_mw.bind_info.addr = sg->addr;
	sg->bind_wr.bind_mw.bind_info.length = sg->len;
	sg->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;	// OK: rdma-access-flags-invalid -- read windows need only MW_BIND, which both callers' MRs have
}

/* header layout: xid, nsegs, then {rkey, len, addr} per segment */
static int rpc_call_common(struct rpc_conn *c, struct rpc_req *rq, const void *args,
			   size_t arglen, struct ibv_mr *arg_mr)
{
	unsigned int idx = (unsigned int)(rq - c->reqs);
	char *hdr = c->hdr_buf + (size_t)idx * RPC_HDR_SIZE;
	uint32_t *w = (uint32_t *)hdr;
	struct ibv_send_wr *first = NULL, **prev = &first;
	int i;

	/* a write chunk is sized for the reply, a read chunk for the argument */
	rq->nsegs = (int)(((rq->write_chunk ? rq->reply_len : arglen) + RPC_SEG_SIZE - 1) / RPC_SEG_SIZE);
	w[0] = htobe32(rq->xid);
	w[1] = htobe32(rq->nsegs);
	for (i = 0; i < rq->nsegs; i++) {
		struct rpc_seg *sg = &rq->segs[i];
		size_t off = (size_t)i * RPC_SEG_SIZE;

		sg->len = rq->write_chunk || arglen - off > RPC_SEG_SIZE ? RPC_SEG_SIZE
								 : (uint32_t)(arglen - off);
		if (rq->write_chunk) {
			sg->addr = (uintptr_t)(c->wchunk_pool + ((size_t)idx * RPC_MAX_SEGS + i) * RPC_SEG_SIZE);
			rpc_bind_write_chunk(c, sg);
		} else if (arg_mr) {
			sg->addr = (uintptr_t)args + off;
			rpc_bind_read_chunk(sg, arg_mr);
		} else {
			sg->addr = (uintptr_t)(c->rchunk_pool + ((size_t)idx * RPC_MAX_SEGS + i) * RPC_SEG_SIZE);
			memcpy((void *)(uintptr_t)sg->addr, (const char *)args + off, sg->len);
			rpc_bind_read_chunk(sg, c->rchunk_mr);
		}
		w[2 + 4 * i] = htobe32(sg->rkey);
		w[3 + 4 * i] = htobe32(sg->len);
		memcpy(&w[4 + 4 * i], &sg->addr, sizeof(sg->addr));
		*prev = &sg->bind_wr;
		prev = &sg->bind_wr.next;
	}

	memset(&rq->send_wr, 0, sizeof(rq->send_wr));
	rq->send_sge.addr = (uintptr_t)hdr;
	rq->send_sge.length = 8 + 16 * rq->nsegs;
	rq->send_sge.lkey = c->hdr_mr->lkey;
	rq->send_wr.wr_id = idx;
	rq->send_wr.opcode = IBV_WR_SEND;
	rq->send_wr.sg_list = &rq->send_sge;
	rq->send_wr.num_sge = 1;
	*prev = &rq->send_wr;
	rq->done = 0;
	if (rpc_post(c, first, &rq->send_wr))
		return -EIO;
	c->inflight++;
	return 0;
}

static struct rpc_req *rpc_get_req(struct rpc_conn *c)
{
	struct rpc_req *rq = c->free_reqs;

	if (rq)
		c->free_reqs = rq->next;
	return rq;
}

static void rpc_put_req(struct rpc_conn *c, struct rpc_req *rq)
{
	rq->next = c->free_reqs;
	c->free_reqs = rq;
}

int rpc_call(struct rpc_conn *c, uint32_t xid, const void *args, size_t arglen,
	     void *reply, size_t reply_len)
{
	struct rpc_req *rq;
	int ret;

	/* calls with a reply chunk must fit their arguments in the header */
	if (arglen > RPC_MAX_SEGS * RPC_SEG_SIZE || reply_len > RPC_MAX_SEGS * RPC_SEG_SIZE ||
	    (reply_len && arglen))
		return -EMSGSIZE;
	rq = rpc_get_req(c);
	if (!rq)
		return -EAGAIN;
	rq->xid = xid;
	rq->write_chunk = reply_len > 0;
	rq->reply_dst = reply;
	rq->reply_len = reply_len;
	ret = rpc_call_common(c, rq, args, arglen, NULL);
	if (ret)
		rpc_put_req(c, rq);
	return ret;
}

/* zero-copy variant: the server reads the argument straight from the caller */
int rpc_call_zc(struct rpc_conn *c, uint32_t xid, void *args, size_t arglen)
{
	struct ibv_mr *arg_mr;
	struct rpc_req *rq;
	int ret;

	if (arglen > RPC_MAX_SEGS * RPC_SEG_SIZE)
		return -EMSGSIZE;
	arg_mr = ibv_reg_mr(c->pd, args, arglen, IBV_ACCESS_MW_BIND);	// BUG: rdma-registration-in-datapath -- the caller's argument is registered on every call
	if (!arg_mr)
		return -errno;
	rq = rpc_get_req(c);
	if (!rq) {
		ibv_dereg_mr(arg_mr);
		return -EAGAIN;	// OK: rdma-mr-leak -- arg_mr released before giving up
	}
	rq->xid = xid;
	rq->write_chunk = 0;
	rq->reply_dst = NULL;
	rq->reply_len = 0;
	rq->arg_mr = arg_mr;
	ret = rpc_call_common(c, rq, args, arglen, arg_mr);
	if (ret) {
		rpc_put_req(c, rq);
		return ret;	// BUG: rdma-mr-leak -- rq->arg_mr is still registered when the post fails
	}
	return 0;
}

static int rpc_invalidate(struct rpc_conn *c, struct rpc_req *rq)
{
	struct ibv_send_wr *bad;
	int i;

	for (i = 0; i < rq->nsegs; i++) {
		struct ibv_send_wr *inv = &rq->segs[i].inv_wr;

		memset(inv, 0, sizeof(*inv));
		inv->opcode = IBV_WR_LOCAL_INV;
		inv->invalidate_rkey = rq->segs[i].rkey;
		inv->next = i + 1 < rq->nsegs ? &rq->segs[i + 1].inv_wr : NULL;
		inv->send_flags = 0;	// OK: rdma-unsignaled-send-starvation -- the last LOCAL_INV of the chain is signaled below and retires the others
	}
	rq->segs[rq->nsegs - 1].inv_wr.wr_id = (uint64_t)(rq - c->reqs);
	rq->segs[rq->nsegs - 1].inv_wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &rq->segs[0].inv_wr, &bad) ? -errno : 0;
}

static void rpc_complete(struct rpc_conn *c, struct rpc_req *rq, const struct ibv_wc *wc)
{
	unsigned int idx = (unsigned int)(rq - c->reqs);

	if (rq->write_chunk && wc->status == IBV_WC_SUCCESS)
		memcpy(rq->reply_dst, c->wchunk_pool + (size_t)idx * RPC_MAX_SEGS * RPC_SEG_SIZE,
		       rq->reply_len < RPC_SEG_SIZE * RPC_MAX_SEGS ? rq->reply_len : RPC_SEG_SIZE * RPC_MAX_SEGS);
	if (rq->arg_mr) {
		ibv_dereg_mr(rq->arg_mr);	// BUG: rdma-registration-in-datapath -- the zero-copy argument is deregistered at every completion
		rq->arg_mr = NULL;
	}
	rq->done = 1;
	c->inflight--;
	rpc_put_req(c, rq);
}

int rpc_send_ping(struct rpc_conn *c)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = RPC_WRID_PING;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htobe32(0);
	wr.send_flags = IBV_SEND_INLINE;
	if (++c->ping_unsig % RPC_SIGNAL_BATCH == 0)
		wr.send_flags |= IBV_SEND_SIGNALED;	// OK: rdma-unsignaled-send-starvation -- ping_unsig advances on every ping
	return ibv_post_send(c->qp, &wr, &bad) ? -errno : 0;
}

int rpc_poll(struct rpc_conn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(c->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].wr_id == RPC_WRID_PING)
			continue;
		if (wc[i].opcode == IBV_WC_RECV) {
			/* reply header: xid, then the slot the call was sent from */
			uint32_t *w = (uint32_t *)(c->rep_buf + wc[i].wr_id * RPC_HDR_SIZE);
			uint32_t slot = be32toh(w[1]);

			if (slot < RPC_MAX_REQS) {
				struct rpc_req *rq = &c->reqs[slot];

				if (rq->nsegs == 0)
					rpc_complete(c, rq, &wc[i]);
				else if (rpc_invalidate(c, rq))
					return -EIO;
			}
			rpc_post_recv(c, (unsigned int)wc[i].wr_id);
		} else if (wc[i].opcode == IBV_WC_LOCAL_INV) {
			rpc_complete(c, &c->reqs[wc[i].wr_id], &wc[i]);
		}
	}
	return n;
}

/* benchmark loop: one argument buffer, registered for the whole run */
int rpc_bench(struct rpc_conn *c, size_t size, unsigned int iters)
{
	struct ibv_mr *mr;
	struct rpc_req *rq;
	unsigned int i;
	void *buf;
	int ret = 0;

	buf = aligned_alloc(4096, size);
	if (!buf)
		return -ENOMEM;
	mr = ibv_reg_mr(c->pd, buf, size, IBV_ACCESS_MW_BIND);	// OK: rdma-registration-in-datapath -- once per run, outside the posting loop
	if (!mr) {
		free(buf);
		return -errno;
	}
	for (i = 0; i < iters && !ret; i++) {
		while (!(rq = rpc_get_req(c)))
			if (rpc_poll(c) < 0)
				break;
		if (!rq) {
			ret = -EIO;
			break;
		}
		rq->xid = i;
		rq->write_chunk = 0;
		rq->arg_mr = NULL;
		ret = rpc_call_common(c, rq, buf, size, mr);
	}
	while (c->inflight && rpc_poll(c) >= 0)
		;
	ibv_dereg_mr(mr);	// OK: rdma-registration-in-datapath -- after the loop, once per run
	free(buf);
	return ret;
}
