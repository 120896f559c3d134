/*
 * psrv: the aggregation side of a synchronous parameter server.  Each
 * worker has its own RC QP (extended API: ibv_create_qp_ex, ibv_wr_*) and
 * a gradient slot in one big gradient area; the slot is exposed to the
 * worker through a type-2 window for the duration of a training round.
 * A round: bind every live worker's window and tell the worker (SEND of
 * round, va, rkey); workers RDMA-WRITE their gradients; at the deadline
 * the server invalidates every window, waits for the LOCAL_INVs and sums
 * the slots.  Workers that miss too many deadlines are evicted and their
 * slot goes back to the slot free list for the next worker to join.
 *
 * Correct: the first bind of a freshly allocated window (its key was never
 * handed out); shutdown invalidates with signaled LOCAL_INVs and polls
 * for them before the windows and the area are released; the send queue
 * is sized without a per-request factor and clamped to the device.
 *
 * Not correct: every round re-binds the window with the key of the
 * previous round (w->key is never rotated), so a straggler still writing
 * with last round's key lands in this round's gradients; eviction posts
 * an unsignaled LOCAL_INV and puts the slot on the free list at once.
 */
#include <infiniband/verbs.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PSRV_MAX_WORKERS	64
#define PSRV_SQ_WANT		128

struct psrv_ctl {
	uint32_t round;
	uint32_t rkey;
	uint64_t va;
	uint32_t len;
	uint32_t flags;
};

struct psrv_worker {
	struct ibv_qp    *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mw    *mw;
	uint32_t          key;
	int               slot;		/* index into the gradient area, -1 if none */
	bool              live;
	unsigned int      missed;
	struct psrv_ctl   ctl;
};

struct psrv {
	struct ibv_context *ctx;
	struct ibv_pd      *pd;
	struct ibv_cq      *cq;
	struct ibv_mr      *grad_mr;	/* LOCAL_WRITE | MW_BIND over all slots */
	struct ibv_mr      *ctl_mr;	/* covers workers[] (the ctl messages) */
	float              *grads;
	size_t              slot_len;
	uint32_t            round;
	int                 free_slots[PSRV_MAX_WORKERS];
	unsigned int        nfree;
	struct psrv_worker  workers[PSRV_MAX_WORKERS];
};

static inline char *psrv_slot_addr(struct psrv *ps, int slot)
{
	return (char *)ps->grads + (size_t)slot * ps->slot_len;
}

int psrv_create_worker_qp(struct psrv *ps, struct psrv_worker *w)
{
	struct ibv_device_attr da;
	struct ibv_qp_init_attr_ex attr;

	if (ibv_query_device(ps->ctx, &da))
		return -EIO;
	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = ps->cq;
	attr.recv_cq = ps->cq;
	attr.pd = ps->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			      IBV_QP_EX_WITH_LOCAL_INV;
	attr.cap.max_send_wr = (unsigned int)da.max_qp_wr < PSRV_SQ_WANT ?
			       (unsigned int)da.max_qp_wr : PSRV_SQ_WANT;
	attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	w->qp = ibv_create_qp_ex(ps->ctx, &attr);
	if (!w->qp)
		return -errno;
	w->qpx = ibv_qp_to_qp_ex(w->qp);
	return 0;
}

