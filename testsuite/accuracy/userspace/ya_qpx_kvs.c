/*
 * ya_qpx_kvs.c - one-sided GET leases for a small key-value server, written
 * against the extended verbs API (ibv_qp_ex work-request builders, ibv_cq_ex
 * polling).
 *
 * Values live in fixed cells carved out of one arena registered LOCAL_WRITE |
 * MW_BIND.  A GET grants the client a read lease on the cell: the cell's
 * type-2 window (allocated on first use) is bound REMOTE_READ over the value
 * with ibv_wr_bind_mw() and the {addr, len, rkey} reply is chained after the
 * bind in the same ibv_wr_start()/ibv_wr_complete() batch.  The client gives
 * the lease back with a RELEASE sent as SEND_WITH_INV, or the server revokes
 * it with ibv_wr_local_inv().  SCAN binds a per-server scan window over a run
 * of cells.  Cells are handed out by their `used` flag.
 *
 * Right: grants rotate the key (or use the allocation key of a window made on
 * that path); RELEASE hands the invalidated key to a helper that compares it;
 * shutdown waits for every LOCAL_INV before releasing cells.  Wrong: SCAN
 * re-binds the scan window under its allocation key every time; SCAN_DONE
 * trusts the with-invalidate flag; DELETE frees the cell right after an
 * unsignaled LOCAL_INV; LRU eviction frees the cell even when the revoke
 * failed.
 *
 * NOT-ANNOTATED: rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-mr-leak, rdma-queue-cap-unchecked, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define KV_CELLS        1024
#define KV_CELL_SIZE    4096
#define KV_LEASE_SEC    5
#define KV_RX_DEPTH     64

#define KV_WRID_TX      1ull
#define KV_WRID_BIND    2ull
#define KV_WRID_INV(i)  ((3ull << 32) | (uint32_t)(i))
#define KV_WRID_IS_INV(id) (((id) >> 32) == 3)

enum kv_op { KV_GET = 1, KV_RELEASE, KV_SCAN, KV_SCAN_DONE, KV_REPLY };

struct kv_msg {
	uint32_t op;
	int32_t  status;
	uint64_t hkey;
	uint32_t first, count;
	uint64_t addr;
	uint32_t len;
	uint32_t rkey;
};

struct kv_cell {
	char          *mem;
	uint32_t       len;
	uint64_t       hkey;
	bool           used;
	bool           leased;
	struct ibv_mw *mw;
	uint32_t       rkey;
	time_t         lease_end;
	time_t         atime;
};

struct kv_rx {
	const struct kv_msg *msg;
	unsigned             wc_flags;
	uint32_t             inv_rkey;
};

struct kv_srv {
	struct ibv_pd    *pd;
	struct ibv_cq_ex *scq, *rcq;
	struct ibv_qp    *qp;
	struct ibv_qp_ex *qpx;
	char             *arena;
	struct ibv_mr    *arena_mr;
	struct kv_cell    cells[KV_CELLS];
	struct ibv_mw    *scan_mw;
	bool              scan_bound;
	uint32_t          scan_first, scan_count;
	struct kv_msg     rx[KV_RX_DEPTH];
	struct ibv_mr    *rx_mr;
};

#define kv_log(fmt, ...) fprintf(stderr, "kvs: " fmt "\n", ##__VA_ARGS__)

static inline unsigned kv_idx(struct kv_srv *s, struct kv_cell *c)
{
	return (unsigned)(c - s->cells);
}

static struct kv_cell *kv_lookup(struct kv_srv *s, uint64_t hkey)
{
	unsigned i;

	for (i = 0; i < KV_CELLS; i++)
		if (s->cells[i].used && s->cells[i].hkey == hkey)
			return &s->cells[i];
	return NULL;
}

struct kv_cell *kv_cell_alloc(struct kv_srv *s)
{
	unsigned i;

	for (i = 0; i < KV_CELLS; i++) {
		if (!s->cells[i].used) {
			s->cells[i].used = true;
			s->cells[i].atime = time(NULL);
			return &s->cells[i];
		}
	}
	return NULL;
}

static void kv_cell_release(struct kv_srv *s, struct kv_cell *c)
{
	(void)s;
	c->leased = false;
	c->hkey = 0;
	c->len = 0;
	c->used = false;
}

/* wait for one signaled send-side completion */
static int kv_wait_send(struct kv_srv *s, uint64_t wr_id)
{
	struct ibv_poll_cq_attr attr = {};
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	bool found = false;
	int ret;

	while (!found) {
		ret = ibv_start_poll(s->scq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return -EIO;
		do {
			if (s->scq->wr_id == wr_id) {
				found = true;
				st = s->scq->status;
			}
		} while (!found && ibv_next_poll(s->scq) == 0);
		ibv_end_poll(s->scq);
	}
	return st == IBV_WC_SUCCESS ? 0 : -EIO;
}

static int kv_send_reply(struct kv_srv *s, struct kv_msg *reply)
{
	s->qpx->wr_id = KV_WRID_TX;
	s->qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(s->qpx);
	ibv_wr_set_inline_data(s->qpx, reply, sizeof(*reply));
	return 0;
}

static int kv_lease_grant(struct kv_srv *s, struct kv_cell *c)
{
	struct ibv_mw_bind_info bi;
	struct kv_msg reply = { .op = KV_REPLY };
	uint32_t rkey;
	int ret;

	if (!c->mw) {
		c->mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2);
		if (!c->mw)
			return -ENOMEM;
		c->rkey = c->mw->rkey;
		rkey = c->mw->rkey;	/* new window: nobody has seen this key */
	} else {
		rkey = ibv_inc_rkey(c->rkey);
	}

	bi.mr = s->arena_mr;
	bi.addr = (uintptr_t)c->mem;
	bi.length = c->len;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ;

	reply.hkey = c->hkey;
	reply.addr = bi.addr;
	reply.len = c->len;
	reply.rkey = rkey;

	ibv_wr_start(s->qpx);
	s->qpx->wr_id = KV_WRID_BIND;
	s->qpx->wr_flags = 0;
	ibv_wr_bind_mw(s->qpx, c->mw, rkey, &bi); // OK: rdma-rkey-reuse -- rotated, or the allocation key of a window created just above
	kv_send_reply(s, &reply);
	ret = ibv_wr_complete(s->qpx);
	if (ret)
		return -ret;

	c->rkey = rkey;
	c->leased = true;
	c->lease_end = time(NULL) + KV_LEASE_SEC;
	return 0;
}

