/*
 * tc_pubsub_broker.c - topic broker of a one-sided publish/subscribe bus
 * (mlx5 devices).
 *
 * Publishers send a PUBLISH descriptor (addr, len, rkey of their message);
 * the broker pulls the message with RDMA READ into the topic's ring of
 * segments.  Subscribers read the ring themselves:
 *   - durable subscribers own a type-2 window that is re-armed over the
 *     current segment each time the ring moves on (new key each time);
 *   - ephemeral subscribers borrow a window from a shared pool;
 *   - catch-up readers get an mlx5 indirect mkey that stitches all the
 *     segments of a topic into one virtual range (mlx5dv_wr_mr_list).
 * Sends, binds and invalidations use the extended QP API.
 *
 * Problems: the publisher credit counters are registered for remote
 * atomics that nobody is given a key for; pooled windows are bound for the
 * next subscriber under the key the previous one held; and a failed
 * detach drops a durable subscriber's window on the floor.
 *
 * NOT-ANNOTATED: rdma-invalidation-leak, rdma-unmap-before-invalidate, rdma-remote-invalidate-unchecked, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- broker reviewed for key lifetime and registration only
 */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define BRK_SEGS		8
#define BRK_SEG_SIZE		(1u << 20)
#define BRK_MW_POOL		64
#define BRK_MAX_PUBS		128
#define BRK_SQ_DEPTH		256

struct brk_topic {
	char			name[32];
	char			*seg[BRK_SEGS];
	struct ibv_mr		*seg_mr[BRK_SEGS];
	struct mlx5dv_mkey	*catchup;
	unsigned int		cur;		/* segment being filled */
	uint32_t		fill;
};

struct brk_conn {
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	struct mlx5dv_qp_ex	*mqpx;
};

struct brk_sub {
	struct brk_topic	*topic;
	struct brk_conn		*conn;
	struct ibv_mw		*mw;
	uint32_t		rkey;
	int			durable;
};

/* what a subscriber is told about its window */
struct brk_grant {
	uint64_t		addr;
	uint32_t		rkey;
	uint32_t		len;
};

struct broker {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	uint64_t		*credits;	/* one counter per publisher */
	struct ibv_mr		*credits_mr;
	struct ibv_mw		*mw_pool[BRK_MW_POOL];
	int			mw_nfree;
};

static int brk_send_grant(struct brk_conn *c, struct broker *b, const struct brk_grant *g)
{
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = 0;
	c->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(c->qpx);
	ibv_wr_set_inline_data(c->qpx, (void *)g, sizeof(*g));
	(void)b;
	return ibv_wr_complete(c->qpx);
}

