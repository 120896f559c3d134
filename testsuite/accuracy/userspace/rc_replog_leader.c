/*
 * rc_replog_leader.c - leader side of "rlog", a Raft-style replicated log
 * that ships entries to followers with one-sided writes.
 *
 * Each follower exposes a ring of entry slots and a tail word (address and
 * rkey arrive in its hello).  The leader appends an entry with an RDMA
 * WRITE of the entry into the follower's slot, an RDMA WRITE of the new
 * tail, and an inline SEND that wakes the follower; a completion is asked
 * for once every RLOG_SIG_EVERY appends.  Followers acknowledge by RDMA
 * WRITE into the leader's ack slots, whose rkey the leader hands out.
 * All posting uses the extended verbs API (ibv_wr_start ... ibv_wr_complete).
 *
 * A follower that lost entries is offered a catch-up window: a type 2
 * memory window over the missing part of the leader's log, which the
 * follower RDMA READs; the window is invalidated (LOCAL_INV) when the
 * follower reports completion or the offer times out.
 *
 * Wrong here: the send queue was sized when an append was two work
 * requests (the tail write made it three); heartbeat signaling hangs on a
 * countdown nothing counts down; a re-offered window is bound under the
 * key the follower already holds; the tail staging area grants remote read.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-invalidation-leak, rdma-local-mr-management, rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-invalidate-unchecked, rdma-unmap-before-invalidate -- not reviewed here
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <infiniband/verbs.h>

#define RLOG_MAX_FOLLOWERS	4
#define RLOG_WRS_PER_ENTRY	2	/* entry WRITE + doorbell SEND */
#define RLOG_SIG_EVERY		32
#define RLOG_HB_SIG_EVERY	8
#define RLOG_RECV_DEPTH		64
#define RLOG_SLOT_SIZE		4096
#define RLOG_LOG_BYTES		(64u << 20)
#define RLOG_CATCHUP_MS		200

#define RLOG_WRID_CTRL		(1ull << 63)
#define RLOG_WRID_HB		(RLOG_WRID_CTRL | 1)
#define RLOG_WRID_OFFER		(RLOG_WRID_CTRL | 2)
#define RLOG_WRID_INV		(RLOG_WRID_CTRL | 3)
#define RLOG_WRID_HELLO		(RLOG_WRID_CTRL | 4)

enum { RLOG_MSG_APPEND = 1, RLOG_MSG_HEARTBEAT, RLOG_MSG_CATCHUP,
       RLOG_MSG_HELLO, RLOG_MSG_NACK, RLOG_MSG_CAUGHT_UP };

struct rlog_entry_hdr { uint64_t index; uint32_t term; uint32_t len; };

struct rlog_msg {
	uint8_t		type;
	uint8_t		pad[3];
	uint32_t	rkey;
	uint64_t	index, addr, len;
};

struct rlog_follower {
	int			id;
	struct ibv_qp		*qp;
	struct ibv_qp_ex	*qpx;
	uint32_t		window;		/* appends allowed in flight */
	uint32_t		inflight;
	uint32_t		since_sig;
	uint32_t		hb_countdown;
	uint64_t		next_index;
	uint64_t		ring_addr;	/* from the follower's hello */
	uint32_t		ring_rkey;
	uint64_t		ring_slots;
	uint64_t		tail_addr;
	struct ibv_mw		*cu_mw;
	uint32_t		cu_rkey;
	bool			cu_active;
	uint64_t		cu_from;
	uint64_t		cu_len;
	uint64_t		cu_deadline_ms;
	struct rlog_msg		rx[RLOG_RECV_DEPTH];
};

struct rlog_leader {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	uint8_t			*log;
	struct ibv_mr		*log_mr;
	uint64_t		*acks;		/* one match index per follower */
	struct ibv_mr		*ack_mr;
	uint64_t		*tails;		/* staged tail values, one per follower */
	struct ibv_mr		*tails_mr;
	struct ibv_mr		*rx_mr;
	uint64_t		last_index;
	uint32_t		term;
	uint32_t		window;
	int			nfollowers;
	struct rlog_follower	fol[RLOG_MAX_FOLLOWERS];
};

static uint64_t rlog_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct rlog_entry_hdr *rlog_entry(struct rlog_leader *l, uint64_t index)
{
	return (struct rlog_entry_hdr *)(l->log + (index * RLOG_SLOT_SIZE) % RLOG_LOG_BYTES);
}

