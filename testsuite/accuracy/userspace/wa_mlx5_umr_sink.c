/*
 * umr_sink.c - receive side of "umrcat", a bulk streaming tool for mlx5 NICs.
 *
 * The sink owns a ring of segments, separate allocations registered for
 * remote write. With UMR support it builds one indirect mkey over all the
 * segments (mlx5dv_wr_mr_list) and gives the source a single key; without it
 * the hello message carries one key per segment. Each stream also gets a
 * status word: a slot of a small slab exposed through a type-2 memory window,
 * into which the source writes the epoch it finished. The window is moved to
 * a fresh slot per stream and re-armed at every epoch so that a late write
 * for an old epoch cannot land in the current one.
 *
 * Correct: key rotation when a stream starts, a bind that failed being
 * recycled, stream end waiting for its LOCAL_INV, the segment unwinding order.
 * Not correct: the prefetch failure leaks the current segment's MR, setup
 * skips the segment cleanup when the status slab fails, re-arm rotates the
 * key only when the source reconnected, abort recycles the status slot right
 * after an unsignaled LOCAL_INV, and teardown frees the segments while their
 * remotely writable MRs are still registered.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-registration-in-datapath, rdma-queue-cap-unchecked, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation -- not reviewed for this file
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define SINK_MAX_SEGS     16
#define SINK_SEG_SIZE     (4u << 20)
#define SINK_CTRL_SIZE    4096
#define SINK_NSLOTS       8
#define SINK_SLOT_SIZE    64
#define SINK_MAGIC        0x756d7263u

enum { WRID_UMR = 1, WRID_BIND, WRID_INV, WRID_MKEY_INV };

#define LOG(fmt, ...) fprintf(stderr, "umr_sink: " fmt "\n", ##__VA_ARGS__)

struct slot {
	struct slot       *next;
	volatile uint64_t *word;
	uint64_t           epoch;
	uint32_t           peer_gen;
};

struct seg {
	void          *buf;
	struct ibv_mr *mr;
};

struct sink {
	struct ibv_context  *ctx;
	struct ibv_pd       *pd;
	struct ibv_cq       *cq;
	struct ibv_qp       *qp;
	struct ibv_qp_ex    *qpx;
	struct mlx5dv_qp_ex *mqpx;
	int                  use_umr;
	int                  odp;
	uint32_t             peer_gen;

	struct seg           segs[SINK_MAX_SEGS];
	int                  nsegs;
	struct mlx5dv_mkey  *mkey;

	void                *ctrl;
	struct ibv_mr       *ctrl_mr;

	void                *slab;
	struct ibv_mr       *slab_mr;
	struct slot          slots[SINK_NSLOTS];
	struct slot         *free_slots;
	struct ibv_mw       *mw;
	uint32_t             mw_rkey;
};

struct hello {
	uint32_t magic;
	uint16_t nkeys;
	uint16_t flags;
	uint64_t status_addr;
	uint32_t status_rkey;
	uint32_t pad;
	struct {
		uint64_t addr;
		uint32_t rkey;
		uint32_t len;
	} keys[SINK_MAX_SEGS];
};

static int sink_wait(struct sink *s, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			return -1;
	} while (n == 0 || wc.wr_id != wr_id);
	if (wc.status != IBV_WC_SUCCESS) {
		LOG("wr %llu: %s", (unsigned long long)wr_id, ibv_wc_status_str(wc.status));
		return -1;
	}
	return 0;
}

static int sink_create_qp(struct sink *s)
{
	struct ibv_qp_init_attr_ex qa;
	struct mlx5dv_qp_init_attr dv;

	memset(&qa, 0, sizeof(qa));
	memset(&dv, 0, sizeof(dv));
	qa.qp_type          = IBV_QPT_RC;
	qa.send_cq          = s->cq;
	qa.recv_cq          = s->cq;
	qa.cap.max_send_wr  = 64;
	qa.cap.max_recv_wr  = 16;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 64;
	qa.pd               = s->pd;
	qa.comp_mask        = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags   = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_LOCAL_INV |
			      IBV_QP_EX_WITH_BIND_MW;
	dv.comp_mask        = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags   = s->use_umr ? MLX5DV_QP_EX_WITH_MR_LIST : 0;

	s->qp = mlx5dv_create_qp(s->ctx, &qa, &dv);
	if (!s->qp)
		return -1;
	s->qpx  = ibv_qp_to_qp_ex(s->qp);
	s->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(s->qpx);
	return 0;
}

static struct ibv_mr *sink_reg_ctrl(struct ibv_pd *pd, void *buf, size_t len)
{
	return ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE); // OK: rdma-local-mr-management -- hello/credit messages, registered once for local access
}

static int sink_reg_segs(struct sink *s, int nsegs)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_sge sge;
	int i, j;

	if (s->odp)
		access |= IBV_ACCESS_ON_DEMAND;

	for (i = 0; i < nsegs; i++) {
		s->segs[i].buf = aligned_alloc(4096, SINK_SEG_SIZE);
		if (!s->segs[i].buf)
			goto unwind;
		s->segs[i].mr = ibv_reg_mr(s->pd, s->segs[i].buf, SINK_SEG_SIZE, access); // BUG: rdma-local-mr-management -- the source writes the segments through these keys (or the mkey over them)
		if (!s->segs[i].mr) {
			free(s->segs[i].buf);
			goto unwind;
		}
		if (!s->odp)
			continue;

		sge.addr   = (uintptr_t)s->segs[i].buf;
		sge.length = SINK_SEG_SIZE;
		sge.lkey   = s->segs[i].mr->lkey;
		if (ibv_advise_mr(s->pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
				  IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1)) {
			LOG("prefetch of segment %d failed", i);
			goto unwind; // BUG: rdma-mr-leak -- segment i is registered, but the unwinding stops at i - 1
		}
	}
	s->nsegs = nsegs;
	return 0;

unwind:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(s->segs[j].mr);
		free(s->segs[j].buf); // OK: rdma-invalidation-leak -- deregistered on the line above, before its memory goes
		s->segs[j].mr  = NULL;
		s->segs[j].buf = NULL;
	}
	return -1;
}

static int sink_build_mkey(struct sink *s)
{
	struct mlx5dv_mkey_init_attr mattr;
	struct ibv_sge sge[SINK_MAX_SEGS];
	int i;

	memset(&mattr, 0, sizeof(mattr));
	mattr.pd           = s->pd;
	mattr.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
	mattr.max_entries  = SINK_MAX_SEGS;
	s->mkey = mlx5dv_create_mkey(&mattr); // BUG: rdma-local-mr-management -- indirect mkey built to give the source one key for the whole ring
	if (!s->mkey)
		return -1;

	for (i = 0; i < s->nsegs; i++) {
		sge[i].addr   = (uintptr_t)s->segs[i].buf;
		sge[i].length = SINK_SEG_SIZE;
		sge[i].lkey   = s->segs[i].mr->lkey;
	}

	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = WRID_UMR;
	s->qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	mlx5dv_wr_mr_list(s->mqpx, s->mkey,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
			  (uint16_t)s->nsegs, sge); // BUG: rdma-local-mr-management -- the sink lays out the remotely writable mkey itself
	if (ibv_wr_complete(s->qpx) || sink_wait(s, WRID_UMR)) {
		mlx5dv_destroy_mkey(s->mkey);
		s->mkey = NULL;
		return -1;
	}
	return 0;
}

static int sink_status_init(struct sink *s)
{
	size_t len = SINK_NSLOTS * SINK_SLOT_SIZE;
	int i;

	s->slab = aligned_alloc(4096, len);
	if (!s->slab)
		return -1;
	memset(s->slab, 0, len);

	s->slab_mr = ibv_reg_mr(s->pd, s->slab, len,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND); // BUG: rdma-local-mr-management -- registered so that a window can hand its slots to the source
	if (!s->slab_mr)
		goto err_slab;

	s->mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- window that exposes the status slots
	if (!s->mw)
		goto err_mr;
	s->mw_rkey = s->mw->rkey;

	s->free_slots = NULL;
	for (i = SINK_NSLOTS - 1; i >= 0; i--) {
		s->slots[i].word = (volatile uint64_t *)((char *)s->slab + i * SINK_SLOT_SIZE);
		s->slots[i].next = s->free_slots;
		s->free_slots    = &s->slots[i];
	}
	return 0;

err_mr:
	ibv_dereg_mr(s->slab_mr);
	s->slab_mr = NULL;
err_slab:
	free(s->slab);
	s->slab = NULL;
	return -1;
}

struct slot *sink_stream_start(struct sink *s, uint64_t epoch)
{
	struct ibv_mw_bind_info bi;
	struct slot *st = s->free_slots;

	if (!st)
		return NULL;
	s->free_slots = st->next;
	*st->word    = 0;
	st->epoch    = epoch;
	st->peer_gen = s->peer_gen;

	bi.mr              = s->slab_mr;
	bi.addr            = (uintptr_t)st->word;
	bi.length          = SINK_SLOT_SIZE;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	s->mw_rkey = ibv_inc_rkey(s->mw_rkey);
	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = WRID_BIND;
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the sink binds the status window itself */
	ibv_wr_bind_mw(s->qpx, s->mw, s->mw_rkey, &bi); // OK: rdma-rkey-reuse -- rotated with ibv_inc_rkey() just above
	if (ibv_wr_complete(s->qpx) || sink_wait(s, WRID_BIND)) {
		st->next      = s->free_slots;
		s->free_slots = st; // OK: rdma-invalidation-leak -- the bind failed, nothing was exposed
		return NULL;
	}
	return st;
}

