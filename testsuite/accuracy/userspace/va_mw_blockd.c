/*
 * va_mw_blockd.c - block export daemon, "pull" data path over type-2
 * memory windows.
 *
 * The daemon stages block data in one large buffer registered once with
 * LOCAL_WRITE | MW_BIND; the MR's own rkey is never handed out.  For every
 * READ command it takes a staging slot from a free list, binds the slot's
 * type-2 window (REMOTE_READ) over the slot with an IBV_WR_BIND_MW work
 * request and sends the window's rkey to the client in the READ response.
 * The client RDMA-READs the data and answers with a DONE message sent with
 * SEND_WITH_INV on that rkey.  A DONE without remote invalidation is
 * finished with a signaled LOCAL_INV whose completion returns the slot.
 *
 * Correct: window keys rotate with ibv_inc_rkey() for every READ; a DONE's
 * invalidated rkey is compared with the slot's; a slot whose bind was never
 * posted goes straight back; shutdown waits for each LOCAL_INV before the
 * slot is returned and deallocates the windows before freeing the staging
 * memory.
 * Wrong: the expiry timer and a failed response send recycle slots whose
 * window is still bound, the ABORT handler recycles the slot right after an
 * unsignaled LOCAL_INV, a CRC retry re-binds under the key the client has
 * just invalidated, and pool setup leaks the staging MR when the slot array
 * cannot be allocated.
 *
 * NOT-ANNOTATED: rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-queue-cap-unchecked, rdma-unsignaled-send-starvation -- queue sizing, rights and migration notes are not what this file is about
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define BD_SLOT_SIZE		(128u * 1024)
#define BD_RX_DEPTH		64
#define BD_IO_TIMEOUT_MS	5000
#define BD_DONE_F_RETRY		0x1

enum bd_msg_type {
	BD_MSG_READ = 1,
	BD_MSG_READ_RSP,
	BD_MSG_DONE,
	BD_MSG_ABORT,
};

struct bd_msg {
	uint32_t type;
	uint32_t tag;
	uint64_t lba;
	uint64_t addr;
	uint32_t len;
	uint32_t rkey;
	uint32_t flags;
	int32_t status;
};

/* low three bits of a wr_id say what the work request was */
enum bd_wr_kind { BD_WR_BIND = 1, BD_WR_RSP = 2, BD_WR_INV = 3, BD_WR_RECV = 4 };

#define BD_WRID(kind, p)	((uint64_t)(uintptr_t)(p) | (uint64_t)(kind))
#define BD_WRID_KIND(id)	((unsigned int)((id) & 0x7))
#define BD_WRID_PTR(id)		((void *)(uintptr_t)((id) & ~(uint64_t)0x7))

struct bd_slot {
	struct bd_slot *next;
	struct ibv_mw *mw;
	uint32_t rkey;			/* key of the last bind */
	char *data;
	uint32_t tag;
	uint32_t len;
	int busy;
	uint64_t deadline_ms;
	struct bd_msg rsp;		/* posted inline */
} __attribute__((aligned(8)));

struct bd_pool {
	char *base;
	size_t size;
	struct ibv_mr *mr;
	struct bd_slot *slots;
	struct bd_slot *free;
	unsigned int nr;
};

struct bd_conn {
	struct ibv_pd *pd;
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct bd_pool pool;
	struct bd_msg *rx;
	struct ibv_mr *rx_mr;
	int failed;
};

extern void bd_backend_read(uint64_t lba, void *dst, uint32_t len);

static uint64_t bd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct bd_slot *bd_slot_get(struct bd_pool *p)
{
	struct bd_slot *s = p->free;

	if (!s)
		return NULL;
	p->free = s->next;
	s->next = NULL;
	s->busy = 1;
	return s;
}

static void bd_slot_put(struct bd_pool *p, struct bd_slot *s)
{
	s->busy = 0;
	s->tag = 0;
	s->next = p->free;
	p->free = s;
}

static struct bd_slot *bd_slot_lookup(struct bd_conn *c, uint32_t tag)
{
	unsigned int i;

	for (i = 0; i < c->pool.nr; i++)
		if (c->pool.slots[i].busy && c->pool.slots[i].tag == tag)
			return &c->pool.slots[i];
	return NULL;
}

static int bd_pool_init(struct bd_conn *c, unsigned int nr)
{
	struct bd_pool *p = &c->pool;
	unsigned int i;

	p->size = (size_t)nr * BD_SLOT_SIZE;
	p->base = aligned_alloc(4096, p->size);
	if (!p->base)
		return -ENOMEM;

	p->mr = ibv_reg_mr(c->pd, p->base, p->size,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!p->mr)
		goto err_free;

	p->slots = calloc(nr, sizeof(*p->slots));
	if (!p->slots)
		goto err_free;	// BUG: rdma-mr-leak -- jumps past the ibv_dereg_mr() of err_mw; the staging MR stays registered

	for (i = 0; i < nr; i++) {
		struct bd_slot *s = &p->slots[i];

		s->mw = ibv_alloc_mw(c->pd, IBV_MW_TYPE_2);
		if (!s->mw)
			goto err_mw;
		s->rkey = s->mw->rkey;
		s->data = p->base + (size_t)i * BD_SLOT_SIZE;
		bd_slot_put(p, s);	// OK: rdma-invalidation-leak -- a freshly allocated window is bound to nothing
	}
	p->nr = nr;
	return 0;

err_mw:
	while (i--)
		ibv_dealloc_mw(p->slots[i].mw);	// OK: rdma-mr-leak -- unwinds every window allocated before the failing one
	p->free = NULL;
	free(p->slots);
	p->slots = NULL;
	ibv_dereg_mr(p->mr);
err_free:
	free(p->base);	// OK: rdma-invalidation-leak -- no window was ever bound and the MR itself grants no remote access
	p->base = NULL;
	return -ENOMEM;
}

