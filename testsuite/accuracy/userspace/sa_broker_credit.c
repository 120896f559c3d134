/*
 * sa_broker_credit.c - RDMA transport of a message broker with credit-based
 * flow control (rdma_cm, broker side).
 *
 * Each producer connection owns a ring of BRK_SLOTS slots registered
 * LOCAL_WRITE | REMOTE_WRITE; ring address, key and the initial credits go
 * out in the accept private data.  A producer RDMA-WRITE-WITH-IMMs into a
 * slot it holds a credit for; the broker hands credits back with small
 * SENDs once the message was taken.  Messages larger than a slot go through
 * a large message buffer (LMB) from a global pool: the broker binds the
 * LMB's type-2 window (IBV_WR_BIND_MW) and sends BRK_LMB_GRANT; the producer
 * writes and finishes with SEND_WITH_INV of the window key; a message larger
 * than an LMB is streamed through one LMB piece by piece.  A read-only
 * statistics page is exposed per connection through a type-1 window.
 *
 * Wrong: an LMB cancelled by the consumer is recycled right after its
 * unsignaled LOCAL_INV; expired grants are recycled with the key still out;
 * streaming binds every piece under one key; conn setup loses the ring
 * registration (and frees the ring under it) when the stats window cannot
 * be allocated.
 *
 * NOT-ANNOTATED: rdma-local-mr-management, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked, rdma-remote-invalidate-unchecked -- not reviewed here
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

#define BRK_SLOTS	64
#define BRK_SLOT_SIZE	4096
#define BRK_NLMB	16
#define BRK_LMB_SIZE	(4u << 20)
#define BRK_GRANT_TTL	10
#define BRK_RECV_DEPTH	32

#define brk_err(fmt, ...) fprintf(stderr, "broker: " fmt "\n", ##__VA_ARGS__)

enum { BRK_LMB_GRANT = 1, BRK_LMB_DONE, BRK_CREDIT };

struct brk_ctl {
	uint32_t type;
	uint32_t lmb;
	uint32_t rkey;
	uint32_t credits;
	uint64_t addr;
	uint64_t len;
};

struct brk_pdata {
	uint64_t ring_addr;
	uint32_t ring_rkey;
	uint32_t stats_rkey;
	uint64_t stats_addr;
	uint32_t credits;
};

struct brk_conn;

struct brk_lmb {
	char			*buf;
	struct ibv_mw		*mw;
	uint32_t		 rkey;
	uint32_t		 len;
	bool			 busy;
	struct brk_conn		*owner;
	time_t			 deadline;
};

struct brk_conn {
	struct rdma_cm_id	*id;
	struct ibv_cq		*cq;
	char			*ring;
	struct ibv_mr		*ring_mr;
	struct ibv_mw		*stats_mw;
	struct brk_ctl		*ctl;		/* BRK_RECV_DEPTH recv + 1 send */
	struct ibv_mr		*ctl_mr;
	unsigned int		 credits;
	uint64_t		 wrid;
};

static struct {
	struct ibv_pd	*pd;
	char		*lmb_arena;
	struct ibv_mr	*lmb_mr;
	struct brk_lmb	 lmb[BRK_NLMB];
	uint64_t	*stats;
	struct ibv_mr	*stats_mr;
} brk;

static int brk_poll_until(struct brk_conn *c, uint64_t wrid)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n && wc.wr_id == wrid)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

static int brk_post(struct brk_conn *c, struct ibv_send_wr *wr, bool wait)
{
	struct ibv_send_wr *bad;

	wr->wr_id = ++c->wrid;
	if (wait)
		wr->send_flags |= IBV_SEND_SIGNALED;
	if (ibv_post_send(c->id->qp, wr, &bad))
		return -EIO;
	return wait ? brk_poll_until(c, wr->wr_id) : 0;
}

static int brk_send_ctl(struct brk_conn *c, const struct brk_ctl *m)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)&c->ctl[BRK_RECV_DEPTH],
		.length = sizeof(*m), .lkey = c->ctl_mr->lkey,
	};
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND };

	c->ctl[BRK_RECV_DEPTH] = *m;
	return brk_post(c, &wr, true);
}

