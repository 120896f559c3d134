/*
 * ra_nvmft_push_target.c -- userspace NVMe-oF-style RDMA target, "push" mode.
 *
 * Instead of pulling write data with RDMA READ, this transport lets hosts
 * push it: for a WRITE the target lends the request's
 * data buffer through the request's type-2 memory window (REMOTE_WRITE) in
 * an R2T capsule; the host RDMA-WRITEs the data and sends H2C_DONE with
 * SEND_WITH_INV for the window's key.  If the completion does not show that
 * exact key invalidated, the target posts its own signaled LOCAL_INV and
 * continues from that completion.  Buffers come from a pool registered once
 * (LOCAL_WRITE | MW_BIND); transfers above one pool unit get a per-request
 * registration.
 *
 * Right: the pooled R2T path, the H2C_DONE handling (remote invalidation
 * compared with the window's key, else LOCAL_INV), request release from the
 * response completion, qpair setup.
 * Wrong: the large-transfer R2T rebinds the window with the key it already
 * had and leaks its per-request MR when the post fails; ABORT releases the
 * buffer right after posting LOCAL_INV; the R2T timeout releases requests
 * whose windows are still bound.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport,
 *   rdma-remote-access-overbroad, rdma-local-mr-management,
 *   rdma-registration-in-datapath, rdma-send-queue-undersized,
 *   rdma-send-queue-manual-factor, rdma-queue-cap-unchecked,
 *   rdma-unsignaled-send-starvation, rdma-remote-invalidate-unchecked
 *   -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <infiniband/verbs.h>

#define NVMFT_ERRLOG(...)	fprintf(stderr, "nvmft_rdma: " __VA_ARGS__)
#define NVMFT_MAX_QD		128
#define NVMFT_IO_UNIT		(128 * 1024)
#define NVMFT_POOL_BUFS		512
#define NVMFT_R2T_TIMEOUT_US	(5 * 1000 * 1000)

enum { OPC_WRITE = 0x01, OPC_READ = 0x02, OPC_ABORT = 0x08, OPC_H2C_DONE = 0x7f };
enum { WRID_RSP = 1, WRID_INV = 2, WRID_OTHER = 3 };

enum nvmft_req_state {
	RDMA_REQ_STATE_FREE,
	RDMA_REQ_STATE_R2T_SENT,	/* window lent, waiting for H2C_DONE */
	RDMA_REQ_STATE_INVALIDATING,
	RDMA_REQ_STATE_COMPLETING,
};

struct nvmft_capsule {
	uint8_t  opc, flags;
	uint16_t cid;
	uint32_t nsid;
	uint64_t slba;
	uint32_t length;
	uint32_t host_key;
	uint64_t host_addr;
	uint16_t abort_cid;
};

struct nvmft_rsp {
	uint16_t cid, status;
	uint32_t r2t_key;
	uint64_t r2t_addr;
	uint32_t r2t_len;
};

struct nvmft_rdma_qpair;

struct nvmft_rdma_request {
	STAILQ_ENTRY(nvmft_rdma_request)	link;
	struct nvmft_rdma_qpair			*rqpair;
	enum nvmft_req_state			state;
	uint16_t				cid;
	struct nvmft_rsp			*rsp;
	void					*data;
	uint32_t				length;
	struct ibv_mw				*mw;
	uint32_t				mw_key;
	struct ibv_mr				*large_mr;
	uint64_t				deadline;
};

struct nvmft_rdma_qpair {
	struct ibv_qp				*qp;
	struct ibv_qp_ex			*qpx;
	struct ibv_pd				*pd;
	struct nvmft_rdma_request		reqs[NVMFT_MAX_QD];
	STAILQ_HEAD(, nvmft_rdma_request)	free_queue;
	struct nvmft_rsp			*rsps;
	struct ibv_mr				*rsps_mr;
};

static struct {
	void		*base;
	struct ibv_mr	*mr;		/* LOCAL_WRITE | MW_BIND */
	void		*free[NVMFT_POOL_BUFS];
	int		nfree;
} g_pool;

int bdev_submit(uint8_t opc, uint64_t slba, void *buf, uint32_t len);
uint64_t nvmft_now_us(void);

#define WRID(req, t)	((uint64_t)(uintptr_t)(req) | (t))

static void *nvmft_buf_get(void)
{
	return g_pool.nfree ? g_pool.free[--g_pool.nfree] : NULL;
}

static void nvmft_buf_put(void *buf)
{
	g_pool.free[g_pool.nfree++] = buf;
}