static int rlog_reg_buffers(struct rlog_leader *l)
{
	l->log = aligned_alloc(4096, RLOG_LOG_BYTES);
	l->acks = calloc(RLOG_MAX_FOLLOWERS, sizeof(*l->acks));
	l->tails = calloc(RLOG_MAX_FOLLOWERS, sizeof(*l->tails));
	if (!l->log || !l->acks || !l->tails)
		return -ENOMEM;

	/* remote access to the log only ever goes through catch-up windows */
	l->log_mr = ibv_reg_mr(l->pd, l->log, RLOG_LOG_BYTES,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	l->ack_mr = ibv_reg_mr(l->pd, l->acks, RLOG_MAX_FOLLOWERS * sizeof(*l->acks),
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); // OK: rdma-remote-access-overbroad -- followers write their match index here; the rkey goes out in the hello
	l->tails_mr = ibv_reg_mr(l->pd, l->tails, RLOG_MAX_FOLLOWERS * sizeof(*l->tails),
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); // BUG: rdma-remote-access-overbroad -- the staged tails are only a WRITE source (lkey); their rkey is never sent
	if (!l->log_mr || !l->ack_mr || !l->tails_mr)
		return -errno;
	return 0;
}

static int rlog_create_qp(struct rlog_leader *l, struct rlog_follower *f)
{
	struct ibv_qp_init_attr_ex attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = l->cq;
	attr.recv_cq = l->cq;
	attr.pd = l->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
			      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
	attr.sq_sig_all = 0;
	/* BUG(file): rdma-send-queue-undersized -- an append posts three WRs (entry WRITE, tail WRITE, SEND) but the queue holds two per append in the window */
	attr.cap.max_send_wr = RLOG_WRS_PER_ENTRY * f->window + 1; // BUG: rdma-send-queue-manual-factor -- hand-made per-request factor times the window in a file that binds and invalidates windows per catch-up
	attr.cap.max_recv_wr = RLOG_RECV_DEPTH;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 64; // OK: rdma-queue-cap-unchecked -- 64 bytes of inline data is what every RC device offers

	f->qp = ibv_create_qp_ex(l->ctx, &attr);
	if (!f->qp)
		return -errno;
	f->qpx = ibv_qp_to_qp_ex(f->qp);
	return 0;
}

static int rlog_send_ctrl(struct rlog_follower *f, uint64_t wr_id,
			  struct rlog_msg *msg)
{
	ibv_wr_start(f->qpx);
	f->qpx->wr_id = wr_id;
	f->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(f->qpx);
	ibv_wr_set_inline_data(f->qpx, msg, sizeof(*msg));
	return ibv_wr_complete(f->qpx);
}

static int rlog_follower_setup(struct rlog_leader *l, struct rlog_follower *f)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;
	struct rlog_msg hello;
	int i, ret;

	f->window = l->window;
	ret = rlog_create_qp(l, f);
	if (ret)
		return ret;
	f->cu_mw = ibv_alloc_mw(l->pd, IBV_MW_TYPE_2);
	if (!f->cu_mw)
		return -errno;
	f->cu_rkey = f->cu_mw->rkey;
	f->hb_countdown = RLOG_HB_SIG_EVERY;

	for (i = 0; i < RLOG_RECV_DEPTH; i++) {
		sge = (struct ibv_sge){ (uintptr_t)&f->rx[i], sizeof(f->rx[i]),
					l->rx_mr->lkey };
		wr = (struct ibv_recv_wr){ .wr_id = i, .sg_list = &sge, .num_sge = 1 };
		if (ibv_post_recv(f->qp, &wr, &bad))
			return -errno;
	}

	/* (QP connection through the out-of-band channel omitted) */
	hello = (struct rlog_msg){ .type = RLOG_MSG_HELLO,
				   .addr = (uintptr_t)&l->acks[f->id],
				   .rkey = l->ack_mr->rkey };
	return rlog_send_ctrl(f, RLOG_WRID_HELLO, &hello);
}