static int brk_lmb_bind(struct brk_conn *c, struct brk_lmb *l, uint32_t key, uint32_t len)
{
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_BIND_MW;
	wr.bind_mw.mw = l->mw;
	wr.bind_mw.rkey = key;
	wr.bind_mw.bind_info.mr = brk.lmb_mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)l->buf;
	wr.bind_mw.bind_info.length = len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	return brk_post(c, &wr, true);
}

static int brk_lmb_local_inv(struct brk_conn *c, struct brk_lmb *l, bool wait)
{
	struct ibv_send_wr wr;

	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = l->rkey;
	return brk_post(c, &wr, wait);
}

static int brk_lmb_revoke(struct brk_conn *c, struct brk_lmb *l)
{
	int rc = brk_lmb_local_inv(c, l, true);

	if (rc)
		return rc;
	l->owner = NULL;
	l->busy = false;	/* OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the LOCAL_INV completed */
	return 0;
}

static struct brk_lmb *brk_lmb_take(void)
{
	int i;

	for (i = 0; i < BRK_NLMB; i++) {
		if (!brk.lmb[i].busy && brk.lmb[i].mw) {
			brk.lmb[i].busy = true;
			return &brk.lmb[i];
		}
	}
	return NULL;
}

int brk_lmb_grant(struct brk_conn *c, uint32_t len)
{
	struct brk_lmb *l = brk_lmb_take();
	struct brk_ctl m = { .type = BRK_LMB_GRANT };

	if (!l)
		return -EAGAIN;
	l->rkey = ibv_inc_rkey(l->rkey);
	if (brk_lmb_bind(c, l, l->rkey, len)) {	/* OK: rdma-rkey-reuse -- rotated just above */
		l->busy = false;	/* OK: rdma-invalidation-leak -- the bind failed, nothing was exposed */
		return -EIO;
	}
	l->len = len;
	l->owner = c;
	l->deadline = time(NULL) + BRK_GRANT_TTL;

	m.lmb = (uint32_t)(l - brk.lmb);
	m.rkey = l->rkey;
	m.addr = (uintptr_t)l->buf;
	m.len = len;
	if (brk_send_ctl(c, &m))
		return brk_lmb_revoke(c, l) ? -EIO : -ECOMM;
	return 0;
}

/* Wait for the producer's SEND_WITH_INV that ends one piece. */
static int brk_wait_piece(struct brk_conn *c, struct brk_lmb *l)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(c->cq, 1, &wc);
	} while (n == 0 || (n > 0 && wc.opcode != IBV_WC_RECV));
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		return -EIO;
	if ((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == l->rkey)
		return 0;
	return brk_lmb_local_inv(c, l, true);
}

/* A message larger than an LMB is pulled through the same LMB in pieces. */
int brk_lmb_stream(struct brk_conn *c, struct brk_lmb *l, uint64_t total)
{
	struct brk_ctl m = { .type = BRK_LMB_GRANT };
	uint32_t key = ibv_inc_rkey(l->rkey);
	uint64_t off;
	int rc;

	m.lmb = (uint32_t)(l - brk.lmb);
	l->owner = c;
	for (off = 0; off < total; off += BRK_LMB_SIZE) {
		uint32_t len = total - off > BRK_LMB_SIZE ? BRK_LMB_SIZE : (uint32_t)(total - off);

		if (brk_lmb_bind(c, l, key, len))	/* BUG: rdma-rkey-reuse -- rotated once before the loop, every piece is bound under the same key */
			return -EIO;
		l->rkey = key;
		m.rkey = key;
		m.addr = (uintptr_t)l->buf;
		m.len = len;
		if (brk_send_ctl(c, &m))
			return brk_lmb_revoke(c, l) ? -EIO : -ECOMM;
		rc = brk_wait_piece(c, l);
		if (rc)
			return rc;
		/* append l->buf[0..len) to the spooled message here */
	}
	l->owner = NULL;
	l->busy = false;	/* OK: rdma-invalidation-leak -- the last piece's key was checked invalidated or locally invalidated and waited for */
	return 0;
}

