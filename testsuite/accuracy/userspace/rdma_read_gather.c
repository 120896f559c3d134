/*
 * logpull: a backup agent that pulls log segments from primaries with
 * RDMA READ, on the extended QP API (ibv_wr_rdma_read + ibv_wr_set_sge),
 * into a staging ring registered once, and pushes checkpoints back to the
 * primary with RDMA WRITE from the same ring.  Runs on whatever RDMA
 * device the host has (InfiniBand, RoCE or iWARP).
 *
 * Correct: the ring is registered once; READs are signaled and their
 * number in flight is bounded by the ring; the send queue holds one entry
 * per ring slot.
 * Not correct: the ring was registered LOCAL_WRITE only.  It is the sink
 * of RDMA READs, which on iWARP needs REMOTE_WRITE on the sink; on an
 * iWARP host every READ completes in error.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LP_SLOTS	64
#define LP_SLOT_SIZE	(1u << 20)

struct lp_agent {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_qp      *qp;
	struct ibv_qp_ex   *qpx;
	char               *ring;
	struct ibv_mr      *ring_mr;
	unsigned int        head, inflight;
};

int lp_setup(struct lp_agent *a)
{
	struct ibv_qp_init_attr_ex attr;

	a->ring = aligned_alloc(4096, (size_t)LP_SLOTS * LP_SLOT_SIZE);
	if (!a->ring)
		return -ENOMEM;
	a->ring_mr = ibv_reg_mr(a->pd, a->ring, (size_t)LP_SLOTS * LP_SLOT_SIZE, // BUG: rdma-local-mr-management -- the ring is the sink/source of the agent's own READ/WRITE
				IBV_ACCESS_LOCAL_WRITE);
	if (!a->ring_mr)
		goto err_ring;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = a->cq;
	attr.recv_cq = a->cq;
	attr.pd = a->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_RDMA_WRITE;
	/* OK: rdma-send-queue-undersized -- one READ or WRITE per ring slot in flight */
	attr.cap.max_send_wr = LP_SLOTS;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	a->qp = ibv_create_qp_ex(a->ctx, &attr);
	if (!a->qp)
		goto err_mr;
	a->qpx = ibv_qp_to_qp_ex(a->qp);
	return 0;

err_mr:
	ibv_dereg_mr(a->ring_mr);
err_ring:
	free(a->ring);
	return -EIO;
}

int lp_pull_segment(struct lp_agent *a, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	char *slot;

	if (a->inflight == LP_SLOTS || len > LP_SLOT_SIZE)
		return -EAGAIN;
	slot = a->ring + (size_t)(a->head % LP_SLOTS) * LP_SLOT_SIZE;

	ibv_wr_start(a->qpx);
	a->qpx->wr_id = a->head;
	/* OK: rdma-unsignaled-send-starvation -- every READ is signaled */
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(a->qpx, rkey, raddr);
	// BUG: rdma-access-flags-transport -- the READ sink (ring_mr) has no REMOTE_WRITE; fails on iWARP
	ibv_wr_set_sge(a->qpx, a->ring_mr->lkey, (uintptr_t)slot, len);
	if (ibv_wr_complete(a->qpx))
		return -EIO;
	a->head++;
	a->inflight++;
	return 0;
}

int lp_push_checkpoint(struct lp_agent *a, unsigned int slot_idx, uint64_t raddr,
		       uint32_t rkey, uint32_t len)
{
	char *slot = a->ring + (size_t)(slot_idx % LP_SLOTS) * LP_SLOT_SIZE;

	if (a->inflight == LP_SLOTS)
		return -EAGAIN;
	ibv_wr_start(a->qpx);
	a->qpx->wr_id = (1ull << 32) | slot_idx;
	a->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(a->qpx, rkey, raddr);
	/* OK: rdma-access-flags-transport -- an RDMA WRITE source needs no remote rights */
	ibv_wr_set_sge(a->qpx, a->ring_mr->lkey, (uintptr_t)slot, len);
	if (ibv_wr_complete(a->qpx))
		return -EIO;
	a->inflight++;
	return 0;
}

int lp_reap(struct lp_agent *a)
{
	struct ibv_wc wc[16];
	int n, i;

	n = ibv_poll_cq(a->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -EIO;
		a->inflight--;
	}
	return n;
}