/* New epoch on a running stream: fence off writes meant for the old one. */
int sink_stream_rearm(struct sink *s, struct slot *st, uint64_t epoch)
{
	struct ibv_mw_bind_info bi;
	uint32_t key = s->mw_rkey;

	if (st->peer_gen != s->peer_gen) {
		/* the source reconnected and lost its key anyway */
		key = ibv_inc_rkey(key);
		st->peer_gen = s->peer_gen;
	}
	*st->word = 0;
	st->epoch = epoch;

	bi.mr              = s->slab_mr;
	bi.addr            = (uintptr_t)st->word;
	bi.length          = SINK_SLOT_SIZE;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;

	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = WRID_BIND;
	s->qpx->wr_flags = 0;
	ibv_wr_local_inv(s->qpx, s->mw_rkey);
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the sink binds the status window itself */
	ibv_wr_bind_mw(s->qpx, s->mw, key, &bi); // BUG: rdma-rkey-reuse -- without a reconnect the old epoch's key is bound again over the same word
	if (ibv_wr_complete(s->qpx) || sink_wait(s, WRID_BIND))
		return -1;
	s->mw_rkey = key;
	return 0;
}

int sink_stream_end(struct sink *s, struct slot *st)
{
	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = WRID_INV;
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(s->qpx, s->mw_rkey);
	if (ibv_wr_complete(s->qpx) || sink_wait(s, WRID_INV)) {
		LOG("status window invalidation failed, slot %p kept", (void *)st);
		return -1;
	}
	st->next      = s->free_slots;
	s->free_slots = st; // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the slot is reused only after the LOCAL_INV completed
	return 0;
}

