/*
 * blkc_mw.c - initiator queue of a small RDMA block protocol.
 *
 * Data buffers come from one pool MR registered at queue creation; every
 * command binds a type-2 memory window over its slice of the pool (and a
 * second window over its protection-information slice when the namespace
 * has metadata) in the same post as the command SEND.  The target moves
 * the data with RDMA READ/WRITE and answers with SEND_WITH_INV naming the
 * data window; the metadata window is always invalidated locally, the
 * data window too when the target did not invalidate it.  The request goes
 * back on the free list from the completion of its last LOCAL_INV.
 *
 * Problems: the queue is sized for three work requests per command, the
 * metadata window is re-bound under the key it already had and over an MR
 * without local write, the admin queue believes any remote invalidation,
 * and the timeout and cancel paths recycle requests whose windows are
 * still live.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-mr-leak -- setup-time allocations not annotated in this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define BLKC_MAX_IO		(128 * 1024)
#define BLKC_META_PER_IO	(BLKC_MAX_IO / 512 * 8)
#define BLKC_TIMEOUT_S		30

enum { BLKC_OPC_FLUSH = 0, BLKC_OPC_WRITE = 1, BLKC_OPC_READ = 2, BLKC_OPC_ABORT = 8 };

enum blkc_wr_kind {
	BLKC_WR_SEND = 1,
	BLKC_WR_INV,
	BLKC_WR_SYNC_INV,
};
#define BLKC_WRID(cid, kind)	(((uint64_t)(cid) << 8) | (kind))
#define BLKC_WRID_CID(id)	((uint16_t)((id) >> 8))
#define BLKC_WRID_KIND(id)	((unsigned int)((id) & 0xff))

struct blkc_cmd {
	uint8_t opc;
	uint8_t flags;
	uint16_t cid;
	uint32_t nlb;
	uint64_t slba;
	uint64_t data_addr;
	uint32_t data_rkey;
	uint32_t meta_rkey;
	uint64_t meta_addr;
};

struct blkc_rsp {
	uint16_t cid;
	uint16_t status;
	uint32_t rsvd;
};

struct blkc_req {
	struct blkc_req *next;
	uint16_t cid;
	int is_read;
	int inflight;
	void *buf;
	size_t len;
	void *meta;
	size_t meta_len;
	struct ibv_mw *mw;
	uint32_t rkey;
	struct ibv_mw *meta_mw;
	int need_inv;
	volatile int inv_done;
	int status;
	time_t deadline;
	struct ibv_send_wr bind_wr;
	struct ibv_send_wr meta_bind_wr;
	struct ibv_send_wr send_wr;
	struct ibv_send_wr meta_inv_wr;
	struct ibv_send_wr inv_wr;
	struct ibv_sge send_sge;
	void (*done)(struct blkc_req *req, int status);
};

struct blkc_queue {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint16_t depth;
	int admin;
	void *pool;
	struct ibv_mr *pool_mr;
	void *meta_pool;
	struct ibv_mr *meta_mr;
	struct blkc_cmd *cmds;
	struct ibv_mr *cmd_mr;
	struct blkc_rsp *rsps;
	struct ibv_mr *rsp_mr;
	struct blkc_req *reqs;
	struct blkc_req *free_list;
	int fatal;
};

static int blkc_create_qp(struct blkc_queue *q)
{
	struct ibv_qp_init_attr attr;

	q->cq = ibv_create_cq(q->id->verbs, 4 * q->depth + 1, q, NULL, 0);
	if (!q->cq)
		return -errno;
	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = q->cq;
	attr.recv_cq = q->cq;
	attr.sq_sig_all = 0;
	// BUG(file): rdma-send-queue-undersized -- a command with metadata keeps BIND, BIND, SEND and two LOCAL_INVs on the queue
	attr.cap.max_send_wr = 3 * q->depth + 1;	// BUG: rdma-send-queue-manual-factor -- hand-made factor for the binds and invalidations
	attr.cap.max_recv_wr = q->depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(q->id, q->pd, &attr)) {
		ibv_destroy_cq(q->cq);
		return -errno;
	}
	q->qp = q->id->qp;
	return 0;
}

static int blkc_alloc_reqs(struct blkc_queue *q)
{
	size_t pool_len = (size_t)q->depth * BLKC_MAX_IO;
	size_t meta_len = (size_t)q->depth * BLKC_META_PER_IO;
	int i;

	q->pool = aligned_alloc(4096, pool_len);
	q->meta_pool = aligned_alloc(4096, meta_len);
	q->cmds = calloc(q->depth, sizeof(*q->cmds));
	q->reqs = calloc(q->depth, sizeof(*q->reqs));
	q->rsps = calloc(q->depth, sizeof(*q->rsps));
	if (!q->pool || !q->meta_pool || !q->cmds || !q->reqs || !q->rsps)
		goto err_mem;

	q->pool_mr = ibv_reg_mr(q->pd, q->pool, pool_len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!q->pool_mr)
		goto err_mem;
	q->meta_mr = ibv_reg_mr(q->pd, q->meta_pool, meta_len, IBV_ACCESS_MW_BIND);
	if (!q->meta_mr)
		goto err_pool_mr;
	q->cmd_mr = ibv_reg_mr(q->pd, q->cmds, q->depth * sizeof(*q->cmds), 0);
	if (!q->cmd_mr)
		goto err_meta_mr;
	q->rsp_mr = ibv_reg_mr(q->pd, q->rsps, q->depth * sizeof(*q->rsps),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!q->rsp_mr)
		goto err_cmd_mr;

	for (i = 0; i < q->depth; i++) {
		struct blkc_req *r = &q->reqs[i];

		r->cid = (uint16_t)i;
		r->buf = (char *)q->pool + (size_t)i * BLKC_MAX_IO;
		r->meta = (char *)q->meta_pool + (size_t)i * BLKC_META_PER_IO;
		r->mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2);
		r->meta_mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2);
		if (!r->mw || !r->meta_mw)
			goto err_mw;
		r->rkey = r->mw->rkey;
		r->next = q->free_list;
		q->free_list = r;
	}
	return 0;

err_mw:
	do {
		if (q->reqs[i].meta_mw)
			ibv_dealloc_mw(q->reqs[i].meta_mw);
		if (q->reqs[i].mw)
			ibv_dealloc_mw(q->reqs[i].mw);
	} while (i-- > 0);
	ibv_dereg_mr(q->rsp_mr);
err_cmd_mr:
	ibv_dereg_mr(q->cmd_mr);
err_meta_mr:
	ibv_dereg_mr(q->meta_mr);
err_pool_mr:
	ibv_dereg_mr(q->pool_mr);
err_mem:
	free(q->rsps);
	free(q->reqs);
	free(q->cmds);
	free(q->meta_pool);
	free(q->pool);
	return -ENOMEM;
}

static void blkc_build_bind(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr *wr = &req->bind_wr;

	req->rkey = ibv_inc_rkey(req->rkey);
	memset(wr, 0, sizeof(*wr));
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = req->mw;
	wr->bind_mw.rkey = req->rkey;	// OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() above
	wr->bind_mw.bind_info.mr = q->pool_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)req->buf;
	wr->bind_mw.bind_info.length = req->len;
	wr->bind_mw.bind_info.mw_access_flags =
		req->is_read ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;	// OK: rdma-access-flags-invalid -- the pool MR has LOCAL_WRITE and MW_BIND
}

static void blkc_build_meta_bind(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr *wr = &req->meta_bind_wr;

	memset(wr, 0, sizeof(*wr));
	wr->opcode = IBV_WR_BIND_MW;
	wr->bind_mw.mw = req->meta_mw;
	wr->bind_mw.rkey = req->meta_mw->rkey;	// BUG: rdma-rkey-reuse -- the metadata window is bound again under the key of its previous command
	wr->bind_mw.bind_info.mr = q->meta_mr;
	wr->bind_mw.bind_info.addr = (uintptr_t)req->meta;
	wr->bind_mw.bind_info.length = req->meta_len;
	wr->bind_mw.bind_info.mw_access_flags =
		req->is_read ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;	// BUG: rdma-access-flags-invalid -- remote write through a window over meta_mr, registered without LOCAL_WRITE
}

int blkc_submit(struct blkc_queue *q, struct blkc_req *req, uint64_t slba,
		uint32_t nlb)
{
	struct blkc_cmd *cmd = &q->cmds[req->cid];
	struct ibv_send_wr *bad;
	int ret;

	memset(cmd, 0, sizeof(*cmd));
	cmd->opc = req->is_read ? BLKC_OPC_READ : BLKC_OPC_WRITE;
	cmd->cid = htobe16(req->cid);
	cmd->slba = htobe64(slba);
	cmd->nlb = htobe32(nlb);

	blkc_build_bind(q, req);
	cmd->data_addr = htobe64((uintptr_t)req->buf);
	cmd->data_rkey = htobe32(req->rkey);
	req->bind_wr.next = &req->send_wr;
	if (req->meta_len) {
		blkc_build_meta_bind(q, req);
		cmd->meta_addr = htobe64((uintptr_t)req->meta);
		cmd->meta_rkey = htobe32(req->meta_mw->rkey);
		req->bind_wr.next = &req->meta_bind_wr;
		req->meta_bind_wr.next = &req->send_wr;
	}

	req->send_sge.addr = (uintptr_t)cmd;
	req->send_sge.length = sizeof(*cmd);
	req->send_sge.lkey = q->cmd_mr->lkey;
	memset(&req->send_wr, 0, sizeof(req->send_wr));
	req->send_wr.wr_id = BLKC_WRID(req->cid, BLKC_WR_SEND);
	req->send_wr.opcode = IBV_WR_SEND;
	req->send_wr.send_flags = IBV_SEND_SIGNALED;
	req->send_wr.sg_list = &req->send_sge;
	req->send_wr.num_sge = 1;

	req->need_inv = 1;
	req->inflight = 1;
	req->deadline = time(NULL) + BLKC_TIMEOUT_S;
	ret = ibv_post_send(q->qp, &req->bind_wr, &bad);
	if (ret) {
		req->inflight = 0;
		req->next = q->free_list;	// OK: rdma-invalidation-leak -- the post failed, no window was bound
		q->free_list = req;
		return -ret;
	}
	return 0;
}

static void blkc_complete(struct blkc_queue *q, struct blkc_req *req, int status)
{
	req->inflight = 0;
	req->done(req, status);
	req->next = q->free_list;
	q->free_list = req;
}

static int blkc_post_inv(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr *first = &req->inv_wr, *bad;

	memset(&req->inv_wr, 0, sizeof(req->inv_wr));
	req->inv_wr.opcode = IBV_WR_LOCAL_INV;
	req->inv_wr.invalidate_rkey = req->rkey;
	req->inv_wr.wr_id = BLKC_WRID(req->cid, BLKC_WR_INV);
	req->inv_wr.send_flags = IBV_SEND_SIGNALED;

	if (req->meta_len) {
		memset(&req->meta_inv_wr, 0, sizeof(req->meta_inv_wr));
		req->meta_inv_wr.opcode = IBV_WR_LOCAL_INV;
		req->meta_inv_wr.invalidate_rkey = req->meta_mw->rkey;
		req->meta_inv_wr.wr_id = BLKC_WRID(req->cid, BLKC_WR_INV);
		if (req->need_inv) {
			req->meta_inv_wr.next = &req->inv_wr;
		} else {
			req->meta_inv_wr.send_flags = IBV_SEND_SIGNALED;
		}
		first = &req->meta_inv_wr;
	}
	return ibv_post_send(q->qp, first, &bad);
}

static int blkc_finish(struct blkc_queue *q, struct blkc_req *req)
{
	int ret;

	if (!req->need_inv && !req->meta_len) {
		blkc_complete(q, req, req->status);	// OK: rdma-invalidation-leak -- the data window was invalidated by the target with the expected key
		return 0;
	}
	ret = blkc_post_inv(q, req);
	if (ret)
		q->fatal = 1;	/* the request stays in flight until reconnect */
	return ret;
}

