/*
 * va_objstore_cqex.c - object store target, PUT sinks and read leases
 * exposed through type-2 memory windows; extended verbs throughout
 * (ibv_qp_ex work request builders, ibv_cq_ex polling).
 *
 * PUT:   client sends PUT_REQ, the target binds an op's window (REMOTE_WRITE)
 *        over the op's sink slice and sends a GRANT with the window rkey; the
 *        client RDMA-WRITEs and sends PUT_DONE with SEND_WITH_INV(rkey).
 * LEASE: the object is copied into the sink and the window is bound with
 *        REMOTE_READ; LEASE_DROP comes back with SEND_WITH_INV, LEASE_REMAP
 *        moves the window to another range of the snapshot.
 * A message without remote invalidation is finished with a signaled
 * LOCAL_INV; the op goes back to the free list from that completion.
 *
 * Correct: grants rotate the key with ibv_inc_rkey(); PUT_DONE compares
 * ibv_wc_read_invalidated_rkey() with the op's key; a batch that
 * ibv_wr_complete() refused recycles the op at once; quiesce waits for each
 * signaled LOCAL_INV; close deallocates the windows before freeing the sinks.
 * Wrong: LEASE_DROP trusts IBV_WC_WITH_INV without looking at the key,
 * LEASE_REMAP re-binds under the old key, expiry recycles PUT ops whose
 * window is still bound and recycles lease ops right after an unsignaled
 * LOCAL_INV, and op creation frees the op with its window allocated.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- not the subject of this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define OSD_SINK_SIZE	(256u * 1024)
#define OSD_MAX_OPS	128
#define OSD_RX_DEPTH	128
#define OSD_PUT_TMO_US	3000000ull
#define OSD_LEASE_US	2000000ull

#define osd_error(_fmt, ...)	fprintf(stderr, "osd: " _fmt "\n", ##__VA_ARGS__)

typedef enum {
	OSD_OK			= 0,
	OSD_ERR_NO_RESOURCE	= -1,
	OSD_ERR_IO		= -2,
	OSD_ERR_INVALID		= -3,
} osd_status_t;

enum {
	OSD_AM_PUT_REQ = 1,
	OSD_AM_PUT_DONE,
	OSD_AM_LEASE_REQ,
	OSD_AM_LEASE_REMAP,
	OSD_AM_LEASE_DROP,
	OSD_AM_GRANT,
};

enum { OSD_OP_IDLE, OSD_OP_PUT, OSD_OP_LEASE };
enum { OSD_WR_BIND = 1, OSD_WR_GRANT, OSD_WR_INV, OSD_WR_RX };

#define OSD_WRID(_id, _kind)	(((uint64_t)(_id) << 8) | (_kind))
#define OSD_WRID_KIND(_wrid)	((unsigned)((_wrid) & 0xff))
#define OSD_WRID_IDX(_wrid)	((unsigned)((_wrid) >> 8))

typedef struct osd_hdr {
	uint16_t am_id;
	uint16_t flags;
	uint32_t op_id;
	uint64_t obj;
	uint64_t addr;
	uint32_t offset;
	uint32_t length;
	uint32_t rkey;
	uint32_t pad;
} osd_hdr_t;

typedef struct osd_op {
	struct osd_op *next;
	struct ibv_mw *mw;
	uint32_t rkey;
	uint32_t op_id;
	char *sink;
	uint32_t length;
	int kind;
	uint64_t obj;
	uint64_t deadline_us;
	osd_hdr_t *grant;
} osd_op_t;

typedef struct osd_iface {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	char *sink_base;
	struct ibv_mr *sink_mr;
	osd_op_t *ops[OSD_MAX_OPS];
	osd_op_t *free_ops;
	unsigned num_ops;
	osd_hdr_t *rx;
	struct ibv_mr *rx_mr;
	int failed;
} osd_iface_t;

extern int osd_store_read(uint64_t obj, void *dst, uint32_t len);
extern int osd_store_commit(uint64_t obj, const void *src, uint32_t len);

static uint64_t osd_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000ull + ts.tv_nsec / 1000;
}

static osd_op_t *osd_op_create(osd_iface_t *iface, unsigned idx)
{
	osd_op_t *op = calloc(1, sizeof(*op));

	if (op == NULL)
		return NULL;
	op->mw = ibv_alloc_mw(iface->pd, IBV_MW_TYPE_2);
	if (op->mw == NULL) {
		free(op);
		return NULL;
	}
	op->grant = calloc(1, sizeof(*op->grant));
	if (op->grant == NULL) {
		free(op);	// BUG: rdma-mr-leak -- the op is freed with its memory window still allocated
		return NULL;
	}
	op->op_id = idx;
	op->rkey = op->mw->rkey;
	op->sink = iface->sink_base + (size_t)idx * OSD_SINK_SIZE;
	return op;
}

static void osd_op_destroy(osd_op_t *op)
{
	ibv_dealloc_mw(op->mw);
	free(op->grant);
	free(op);
}

static osd_op_t *osd_op_get(osd_iface_t *iface)
{
	osd_op_t *op = iface->free_ops;

	if (op != NULL)
		iface->free_ops = op->next;
	return op;
}

static void osd_op_put(osd_iface_t *iface, osd_op_t *op)
{
	op->kind = OSD_OP_IDLE;
	op->next = iface->free_ops;
	iface->free_ops = op;
}

static osd_status_t osd_post_grant(osd_iface_t *iface, osd_op_t *op,
				   unsigned access)
{
	struct ibv_qp_ex *qpx = iface->qpx;
	struct ibv_mw_bind_info bi = {
		.mr		 = iface->sink_mr,
		.addr		 = (uint64_t)(uintptr_t)op->sink,
		.length		 = op->length,
		.mw_access_flags = access,
	};

	memset(op->grant, 0, sizeof(*op->grant));
	op->grant->am_id  = OSD_AM_GRANT;
	op->grant->op_id  = op->op_id;
	op->grant->addr   = (uint64_t)(uintptr_t)op->sink;
	op->grant->length = op->length;
	op->grant->rkey   = op->rkey;

	ibv_wr_start(qpx);
	qpx->wr_id    = OSD_WRID(op->op_id, OSD_WR_BIND);
	qpx->wr_flags = 0;
	ibv_wr_bind_mw(qpx, op->mw, op->rkey, &bi);	// OK: rdma-rkey-reuse -- both callers rotate op->rkey just before the grant
	qpx->wr_id    = OSD_WRID(op->op_id, OSD_WR_GRANT);
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, op->grant, sizeof(*op->grant));
	return ibv_wr_complete(qpx) ? OSD_ERR_IO : OSD_OK;
}

static osd_status_t osd_post_inv(osd_iface_t *iface, osd_op_t *op,
				 unsigned wr_flags)
{
	ibv_wr_start(iface->qpx);
	iface->qpx->wr_id    = OSD_WRID(op->op_id, OSD_WR_INV);
	iface->qpx->wr_flags = wr_flags;
	ibv_wr_local_inv(iface->qpx, op->rkey);
	return ibv_wr_complete(iface->qpx) ? OSD_ERR_IO : OSD_OK;
}

static osd_status_t osd_put_req(osd_iface_t *iface, const osd_hdr_t *hdr)
{
	osd_op_t *op;

	if (hdr->length == 0 || hdr->length > OSD_SINK_SIZE)
		return OSD_ERR_INVALID;
	op = osd_op_get(iface);
	if (op == NULL)
		return OSD_ERR_NO_RESOURCE;

	op->kind        = OSD_OP_PUT;
	op->obj         = hdr->obj;
	op->length      = hdr->length;
	op->deadline_us = osd_now_us() + OSD_PUT_TMO_US;
	op->rkey        = ibv_inc_rkey(op->rkey);
	if (osd_post_grant(iface, op, IBV_ACCESS_REMOTE_WRITE) != OSD_OK) {
		osd_op_put(iface, op);	// OK: rdma-invalidation-leak -- ibv_wr_complete() failed, so the bind never reached the queue
		return OSD_ERR_IO;
	}
	return OSD_OK;
}

static osd_status_t osd_lease_req(osd_iface_t *iface, const osd_hdr_t *hdr)
{
	osd_op_t *op = osd_op_get(iface);

	if (op == NULL)
		return OSD_ERR_NO_RESOURCE;
	if (hdr->length > OSD_SINK_SIZE ||
	    osd_store_read(hdr->obj, op->sink, hdr->length) < 0) {
		osd_op_put(iface, op);
		return OSD_ERR_INVALID;
	}
	op->kind        = OSD_OP_LEASE;
	op->obj         = hdr->obj;
	op->length      = hdr->length;
	op->deadline_us = osd_now_us() + OSD_LEASE_US;
	op->rkey        = ibv_inc_rkey(op->rkey);
	if (osd_post_grant(iface, op, IBV_ACCESS_REMOTE_READ) != OSD_OK) {
		osd_op_put(iface, op);	// OK: rdma-invalidation-leak -- the refused batch bound nothing
		return OSD_ERR_IO;
	}
	return OSD_OK;
}

/* the client wants another range of its snapshot; it keeps its key */
static osd_status_t osd_lease_remap(osd_iface_t *iface, osd_op_t *op,
				    const osd_hdr_t *hdr)
{
	struct ibv_qp_ex *qpx = iface->qpx;
	struct ibv_mw_bind_info bi;

	if ((uint64_t)hdr->offset + hdr->length > OSD_SINK_SIZE)
		return OSD_ERR_INVALID;

	bi.mr              = iface->sink_mr;
	bi.addr            = (uint64_t)(uintptr_t)(op->sink + hdr->offset);
	bi.length          = hdr->length;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	ibv_wr_start(qpx);
	qpx->wr_id    = OSD_WRID(op->op_id, OSD_WR_INV);
	qpx->wr_flags = 0;
	ibv_wr_local_inv(qpx, op->rkey);	// OK: rdma-unmap-before-invalidate -- nothing is released after it; the window is re-bound over the same snapshot
	qpx->wr_id    = OSD_WRID(op->op_id, OSD_WR_BIND);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qpx, op->mw, op->rkey, &bi);	// BUG: rdma-rkey-reuse -- the window comes back under the key it had before the LOCAL_INV
	op->deadline_us = osd_now_us() + OSD_LEASE_US;
	return ibv_wr_complete(qpx) ? OSD_ERR_IO : OSD_OK;
}