static uint32_t nvmft_req_next_key(struct nvmft_rdma_request *req)
{
	return ibv_inc_rkey(req->mw_key);
}

static void nvmft_req_release(struct nvmft_rdma_request *req)
{
	if (req->large_mr) {
		ibv_dereg_mr(req->large_mr);
		free(req->data);
		req->large_mr = NULL;
	} else if (req->data) {
		nvmft_buf_put(req->data);
	}
	req->data = NULL;
	req->state = RDMA_REQ_STATE_FREE;
	STAILQ_INSERT_HEAD(&req->rqpair->free_queue, req, link);
}

static int nvmft_send_rsp(struct nvmft_rdma_request *req, uint16_t status)
{
	struct nvmft_rdma_qpair *rq = req->rqpair;

	req->rsp->cid = req->cid;
	req->rsp->status = status;
	ibv_wr_start(rq->qpx);
	rq->qpx->wr_id = WRID(req, WRID_RSP);
	rq->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(rq->qpx);
	ibv_wr_set_sge(rq->qpx, rq->rsps_mr->lkey, (uintptr_t)req->rsp, sizeof(*req->rsp));
	req->state = RDMA_REQ_STATE_COMPLETING;
	return ibv_wr_complete(rq->qpx);
}

/* Lend the request's buffer to the host and tell it where to write. */
static int nvmft_req_push(struct nvmft_rdma_request *req, uint32_t len)
{
	struct nvmft_rdma_qpair *rq = req->rqpair;
	struct ibv_mw_bind_info bi;
	uint32_t key;

	req->data = nvmft_buf_get();
	if (!req->data)
		return -ENOMEM;
	key = nvmft_req_next_key(req);
	bi.mr = g_pool.mr;
	bi.addr = (uintptr_t)req->data;
	bi.length = len;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	req->rsp->r2t_key = key;
	req->rsp->r2t_addr = bi.addr;
	req->rsp->r2t_len = len;
	ibv_wr_start(rq->qpx);
	rq->qpx->wr_id = WRID(req, WRID_OTHER);
	rq->qpx->wr_flags = 0;
	ibv_wr_bind_mw(rq->qpx, req->mw, key, &bi);	// OK: rdma-rkey-reuse -- nvmft_req_next_key() rotates the key for every R2T
	ibv_wr_send(rq->qpx);
	ibv_wr_set_sge(rq->qpx, rq->rsps_mr->lkey, (uintptr_t)req->rsp, sizeof(*req->rsp));
	if (ibv_wr_complete(rq->qpx)) {
		nvmft_buf_put(req->data);	// OK: rdma-invalidation-leak -- the batch was not posted, the window was never bound
		req->data = NULL;
		return -EIO;
	}
	req->mw_key = key;
	req->length = len;
	req->state = RDMA_REQ_STATE_R2T_SENT;
	req->deadline = nvmft_now_us() + NVMFT_R2T_TIMEOUT_US;
	return 0;
}

/* Transfers above one pool unit: register a dedicated buffer. */
static int nvmft_req_push_large(struct nvmft_rdma_request *req, uint32_t len)
{
	struct nvmft_rdma_qpair *rq = req->rqpair;
	struct ibv_mw_bind_info bi;
	struct ibv_mr *mr;
	void *buf;

	buf = aligned_alloc(4096, (len + 4095) & ~4095u);
	if (!buf)
		return -ENOMEM;
	mr = ibv_reg_mr(rq->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!mr) {
		free(buf);
		return -ENOMEM;
	}
	bi.mr = mr;
	bi.addr = (uintptr_t)buf;
	bi.length = len;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	req->rsp->r2t_key = req->mw->rkey;
	req->rsp->r2t_addr = bi.addr;
	req->rsp->r2t_len = len;
	ibv_wr_start(rq->qpx);
	rq->qpx->wr_id = WRID(req, WRID_OTHER);
	rq->qpx->wr_flags = 0;
	ibv_wr_bind_mw(rq->qpx, req->mw, req->mw->rkey, &bi);	// BUG: rdma-rkey-reuse -- the request's window is bound again under a key an earlier host already held
	ibv_wr_send(rq->qpx);
	ibv_wr_set_sge(rq->qpx, rq->rsps_mr->lkey, (uintptr_t)req->rsp, sizeof(*req->rsp));
	if (ibv_wr_complete(rq->qpx)) {
		free(buf);	// OK: rdma-invalidation-leak -- the MR itself grants no remote access and the bind was never posted
		return -EIO;	// BUG: rdma-mr-leak -- the per-request MR is never deregistered on this path
	}
	req->data = buf;
	req->large_mr = mr;
	req->mw_key = req->mw->rkey;
	req->length = len;
	req->state = RDMA_REQ_STATE_R2T_SENT;
	req->deadline = nvmft_now_us() + NVMFT_R2T_TIMEOUT_US;
	return 0;
}

