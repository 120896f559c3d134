/*
 * ra_ring_allreduce.c -- ring allreduce for a small collectives library.
 *
 * Every rank holds one RC QP per peer (extended send API) and one type-2
 * memory window per peer.  For a ring allreduce a rank lends its left
 * neighbour a window over a scratch slot (two blocks, REMOTE_WRITE); the
 * neighbour RDMA-WRITEs blocks into it with immediate data and the rank
 * reduces them into the user's buffer.  Windows are bound with a fresh key
 * per operation, the key goes to the neighbour out of band, and the window
 * is invalidated (signaled LOCAL_INV, waited for) before the scratch slot
 * goes back to the pool.  Persistent allreduces (init/start/free) keep a
 * window of their own.
 *
 * Right: the one-shot allreduce's bind and normal teardown, the bind and
 * key-exchange failure paths, persistent init/free, communicator setup.
 * Wrong: the abort path recycles the slot right after posting its
 * LOCAL_INV; a failed user-buffer registration recycles a slot whose window
 * the neighbour can still write; the abort path leaks the user-buffer MR;
 * persistent starts rebind the window under the key of the first start.
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
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

typedef enum {
	RC_OK		= 0,
	RC_ERR_NO_MEMORY = -1,
	RC_ERR_IO	= -2,
	RC_ERR_NO_RESOURCE = -3,
} rc_status_t;

#define RC_WRID_BIND	0xb1ULL
#define RC_WRID_INV	0x1eULL
#define RC_WRID_WRITE	0x3aULL
#define RC_POOL_SLOTS	8
#define RC_RECV_DEPTH	64

struct rc_peer {
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct ibv_mw		*mw;		/* our window for this peer */
	uint32_t		win_key;	/* key of mw's current binding */
	uint64_t		raddr;		/* peer's window for us */
	uint32_t		rkey;
};

struct rc_comm {
	int			rank, size;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct rc_peer		*peers;
	void			*pool;
	size_t			slot_size;
	struct ibv_mr		*pool_mr;	/* LOCAL_WRITE | MW_BIND */
	void			*free_slots[RC_POOL_SLOTS];
	int			nfree;
};

struct rc_persist {
	struct rc_comm		*comm;
	struct ibv_mw		*mw;
	uint32_t		key;
	int			bound;
	void			*slot;
	struct ibv_mr		*umr;
	uint64_t		raddr;		/* right neighbour's persistent window */
	uint32_t		rkey;
	float			*buf;
	size_t			count;
};

/* out-of-band bootstrap, provided by the runtime */
int rc_oob_connect(struct rc_comm *c, int peer, struct ibv_qp *qp);
int rc_oob_swap(struct rc_comm *c, int to, uint64_t addr, uint32_t key,
		int from, uint64_t *raddr, uint32_t *rkey);

#define RC_LEFT(c)	(((c)->rank + (c)->size - 1) % (c)->size)
#define RC_RIGHT(c)	(((c)->rank + 1) % (c)->size)

static void *rc_scratch_get(struct rc_comm *c)
{
	return c->nfree ? c->free_slots[--c->nfree] : NULL;
}

static void rc_scratch_put(struct rc_comm *c, void *slot)
{
	c->free_slots[c->nfree++] = slot;
}

static rc_status_t rc_wait(struct rc_comm *c, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return RC_ERR_IO;
		if (n == 0 || wc.wr_id != wr_id)
			continue;
		return wc.status == IBV_WC_SUCCESS ? RC_OK : RC_ERR_IO;
	}
}