static void osd_handle_rx(osd_iface_t *iface, struct ibv_cq_ex *cq)
{
	osd_hdr_t *hdr = &iface->rx[OSD_WRID_IDX(cq->wr_id)];
	unsigned wc_flags = ibv_wc_read_wc_flags(cq);
	osd_op_t *op = NULL;

	if (hdr->am_id != OSD_AM_PUT_REQ && hdr->am_id != OSD_AM_LEASE_REQ) {
		if (hdr->op_id >= iface->num_ops)
			return;
		op = iface->ops[hdr->op_id];
		if (op->kind == OSD_OP_IDLE)
			return;
	}

	switch (hdr->am_id) {
	case OSD_AM_PUT_REQ:
		osd_put_req(iface, hdr);
		break;
	case OSD_AM_LEASE_REQ:
		osd_lease_req(iface, hdr);
		break;
	case OSD_AM_LEASE_REMAP:
		if (osd_lease_remap(iface, op, hdr) != OSD_OK)
			iface->failed = 1;
		break;
	case OSD_AM_PUT_DONE:
		if (wc_flags & IBV_WC_WITH_INV) {	// OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is read and compared with the op's
			uint32_t inv_rkey = ibv_wc_read_invalidated_rkey(cq);

			if (inv_rkey != op->rkey) {
				osd_error("op %u: client invalidated 0x%x, granted 0x%x",
					  op->op_id, inv_rkey, op->rkey);
				iface->failed = 1;
				break;
			}
			osd_store_commit(op->obj, op->sink, op->length);
			osd_op_put(iface, op);	// OK: rdma-invalidation-leak -- the client invalidated this op's window
		} else if (osd_post_inv(iface, op, IBV_SEND_SIGNALED) != OSD_OK) {
			iface->failed = 1;
		}
		break;
	case OSD_AM_LEASE_DROP:
		if (wc_flags & IBV_WC_WITH_INV) {	// BUG: rdma-remote-invalidate-unchecked -- any invalidated key is taken as this lease's
			osd_op_put(iface, op);
		} else if (osd_post_inv(iface, op, IBV_SEND_SIGNALED) != OSD_OK) {
			iface->failed = 1;
		}
		break;
	default:
		osd_error("unknown am_id %u", hdr->am_id);
		break;
	}
}