int rlog_ship(struct rlog_leader *l, struct rlog_follower *f, uint64_t index)
{
	struct ibv_qp_ex *qpx = f->qpx;
	struct rlog_entry_hdr *e = rlog_entry(l, index);
	uint64_t slot = index % f->ring_slots;
	struct rlog_msg msg = { .type = RLOG_MSG_APPEND, .index = index };
	int ret;

	if (f->inflight >= f->window)
		return -EAGAIN;
	l->tails[f->id] = index + 1;

	ibv_wr_start(qpx);
	qpx->wr_id = index;
	qpx->wr_flags = 0;
	ibv_wr_rdma_write(qpx, f->ring_rkey, f->ring_addr + slot * RLOG_SLOT_SIZE);
	ibv_wr_set_sge(qpx, l->log_mr->lkey, (uintptr_t)e, sizeof(*e) + e->len);

	qpx->wr_flags = 0;
	ibv_wr_rdma_write(qpx, f->ring_rkey, f->tail_addr);
	ibv_wr_set_sge(qpx, l->tails_mr->lkey, (uintptr_t)&l->tails[f->id],
		       sizeof(uint64_t));

	qpx->wr_flags = IBV_SEND_INLINE;
	if (++f->since_sig == RLOG_SIG_EVERY) { // OK: rdma-unsignaled-send-starvation -- since_sig counts every append and is reset when one is signaled
		qpx->wr_flags |= IBV_SEND_SIGNALED;
		f->since_sig = 0;
	}
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, &msg, sizeof(msg));

	ret = ibv_wr_complete(qpx);
	if (ret)
		return -ret;
	f->inflight++;
	f->next_index = index + 1;
	return 0;
}

static int rlog_heartbeat(struct rlog_leader *l, struct rlog_follower *f)
{
	struct rlog_msg msg = {
		.type = RLOG_MSG_HEARTBEAT,
		.index = l->last_index,
		.len = l->term,
	};

	ibv_wr_start(f->qpx);
	f->qpx->wr_id = RLOG_WRID_HB;
	f->qpx->wr_flags = IBV_SEND_INLINE;
	if (!f->hb_countdown) { // BUG: rdma-unsignaled-send-starvation -- hb_countdown is reloaded here and at setup but never counted down, so heartbeats stay unsignaled
		f->qpx->wr_flags |= IBV_SEND_SIGNALED;
		f->hb_countdown = RLOG_HB_SIG_EVERY;
	}
	ibv_wr_send(f->qpx);
	ibv_wr_set_inline_data(f->qpx, &msg, sizeof(msg));
	return ibv_wr_complete(f->qpx);
}

static void rlog_fill_bind(struct rlog_leader *l, struct rlog_follower *f,
			   struct ibv_mw_bind_info *bi)
{
	bi->mr = l->log_mr;
	bi->addr = (uintptr_t)rlog_entry(l, f->cu_from);
	bi->length = f->cu_len;
	bi->mw_access_flags = IBV_ACCESS_REMOTE_READ;
}

static int rlog_offer_catchup(struct rlog_leader *l, struct rlog_follower *f,
			      uint64_t from)
{
	struct ibv_mw_bind_info bi;
	struct rlog_msg msg;
	uint32_t rkey = ibv_inc_rkey(f->cu_rkey);
	int ret;

	if (f->cu_active || from > l->last_index)
		return -EBUSY;
	f->cu_from = from;
	f->cu_len = (l->last_index - from + 1) * RLOG_SLOT_SIZE;
	rlog_fill_bind(l, f, &bi);

	msg = (struct rlog_msg){ .type = RLOG_MSG_CATCHUP, .index = from,
				 .addr = bi.addr, .len = f->cu_len, .rkey = rkey };

	ibv_wr_start(f->qpx);
	f->qpx->wr_id = RLOG_WRID_OFFER;
	f->qpx->wr_flags = 0;
	ibv_wr_bind_mw(f->qpx, f->cu_mw, rkey, &bi); // OK: rdma-rkey-reuse -- every offer binds under a key one past the previous one
	f->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(f->qpx);
	ibv_wr_set_inline_data(f->qpx, &msg, sizeof(msg));
	ret = ibv_wr_complete(f->qpx);
	if (ret)
		return -ret;

	f->cu_rkey = rkey;
	f->cu_active = true;
	f->cu_deadline_ms = rlog_now_ms() + RLOG_CATCHUP_MS;
	return 0;
}