static int blkc_io_rsp(struct blkc_queue *q, struct ibv_wc *wc, struct blkc_rsp *rsp)
{
	struct blkc_req *req = &q->reqs[be16toh(rsp->cid) % q->depth];

	req->status = be16toh(rsp->status);
	if (wc->wc_flags & IBV_WC_WITH_INV) {
		if (wc->invalidated_rkey != req->rkey) {	// OK: rdma-remote-invalidate-unchecked -- compared with the data window's key
			fprintf(stderr, "blkc: cid %u: target invalidated %#x, expected %#x\n",
				req->cid, wc->invalidated_rkey, req->rkey);
			q->fatal = 1;
			return -EPROTO;
		}
		req->need_inv = 0;
	}
	return blkc_finish(q, req);
}

static int blkc_admin_rsp(struct blkc_queue *q, struct ibv_wc *wc, struct blkc_rsp *rsp)
{
	struct blkc_req *req = &q->reqs[be16toh(rsp->cid) % q->depth];

	req->status = be16toh(rsp->status);
	if (wc->wc_flags & IBV_WC_WITH_INV)	// BUG: rdma-remote-invalidate-unchecked -- any key the target invalidated is taken as this command's window
		req->need_inv = 0;
	return blkc_finish(q, req);
}

static void blkc_inv_done(struct blkc_queue *q, struct ibv_wc *wc)
{
	struct blkc_req *req = &q->reqs[BLKC_WRID_CID(wc->wr_id) % q->depth];

	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "blkc: LOCAL_INV cid %u: %s\n", req->cid,
			ibv_wc_status_str(wc->status));
		q->fatal = 1;
		return;
	}
	blkc_complete(q, req, req->status);	// OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- released from the completion of its LOCAL_INV
}