static void osd_post_rx(osd_iface_t *iface, unsigned idx)
{
	struct ibv_sge sge = {
		.addr   = (uint64_t)(uintptr_t)&iface->rx[idx],
		.length = sizeof(osd_hdr_t),
		.lkey   = iface->rx_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id   = OSD_WRID(idx, OSD_WR_RX),
		.sg_list = &sge,
		.num_sge = 1,
	}, *bad;

	if (ibv_post_recv(iface->qp, &wr, &bad))
		iface->failed = 1;
}

unsigned osd_progress(osd_iface_t *iface)
{
	struct ibv_poll_cq_attr attr = {};
	struct ibv_cq_ex *cq = iface->cq;
	unsigned count = 0;
	osd_op_t *op;

	if (ibv_start_poll(cq, &attr) != 0)
		return 0;
	do {
		unsigned kind = OSD_WRID_KIND(cq->wr_id);

		count++;
		if (cq->status != IBV_WC_SUCCESS) {
			osd_error("wr kind %u failed: %s", kind,
				  ibv_wc_status_str(cq->status));
			iface->failed = 1;
			continue;
		}
		if (kind == OSD_WR_RX) {
			osd_handle_rx(iface, cq);
			osd_post_rx(iface, OSD_WRID_IDX(cq->wr_id));
		} else if (kind == OSD_WR_INV) {
			op = iface->ops[OSD_WRID_IDX(cq->wr_id)];
			if (op->kind == OSD_OP_PUT)
				osd_store_commit(op->obj, op->sink, op->length);
			osd_op_put(iface, op);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- only a successful LOCAL_INV completion gets here
		}
	} while (ibv_next_poll(cq) == 0);
	ibv_end_poll(cq);
	return count;
}