static int bd_post_bind(struct bd_conn *c, struct bd_slot *s)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = BD_WRID(BD_WR_BIND, s);
	wr.opcode = IBV_WR_BIND_MW;
	wr.bind_mw.mw = s->mw;
	wr.bind_mw.rkey = s->rkey;
	wr.bind_mw.bind_info.mr = c->pool.mr;
	wr.bind_mw.bind_info.addr = (uint64_t)(uintptr_t)s->data;
	wr.bind_mw.bind_info.length = s->len;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	return ibv_post_send(c->qp, &wr, &bad);
}

static int bd_post_rsp(struct bd_conn *c, struct bd_slot *s)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	s->rsp.type = BD_MSG_READ_RSP;
	s->rsp.tag = s->tag;
	s->rsp.addr = (uint64_t)(uintptr_t)s->data;
	s->rsp.len = s->len;
	s->rsp.rkey = s->rkey;
	s->rsp.status = 0;

	sge.addr = (uint64_t)(uintptr_t)&s->rsp;
	sge.length = sizeof(s->rsp);
	sge.lkey = 0;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = BD_WRID(BD_WR_RSP, s);
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	return ibv_post_send(c->qp, &wr, &bad);
}

static int bd_post_local_inv(struct bd_conn *c, struct bd_slot *s,
			     unsigned int send_flags)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = BD_WRID(BD_WR_INV, s);
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.invalidate_rkey = s->rkey;
	wr.send_flags = send_flags;
	return ibv_post_send(c->qp, &wr, &bad);
}

static int bd_handle_read(struct bd_conn *c, const struct bd_msg *req)
{
	struct bd_slot *s;
	int ret;

	if (req->len == 0 || req->len > BD_SLOT_SIZE)
		return -EINVAL;

	s = bd_slot_get(&c->pool);
	if (!s)
		return -EBUSY;
	s->tag = req->tag;
	s->len = req->len;
	bd_backend_read(req->lba, s->data, s->len);

	s->rkey = ibv_inc_rkey(s->rkey);
	ret = bd_post_bind(c, s);	// OK: rdma-rkey-reuse -- every READ gets the next key of the window
	if (ret) {
		bd_slot_put(&c->pool, s);	// OK: rdma-invalidation-leak -- the bind was never posted, nothing is exposed
		return ret;
	}

	ret = bd_post_rsp(c, s);
	if (ret) {
		/* the client times out and retries the READ */
		bd_slot_put(&c->pool, s);	// BUG: rdma-invalidation-leak -- the window is bound with REMOTE_READ over the slot that goes back on the free list
		return ret;
	}
	s->deadline_ms = bd_now_ms() + BD_IO_TIMEOUT_MS;
	return 0;
}

static void bd_handle_done(struct bd_conn *c, const struct bd_msg *m,
			   const struct ibv_wc *wc)
{
	struct bd_slot *s = bd_slot_lookup(c, m->tag);

	if (!s)
		return;

	if (wc->wc_flags & IBV_WC_WITH_INV) {	// OK: rdma-remote-invalidate-unchecked -- the invalidated rkey is compared with the slot's just below
		if (wc->invalidated_rkey != s->rkey) {
			fprintf(stderr, "tag %u: peer invalidated 0x%x, expected 0x%x\n",
				m->tag, wc->invalidated_rkey, s->rkey);
			c->failed = 1;
			return;
		}
		if (m->flags & BD_DONE_F_RETRY) {
			/* CRC error on the client: the prebuilt response still names the key */
			if (bd_post_bind(c, s) || bd_post_rsp(c, s))	// BUG(file): rdma-rkey-reuse -- binds again under the key the client just invalidated
				c->failed = 1;
			s->deadline_ms = bd_now_ms() + BD_IO_TIMEOUT_MS;
			return;
		}
		bd_slot_put(&c->pool, s);	// OK: rdma-invalidation-leak -- the client invalidated exactly this window's key
		return;
	}

	/* older clients send a plain SEND: invalidate here, slot returns on completion */
	if (bd_post_local_inv(c, s, IBV_SEND_SIGNALED))
		c->failed = 1;
}