static int blkc_post_recv(struct blkc_queue *q, struct blkc_rsp *rsp)
{
	struct ibv_sge sge = { .addr = (uintptr_t)rsp, .length = sizeof(*rsp),
			       .lkey = q->rsp_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uintptr_t)rsp, .sg_list = &sge,
				  .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

static void blkc_dispatch(struct blkc_queue *q, struct ibv_wc *wc)
{
	if (wc->opcode == IBV_WC_RECV) {
		struct blkc_rsp *rsp = (void *)(uintptr_t)wc->wr_id;

		if (wc->status != IBV_WC_SUCCESS) {
			q->fatal = 1;
			return;
		}
		if (q->admin)
			blkc_admin_rsp(q, wc, rsp);
		else
			blkc_io_rsp(q, wc, rsp);
		if (blkc_post_recv(q, rsp))
			q->fatal = 1;
		return;
	}
	switch (BLKC_WRID_KIND(wc->wr_id)) {
	case BLKC_WR_INV:
		blkc_inv_done(q, wc);
		break;
	case BLKC_WR_SYNC_INV:
		q->reqs[BLKC_WRID_CID(wc->wr_id) % q->depth].inv_done = 1;
		break;
	default:
		if (wc->status != IBV_WC_SUCCESS)
			q->fatal = 1;
	}
}

int blkc_poll(struct blkc_queue *q, int budget)
{
	struct ibv_wc wc[16];
	int n, i, total = 0;

	while (total < budget) {
		n = ibv_poll_cq(q->cq, 16, wc);
		if (n <= 0)
			return n < 0 ? -EIO : total;
		for (i = 0; i < n; i++)
			blkc_dispatch(q, &wc[i]);
		total += n;
	}
	return total;
}

static int blkc_send_abort(struct blkc_queue *q, uint16_t cid);

/* Called once a second from the application's timer. */
void blkc_check_timeouts(struct blkc_queue *q)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < q->depth; i++) {
		struct blkc_req *req = &q->reqs[i];

		if (!req->inflight || now < req->deadline)
			continue;
		blkc_send_abort(q, req->cid);
		blkc_complete(q, req, -ETIMEDOUT);	// BUG: rdma-invalidation-leak -- the command's windows are still bound; the target may write into the recycled buffer
	}
}

