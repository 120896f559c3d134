/*
 * statpush: pushes per-second statistics snapshots into a monitoring
 * node's buffer with RDMA WRITE on the extended QP API.  Snapshots of up
 * to 48 bytes go inline; the QP was created with the default "requested
 * completions only" signaling and the post sets wr_flags to either
 * IBV_SEND_INLINE or 0 -- never IBV_SEND_SIGNALED.  The monitoring node
 * sees data for max_send_wr seconds, then nothing.
 *
 * Correct: the snapshot buffer used for the non-inline case is registered
 * once (local source of the WRITE); capacities are small constants.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SP_DEPTH	32
#define SP_INLINE	48

struct statpush {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	char               *snap;
	struct ibv_mr      *snap_mr;
	uint64_t            remote_addr;
	uint32_t            remote_rkey;
};

int statpush_init(struct statpush *p, size_t snap_max)
{
	struct ibv_qp_init_attr_ex attr;

	p->snap = malloc(snap_max);
	if (!p->snap)
		return -ENOMEM;
	p->snap_mr = ibv_reg_mr(p->pd, p->snap, snap_max, 0); // BUG: rdma-local-mr-management -- lkey is the source of the ULP's own RDMA WRITE
	if (!p->snap_mr) {
		free(p->snap);
		return -errno;
	}
	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = p->cq;
	attr.recv_cq = p->cq;
	attr.pd = p->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	attr.cap.max_send_wr = SP_DEPTH;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = SP_INLINE;	/* OK: rdma-queue-cap-unchecked -- 48 bytes */
	// BUG(file): rdma-unsignaled-send-starvation -- requested-only signaling and no WRITE ever sets IBV_SEND_SIGNALED
	p->qp = ibv_create_qp_ex(p->ctx, &attr);
	if (!p->qp) {
		ibv_dereg_mr(p->snap_mr);
		free(p->snap);
		return -errno;
	}
	p->qpx = ibv_qp_to_qp_ex(p->qp);
	return 0;
}

int statpush_push(struct statpush *p, const void *snap, uint32_t len, uint64_t slot)
{
	ibv_wr_start(p->qpx);
	p->qpx->wr_id = slot;
	p->qpx->wr_flags = len <= SP_INLINE ? IBV_SEND_INLINE : 0;
	ibv_wr_rdma_write(p->qpx, p->remote_rkey, p->remote_addr + slot * 4096);
	if (len <= SP_INLINE) {
		ibv_wr_set_inline_data(p->qpx, (void *)snap, len);
	} else {
		memcpy(p->snap, snap, len);
		ibv_wr_set_sge(p->qpx, p->snap_mr->lkey, (uintptr_t)p->snap, len);
	}
	return ibv_wr_complete(p->qpx);
}