/* The source sent garbage: cut it off and give the slot back right away. */
void sink_stream_abort(struct sink *s, struct slot *st)
{
	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = WRID_INV;
	s->qpx->wr_flags = 0;
	ibv_wr_local_inv(s->qpx, s->mw_rkey);
	if (ibv_wr_complete(s->qpx)) {
		LOG("could not post status invalidation");
		return;
	}
	st->next      = s->free_slots;
	s->free_slots = st; // BUG: rdma-unmap-before-invalidate -- unsignaled LOCAL_INV, never waited for; the next stream may get this slot while the old key still works
}

int sink_send_hello(struct sink *s, struct slot *st)
{
	struct hello *h = s->ctrl;
	uint32_t rkey;
	int i;

	memset(h, 0, sizeof(*h));
	h->magic       = htobe32(SINK_MAGIC);
	h->status_addr = htobe64((uintptr_t)st->word);
	h->status_rkey = htobe32(s->mw_rkey);
	if (s->mkey) {
		h->nkeys = htobe16(1);
		h->keys[0].addr = 0;
		h->keys[0].rkey = htobe32(s->mkey->rkey);
		h->keys[0].len  = htobe32(SINK_SEG_SIZE * (uint32_t)s->nsegs);
	} else {
		h->nkeys = htobe16((uint16_t)s->nsegs);
		for (i = 0; i < s->nsegs; i++) {
			rkey = htobe32(s->segs[i].mr->rkey);
			h->keys[i].addr = htobe64((uintptr_t)s->segs[i].buf);
			memcpy(&h->keys[i].rkey, &rkey, sizeof(rkey));
			h->keys[i].len  = htobe32(SINK_SEG_SIZE);
		}
	}

	ibv_wr_start(s->qpx);
	s->qpx->wr_id    = 0;
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(s->qpx);
	ibv_wr_set_sge(s->qpx, s->ctrl_mr->lkey, (uintptr_t)h, sizeof(*h));
	return ibv_wr_complete(s->qpx);
}