/* The consumer went away; the producer's upload is not needed any more. */
void brk_lmb_abort(struct brk_conn *c, struct brk_lmb *l)
{
	if (brk_lmb_local_inv(c, l, false)) {
		brk_err("LOCAL_INV post failed for lmb %td", l - brk.lmb);
		return;
	}
	l->owner = NULL;
	l->busy = false;	/* BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed; the next grant gets this buffer */
}

void brk_lmb_expire(void)
{
	time_t now = time(NULL);
	int i;

	for (i = 0; i < BRK_NLMB; i++) {
		struct brk_lmb *l = &brk.lmb[i];

		if (!l->busy || now <= l->deadline)
			continue;
		brk_err("lmb %d: producer did not finish in time", i);
		l->owner = NULL;
		l->busy = false;	/* BUG: rdma-invalidation-leak -- the slow producer still holds the window key */
	}
}

/* BRK_LMB_DONE arrives as SEND_WITH_INV of the LMB window key. */
int brk_on_lmb_done(struct brk_conn *c, const struct ibv_wc *wc, const struct brk_ctl *m)
{
	struct brk_lmb *l;

	if (m->lmb >= BRK_NLMB)
		return -EINVAL;
	l = &brk.lmb[m->lmb];
	if (l->owner != c)
		return -EPERM;
	if (!(wc->wc_flags & IBV_WC_WITH_INV) || wc->invalidated_rkey != l->rkey)
		return brk_lmb_revoke(c, l);

	/* deliver l->buf[0..m->len) to the topic here */
	l->owner = NULL;
	l->busy = false;	/* OK: rdma-invalidation-leak -- the producer's SEND_WITH_INV killed exactly this key */
	return 0;
}

static int brk_stats_expose(struct brk_conn *c)
{
	struct ibv_mw_bind mwb = {
		.wr_id = ++c->wrid,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = brk.stats_mr,
			.addr = (uintptr_t)brk.stats,
			.length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ,
		},
	};

	if (ibv_bind_mw(c->id->qp, c->stats_mw, &mwb))	/* OK: rdma-rkey-reuse -- type-1 bind, the provider picks the next key */
		return -EIO;
	return brk_poll_until(c, mwb.wr_id);
}

static int brk_conn_setup(struct brk_conn *c)
{
	if (posix_memalign((void **)&c->ring, 4096, BRK_SLOTS * BRK_SLOT_SIZE))
		return -ENOMEM;
	c->ring_mr = ibv_reg_mr(brk.pd, c->ring, BRK_SLOTS * BRK_SLOT_SIZE,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->ring_mr)
		goto err_ring;
	c->ctl = calloc(BRK_RECV_DEPTH + 1, sizeof(*c->ctl));
	if (!c->ctl)
		goto err_ring_mr;
	c->ctl_mr = ibv_reg_mr(brk.pd, c->ctl, (BRK_RECV_DEPTH + 1) * sizeof(*c->ctl),
			       IBV_ACCESS_LOCAL_WRITE);
	if (!c->ctl_mr)
		goto err_ctl;
	c->stats_mw = ibv_alloc_mw(brk.pd, IBV_MW_TYPE_1);
	if (!c->stats_mw) {
		ibv_dereg_mr(c->ctl_mr);
		free(c->ctl);
		free(c->ring);	/* BUG: rdma-invalidation-leak -- ring_mr (remote write) is still registered over the freed ring */
		return -ENOMEM;	/* BUG: rdma-mr-leak -- ring_mr is left behind and the caller frees the conn */
	}
	c->credits = BRK_SLOTS;
	return 0;

err_ctl:
	free(c->ctl);
err_ring_mr:
	ibv_dereg_mr(c->ring_mr);
err_ring:
	free(c->ring);		/* OK: rdma-invalidation-leak -- ring_mr is deregistered (or was never created) first */
	return -ENOMEM;
}

