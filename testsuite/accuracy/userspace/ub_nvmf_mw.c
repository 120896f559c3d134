/*
 * ub_nvmf_mw.c - NVMe-oF/RDMA initiator queue for a userspace block layer
 * (SPDK bdev_nvme style): one queue pair per NVMe queue, a request array
 * with a free list, keyed SGLs.
 *
 * Data buffers come from one pool registered with LOCAL_WRITE | MW_BIND.
 * Per I/O the request's type-2 memory window is bound over its buffer
 * (the REG_MR of the kernel initiator, emulated with ibv_wr_bind_mw) and
 * the window's rkey goes into the command's keyed SGL; BIND_MW and the
 * command SEND go out in one ibv_wr_start()/ibv_wr_complete() batch.  The
 * target may invalidate the window with SEND_WITH_INV; the response
 * handler checks the invalidated rkey (through the copy kept in the
 * response slot) and posts a LOCAL_INV when the target did not.
 *
 * Not right: the send queue is sized 2 per request although a request may
 * post BIND_MW, SEND and LOCAL_INV; failed commands and timeouts recycle
 * the request with the window still bound; the mismatch path and the
 * controller-reset path recycle right after posting the LOCAL_INV; the
 * admin path rebinds its window with the same key, over an MR without
 * local write, and trusts any remote invalidation.
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define NVMF_INLINE_DATA	256
#define NVMF_IO_SIZE		(128 * 1024)
#define NVMF_ADMIN_BUF		4096
#define NVMF_ADMIN_CID		0xffff

enum { NVMF_WR_SEND = 1, NVMF_WR_RECV, NVMF_WR_INV, NVMF_WR_BIND };
#define NVMF_WRID(t, cid)	(((uint64_t)(t) << 16) | (cid))
#define NVMF_WRID_TYPE(id)	((unsigned int)((id) >> 16))
#define NVMF_WRID_CID(id)	((uint16_t)(id))

struct nvme_keyed_sgl {
	uint64_t addr;
	uint8_t  length[3];
	uint8_t  key[4];
	uint8_t  type;		/* 0x40: keyed data block, 0x0f: invalidate */
} __attribute__((packed));

struct nvme_cmd {
	uint8_t  opc, flags;
	uint16_t cid;
	uint32_t nsid;
	uint64_t rsvd, mptr;
	struct nvme_keyed_sgl dptr;
	uint32_t cdw10[6];
} __attribute__((packed));

struct nvme_cpl {
	uint32_t cdw0, rsvd;
	uint16_t sqhd, sqid, cid, status;
};

struct nvmf_rsp {
	struct nvme_cpl cpl;
	uint32_t wc_flags;	/* copied from the receive completion */
	uint32_t inv_rkey;
};

typedef void (*nvmf_cb_t)(void *arg, int status);

struct nvmf_req {
	struct nvmf_req *next;
	uint16_t cid;
	int busy;
	void *data;
	uint32_t len;
	int to_ctrl;		/* write: the controller reads our buffer */
	struct ibv_mw *mw;
	uint32_t rkey;		/* key the window is bound with */
	uint64_t deadline;
	int status;
	nvmf_cb_t cb;
	void *cb_arg;
};

struct nvmf_queue {
	uint16_t qid, depth;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	uint32_t max_inline;

	struct nvmf_req *reqs, *free_reqs, *parked;
	struct nvme_cmd *cmds;
	struct nvmf_rsp *rsps;
	struct ibv_mr *cmd_mr, *rsp_mr;
	uint8_t *pool;
	struct ibv_mr *pool_mr;

	/* admin queue only: one outstanding data-in command (identify, log page) */
	void *admin_buf;
	struct ibv_mr *admin_mr;
	struct ibv_mw *admin_mw;
	nvmf_cb_t admin_cb;
	unsigned int inv_pending;
};

static void nvmf_req_done(struct nvmf_queue *q, struct nvmf_req *req, int status)
{
	nvmf_cb_t cb = req->cb;

	req->busy = 0;
	req->next = q->free_reqs;
	q->free_reqs = req;
	if (cb)
		cb(req->cb_arg, status);
}