static int rlog_retire_catchup(struct rlog_follower *f)
{
	int ret;

	ibv_wr_start(f->qpx);
	f->qpx->wr_id = RLOG_WRID_INV;
	f->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(f->qpx, f->cu_rkey);
	ret = ibv_wr_complete(f->qpx);
	if (!ret)
		f->cu_active = false;
	return ret;
}

/*
 * The follower missed the deadline.  Kill the window and offer the same
 * range again; the follower may still have the first offer queued, so
 * keep the key it already knows.
 */
static int rlog_reoffer(struct rlog_leader *l, struct rlog_follower *f)
{
	struct ibv_mw_bind_info bi;
	struct rlog_msg msg;
	int ret;

	ret = rlog_retire_catchup(f);
	if (ret)
		return -ret;
	rlog_fill_bind(l, f, &bi);

	msg = (struct rlog_msg){ .type = RLOG_MSG_CATCHUP, .index = f->cu_from,
				 .addr = bi.addr, .len = f->cu_len, .rkey = f->cu_rkey };

	ibv_wr_start(f->qpx);
	f->qpx->wr_id = RLOG_WRID_OFFER;
	f->qpx->wr_flags = 0;
	ibv_wr_bind_mw(f->qpx, f->cu_mw, f->cu_rkey, &bi); // BUG: rdma-rkey-reuse -- the window is bound again under the key of the invalidated offer; a stale READ with it reaches the new binding
	f->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(f->qpx);
	ibv_wr_set_inline_data(f->qpx, &msg, sizeof(msg));
	ret = ibv_wr_complete(f->qpx);
	if (ret)
		return -ret;
	f->cu_active = true;
	f->cu_deadline_ms = rlog_now_ms() + RLOG_CATCHUP_MS;
	return 0;
}

static struct rlog_follower *rlog_by_qpn(struct rlog_leader *l, uint32_t qpn)
{
	int i;

	for (i = 0; i < l->nfollowers; i++)
		if (l->fol[i].qp->qp_num == qpn)
			return &l->fol[i];
	return NULL;
}

void rlog_poll(struct rlog_leader *l)
{
	struct ibv_wc wc[32];
	int i, n;

	n = ibv_poll_cq(l->cq, 32, wc);
	for (i = 0; i < n; i++) {
		struct rlog_follower *f = rlog_by_qpn(l, wc[i].qp_num);
		struct rlog_msg *m;

		if (!f || wc[i].status != IBV_WC_SUCCESS)
			continue;
		if (wc[i].opcode != IBV_WC_RECV) {
			if (!(wc[i].wr_id & RLOG_WRID_CTRL))
				f->inflight -= RLOG_SIG_EVERY;
			continue;
		}
		m = &f->rx[wc[i].wr_id];	/* re-posting omitted */
		if (m->type == RLOG_MSG_NACK)
			rlog_offer_catchup(l, f, m->index);
		else if (m->type == RLOG_MSG_CAUGHT_UP && f->cu_active)
			rlog_retire_catchup(f);
	}
}

void rlog_tick(struct rlog_leader *l)
{
	uint64_t now = rlog_now_ms();
	int i;

	for (i = 0; i < l->nfollowers; i++) {
		struct rlog_follower *f = &l->fol[i];

		if (f->cu_active && now > f->cu_deadline_ms)
			rlog_reoffer(l, f);
		else if (f->next_index > l->last_index)
			rlog_heartbeat(l, f);
	}
}

int rlog_leader_init(struct rlog_leader *l, struct ibv_context *ctx,
		     int nfollowers, uint32_t window)
{
	int i, ret;

	l->ctx = ctx;
	l->window = window;
	l->nfollowers = nfollowers;
	l->pd = ibv_alloc_pd(ctx);
	l->cq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
	if (!l->pd || !l->cq)
		return -ENOMEM;
	ret = rlog_reg_buffers(l);
	if (ret)
		return ret;
	l->rx_mr = ibv_reg_mr(l->pd, l->fol, sizeof(l->fol), IBV_ACCESS_LOCAL_WRITE);
	if (!l->rx_mr)
		return -errno;
	for (i = 0; i < nfollowers; i++) {
		l->fol[i].id = i;
		ret = rlog_follower_setup(l, &l->fol[i]);
		if (ret)
			return ret;
	}
	return 0;
}