/* cheap revoke: rides ahead of the next signaled send */
static int kv_lease_revoke(struct kv_srv *s, struct kv_cell *c)
{
	ibv_wr_start(s->qpx);
	s->qpx->wr_id = KV_WRID_INV(kv_idx(s, c));
	s->qpx->wr_flags = 0;
	ibv_wr_local_inv(s->qpx, c->rkey);
	return ibv_wr_complete(s->qpx);
}

static int kv_lease_revoke_sync(struct kv_srv *s, struct kv_cell *c)
{
	uint64_t wr_id = KV_WRID_INV(kv_idx(s, c));

	ibv_wr_start(s->qpx);
	s->qpx->wr_id = wr_id;
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(s->qpx, c->rkey);
	if (ibv_wr_complete(s->qpx))
		return -EIO;
	return kv_wait_send(s, wr_id);
}

static bool kv_lease_accept_inv(struct kv_cell *c, uint32_t inv_rkey)
{
	if (inv_rkey != c->rkey) {
		kv_log("cell %p: client invalidated 0x%x, lease is 0x%x",
		       (void *)c, inv_rkey, c->rkey);
		return false;
	}
	return true;
}

static bool kv_in_scan(struct kv_srv *s, struct kv_cell *c)
{
	unsigned i = kv_idx(s, c);

	return s->scan_bound && i >= s->scan_first && i < s->scan_first + s->scan_count;
}

int kv_delete(struct kv_srv *s, uint64_t hkey)
{
	struct kv_cell *c = kv_lookup(s, hkey);

	if (!c)
		return -ENOENT;
	if (kv_in_scan(s, c))
		return -EBUSY;
	if (!c->leased) {
		kv_cell_release(s, c); // OK: rdma-invalidation-leak, rdma-unmap-before-invalidate -- no lease outstanding: the window holds no live key
		return 0;
	}
	if (kv_lease_revoke(s, c))
		return -EIO;
	kv_cell_release(s, c); // BUG: rdma-unmap-before-invalidate -- cell handed out again before the unsignaled LOCAL_INV has executed
	return 0;
}

/* make room: drop the least recently used cells */
int kv_evict_lru(struct kv_srv *s, unsigned need)
{
	struct kv_cell *c, *oldest;
	unsigned i, freed = 0;

	while (freed < need) {
		oldest = NULL;
		for (i = 0; i < KV_CELLS; i++) {
			c = &s->cells[i];
			if (c->used && !kv_in_scan(s, c) && (!oldest || c->atime < oldest->atime))
				oldest = c;
		}
		if (!oldest)
			break;
		if (oldest->leased && kv_lease_revoke_sync(s, oldest))
			kv_log("evict: revoke of lease 0x%x failed", oldest->rkey);
		// OK: rdma-unmap-before-invalidate -- kv_lease_revoke_sync() waits for its LOCAL_INV
		kv_cell_release(s, oldest); // BUG: rdma-invalidation-leak -- when the revoke failed the client's lease key is still valid
		freed++;
	}
	return freed;
}