int sink_setup(struct sink *s, struct ibv_device *dev, int nsegs)
{
	struct mlx5dv_context_attr dattr = { .flags = MLX5DV_CONTEXT_FLAGS_DEVX };
	int i;

	s->ctx = mlx5dv_open_device(dev, &dattr);
	if (!s->ctx)
		return -1;
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 128, NULL, NULL, 0);
	if (!s->pd || !s->cq)
		return -1;

	s->ctrl = calloc(1, SINK_CTRL_SIZE);
	if (!s->ctrl)
		return -1;
	s->ctrl_mr = sink_reg_ctrl(s->pd, s->ctrl, SINK_CTRL_SIZE);
	if (!s->ctrl_mr)
		goto err_ctrl;
	if (sink_create_qp(s))
		goto err_ctrl_mr;
	if (sink_reg_segs(s, nsegs))
		goto err_qp;
	if (s->use_umr && sink_build_mkey(s))
		goto err_segs; // OK: rdma-mr-leak -- err_segs releases every segment MR
	if (sink_status_init(s))
		goto err_qp; // BUG: rdma-mr-leak -- jumps past err_segs; the segment MRs stay registered in s->segs
	return 0;

err_segs:
	if (s->mkey) {
		mlx5dv_destroy_mkey(s->mkey);
		s->mkey = NULL;
	}
	for (i = 0; i < s->nsegs; i++) {
		ibv_dereg_mr(s->segs[i].mr);
		free(s->segs[i].buf);
	}
	s->nsegs = 0;
err_qp:
	ibv_destroy_qp(s->qp);
err_ctrl_mr:
	ibv_dereg_mr(s->ctrl_mr);
err_ctrl:
	free(s->ctrl);
	return -1;
}

void sink_teardown(struct sink *s)
{
	int i;

	if (s->mkey) {
		ibv_wr_start(s->qpx);
		s->qpx->wr_id    = WRID_MKEY_INV;
		s->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(s->qpx, s->mkey->rkey);
		if (ibv_wr_complete(s->qpx) == 0)
			sink_wait(s, WRID_MKEY_INV);
		mlx5dv_destroy_mkey(s->mkey);
		s->mkey = NULL;
	}
	ibv_dealloc_mw(s->mw);
	ibv_dereg_mr(s->slab_mr);
	free(s->slab); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the window bound over the slab was deallocated above, which invalidates it

	for (i = 0; i < s->nsegs; i++) {
		free(s->segs[i].buf); // BUG: rdma-invalidation-leak -- the segment MR has remote write and its key went out in the hello; it is deregistered only on the next line
		ibv_dereg_mr(s->segs[i].mr);
	}
	s->nsegs = 0;

	free(s->ctrl); // OK: rdma-invalidation-leak -- local-only registration
	ibv_dereg_mr(s->ctrl_mr);
	ibv_destroy_qp(s->qp);
}