void osd_expire(osd_iface_t *iface)
{
	uint64_t now = osd_now_us();
	unsigned i;

	for (i = 0; i < iface->num_ops; i++) {
		osd_op_t *op = iface->ops[i];

		if (op->kind == OSD_OP_IDLE || op->deadline_us > now)
			continue;
		if (op->kind == OSD_OP_LEASE) {
			/* read-only lease: invalidate lazily */
			if (osd_post_inv(iface, op, 0) == OSD_OK)
				// OK: rdma-invalidation-leak -- the lease key's LOCAL_INV was posted; what is missing is the wait
				osd_op_put(iface, op);	// BUG: rdma-unmap-before-invalidate -- the LOCAL_INV is unsignaled and not waited for; the sink is handed to the next op while the lease window may still read it
		} else {
			osd_error("op %u: PUT not finished, dropping", op->op_id);
			osd_op_put(iface, op);	// BUG: rdma-invalidation-leak -- the PUT window is still bound with REMOTE_WRITE over the sink
		}
	}
}

static osd_status_t osd_wait_wr(osd_iface_t *iface, uint64_t wr_id)
{
	struct ibv_poll_cq_attr attr = {};
	struct ibv_cq_ex *cq = iface->cq;
	enum ibv_wc_status status;
	int ret;

	for (;;) {
		ret = ibv_start_poll(cq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret != 0)
			return OSD_ERR_IO;
		do {
			if (cq->wr_id == wr_id) {
				status = cq->status;
				ibv_end_poll(cq);
				return status == IBV_WC_SUCCESS ? OSD_OK : OSD_ERR_IO;
			}
		} while (ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
}

void osd_iface_close(osd_iface_t *iface)
{
	unsigned i;

	for (i = 0; i < iface->num_ops; i++) {
		osd_op_t *op = iface->ops[i];

		if (op->kind == OSD_OP_IDLE)
			continue;
		if (osd_post_inv(iface, op, IBV_SEND_SIGNALED) != OSD_OK ||
		    osd_wait_wr(iface, OSD_WRID(op->op_id, OSD_WR_INV)) != OSD_OK)
			continue;
		osd_op_put(iface, op);	// OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV was waited for
	}

	for (i = 0; i < iface->num_ops; i++)
		osd_op_destroy(iface->ops[i]);
	iface->num_ops = 0;
	ibv_dereg_mr(iface->sink_mr);
	free(iface->sink_base);	// OK: rdma-invalidation-leak -- every window was deallocated before the sink memory goes
	ibv_dereg_mr(iface->rx_mr);
	free(iface->rx);
}

/* iface->cq (ibv_create_cq_ex) and iface->qp (ibv_create_qp_ex with
 * SEND | BIND_MW | LOCAL_INV send ops) are set up by the transport layer */
osd_status_t osd_iface_open(osd_iface_t *iface, unsigned num_ops)
{
	unsigned i;

	if (num_ops > OSD_MAX_OPS)
		return OSD_ERR_INVALID;
	iface->qpx = ibv_qp_to_qp_ex(iface->qp);

	iface->sink_base = aligned_alloc(4096, (size_t)num_ops * OSD_SINK_SIZE);
	if (iface->sink_base == NULL)
		return OSD_ERR_NO_RESOURCE;
	iface->sink_mr = ibv_reg_mr(iface->pd, iface->sink_base,
				    (size_t)num_ops * OSD_SINK_SIZE,
				    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (iface->sink_mr == NULL)
		goto err_sink;

	iface->rx = calloc(OSD_RX_DEPTH, sizeof(*iface->rx));
	if (iface->rx == NULL)
		goto err_sink_mr;
	iface->rx_mr = ibv_reg_mr(iface->pd, iface->rx,
				  OSD_RX_DEPTH * sizeof(*iface->rx),
				  IBV_ACCESS_LOCAL_WRITE);
	if (iface->rx_mr == NULL)
		goto err_rx;

	iface->free_ops = NULL;
	for (i = 0; i < num_ops; i++) {
		iface->ops[i] = osd_op_create(iface, i);
		if (iface->ops[i] == NULL)
			goto err_ops;
		osd_op_put(iface, iface->ops[i]);	// OK: rdma-invalidation-leak -- a window fresh from ibv_alloc_mw() is bound to nothing
	}
	iface->num_ops = num_ops;

	for (i = 0; i < OSD_RX_DEPTH; i++)
		osd_post_rx(iface, i);
	return iface->failed ? OSD_ERR_IO : OSD_OK;

err_ops:
	while (i-- > 0)
		osd_op_destroy(iface->ops[i]);	// OK: rdma-mr-leak -- every op created so far gives its window back
	iface->free_ops = NULL;
	ibv_dereg_mr(iface->rx_mr);
err_rx:
	free(iface->rx);
err_sink_mr:
	ibv_dereg_mr(iface->sink_mr);
err_sink:
	free(iface->sink_base);
	return OSD_ERR_NO_RESOURCE;
}