void kv_expire_leases(struct kv_srv *s)
{
	time_t now = time(NULL);
	unsigned i;

	for (i = 0; i < KV_CELLS; i++) {
		if (s->cells[i].leased && s->cells[i].lease_end <= now &&
		    kv_lease_revoke_sync(s, &s->cells[i]) == 0)
			s->cells[i].leased = false;
	}
}

static int kv_handle_release(struct kv_srv *s, const struct kv_rx *rx)
{
	struct kv_cell *c = kv_lookup(s, rx->msg->hkey);

	if (!c || !c->leased)
		return -ENOENT;
	if (rx->wc_flags & IBV_WC_WITH_INV) { // OK: rdma-remote-invalidate-unchecked -- kv_lease_accept_inv() compares the key
		if (kv_lease_accept_inv(c, rx->inv_rkey)) {
			c->leased = false;
			return 0;
		}
	}
	if (kv_lease_revoke_sync(s, c))
		return -EIO;
	c->leased = false;
	return 0;
}

static int kv_handle_scan(struct kv_srv *s, const struct kv_rx *rx)
{
	struct kv_msg reply = { .op = KV_REPLY, .hkey = rx->msg->hkey };
	struct ibv_mw_bind_info bi;
	uint32_t first = rx->msg->first, count = rx->msg->count;

	if (s->scan_bound || count == 0 || first >= KV_CELLS || count > KV_CELLS - first)
		return -EBUSY;

	bi.mr = s->arena_mr;
	bi.addr = (uintptr_t)s->cells[first].mem;
	bi.length = (uint64_t)count * KV_CELL_SIZE;
	bi.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	reply.first = first;
	reply.count = count;
	reply.addr = bi.addr;
	reply.len = (uint32_t)bi.length;
	reply.rkey = s->scan_mw->rkey;

	ibv_wr_start(s->qpx);
	s->qpx->wr_id = KV_WRID_BIND;
	s->qpx->wr_flags = 0;
	ibv_wr_bind_mw(s->qpx, s->scan_mw, s->scan_mw->rkey, &bi); // BUG: rdma-rkey-reuse -- the scan window is re-bound for every SCAN under the same (allocation) key
	kv_send_reply(s, &reply);
	if (ibv_wr_complete(s->qpx))
		return -EIO;
	s->scan_bound = true;
	s->scan_first = first;
	s->scan_count = count;
	return 0;
}

static int kv_handle_scan_done(struct kv_srv *s, const struct kv_rx *rx)
{
	if (!s->scan_bound)
		return -EINVAL;
	if (rx->wc_flags & IBV_WC_WITH_INV) { // BUG: rdma-remote-invalidate-unchecked -- rx->inv_rkey is not compared with the scan window's key
		s->scan_bound = false;
		return 0;
	}

	ibv_wr_start(s->qpx);
	s->qpx->wr_id = KV_WRID_INV(KV_CELLS);
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(s->qpx, s->scan_mw->rkey);
	if (ibv_wr_complete(s->qpx) || kv_wait_send(s, KV_WRID_INV(KV_CELLS)))
		return -EIO;
	s->scan_bound = false;
	return 0;
}

static void kv_post_rx(struct kv_srv *s, unsigned i)
{
	struct ibv_sge sge = { (uintptr_t)&s->rx[i], sizeof(s->rx[i]), s->rx_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(s->qp, &wr, &bad))
		kv_log("rx repost %u failed", i);
}

int kv_progress(struct kv_srv *s)
{
	struct ibv_poll_cq_attr attr = {};
	struct kv_rx rx;
	unsigned idx;
	int ret;

	ret = ibv_start_poll(s->rcq, &attr);
	if (ret == ENOENT)
		return 0;
	if (ret)
		return -EIO;
	do {
		idx = (unsigned)s->rcq->wr_id;
		if (s->rcq->status != IBV_WC_SUCCESS)
			continue;
		rx.msg = &s->rx[idx];
		rx.wc_flags = ibv_wc_read_wc_flags(s->rcq);
		rx.inv_rkey = (rx.wc_flags & IBV_WC_WITH_INV) ?
			      ibv_wc_read_invalidated_rkey(s->rcq) : 0;
		switch (rx.msg->op) {
		case KV_RELEASE:   kv_handle_release(s, &rx);   break;
		case KV_SCAN:      kv_handle_scan(s, &rx);      break;
		case KV_SCAN_DONE: kv_handle_scan_done(s, &rx); break;
		default:           break;
		}
		kv_post_rx(s, idx);
	} while (ibv_next_poll(s->rcq) == 0);
	ibv_end_poll(s->rcq);
	return 0;
}