static void brk_conn_destroy(struct brk_conn *c)
{
	int i;

	for (i = 0; i < BRK_NLMB; i++) {
		struct brk_lmb *l = &brk.lmb[i];

		if (l->owner != c || !brk_lmb_revoke(c, l))
			continue;
		/* QP already in error: retire the window with its key */
		ibv_dealloc_mw(l->mw);
		l->mw = ibv_alloc_mw(brk.pd, IBV_MW_TYPE_2);	/* OK: rdma-mr-leak -- the old window was deallocated just above */
		l->rkey = l->mw ? l->mw->rkey : 0;
		l->owner = NULL;
		l->busy = false;	/* OK: rdma-invalidation-leak -- deallocating the window killed its key */
	}
	ibv_dealloc_mw(c->stats_mw);
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->ring_mr);
	free(c->ring);		/* OK: rdma-invalidation-leak -- the ring MR is deregistered first */
	ibv_dereg_mr(c->ctl_mr);
	free(c->ctl);
	ibv_destroy_cq(c->cq);
	rdma_destroy_id(c->id);
	free(c);
}

int brk_accept(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = BRK_RECV_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct brk_pdata pd;
	struct rdma_conn_param cp = { .private_data = &pd, .private_data_len = sizeof(pd),
				      .responder_resources = 1, .rnr_retry_count = 7 };
	struct brk_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return rdma_reject(id, NULL, 0);
	c->id = id;
	c->cq = ibv_create_cq(id->verbs, 128, c, NULL, 0);
	if (!c->cq)
		goto err_free;
	qa.send_cq = qa.recv_cq = c->cq;
	if (rdma_create_qp(id, brk.pd, &qa))
		goto err_cq;
	if (brk_conn_setup(c))
		goto err_qp;
	if (brk_stats_expose(c))
		goto err_conn;

	pd.ring_addr = (uintptr_t)c->ring;
	pd.ring_rkey = c->ring_mr->rkey;
	pd.stats_rkey = c->stats_mw->rkey;
	pd.stats_addr = (uintptr_t)brk.stats;
	pd.credits = c->credits;
	if (rdma_accept(id, &cp))
		goto err_conn;
	id->context = c;
	return 0;

err_conn:
	brk_conn_destroy(c);
	return -1;
err_qp:
	rdma_destroy_qp(id);
err_cq:
	ibv_destroy_cq(c->cq);
err_free:
	free(c);
	return rdma_reject(id, NULL, 0);
}

int brk_server_init(struct ibv_pd *pd)
{
	int i;

	brk.pd = pd;
	if (posix_memalign((void **)&brk.lmb_arena, 4096, (size_t)BRK_NLMB * BRK_LMB_SIZE))
		return -ENOMEM;
	brk.lmb_mr = ibv_reg_mr(pd, brk.lmb_arena, (size_t)BRK_NLMB * BRK_LMB_SIZE,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!brk.lmb_mr)
		goto err_arena;

	for (i = 0; i < BRK_NLMB; i++) {
		struct brk_lmb *l = &brk.lmb[i];

		l->buf = brk.lmb_arena + (size_t)i * BRK_LMB_SIZE;
		l->mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!l->mw)
			goto err_lmb;
		l->rkey = l->mw->rkey;
	}

	brk.stats = aligned_alloc(4096, 4096);
	if (!brk.stats)
		goto err_lmb;
	brk.stats_mr = ibv_reg_mr(pd, brk.stats, 4096, IBV_ACCESS_MW_BIND);
	if (!brk.stats_mr) {
		free(brk.stats);
		goto err_lmb;
	}
	return 0;

err_lmb:
	for (i--; i >= 0; i--) {
		ibv_dealloc_mw(brk.lmb[i].mw);
		brk.lmb[i].mw = NULL;
	}
	ibv_dereg_mr(brk.lmb_mr);
err_arena:
	free(brk.lmb_arena);
	return -ENOMEM;		/* OK: rdma-mr-leak -- slot i has no window; the loop above freed all earlier ones */
}

void brk_server_fini(void)
{
	int i;

	for (i = 0; i < BRK_NLMB; i++)
		if (brk.lmb[i].mw)
			ibv_dealloc_mw(brk.lmb[i].mw);
	ibv_dereg_mr(brk.lmb_mr);
	free(brk.lmb_arena);	/* OK: rdma-invalidation-leak -- every LMB window was deallocated above */
	ibv_dereg_mr(brk.stats_mr);
	free(brk.stats);
}