static int nvmf_post_recv(struct nvmf_queue *q, uint16_t i)
{
	struct ibv_sge sge = { (uintptr_t)&q->rsps[i].cpl, sizeof(struct nvme_cpl),
			       q->rsp_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = NVMF_WRID(NVMF_WR_RECV, i),
				  .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(q->qp, &wr, &bad);
}

static int nvmf_post_inv(struct nvmf_queue *q, uint16_t cid, uint32_t rkey,
			 unsigned int flags)
{
	ibv_wr_start(q->qpx);
	q->qpx->wr_id = NVMF_WRID(NVMF_WR_INV, cid);
	q->qpx->wr_flags = flags;
	ibv_wr_local_inv(q->qpx, rkey);
	return ibv_wr_complete(q->qpx);
}

/* one type-2 window per request, unwound on failure */
static int nvmf_alloc_windows(struct nvmf_queue *q)
{
	int i;

	for (i = 0; i < q->depth; i++) {
		struct nvmf_req *r = &q->reqs[i];

		r->cid = i;
		r->data = q->pool + (size_t)i * NVMF_IO_SIZE;
		r->mw = ibv_alloc_mw(q->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- per-request memory windows: the ULP exposes memory itself
		if (!r->mw)
			goto unwind;
		r->rkey = r->mw->rkey;
		r->next = q->free_reqs;
		q->free_reqs = r;
	}
	return 0;
unwind:
	while (i--)
		ibv_dealloc_mw(q->reqs[i].mw); /* OK: rdma-mr-leak -- every window allocated so far is released */
	q->free_reqs = NULL;
	return -ENOMEM;
}

static void nvmf_free_windows(struct nvmf_queue *q)
{
	int i;

	for (i = 0; i < q->depth; i++)
		ibv_dealloc_mw(q->reqs[i].mw);
}

struct nvmf_queue *nvmf_queue_create(struct ibv_context *ctx, struct ibv_pd *pd,
				     uint16_t qid, uint16_t depth)
{
	struct ibv_qp_init_attr_ex init = {};
	struct nvmf_queue *q;
	size_t pool_len = (size_t)depth * NVMF_IO_SIZE;
	int i;

	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->qid = qid;
	q->depth = depth;
	q->pd = pd;
	q->reqs = calloc(depth, sizeof(*q->reqs));
	q->cmds = calloc(depth + 1, sizeof(*q->cmds));	/* +1: admin data-in slot */
	q->rsps = calloc(depth, sizeof(*q->rsps));
	if (!q->reqs || !q->cmds || !q->rsps || posix_memalign((void **)&q->pool, 4096, pool_len))
		goto err_free;

	q->cq = ibv_create_cq(ctx, 3 * depth + 1, q, NULL, 0);
	if (!q->cq)
		goto err_free;
	init.qp_type = IBV_QPT_RC;
	init.send_cq = init.recv_cq = q->cq;
	init.pd = pd;
	init.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	init.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			      IBV_QP_EX_WITH_LOCAL_INV;
	init.cap.max_send_wr = 2 * q->depth + 1; // BUG(file): rdma-send-queue-undersized, rdma-send-queue-manual-factor -- hand-made factor 2 (BIND + SEND) but the completion path adds a LOCAL_INV per request
	init.cap.max_recv_wr = depth;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	init.cap.max_inline_data = NVMF_INLINE_DATA; /* OK: rdma-queue-cap-unchecked -- the granted inline size is read back below */
	q->qp = ibv_create_qp_ex(ctx, &init);
	if (!q->qp)
		goto err_cq;
	q->qpx = ibv_qp_to_qp_ex(q->qp);
	q->max_inline = init.cap.max_inline_data;

	q->cmd_mr = ibv_reg_mr(pd, q->cmds, (depth + 1) * sizeof(*q->cmds), 0);
	q->rsp_mr = ibv_reg_mr(pd, q->rsps, depth * sizeof(*q->rsps), IBV_ACCESS_LOCAL_WRITE);
	if (!q->cmd_mr || !q->rsp_mr)
		goto err_mrs;
	q->pool_mr = ibv_reg_mr(pd, q->pool, pool_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!q->pool_mr)
		goto err_mrs;

	if (nvmf_alloc_windows(q))
		goto err_pool;

	if (qid == 0) {
		q->admin_buf = aligned_alloc(4096, NVMF_ADMIN_BUF);
		if (!q->admin_buf)
			goto err_mw;
		q->admin_mr = ibv_reg_mr(pd, q->admin_buf, NVMF_ADMIN_BUF, IBV_ACCESS_MW_BIND);
		if (!q->admin_mr)
			goto err_admin_buf;
		q->admin_mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- window over the admin buffer, handed to the controller
		if (!q->admin_mw)
			goto err_admin_buf; // BUG: rdma-mr-leak -- admin_mr is registered but this label only frees the buffer
	}

	for (i = 0; i < depth; i++)
		nvmf_post_recv(q, i);
	return q;

err_admin_buf:
	free(q->admin_buf);
err_mw:
	nvmf_free_windows(q);
err_pool:
	ibv_dereg_mr(q->pool_mr);
err_mrs:
	if (q->cmd_mr)
		ibv_dereg_mr(q->cmd_mr);
	if (q->rsp_mr)
		ibv_dereg_mr(q->rsp_mr);
	ibv_destroy_qp(q->qp);
err_cq:
	ibv_destroy_cq(q->cq);
err_free:
	free(q->pool);
	free(q->rsps);
	free(q->cmds);
	free(q->reqs);
	free(q);
	return NULL;
}

/* the qpair is disconnected and quiesced: release everything */
void nvmf_queue_destroy(struct nvmf_queue *q)
{
	ibv_destroy_qp(q->qp);
	ibv_destroy_cq(q->cq);
	nvmf_free_windows(q);
	if (q->admin_mw)
		ibv_dealloc_mw(q->admin_mw);
	if (q->admin_mr)
		ibv_dereg_mr(q->admin_mr);
	free(q->admin_buf);
	ibv_dereg_mr(q->pool_mr);
	ibv_dereg_mr(q->rsp_mr);
	ibv_dereg_mr(q->cmd_mr);
	free(q->pool);
	free(q->rsps);
	free(q->cmds);
	free(q->reqs);
	free(q);
}

static void nvmf_sgl_set(struct nvme_keyed_sgl *sgl, uint64_t addr, uint32_t len,
			 uint32_t rkey)
{
	sgl->addr = htole64(addr);
	sgl->length[0] = len & 0xff;
	sgl->length[1] = (len >> 8) & 0xff;
	sgl->length[2] = (len >> 16) & 0xff;
	memcpy(sgl->key, &(uint32_t){ htole32(rkey) }, 4);
	sgl->type = 0x40;
}

/* BIND_MW over the request's buffer + SEND of its command, one batch */
static int nvmf_post_io(struct nvmf_queue *q, struct nvmf_req *req)
{
	struct ibv_mw_bind_info bind = {
		.mr = q->pool_mr,
		.addr = (uintptr_t)req->data,
		.length = req->len,
		.mw_access_flags = req->to_ctrl ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE, /* OK: rdma-access-flags-invalid -- the pool MR has LOCAL_WRITE and MW_BIND */
	};

	ibv_wr_start(q->qpx);
	q->qpx->wr_id = NVMF_WRID(NVMF_WR_BIND, req->cid);
	q->qpx->wr_flags = 0;
	ibv_wr_bind_mw(q->qpx, req->mw, req->rkey, &bind); // BUG: rdma-local-mr-management -- per-I/O window bind instead of a core-managed registration context
	q->qpx->wr_id = NVMF_WRID(NVMF_WR_SEND, req->cid);
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(q->qpx);
	ibv_wr_set_sge(q->qpx, q->cmd_mr->lkey, (uintptr_t)&q->cmds[req->cid], sizeof(struct nvme_cmd));
	return ibv_wr_complete(q->qpx);
}

int nvmf_submit_io(struct nvmf_queue *q, uint8_t opc, uint32_t nsid, uint64_t slba,
		   uint32_t len, int to_ctrl, nvmf_cb_t cb, void *arg, uint64_t now)
{
	struct nvmf_req *req = q->free_reqs;
	struct nvme_cmd *cmd;
	int ret;

	if (!req || len > NVMF_IO_SIZE)
		return -EAGAIN;
	q->free_reqs = req->next;
	req->busy = 1;
	req->len = len;
	req->to_ctrl = to_ctrl;
	req->cb = cb;
	req->cb_arg = arg;
	req->deadline = now + 30ull * 1000000000ull;
	req->rkey = ibv_inc_rkey(req->rkey); /* OK: rdma-rkey-reuse -- every I/O binds its window under a fresh key */

	cmd = &q->cmds[req->cid];
	memset(cmd, 0, sizeof(*cmd));
	cmd->opc = opc;
	cmd->cid = htole16(req->cid);
	cmd->nsid = htole32(nsid);
	memcpy(cmd->cdw10, &slba, sizeof(slba));
	nvmf_sgl_set(&cmd->dptr, (uintptr_t)req->data, len, req->rkey);

	ret = nvmf_post_io(q, req);
	if (ret == ENOMEM) {		/* send queue full: park it, nothing was posted */
		req->next = q->parked;
		q->parked = req;
		return 0;
	}
	if (ret) {
		nvmf_req_done(q, req, -EIO); /* OK: rdma-invalidation-leak -- the batch was not posted, the window was never bound */
		return -EIO;
	}
	return 0;
}

/* completions freed send queue space: post what nvmf_submit_io() parked */
static void nvmf_post_parked(struct nvmf_queue *q)
{
	struct nvmf_req *req;

	while ((req = q->parked) != NULL) {
		if (nvmf_post_io(q, req)) /* OK: rdma-rkey-reuse -- the parked bind never went out; no peer has seen the key chosen at submit */
			break;
		q->parked = req->next;
	}
}

int nvmf_admin_data_in(struct nvmf_queue *q, uint8_t opc, uint32_t cdw10, nvmf_cb_t cb)
{
	struct ibv_mw_bind_info bind = {
		.mr = q->admin_mr,
		.addr = (uintptr_t)q->admin_buf,
		.length = NVMF_ADMIN_BUF,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE, // BUG: rdma-access-flags-invalid -- admin_mr was registered with MW_BIND only; a write window needs LOCAL_WRITE on the MR
	};
	struct nvme_cmd *cmd = &q->cmds[q->depth];

	q->admin_cb = cb;
	memset(cmd, 0, sizeof(*cmd));
	cmd->opc = opc;
	cmd->cid = htole16(NVMF_ADMIN_CID);
	cmd->cdw10[0] = htole32(cdw10);
	nvmf_sgl_set(&cmd->dptr, bind.addr, NVMF_ADMIN_BUF, q->admin_mw->rkey);

	ibv_wr_start(q->qpx);
	q->qpx->wr_id = NVMF_WRID(NVMF_WR_BIND, NVMF_ADMIN_CID);
	q->qpx->wr_flags = 0;
	/* BUG: rdma-local-mr-management -- window bind exposing the admin buffer */
	ibv_wr_bind_mw(q->qpx, q->admin_mw, q->admin_mw->rkey, &bind); // BUG: rdma-rkey-reuse -- every admin command rebinds the window under the key the controller already saw
	q->qpx->wr_id = NVMF_WRID(NVMF_WR_SEND, NVMF_ADMIN_CID);
	q->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(q->qpx);
	ibv_wr_set_sge(q->qpx, q->cmd_mr->lkey, (uintptr_t)cmd, sizeof(*cmd));
	return ibv_wr_complete(q->qpx);
}

static void nvmf_admin_complete(struct nvmf_queue *q, struct nvmf_rsp *rsp)
{
	int status = le16toh(rsp->cpl.status) >> 1;

	if (!(rsp->wc_flags & IBV_WC_WITH_INV)) {
		nvmf_post_inv(q, NVMF_ADMIN_CID, q->admin_mw->rkey, IBV_SEND_SIGNALED);
		return;		/* admin_cb runs from the LOCAL_INV completion */
	} else {
		q->admin_cb(q->admin_buf, status ? -EIO : 0); // BUG: rdma-remote-invalidate-unchecked -- any invalidated key is taken as the admin window's
	}
}

static void nvmf_io_complete(struct nvmf_queue *q, struct nvmf_req *req,
			     struct nvmf_rsp *rsp)
{
	req->status = (le16toh(rsp->cpl.status) >> 1) ? -EIO : 0;

	if (rsp->wc_flags & IBV_WC_WITH_INV) {
		if (rsp->inv_rkey != req->rkey) { /* OK: rdma-remote-invalidate-unchecked -- the copied invalidated rkey is compared with the request's */
			fprintf(stderr, "nvmf q%u: cid %u: target invalidated %#x, expected %#x\n",
				q->qid, req->cid, rsp->inv_rkey, req->rkey);
			nvmf_post_inv(q, req->cid, req->rkey, 0);
			nvmf_req_done(q, req, -EIO); // BUG: rdma-unmap-before-invalidate -- the request and its buffer go back right after an unsignaled LOCAL_INV
			return;
		}
		nvmf_req_done(q, req, req->status);	/* the target invalidated exactly this window */
		return;
	}
	if (req->status) {
		/* the command failed, treat the data phase as never started */
		nvmf_req_done(q, req, req->status); // BUG: rdma-invalidation-leak -- a failed command skips the LOCAL_INV; the window stays bound to the recycled buffer
		return;
	}
	nvmf_post_inv(q, req->cid, req->rkey, IBV_SEND_SIGNALED);
	q->inv_pending++;
}

int nvmf_process_completions(struct nvmf_queue *q, int max)
{
	struct ibv_wc wc[16];
	struct nvmf_rsp *rsp;
	struct nvmf_req *req;
	uint16_t cid;
	int n, i;

	n = ibv_poll_cq(q->cq, max < 16 ? max : 16, wc);
	for (i = 0; i < n; i++) {
		cid = NVMF_WRID_CID(wc[i].wr_id);
		switch (NVMF_WRID_TYPE(wc[i].wr_id)) {
		case NVMF_WR_RECV:
			rsp = &q->rsps[cid];
			rsp->wc_flags = wc[i].wc_flags;
			rsp->inv_rkey = wc[i].invalidated_rkey;
			if (le16toh(rsp->cpl.cid) == NVMF_ADMIN_CID)
				nvmf_admin_complete(q, rsp);
			else if (le16toh(rsp->cpl.cid) < q->depth)
				nvmf_io_complete(q, &q->reqs[le16toh(rsp->cpl.cid)], rsp);
			nvmf_post_recv(q, cid);
			break;
		case NVMF_WR_INV:
			if (cid == NVMF_ADMIN_CID) {
				q->admin_cb(q->admin_buf, 0);
				break;
			}
			req = &q->reqs[cid];
			q->inv_pending--;
			nvmf_req_done(q, req, wc[i].status == IBV_WC_SUCCESS ? req->status : -EIO); /* OK: rdma-unmap-before-invalidate -- released from the LOCAL_INV's own completion */
			break;
		default:
			break;
		}
	}
	if (n > 0 && q->parked)
		nvmf_post_parked(q);
	return n;
}

/* I/O timeout: fail the request back to the bdev layer */
void nvmf_check_timeouts(struct nvmf_queue *q, uint64_t now)
{
	int i;

	for (i = 0; i < q->depth; i++) {
		struct nvmf_req *req = &q->reqs[i];

		if (req->busy && req->deadline < now)
			nvmf_req_done(q, req, -ETIMEDOUT); // BUG: rdma-invalidation-leak -- the timed-out request is recycled with its window still bound and the key at the target
	}
}

/* controller reset: fail everything outstanding, the qpair is reconnected later */
void nvmf_queue_abort_all(struct nvmf_queue *q)
{
	int i;

	for (i = 0; i < q->depth; i++) {
		struct nvmf_req *req = &q->reqs[i];

		if (!req->busy)
			continue;
		nvmf_post_inv(q, req->cid, req->rkey, IBV_SEND_SIGNALED);
		nvmf_req_done(q, req, -ECANCELED); // BUG: rdma-unmap-before-invalidate -- recycled without waiting for the signaled LOCAL_INV to complete
	}
}

/* orderly disconnect: fence every window before the buffers are reused */
void nvmf_queue_quiesce(struct nvmf_queue *q)
{
	struct ibv_wc wc;
	int i, pending = 0;

	for (i = 0; i < q->depth; i++) {
		if (q->reqs[i].busy &&
		    !nvmf_post_inv(q, q->reqs[i].cid, q->reqs[i].rkey, IBV_SEND_SIGNALED))
			pending++;
	}
	while (pending > 0) {
		if (ibv_poll_cq(q->cq, 1, &wc) <= 0)
			continue;
		if (NVMF_WRID_TYPE(wc.wr_id) == NVMF_WR_INV)
			pending--;
	}
	for (i = 0; i < q->depth; i++) {
		if (q->reqs[i].busy)
			nvmf_req_done(q, &q->reqs[i], -ECANCELED); /* OK: rdma-unmap-before-invalidate -- every LOCAL_INV completed before the requests go back */
	}
}