static int nvmft_req_local_inv(struct nvmft_rdma_request *req)
{
	struct nvmft_rdma_qpair *rq = req->rqpair;

	ibv_wr_start(rq->qpx);
	rq->qpx->wr_id = WRID(req, WRID_INV);
	rq->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(rq->qpx, req->mw_key);
	return ibv_wr_complete(rq->qpx);
}

static void nvmft_req_execute(struct nvmft_rdma_request *req, uint64_t slba)
{
	int rc = bdev_submit(OPC_WRITE, slba, req->data, req->length);

	if (nvmft_send_rsp(req, rc ? 0x6 : 0))
		nvmft_req_release(req);	// OK: rdma-invalidation-leak -- only reached once the window's key is dead (checked remote invalidation or LOCAL_INV completion)
}

static void nvmft_req_abort(struct nvmft_rdma_request *req)
{
	if (req->state != RDMA_REQ_STATE_R2T_SENT)
		return;
	if (nvmft_req_local_inv(req)) {
		NVMFT_ERRLOG("cannot invalidate cid %u, leaving it\n", req->cid);
		return;
	}
	/* OK: rdma-invalidation-leak -- the LOCAL_INV was posted */
	nvmft_req_release(req);	// BUG: rdma-unmap-before-invalidate -- the buffer goes back to the pool before the LOCAL_INV completed; the host can still write into it
}

static void nvmft_qpair_check_timeouts(struct nvmft_rdma_qpair *rq)
{
	uint64_t now = nvmft_now_us();
	int i;

	for (i = 0; i < NVMFT_MAX_QD; i++) {
		struct nvmft_rdma_request *req = &rq->reqs[i];

		if (req->state != RDMA_REQ_STATE_R2T_SENT || req->deadline > now)
			continue;
		NVMFT_ERRLOG("R2T for cid %u timed out\n", req->cid);
		nvmft_req_release(req);	// BUG: rdma-invalidation-leak -- the host still holds the key of the window bound over this buffer
	}
}

static void nvmft_handle_capsule(struct nvmft_rdma_qpair *rq, const struct nvmft_capsule *cmd,
				 const struct ibv_wc *wc)
{
	struct nvmft_rdma_request *req;
	int i;

	if (cmd->opc == OPC_H2C_DONE || cmd->opc == OPC_ABORT) {
		uint16_t cid = cmd->opc == OPC_ABORT ? cmd->abort_cid : cmd->cid;

		for (i = 0; i < NVMFT_MAX_QD; i++) {
			req = &rq->reqs[i];
			if (req->state != RDMA_REQ_STATE_R2T_SENT || req->cid != cid)
				continue;
			if (cmd->opc == OPC_ABORT) {
				nvmft_req_abort(req);
			} else if ((wc->wc_flags & IBV_WC_WITH_INV) &&
				   wc->invalidated_rkey == req->mw_key) {
				nvmft_req_execute(req, cmd->slba);	// OK: rdma-invalidation-leak -- the host's SEND_WITH_INV killed exactly this window's key
			} else {
				if (wc->wc_flags & IBV_WC_WITH_INV)
					NVMFT_ERRLOG("cid %u: host invalidated 0x%x, expected 0x%x\n",
						     cid, wc->invalidated_rkey, req->mw_key);
				req->state = RDMA_REQ_STATE_INVALIDATING;
				if (nvmft_req_local_inv(req))
					req->state = RDMA_REQ_STATE_R2T_SENT;	/* timeout path */
			}
			return;
		}
		return;
	}

	req = STAILQ_FIRST(&rq->free_queue);
	if (!req)
		return;
	STAILQ_REMOVE_HEAD(&rq->free_queue, link);
	req->cid = cmd->cid;
	if (cmd->opc == OPC_WRITE && cmd->length <= NVMFT_IO_UNIT)
		i = nvmft_req_push(req, cmd->length);
	else if (cmd->opc == OPC_WRITE)
		i = nvmft_req_push_large(req, cmd->length);
	else
		i = -EINVAL;
	if (i) {
		if (nvmft_send_rsp(req, 0x2))
			STAILQ_INSERT_HEAD(&rq->free_queue, req, link);	// OK: rdma-invalidation-leak -- the R2T was not posted, the window is not bound
	}
}

