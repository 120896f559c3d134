/*
 * dcache_mkey_srv.c - object server of a distributed page cache (mlx5).
 *
 * Objects are kept as scattered 4 KiB pages of one registered page pool.
 * A GET composes an indirect mkey over the object's pages with a UMR
 * (mlx5dv_wr_mr_list) and replies with the mkey's rkey; the client pulls
 * the object with one RDMA READ and answers DONE, as SEND_WITH_INV of the
 * mkey when it can.  A PUT composes a writable mkey over fresh pages and is
 * closed by COMMIT.  Every request slot owns one indirect mkey created with
 * MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE.
 *
 * The UMR and the reply go out in one ibv_wr_start()/ibv_wr_complete()
 * batch; UMRs are posted inline as mlx5dv_wr_post(3) requires.
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#define DC_QUEUE_DEPTH      128
#define DC_PAGE_SIZE        4096
#define DC_MAX_PAGES        64
#define DC_UMR_INLINE       512
#define DC_WRID_INV         (1ULL << 62)

#define DC_ERRLOG(fmt, ...) fprintf(stderr, "dcache: " fmt, ##__VA_ARGS__)

enum { DC_GET = 1, DC_PUT, DC_DONE, DC_COMMIT, DC_REPLY };

struct dc_msg {
	uint8_t              op;
	uint8_t              status;
	uint16_t             slot;
	uint32_t             rkey;
	uint64_t             oid;
	uint32_t             npages;
	uint32_t             len;
};

struct dc_req {
	struct dc_req       *next_free;
	struct mlx5dv_mkey  *mkey;
	int                  busy;
	uint16_t             slot;
	uint32_t             npages;
	struct ibv_sge       sges[DC_MAX_PAGES];
	struct dc_msg        reply;
};

struct dc_qpair {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	char                *pages;
	size_t               pages_len;
	struct ibv_mr       *pages_mr;
	struct ibv_mr       *reply_mr;
	struct dc_req        reqs[DC_QUEUE_DEPTH];
	struct dc_req       *free_reqs;
};

/* object index (dc_index.c) */
int dc_index_pages(uint64_t oid, char **pages, uint32_t max);
int dc_index_alloc(uint64_t oid, uint32_t len, char **pages, uint32_t max);
void dc_index_commit(uint64_t oid);

static void dc_req_release(struct dc_qpair *qp, struct dc_req *req)
{
	req->busy = 0;
	req->npages = 0;
	req->next_free = qp->free_reqs;
	qp->free_reqs = req;
}

int dc_qpair_create(struct dc_qpair *qp)
{
	struct ibv_qp_init_attr_ex attr = { 0 };
	struct mlx5dv_qp_init_attr dv = { 0 };

	attr.send_cq = attr.recv_cq = qp->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.pd = qp->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV;
	attr.sq_sig_all = 0;	/* OK: rdma-unsignaled-send-starvation -- each reply SEND and each LOCAL_INV is signaled */
	// BUG(file): rdma-send-queue-undersized -- a slot keeps its UMR, its reply and its LOCAL_INV on the queue: 3 x 128 entries, not 256
	attr.cap.max_send_wr = 2 * DC_QUEUE_DEPTH;
	attr.cap.max_recv_wr = DC_QUEUE_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = DC_UMR_INLINE;	// BUG: rdma-queue-cap-unchecked -- 512 bytes of inline data for the UMR lists, never compared with the device's grant
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;

	qp->qp = mlx5dv_create_qp(qp->ctx, &attr, &dv);
	if (!qp->qp)
		return -errno;
	qp->qpx = ibv_qp_to_qp_ex(qp->qp);
	qp->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(qp->qpx);
	return 0;
}