static void bd_handle_abort(struct bd_conn *c, const struct bd_msg *m)
{
	struct bd_slot *s = bd_slot_lookup(c, m->tag);

	if (!s)
		return;
	if (bd_post_local_inv(c, s, 0)) {
		c->failed = 1;
		return;
	}
	// OK: rdma-invalidation-leak -- a LOCAL_INV of the slot's key was posted; the fault is not waiting for it
	bd_slot_put(&c->pool, s);	// BUG: rdma-unmap-before-invalidate -- the unsignaled LOCAL_INV may not have executed yet; the slot is handed to the next READ while the window still reaches it
}

static void bd_handle_wc(struct bd_conn *c, const struct ibv_wc *wc)
{
	struct bd_slot *s;
	struct bd_msg *m;

	switch (BD_WRID_KIND(wc->wr_id)) {
	case BD_WR_RECV:
		m = BD_WRID_PTR(wc->wr_id);
		if (wc->status != IBV_WC_SUCCESS) {
			c->failed = 1;
			break;
		}
		if (m->type == BD_MSG_READ)
			bd_handle_read(c, m);
		else if (m->type == BD_MSG_DONE)
			bd_handle_done(c, m, wc);
		else if (m->type == BD_MSG_ABORT)
			bd_handle_abort(c, m);
		break;
	case BD_WR_INV:
		s = BD_WRID_PTR(wc->wr_id);
		if (wc->status != IBV_WC_SUCCESS) {
			fprintf(stderr, "LOCAL_INV of 0x%x failed: %s\n", s->rkey,
				ibv_wc_status_str(wc->status));
			c->failed = 1;
			break;
		}
		bd_slot_put(&c->pool, s);	// OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- released from the successful completion of its own LOCAL_INV
		break;
	default:
		if (wc->status != IBV_WC_SUCCESS)
			c->failed = 1;
		break;
	}
}

static void bd_expire(struct bd_conn *c)
{
	uint64_t now = bd_now_ms();
	unsigned int i;

	for (i = 0; i < c->pool.nr; i++) {
		struct bd_slot *s = &c->pool.slots[i];

		if (!s->busy || s->deadline_ms > now)
			continue;
		fprintf(stderr, "tag %u: no DONE within %d ms, reclaiming slot\n",
			s->tag, BD_IO_TIMEOUT_MS);
		bd_slot_put(&c->pool, s);	// BUG: rdma-invalidation-leak -- the window is still bound over the slot; the slow client can read the next READ's data
	}
}

static int bd_wait_wr(struct bd_conn *c, uint64_t wr_id)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 0)
			continue;
		if (wc.wr_id == wr_id)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

static void bd_shutdown(struct bd_conn *c)
{
	struct bd_pool *p = &c->pool;
	unsigned int i;

	for (i = 0; i < p->nr; i++) {
		struct bd_slot *s = &p->slots[i];

		if (!s->busy)
			continue;
		if (bd_post_local_inv(c, s, IBV_SEND_SIGNALED) ||
		    bd_wait_wr(c, BD_WRID(BD_WR_INV, s)))
			continue;	/* ibv_dealloc_mw() below kills it */
		bd_slot_put(p, s);	// OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- the signaled LOCAL_INV completed before the slot is returned
	}

	for (i = 0; i < p->nr; i++)
		ibv_dealloc_mw(p->slots[i].mw);
	ibv_dereg_mr(p->mr);
	free(p->slots);
	free(p->base);	// OK: rdma-invalidation-leak -- every window was deallocated (which invalidates it) before the staging memory goes
	p->slots = NULL;
	p->base = NULL;

	ibv_dereg_mr(c->rx_mr);
	free(c->rx);
}

static int bd_post_rx(struct bd_conn *c, struct bd_msg *m)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge = {
		.addr = (uint64_t)(uintptr_t)m,
		.length = sizeof(*m),
		.lkey = c->rx_mr->lkey,
	};

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = BD_WRID(BD_WR_RECV, m);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(c->qp, &wr, &bad);
}

int bd_conn_run(struct bd_conn *c)
{
	struct ibv_wc wc[16];
	int i, n;

	c->rx = aligned_alloc(64, BD_RX_DEPTH * sizeof(*c->rx));
	if (!c->rx)
		return -ENOMEM;
	c->rx_mr = ibv_reg_mr(c->pd, c->rx, BD_RX_DEPTH * sizeof(*c->rx),
			      IBV_ACCESS_LOCAL_WRITE);
	if (!c->rx_mr) {
		free(c->rx);
		return -ENOMEM;
	}
	if (bd_pool_init(c, 64)) {
		ibv_dereg_mr(c->rx_mr);
		free(c->rx);
		return -ENOMEM;
	}
	for (i = 0; i < BD_RX_DEPTH; i++)
		bd_post_rx(c, &c->rx[i]);

	while (!c->failed) {
		n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0)
			break;
		for (i = 0; i < n; i++) {
			bd_handle_wc(c, &wc[i]);
			if (BD_WRID_KIND(wc[i].wr_id) == BD_WR_RECV &&
			    wc[i].status == IBV_WC_SUCCESS)
				bd_post_rx(c, BD_WRID_PTR(wc[i].wr_id));
		}
		bd_expire(c);
	}
	bd_shutdown(c);
	return c->failed ? -EIO : 0;
}