static int psrv_wait(struct psrv *ps, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(ps->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0)
			continue;
		if (wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

static void psrv_post_ctl(struct psrv *ps, struct psrv_worker *w, int slot)
{
	w->ctl.round = htobe32(ps->round);
	w->ctl.rkey = htobe32(w->key);
	w->ctl.va = htobe64((uintptr_t)psrv_slot_addr(ps, slot));
	w->ctl.len = htobe32((uint32_t)ps->slot_len);
	w->qpx->wr_id = (uintptr_t)&w->ctl;
	w->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(w->qpx);
	ibv_wr_set_sge(w->qpx, ps->ctl_mr->lkey, (uintptr_t)&w->ctl, sizeof(w->ctl));
}

int psrv_admit(struct psrv *ps, struct psrv_worker *w)
{
	struct ibv_mw_bind_info bi;
	int slot;

	if (!ps->nfree)
		return -ENOSPC;
	slot = ps->free_slots[--ps->nfree];

	w->mw = ibv_alloc_mw(ps->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the ULP allocates the worker's window
	if (!w->mw) {
		ps->free_slots[ps->nfree++] = slot;
		return -ENOMEM;
	}
	w->key = w->mw->rkey;
	w->slot = slot;

	bi.mr = ps->grad_mr;
	bi.addr = (uintptr_t)psrv_slot_addr(ps, slot);
	bi.length = ps->slot_len;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(w->qpx);
	w->qpx->wr_id = (uintptr_t)w;
	w->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* OK: rdma-rkey-reuse -- first bind of a new window; its allocation key was never handed out */
	ibv_wr_bind_mw(w->qpx, w->mw, w->key, &bi); // BUG: rdma-local-mr-management -- window bound by the ULP
	psrv_post_ctl(ps, w, slot);
	if (ibv_wr_complete(w->qpx) || psrv_wait(ps, (uintptr_t)w)) {
		/* the bind failed: nothing is exposed */
		ibv_dealloc_mw(w->mw);
		w->mw = NULL;
		w->slot = -1;
		ps->free_slots[ps->nfree++] = slot;
		return -EIO;
	}
	w->live = true;
	w->missed = 0;
	return 0;
}

int psrv_round_open(struct psrv *ps)
{
	struct ibv_mw_bind_info bi;
	unsigned int i;
	int ret = 0;

	ps->round++;
	for (i = 0; i < PSRV_MAX_WORKERS; i++) {
		struct psrv_worker *w = &ps->workers[i];

		if (!w->live)
			continue;
		bi.mr = ps->grad_mr;
		bi.addr = (uintptr_t)psrv_slot_addr(ps, w->slot);
		bi.length = ps->slot_len;
		bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

		ibv_wr_start(w->qpx);
		w->qpx->wr_id = (uintptr_t)w;
		w->qpx->wr_flags = 0;
		ibv_wr_bind_mw(w->qpx, w->mw, w->key, &bi); // BUG: rdma-rkey-reuse, rdma-local-mr-management -- re-bound every round with last round's key
		psrv_post_ctl(ps, w, w->slot);
		if (ibv_wr_complete(w->qpx))
			ret = -EIO;
	}
	return ret;
}

/* end of round: kill every worker's key and wait until the device did */
int psrv_round_close(struct psrv *ps)
{
	unsigned int i, posted = 0;
	struct ibv_wc wc[16];
	int n;

	for (i = 0; i < PSRV_MAX_WORKERS; i++) {
		struct psrv_worker *w = &ps->workers[i];

		if (!w->live)
			continue;
		ibv_wr_start(w->qpx);
		w->qpx->wr_id = (uintptr_t)w | 1;
		w->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(w->qpx, w->key);
		if (ibv_wr_complete(w->qpx) == 0)
			posted++;
	}
	while (posted) {
		n = ibv_poll_cq(ps->cq, 16, wc);
		if (n < 0)
			return -EIO;
		for (int k = 0; k < n; k++)
			if (wc[k].wr_id & 1)
				posted--;
	}
	return 0;
}

void psrv_evict(struct psrv *ps, struct psrv_worker *w)
{
	ibv_wr_start(w->qpx);
	w->qpx->wr_id = (uintptr_t)w | 1;
	w->qpx->wr_flags = 0;
	ibv_wr_local_inv(w->qpx, w->key);
	ibv_wr_complete(w->qpx);

	w->live = false;
	memset(psrv_slot_addr(ps, w->slot), 0, ps->slot_len);
	ps->free_slots[ps->nfree++] = w->slot; // BUG: rdma-unmap-before-invalidate -- the slot is recycled right after an unsignaled LOCAL_INV
	w->slot = -1;
}

void psrv_shutdown(struct psrv *ps)
{
	unsigned int i;

	for (i = 0; i < PSRV_MAX_WORKERS; i++) {
		struct psrv_worker *w = &ps->workers[i];

		if (!w->mw)
			continue;
		if (w->live) {
			ibv_wr_start(w->qpx);
			w->qpx->wr_id = (uintptr_t)w | 1;
			w->qpx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_local_inv(w->qpx, w->key);
			if (ibv_wr_complete(w->qpx) == 0)
				psrv_wait(ps, (uintptr_t)w | 1);
		}
		ibv_dealloc_mw(w->mw);
		w->mw = NULL;
		ibv_destroy_qp(w->qp);
	}
	ibv_dereg_mr(ps->ctl_mr);
	ibv_dereg_mr(ps->grad_mr);
	free(ps->grads); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- LOCAL_INVs waited for, windows deallocated, MR deregistered first
}