static rc_status_t rc_win_bind(struct rc_comm *c, struct rc_peer *p, struct ibv_mw *mw,
			       void *slot, uint32_t key)
{
	struct ibv_mw_bind_info bi = {
		.mr = c->pool_mr,
		.addr = (uintptr_t)slot,
		.length = c->slot_size,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	ibv_wr_start(p->qpx);
	p->qpx->wr_id = RC_WRID_BIND;
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(p->qpx, mw, key, &bi);
	if (ibv_wr_complete(p->qpx))
		return RC_ERR_IO;
	return rc_wait(c, RC_WRID_BIND);
}

static rc_status_t rc_win_invalidate(struct rc_comm *c, struct rc_peer *p, uint32_t key)
{
	ibv_wr_start(p->qpx);
	p->qpx->wr_id = RC_WRID_INV;
	p->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(p->qpx, key);
	if (ibv_wr_complete(p->qpx))
		return RC_ERR_IO;
	return rc_wait(c, RC_WRID_INV);
}

/* A ring step failed: kill our window and hand the slot back right away. */
static void rc_abort(struct rc_comm *c, struct rc_peer *left, void *slot)
{
	ibv_wr_start(left->qpx);
	left->qpx->wr_id = RC_WRID_INV;
	left->qpx->wr_flags = 0;
	ibv_wr_local_inv(left->qpx, left->win_key);
	if (ibv_wr_complete(left->qpx))
		return;			/* slot stays quarantined */
	/* OK: rdma-invalidation-leak -- the LOCAL_INV of the window's key was posted */
	rc_scratch_put(c, slot);	// BUG: rdma-unmap-before-invalidate -- the slot is recycled before the unsignaled LOCAL_INV has executed; the left neighbour can still write into it
}

static int rc_post_recvs(struct ibv_qp *qp, int n)
{
	struct ibv_recv_wr wr = { .wr_id = 0 }, *bad;

	while (n-- > 0)
		if (ibv_post_recv(qp, &wr, &bad))
			return -1;
	return 0;
}

static rc_status_t rc_ring(struct rc_comm *c, struct ibv_mr *umr, float *buf,
			   size_t count, float *slot, uint64_t raddr, uint32_t rkey)
{
	struct rc_peer *right = &c->peers[RC_RIGHT(c)];
	struct rc_peer *left = &c->peers[RC_LEFT(c)];
	size_t blk = count / c->size, i;
	struct ibv_wc wc;
	int step, nsteps = 2 * (c->size - 1), n;

	for (step = 0; step < nsteps; step++) {
		int sblk = (c->rank - step + 2 * c->size) % c->size;
		int rblk = (sblk + c->size - 1) % c->size;
		float *in = slot + (step & 1) * blk;

		ibv_wr_start(right->qpx);
		right->qpx->wr_id = RC_WRID_WRITE;
		right->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write_imm(right->qpx, rkey,
				      raddr + (step & 1) * blk * sizeof(float),
				      htonl(step));
		ibv_wr_set_sge(right->qpx, umr->lkey, (uintptr_t)(buf + sblk * blk),
			       blk * sizeof(float));
		if (ibv_wr_complete(right->qpx))
			return RC_ERR_IO;
		/* wait for our own write and for the left neighbour's block */
		for (int got = 0; got < 2;) {
			n = ibv_poll_cq(c->cq, 1, &wc);
			if (n < 0 || (n == 1 && wc.status != IBV_WC_SUCCESS))
				return RC_ERR_IO;
			if (n == 1 && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			    rc_post_recvs(left->qp, 1))
				return RC_ERR_IO;
			got += n;
		}
		for (i = 0; i < blk; i++) {
			if (step < c->size - 1)
				buf[rblk * blk + i] += in[i];
			else
				buf[rblk * blk + i] = in[i];
		}
	}
	return RC_OK;
}

static rc_status_t rc_reg_user(struct rc_comm *c, void *buf, size_t len, struct ibv_mr **out)
{
	*out = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	return *out ? RC_OK : RC_ERR_NO_MEMORY;
}

rc_status_t rc_allreduce(struct rc_comm *c, float *buf, size_t count)
{
	struct rc_peer *left = &c->peers[RC_LEFT(c)], *right = &c->peers[RC_RIGHT(c)];
	struct ibv_mr *umr;
	rc_status_t st;
	void *slot;
	uint32_t key;

	slot = rc_scratch_get(c);
	if (!slot)
		return RC_ERR_NO_RESOURCE;
	key = ibv_inc_rkey(left->win_key);
	if (rc_win_bind(c, left, left->mw, slot, key) != RC_OK) {	// OK: rdma-rkey-reuse -- a fresh key for every operation
		rc_scratch_put(c, slot);	// OK: rdma-invalidation-leak -- the bind failed, nothing was exposed
		return RC_ERR_IO;
	}
	left->win_key = key;

	if (rc_oob_swap(c, RC_LEFT(c), (uintptr_t)slot, key, RC_RIGHT(c),
			&right->raddr, &right->rkey)) {
		if (rc_win_invalidate(c, left, key) == RC_OK)
			rc_scratch_put(c, slot);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- the key may have gone out; the slot is recycled after the LOCAL_INV completed
		return RC_ERR_IO;
	}

	st = rc_reg_user(c, buf, count * sizeof(float), &umr);
	if (st != RC_OK) {
		rc_scratch_put(c, slot);	// BUG: rdma-invalidation-leak -- the left neighbour already has the key of the window over this slot
		return st;
	}

	st = rc_ring(c, umr, buf, count, slot, right->raddr, right->rkey);
	if (st != RC_OK) {
		rc_abort(c, left, slot);
		return st;		// BUG: rdma-mr-leak -- the user-buffer MR from rc_reg_user() is not deregistered on the abort path
	}

	if (rc_win_invalidate(c, left, key) == RC_OK)
		rc_scratch_put(c, slot);	// OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- LOCAL_INV completed before the slot is recycled
	ibv_dereg_mr(umr);		// OK: rdma-mr-leak -- normal path releases the user-buffer MR
	return RC_OK;
}

rc_status_t rc_allreduce_init(struct rc_comm *c, float *buf, size_t count,
			      struct rc_persist **out)
{
	struct rc_peer *left = &c->peers[RC_LEFT(c)];
	struct rc_persist *ps;

	ps = calloc(1, sizeof(*ps));
	if (!ps)
		return RC_ERR_NO_MEMORY;
	ps->comm = c;
	ps->buf = buf;
	ps->count = count;
	ps->slot = rc_scratch_get(c);
	if (!ps->slot)
		goto err_free;
	ps->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
	if (!ps->mw)
		goto err_slot;
	ps->key = ps->mw->rkey;
	if (rc_win_bind(c, left, ps->mw, ps->slot, ps->mw->rkey) != RC_OK)	// OK: rdma-rkey-reuse -- first bind of a window allocated just above; no peer has seen its key
		goto err_mw;
	ps->bound = 1;
	if (rc_oob_swap(c, RC_LEFT(c), (uintptr_t)ps->slot, ps->key, RC_RIGHT(c),
			&ps->raddr, &ps->rkey))
		goto err_mw;
	if (rc_reg_user(c, buf, count * sizeof(float), &ps->umr) != RC_OK)
		goto err_mw;
	*out = ps;
	return RC_OK;

err_mw:
	ibv_dealloc_mw(ps->mw);
err_slot:
	rc_scratch_put(c, ps->slot);	// OK: rdma-invalidation-leak -- deallocating the window killed its key
err_free:
	free(ps);
	return RC_ERR_NO_MEMORY;
}

rc_status_t rc_allreduce_start(struct rc_persist *ps)
{
	struct rc_comm *c = ps->comm;
	struct rc_peer *left = &c->peers[RC_LEFT(c)];
	rc_status_t st;

	/* the neighbour learned the key at init; keep it so starts need no exchange */
	if (!ps->bound) {
		if (rc_win_bind(c, left, ps->mw, ps->slot, ps->key) != RC_OK)	// BUG: rdma-rkey-reuse -- every start rebinds the window under the key of the first one
			return RC_ERR_IO;
		ps->bound = 1;
	}
	st = rc_ring(c, ps->umr, ps->buf, ps->count, ps->slot, ps->raddr, ps->rkey);
	if (rc_win_invalidate(c, left, ps->key) == RC_OK)
		ps->bound = 0;
	return st;
}

void rc_allreduce_free(struct rc_persist *ps)
{
	ibv_dealloc_mw(ps->mw);
	rc_scratch_put(ps->comm, ps->slot);	// OK: rdma-invalidation-leak -- the window is deallocated before the slot is recycled
	ibv_dereg_mr(ps->umr);
	free(ps);
}

struct rc_comm *rc_comm_create(struct ibv_context *ctx, int rank, int size, size_t slot_size)
{
	struct ibv_qp_init_attr_ex qa;
	struct rc_comm *c;
	int i, s;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->rank = rank;
	c->size = size;
	c->slot_size = slot_size;
	c->peers = calloc(size, sizeof(*c->peers));
	c->pd = ibv_alloc_pd(ctx);
	c->cq = ibv_create_cq(ctx, 4 * RC_RECV_DEPTH, NULL, NULL, 0);
	c->pool = aligned_alloc(4096, slot_size * RC_POOL_SLOTS);
	if (!c->peers || !c->pd || !c->cq || !c->pool)
		goto err_base;
	c->pool_mr = ibv_reg_mr(c->pd, c->pool, slot_size * RC_POOL_SLOTS,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!c->pool_mr)
		goto err_base;
	for (s = 0; s < RC_POOL_SLOTS; s++)
		rc_scratch_put(c, (char *)c->pool + s * slot_size);

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 16;
	qa.cap.max_recv_wr = RC_RECV_DEPTH;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = c->pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			    IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;

	for (i = 0; i < size; i++) {
		struct rc_peer *p = &c->peers[i];

		if (i == rank)
			continue;
		p->qp = ibv_create_qp_ex(ctx, &qa);
		if (!p->qp)
			goto err_peers;
		p->qpx = ibv_qp_to_qp_ex(p->qp);
		p->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!p->mw) {
			ibv_destroy_qp(p->qp);
			goto err_peers;
		}
		p->win_key = p->mw->rkey;
		if (rc_oob_connect(c, i, p->qp) || rc_post_recvs(p->qp, RC_RECV_DEPTH)) {
			i++;		/* unwind this peer too */
			goto err_peers;
		}
	}
	return c;

err_peers:
	while (i-- > 0) {		// OK: rdma-mr-leak -- every peer whose window was allocated is unwound
		if (i == rank)
			continue;
		ibv_dealloc_mw(c->peers[i].mw);
		ibv_destroy_qp(c->peers[i].qp);
	}
	ibv_dereg_mr(c->pool_mr);
err_base:
	free(c->pool);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	free(c->peers);
	free(c);
	return NULL;
}

void rc_comm_destroy(struct rc_comm *c)
{
	int i;

	for (i = 0; i < c->size; i++) {
		if (i == c->rank)
			continue;
		ibv_dealloc_mw(c->peers[i].mw);
		ibv_destroy_qp(c->peers[i].qp);
	}
	ibv_dereg_mr(c->pool_mr);
	free(c->pool);		// OK: rdma-invalidation-leak -- windows deallocated and pool deregistered before the memory goes
	ibv_destroy_cq(c->cq);
	ibv_dealloc_pd(c->pd);
	free(c->peers);
	free(c);
}