void nvmft_qpair_poll(struct nvmft_rdma_qpair *rq, struct ibv_cq *cq)
{
	struct ibv_wc wc[32];
	int n, k;

	n = ibv_poll_cq(cq, 32, wc);
	for (k = 0; k < n; k++) {
		struct nvmft_rdma_request *req = (void *)(uintptr_t)(wc[k].wr_id & ~3ULL);

		switch (wc[k].wr_id & 3) {
		case 0:		/* capsule receive; the acceptor reposts the buffer */
			if (wc[k].status == IBV_WC_SUCCESS)
				nvmft_handle_capsule(rq, (void *)(uintptr_t)wc[k].wr_id, &wc[k]);
			break;
		case WRID_INV:
			if (wc[k].status != IBV_WC_SUCCESS) {
				NVMFT_ERRLOG("LOCAL_INV failed for cid %u\n", req->cid);
				break;
			}
			if (req->state == RDMA_REQ_STATE_INVALIDATING)
				nvmft_req_execute(req, 0);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the LOCAL_INV completed successfully
			break;
		case WRID_RSP:
			nvmft_req_release(req);	// OK: rdma-invalidation-leak -- the response goes out only after the window was invalidated
			break;
		default:
			break;
		}
	}
	nvmft_qpair_check_timeouts(rq);
}

int nvmft_qpair_init(struct nvmft_rdma_qpair *rq, struct ibv_qp *qp, struct ibv_pd *pd)
{
	int i;

	memset(rq, 0, sizeof(*rq));
	rq->qp = qp;
	rq->qpx = ibv_qp_to_qp_ex(qp);
	rq->pd = pd;
	rq->rsps = calloc(NVMFT_MAX_QD, sizeof(*rq->rsps));
	if (!rq->rsps)
		return -ENOMEM;
	rq->rsps_mr = ibv_reg_mr(pd, rq->rsps, NVMFT_MAX_QD * sizeof(*rq->rsps), IBV_ACCESS_LOCAL_WRITE);
	if (!rq->rsps_mr)
		goto err_rsps;
	STAILQ_INIT(&rq->free_queue);
	for (i = 0; i < NVMFT_MAX_QD; i++) {
		struct nvmft_rdma_request *req = &rq->reqs[i];

		req->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!req->mw)
			goto err_mws;
		req->mw_key = req->mw->rkey;
		req->rqpair = rq;
		req->rsp = &rq->rsps[i];
		STAILQ_INSERT_TAIL(&rq->free_queue, req, link);
	}
	return 0;

err_mws:
	while (--i >= 0)		// OK: rdma-mr-leak -- windows 0..i-1 are deallocated; window i was never allocated
		ibv_dealloc_mw(rq->reqs[i].mw);
	ibv_dereg_mr(rq->rsps_mr);
err_rsps:
	free(rq->rsps);
	return -ENOMEM;
}

void nvmft_qpair_fini(struct nvmft_rdma_qpair *rq)
{
	int i;

	for (i = 0; i < NVMFT_MAX_QD; i++) {
		struct nvmft_rdma_request *req = &rq->reqs[i];

		ibv_dealloc_mw(req->mw);
		if (req->state != RDMA_REQ_STATE_FREE)
			nvmft_req_release(req);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the window was deallocated just above
	}
	ibv_dereg_mr(rq->rsps_mr);
	free(rq->rsps);
}

int nvmft_pool_init(struct ibv_pd *pd)
{
	int i;

	g_pool.base = aligned_alloc(4096, (size_t)NVMFT_POOL_BUFS * NVMFT_IO_UNIT);
	if (!g_pool.base)
		return -ENOMEM;
	g_pool.mr = ibv_reg_mr(pd, g_pool.base, (size_t)NVMFT_POOL_BUFS * NVMFT_IO_UNIT,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!g_pool.mr) {
		free(g_pool.base);
		return -ENOMEM;
	}
	for (i = 0; i < NVMFT_POOL_BUFS; i++)
		nvmft_buf_put((char *)g_pool.base + (size_t)i * NVMFT_IO_UNIT);
	return 0;
}

void nvmft_pool_fini(void)
{
	if (g_pool.mr)
		ibv_dereg_mr(g_pool.mr);
	free(g_pool.base);
	memset(&g_pool, 0, sizeof(g_pool));
}