int brk_init(struct broker *b, struct ibv_context *ctx)
{
	int i;

	memset(b, 0, sizeof(*b));
	b->ctx = ctx;
	b->pd = ibv_alloc_pd(ctx);
	if (!b->pd)
		return -errno;
	b->cq = ibv_create_cq(ctx, 4 * BRK_SQ_DEPTH, NULL, NULL, 0);
	if (!b->cq)
		return -errno;

	b->credits = calloc(BRK_MAX_PUBS, sizeof(uint64_t));
	if (!b->credits)
		return -ENOMEM;
	/* publishers were meant to take credits with fetch-and-add */
	/* OK: rdma-local-mr-management -- registered once; credits are returned with SENDs sourced from it */
	b->credits_mr = ibv_reg_mr(b->pd, b->credits, BRK_MAX_PUBS * sizeof(uint64_t), // BUG: rdma-remote-access-overbroad -- remote atomic access, but the credits key is never given to a publisher
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	if (!b->credits_mr)
		return -errno;

	for (i = 0; i < BRK_MW_POOL; i++) {
		b->mw_pool[i] = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- the broker keeps its own pool of windows for subscribers
		if (!b->mw_pool[i])
			break;
	}
	b->mw_nfree = i;
	if (!b->mw_nfree) {
		ibv_dereg_mr(b->credits_mr);
		b->credits_mr = NULL; // OK: rdma-mr-leak -- without windows the broker cannot run; the credits MR is released first
		return -ENOMEM;
	}
	return 0;
}

/* hand a publisher its refreshed credit count */
int brk_return_credit(struct broker *b, struct brk_conn *c, unsigned int pub)
{
	b->credits[pub % BRK_MAX_PUBS] += 1;
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = 0;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(c->qpx);
	ibv_wr_set_sge(c->qpx, b->credits_mr->lkey,
		       (uintptr_t)&b->credits[pub % BRK_MAX_PUBS], sizeof(uint64_t));
	return ibv_wr_complete(c->qpx);
}

int brk_topic_create(struct broker *b, struct brk_topic *t, const char *name)
{
	int i;

	memset(t, 0, sizeof(*t));
	strncpy(t->name, name, sizeof(t->name) - 1);
	for (i = 0; i < BRK_SEGS; i++) {
		t->seg[i] = aligned_alloc(4096, BRK_SEG_SIZE);
		if (!t->seg[i])
			goto unwind;
		/* remote write: iWARP places the pulled message through the sink's key */
		/* BUG: rdma-local-mr-management -- the segment's lkey is the sink of the broker's RDMA READ and windows are bound on it */
		t->seg_mr[i] = ibv_reg_mr(b->pd, t->seg[i], BRK_SEG_SIZE, // OK: rdma-remote-access-overbroad -- remote write on the sink of the RDMA READ
					  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					  IBV_ACCESS_MW_BIND);
		if (!t->seg_mr[i]) {
			free(t->seg[i]);
			goto unwind;
		}
	}
	return 0;

unwind:
	while (i--) {
		ibv_dereg_mr(t->seg_mr[i]); // OK: rdma-mr-leak -- the failing segment freed its buffer; every registered one is released
		free(t->seg[i]);
	}
	return -ENOMEM;
}

/* pull a published message into the topic ring */
int brk_pull(struct brk_conn *c, struct brk_topic *t, uint64_t raddr, uint32_t rkey, uint32_t len)
{
	if (len > BRK_SEG_SIZE)
		return -EMSGSIZE;
	if (t->fill + len > BRK_SEG_SIZE) {
		t->cur = (t->cur + 1) % BRK_SEGS;
		t->fill = 0;
	}
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = (uintptr_t)t;
	c->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(c->qpx, rkey, raddr);
	ibv_wr_set_sge(c->qpx, t->seg_mr[t->cur]->lkey,
		       (uintptr_t)t->seg[t->cur] + t->fill, len);
	t->fill += len;
	return ibv_wr_complete(c->qpx);
}

/* durable subscriber: (re)arm its own window over the current segment */
int brk_sub_durable_arm(struct broker *b, struct brk_sub *s)
{
	struct brk_topic *t = s->topic;
	struct ibv_mw_bind_info bi;
	struct brk_grant g;
	uint32_t key;
	int fresh = 0, ret;

	if (!s->mw) {
		s->mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_2); // BUG: rdma-local-mr-management -- a window per durable subscriber
		if (!s->mw)
			return -errno;
		fresh = 1;
		key = s->mw->rkey;
	} else {
		key = ibv_inc_rkey(s->rkey);
	}

	bi.mr = t->seg_mr[t->cur];
	bi.addr = (uintptr_t)t->seg[t->cur];
	bi.length = BRK_SEG_SIZE;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	ibv_wr_start(s->conn->qpx);
	if (!fresh) {
		/* the previous binding must be gone before the window moves */
		s->conn->qpx->wr_id = 0;
		s->conn->qpx->wr_flags = 0;
		ibv_wr_local_inv(s->conn->qpx, s->rkey);
	}
	s->conn->qpx->wr_id = (uintptr_t)s;
	s->conn->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- the broker binds the subscriber's window itself */
	ibv_wr_bind_mw(s->conn->qpx, s->mw, key, &bi); // OK: rdma-rkey-reuse -- allocation key on a window allocated just above, the next key otherwise
	ret = ibv_wr_complete(s->conn->qpx);
	if (ret) {
		if (fresh) {
			ibv_dealloc_mw(s->mw);
			s->mw = NULL; // OK: rdma-mr-leak -- a window allocated here is freed again when the bind cannot be posted
		}
		return -ret;
	}
	s->rkey = key;

	g.addr = htobe64(bi.addr);
	g.rkey = htobe32(s->rkey);
	g.len = htobe32(BRK_SEG_SIZE);
	return brk_send_grant(s->conn, b, &g);
}

/* ephemeral subscriber: borrow a pooled window for the current segment */
int brk_sub_ephemeral_attach(struct broker *b, struct brk_sub *s)
{
	struct brk_topic *t = s->topic;
	struct ibv_mw_bind_info bi;
	struct brk_grant g;
	struct ibv_mw *mw;

	if (!b->mw_nfree)
		return -EBUSY;
	mw = b->mw_pool[--b->mw_nfree];

	bi.mr = t->seg_mr[t->cur];
	bi.addr = (uintptr_t)t->seg[t->cur];
	bi.length = BRK_SEG_SIZE;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	ibv_wr_start(s->conn->qpx);
	s->conn->qpx->wr_id = (uintptr_t)s;
	s->conn->qpx->wr_flags = IBV_SEND_SIGNALED;
	/* BUG: rdma-local-mr-management -- pooled window bound by the broker */
	ibv_wr_bind_mw(s->conn->qpx, mw, mw->rkey, &bi); // BUG: rdma-rkey-reuse -- a pooled window comes back for the next subscriber under the key its previous holder was granted
	if (ibv_wr_complete(s->conn->qpx)) {
		b->mw_pool[b->mw_nfree++] = mw;
		return -EIO;
	}
	s->mw = mw;
	s->rkey = mw->rkey;

	g.addr = htobe64(bi.addr);
	g.rkey = htobe32(s->rkey);
	g.len = htobe32(BRK_SEG_SIZE);
	return brk_send_grant(s->conn, b, &g);
}