/* Cancel from the upper layer; the caller does not wait. */
void blkc_cancel(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr inv[2], *first = &inv[1], *bad;

	memset(inv, 0, sizeof(inv));
	inv[1].opcode = IBV_WR_LOCAL_INV;
	inv[1].invalidate_rkey = req->rkey;
	if (req->meta_len) {
		inv[0].opcode = IBV_WR_LOCAL_INV;
		inv[0].invalidate_rkey = req->meta_mw->rkey;
		inv[0].next = &inv[1];
		first = &inv[0];
	}
	if (ibv_post_send(q->qp, first, &bad)) {
		q->fatal = 1;
		return;
	}
	blkc_send_abort(q, req->cid);
	// OK: rdma-invalidation-leak -- the LOCAL_INVs were posted
	blkc_complete(q, req, -ECANCELED);	// BUG: rdma-unmap-before-invalidate -- recycled right after posting unsignaled LOCAL_INVs
}

/* Cancel and wait: used before the namespace is detached. */
int blkc_cancel_sync(struct blkc_queue *q, struct blkc_req *req)
{
	struct ibv_send_wr inv, meta_inv, *first = &inv, *bad;
	struct ibv_wc wc;
	int n;

	memset(&inv, 0, sizeof(inv));
	inv.opcode = IBV_WR_LOCAL_INV;
	inv.invalidate_rkey = req->rkey;
	inv.send_flags = IBV_SEND_SIGNALED;
	inv.wr_id = BLKC_WRID(req->cid, BLKC_WR_SYNC_INV);
	if (req->meta_len) {
		memset(&meta_inv, 0, sizeof(meta_inv));
		meta_inv.opcode = IBV_WR_LOCAL_INV;
		meta_inv.invalidate_rkey = req->meta_mw->rkey;
		meta_inv.next = &inv;
		first = &meta_inv;
	}
	req->inv_done = 0;
	if (ibv_post_send(q->qp, first, &bad))
		return -EIO;
	while (!req->inv_done) {
		n = ibv_poll_cq(q->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n)
			blkc_dispatch(q, &wc);
	}
	blkc_complete(q, req, -ECANCELED);	// OK: rdma-unmap-before-invalidate -- waited for the LOCAL_INV completion
	return 0;
}

static int blkc_send_abort(struct blkc_queue *q, uint16_t cid)
{
	struct blkc_cmd abort_cmd = { .opc = BLKC_OPC_ABORT, .cid = htobe16(cid) };
	struct ibv_sge sge = { .addr = (uintptr_t)&abort_cmd,
			       .length = sizeof(abort_cmd) };
	struct ibv_send_wr wr = { .opcode = IBV_WR_SEND, .sg_list = &sge,
				  .num_sge = 1,
				  .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	return ibv_post_send(q->qp, &wr, &bad);
}

int blkc_queue_init(struct blkc_queue *q, struct rdma_cm_id *id,
		    struct ibv_pd *pd, uint16_t depth, int admin)
{
	int ret, i;

	memset(q, 0, sizeof(*q));
	q->id = id;
	q->pd = pd;
	q->depth = depth;
	q->admin = admin;
	ret = blkc_alloc_reqs(q);
	if (ret)
		return ret;
	ret = blkc_create_qp(q);
	if (ret)
		return ret;
	for (i = 0; i < depth; i++) {
		ret = blkc_post_recv(q, &q->rsps[i]);
		if (ret)
			return -ret;
	}
	return 0;
}