int dc_pool_init(struct dc_qpair *qp, size_t pages_len)
{
	struct mlx5dv_mkey_init_attr mattr = {
		.pd = qp->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
				MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE,
		.max_entries = DC_MAX_PAGES,
	};
	int i;

	qp->pages = aligned_alloc(DC_PAGE_SIZE, pages_len);
	if (!qp->pages)
		return -ENOMEM;
	qp->pages_len = pages_len;
	/* OK: rdma-remote-access-overbroad -- the indirect mkeys reach the pages through this MR, so it must allow what they allow */
	qp->pages_mr = ibv_reg_mr(qp->pd, qp->pages, pages_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE); // BUG: rdma-local-mr-management -- the page pool is exposed through per-request mkeys
	if (!qp->pages_mr)
		goto err_pages;
	/* OK: rdma-local-mr-management -- reply messages live in the request slots, registered once for SEND */
	qp->reply_mr = ibv_reg_mr(qp->pd, qp->reqs, sizeof(qp->reqs), IBV_ACCESS_LOCAL_WRITE);
	if (!qp->reply_mr)
		goto err_pages_mr;

	for (i = 0; i < DC_QUEUE_DEPTH; i++) {
		struct dc_req *req = &qp->reqs[i];

		req->mkey = mlx5dv_create_mkey(&mattr);	// BUG: rdma-local-mr-management -- hand-made indirect mkey per slot to expose pages
		if (!req->mkey)
			goto err_mkeys;
		req->slot = i;
		dc_req_release(qp, req);
	}
	return 0;

err_mkeys:
	while (i--)
		mlx5dv_destroy_mkey(qp->reqs[i].mkey);
	ibv_dereg_mr(qp->reply_mr);
	DC_ERRLOG("mlx5dv_create_mkey failed: %s\n", strerror(errno));
	return -ENOMEM;		// BUG: rdma-mr-leak -- the page pool MR stays registered on this error return
err_pages_mr:
	ibv_dereg_mr(qp->pages_mr);
err_pages:
	free(qp->pages);
	return -ENOMEM;
}

static int dc_post_umr_reply(struct dc_qpair *qp, struct dc_req *req, uint32_t access)
{
	struct ibv_qp_ex *qpx = qp->qpx;

	req->reply.op = DC_REPLY;
	req->reply.slot = htobe16(req->slot);
	req->reply.rkey = htobe32(req->mkey->rkey);

	ibv_wr_start(qpx);
	qpx->wr_id = (uintptr_t)req;
	qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(qp->mqpx, req->mkey, access, req->npages, req->sges);	// BUG: rdma-local-mr-management -- UMR composes the exposed mkey by hand
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, qp->reply_mr->lkey, (uintptr_t)&req->reply, sizeof(req->reply));
	return ibv_wr_complete(qpx);
}

static void dc_fill_sges(struct dc_qpair *qp, struct dc_req *req, char **pages, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		req->sges[i].addr = (uintptr_t)pages[i];
		req->sges[i].length = DC_PAGE_SIZE;
		req->sges[i].lkey = qp->pages_mr->lkey;
	}
	req->npages = n;
}

int dc_handle_get(struct dc_qpair *qp, const struct dc_msg *cmd)
{
	char *pages[DC_MAX_PAGES];
	struct dc_req *req = qp->free_reqs;
	int n;

	if (!req)
		return -EBUSY;
	n = dc_index_pages(be64toh(cmd->oid), pages, DC_MAX_PAGES);
	if (n <= 0)
		return -ENOENT;
	qp->free_reqs = req->next_free;
	req->busy = 1;
	dc_fill_sges(qp, req, pages, n);

	/* OK: rdma-access-flags-invalid -- read-only mkey; remote read needs no local write */
	if (dc_post_umr_reply(qp, req, IBV_ACCESS_REMOTE_READ)) {
		dc_req_release(qp, req);	/* OK: rdma-invalidation-leak -- the batch was not posted; the mkey was never configured */
		return -EIO;
	}
	return 0;
}

int dc_handle_put(struct dc_qpair *qp, const struct dc_msg *cmd)
{
	struct ibv_qp_ex *qpx = qp->qpx;
	char *pages[DC_MAX_PAGES];
	struct dc_req *req = qp->free_reqs;
	int n;

	if (!req)
		return -EBUSY;
	n = dc_index_alloc(be64toh(cmd->oid), be32toh(cmd->len), pages, DC_MAX_PAGES);
	if (n <= 0)
		return -ENOSPC;
	qp->free_reqs = req->next_free;
	req->busy = 1;
	dc_fill_sges(qp, req, pages, n);
	req->reply.op = DC_REPLY;
	req->reply.slot = htobe16(req->slot);
	req->reply.rkey = htobe32(req->mkey->rkey);

	ibv_wr_start(qpx);
	qpx->wr_id = (uintptr_t)req;
	qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(qp->mqpx, req->mkey, IBV_ACCESS_REMOTE_WRITE, req->npages, req->sges);	// BUG: rdma-access-flags-invalid, rdma-local-mr-management -- a writable mkey without LOCAL_WRITE: the UMR completes in error
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, qp->reply_mr->lkey, (uintptr_t)&req->reply, sizeof(req->reply));
	return ibv_wr_complete(qpx);
}