int brk_sub_detach(struct broker *b, struct brk_sub *s)
{
	int ret;

	if (!s->mw)
		return 0;
	ibv_wr_start(s->conn->qpx);
	s->conn->qpx->wr_id = 0;
	s->conn->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(s->conn->qpx, s->rkey);
	ret = ibv_wr_complete(s->conn->qpx);
	if (ret) {
		/* the connection is going away and takes the window with it */
		s->mw = NULL; // BUG: rdma-mr-leak -- the LOCAL_INV was not posted and a durable subscriber's window is dropped without ibv_dealloc_mw()
		return -ret;
	}
	if (!s->durable) {
		b->mw_pool[b->mw_nfree++] = s->mw;
		s->mw = NULL; // OK: rdma-mr-leak -- the pooled window went back to the pool first
	}
	return 0;
}

/* stitch the topic's segments behind the catch-up mkey */
static int brk_catchup_stitch(struct brk_conn *c, struct brk_topic *t)
{
	struct ibv_sge sgl[BRK_SEGS];
	int i;

	for (i = 0; i < BRK_SEGS; i++) {
		sgl[i].addr = (uintptr_t)t->seg[i];
		sgl[i].length = BRK_SEG_SIZE;
		sgl[i].lkey = t->seg_mr[i]->lkey;
	}
	ibv_wr_start(c->qpx);
	c->qpx->wr_id = (uintptr_t)t;
	c->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	/* BUG: rdma-local-mr-management -- the broker programs the mkey's layout and rights itself */
	mlx5dv_wr_mr_list(c->mqpx, t->catchup, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
			  BRK_SEGS, sgl);
	return ibv_wr_complete(c->qpx);
}

int brk_catchup_init(struct broker *b, struct brk_conn *c, struct brk_topic *t)
{
	struct mlx5dv_mkey_init_attr attr = {
		.pd = b->pd,
		.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT,
		.max_entries = BRK_SEGS,
	};
	int ret;

	t->catchup = mlx5dv_create_mkey(&attr); // BUG: rdma-local-mr-management -- an indirect mkey the broker manages itself
	if (!t->catchup)
		return -errno;
	ret = brk_catchup_stitch(c, t);
	if (ret) {
		mlx5dv_destroy_mkey(t->catchup);
		t->catchup = NULL;
		return -ret;
	}
	return 0;
}

/* tell a catch-up reader how to read the whole ring */
int brk_catchup_grant(struct broker *b, struct brk_conn *c, struct brk_topic *t)
{
	struct brk_grant g;

	g.addr = 0;
	g.rkey = htobe32(t->catchup->rkey);
	g.len = htobe32(BRK_SEGS * BRK_SEG_SIZE);
	return brk_send_grant(c, b, &g);
}

int brk_conn_create(struct broker *b, struct brk_conn *c)
{
	struct ibv_qp_init_attr_ex attr;
	struct mlx5dv_qp_init_attr dv;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = b->cq;
	attr.recv_cq = b->cq;
	attr.pd = b->pd;
	attr.cap.max_send_wr = BRK_SQ_DEPTH;
	attr.cap.max_recv_wr = 64;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = sizeof(struct brk_grant);
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ |
			      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;

	memset(&dv, 0, sizeof(dv));
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;

	c->qp = mlx5dv_create_qp(b->ctx, &attr, &dv);
	if (!c->qp)
		return -errno;
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	c->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(c->qpx);
	return 0;
}

void brk_topic_destroy(struct brk_topic *t)
{
	int i;

	if (t->catchup)
		mlx5dv_destroy_mkey(t->catchup);
	for (i = 0; i < BRK_SEGS; i++) {
		ibv_dereg_mr(t->seg_mr[i]);
		free(t->seg[i]);
	}
}

void brk_fini(struct broker *b, struct brk_sub *subs, int nsubs)
{
	int i;

	/* windows held by subscribers, durable or borrowed from the pool */
	for (i = 0; i < nsubs; i++)
		if (subs[i].mw)
			ibv_dealloc_mw(subs[i].mw);
	for (i = 0; i < b->mw_nfree; i++)
		ibv_dealloc_mw(b->mw_pool[i]);
	ibv_dereg_mr(b->credits_mr);
	free(b->credits);
	ibv_destroy_cq(b->cq);
	ibv_dealloc_pd(b->pd);
}