int kv_put(struct kv_srv *s, uint64_t hkey, const void *val, uint32_t len)
{
	struct kv_cell *c = kv_lookup(s, hkey);
	bool fresh = false;

	if (!c) {
		c = kv_cell_alloc(s);
		if (!c)
			return -ENOSPC;
		c->hkey = hkey;
		fresh = true;
	}
	if (len > KV_CELL_SIZE) {
		if (fresh)
			kv_cell_release(s, c); // OK: rdma-invalidation-leak -- a cell just taken, never leased
		return -E2BIG;
	}
	/* readers holding a lease must not see a torn value */
	if (c->leased) {
		if (kv_lease_revoke_sync(s, c))
			return -EIO;
		c->leased = false;
	}
	memcpy(c->mem, val, len);
	c->len = len;
	c->atime = time(NULL);
	return 0;
}

int kv_get(struct kv_srv *s, uint64_t hkey)
{
	struct kv_cell *c = kv_lookup(s, hkey);

	if (!c)
		return -ENOENT;
	c->atime = time(NULL);
	if (c->leased)
		return 0;
	return kv_lease_grant(s, c);
}

/* stop serving: revoke every lease, wait for all of them, then drop cells */
int kv_shutdown(struct kv_srv *s)
{
	struct ibv_poll_cq_attr attr = {};
	unsigned i, pending = 0, failed = 0;
	int ret;

	for (i = 0; i < KV_CELLS; i++) {
		if (!s->cells[i].leased)
			continue;
		ibv_wr_start(s->qpx);
		s->qpx->wr_id = KV_WRID_INV(i);
		s->qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(s->qpx, s->cells[i].rkey);
		if (ibv_wr_complete(s->qpx))
			return -EIO;
		pending++;
	}

	while (pending > 0) {
		ret = ibv_start_poll(s->scq, &attr);
		if (ret == ENOENT)
			continue;
		if (ret)
			return -EIO;
		do {
			if (KV_WRID_IS_INV(s->scq->wr_id)) {
				pending--;
				if (s->scq->status != IBV_WC_SUCCESS)
					failed++;
			}
		} while (ibv_next_poll(s->scq) == 0);
		ibv_end_poll(s->scq);
	}
	if (failed)
		return -EIO;

	for (i = 0; i < KV_CELLS; i++) {
		if (s->cells[i].used)
			kv_cell_release(s, &s->cells[i]); // OK: rdma-unmap-before-invalidate, rdma-invalidation-leak -- all LOCAL_INVs completed successfully above
	}
	return 0;
}

int kv_srv_init(struct kv_srv *s, struct ibv_context *ctx)
{
	struct ibv_cq_init_attr_ex cqa = { .cqe = 256, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_qp_init_attr_ex qa = {};
	unsigned i;

	s->pd = ibv_alloc_pd(ctx);
	s->scq = ibv_create_cq_ex(ctx, &cqa);
	s->rcq = ibv_create_cq_ex(ctx, &cqa);
	if (!s->pd || !s->scq || !s->rcq)
		return -ENOMEM;

	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = ibv_cq_ex_to_cq(s->scq);
	qa.recv_cq = ibv_cq_ex_to_cq(s->rcq);
	qa.cap.max_send_wr = 256;
	qa.cap.max_recv_wr = KV_RX_DEPTH;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = sizeof(struct kv_msg);
	qa.pd = s->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW |
			    IBV_QP_EX_WITH_LOCAL_INV;
	s->qp = ibv_create_qp_ex(ctx, &qa);
	if (!s->qp)
		return -EIO;
	s->qpx = ibv_qp_to_qp_ex(s->qp);

	s->arena = aligned_alloc(4096, (size_t)KV_CELLS * KV_CELL_SIZE);
	if (!s->arena)
		return -ENOMEM;
	s->arena_mr = ibv_reg_mr(s->pd, s->arena, (size_t)KV_CELLS * KV_CELL_SIZE,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	s->rx_mr = ibv_reg_mr(s->pd, s->rx, sizeof(s->rx), IBV_ACCESS_LOCAL_WRITE);
	s->scan_mw = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2);
	if (!s->arena_mr || !s->rx_mr || !s->scan_mw)
		return -EIO;

	for (i = 0; i < KV_CELLS; i++)
		s->cells[i].mem = s->arena + (size_t)i * KV_CELL_SIZE;
	for (i = 0; i < KV_RX_DEPTH; i++)
		kv_post_rx(s, i);
	return 0;
}