static int dc_local_inv(struct dc_qpair *qp, struct dc_req *req)
{
	ibv_wr_start(qp->qpx);
	qp->qpx->wr_id = (uintptr_t)req | DC_WRID_INV;
	qp->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qp->qpx, req->mkey->rkey);
	return ibv_wr_complete(qp->qpx);
}

static void dc_handle_done(struct dc_qpair *qp, struct ibv_wc *wc, const struct dc_msg *msg)
{
	struct dc_req *req = &qp->reqs[be16toh(msg->slot) % DC_QUEUE_DEPTH];

	if (!req->busy)
		return;
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == be32toh(msg->rkey)) {	// BUG: rdma-remote-invalidate-unchecked -- compared with the key the client claims, not with this slot's mkey
		dc_req_release(qp, req);
		return;
	}
	dc_local_inv(qp, req);
}

static void dc_handle_commit(struct dc_qpair *qp, struct ibv_wc *wc, const struct dc_msg *msg)
{
	struct dc_req *req = &qp->reqs[be16toh(msg->slot) % DC_QUEUE_DEPTH];

	if (!req->busy)
		return;
	dc_index_commit(be64toh(msg->oid));
	/* OK: rdma-remote-invalidate-unchecked -- accepted only for this slot's own mkey */
	if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == req->mkey->rkey) {
		dc_req_release(qp, req);	/* OK: rdma-invalidation-leak -- the client invalidated exactly this mkey */
		return;
	}
	dc_local_inv(qp, req);
}

/* the client went away in the middle of a request */
void dc_req_abort(struct dc_qpair *qp, struct dc_req *req)
{
	if (!req->busy)
		return;
	if (dc_local_inv(qp, req) == 0)
		dc_req_release(qp, req);	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is only posted; the slot and its pages are reused before it completes
}

void dc_process_completions(struct dc_qpair *qp)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(qp->cq, 32, wc);
	for (i = 0; i < n; i++) {
		struct dc_req *req = (struct dc_req *)(uintptr_t)(wc[i].wr_id & ~DC_WRID_INV);

		if (wc[i].opcode & IBV_WC_RECV) {
			const struct dc_msg *msg = (const struct dc_msg *)(uintptr_t)wc[i].wr_id;

			if (msg->op == DC_GET)
				dc_handle_get(qp, msg);
			else if (msg->op == DC_PUT)
				dc_handle_put(qp, msg);
			else if (msg->op == DC_DONE)
				dc_handle_done(qp, &wc[i], msg);
			else if (msg->op == DC_COMMIT)
				dc_handle_commit(qp, &wc[i], msg);
			continue;
		}
		if (wc[i].wr_id & DC_WRID_INV) {
			/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the slot is reused only from its LOCAL_INV completion */
			dc_req_release(qp, req);
			continue;
		}
		if (wc[i].status != IBV_WC_SUCCESS) {
			DC_ERRLOG("reply to slot %u failed: %s\n", req->slot, ibv_wc_status_str(wc[i].status));
			dc_req_release(qp, req);	// BUG: rdma-invalidation-leak -- a failed reply skips the LOCAL_INV; the mkey still grants access to the pages
		}
	}
}

void dc_qpair_destroy(struct dc_qpair *qp)
{
	struct ibv_wc wc;
	int i, pending = 0;

	for (i = 0; i < DC_QUEUE_DEPTH; i++)
		if (qp->reqs[i].busy && dc_local_inv(qp, &qp->reqs[i]) == 0)
			pending++;
	while (pending > 0)
		if (ibv_poll_cq(qp->cq, 1, &wc) > 0 && (wc.wr_id & DC_WRID_INV))
			pending--;
	for (i = 0; i < DC_QUEUE_DEPTH; i++) {
		qp->reqs[i].busy = 0;
		mlx5dv_destroy_mkey(qp->reqs[i].mkey);
	}
	ibv_destroy_qp(qp->qp);
	ibv_dereg_mr(qp->reply_mr);
	ibv_dereg_mr(qp->pages_mr);
	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- every LOCAL_INV completed and the MR is gone before the pages are freed */
	free(qp->pages);
}
