/*
 * ta_kv_oneside.c - key-value server for one-sided (RDMA READ) lookups
 *
 * Clients GET by reading the hash index and the value log directly with
 * RDMA READ; only PUTs and control messages are two-sided.
 *
 *  - The index is one ibv_reg_mr() registration with REMOTE_READ whose
 *    {addr, rkey} is broadcast to every client; a resize publishes a new
 *    table and deregisters the old one before freeing it.
 *  - Each client gets a lease on the value log: a type 1 window bound with
 *    ibv_bind_mw(), revoked by a zero-length bind before log compaction
 *    and deallocated on disconnect.
 *  - SCAN hands out a consistent snapshot: a copy in one of the connection's
 *    snapshot slots, exposed through a type 2 window (IBV_WR_BIND_MW).
 *    The client ends it with SCAN_DONE sent as SEND_WITH_INV; expired
 *    snapshots are invalidated by the server.
 *
 * NOT-ANNOTATED: rdma-mr-leak, rdma-registration-in-datapath, rdma-remote-access-overbroad, rdma-access-flags-invalid, rdma-access-flags-transport, rdma-local-mr-management, rdma-send-queue-undersized, rdma-send-queue-manual-factor, rdma-unsignaled-send-starvation, rdma-queue-cap-unchecked -- not reviewed for this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define KV_MAX_CONNS	64
#define KV_SNAP_SLOTS	4
#define KV_SNAP_BYTES	(1u << 20)
#define KV_SNAP_TTL	30	/* seconds */

#define KV_WR_SEND	1u
#define KV_WR_RECV	2u
#define KV_WR_BIND	3u
#define KV_WR_INV	4u
#define KV_WR_UNBIND	5u
#define KV_WRID(type, idx)	(((uint64_t)(type) << 32) | (uint32_t)(idx))
#define KV_WRID_TYPE(id)	((uint32_t)((id) >> 32))
#define KV_WRID_IDX(id)		((uint32_t)(id))

enum kv_msg_type { KV_TABLE = 1, KV_LEASE, KV_SCAN_REQ, KV_SCAN_READY, KV_SCAN_RESTART, KV_SCAN_DONE, KV_BYE };

struct kv_msg {
	uint8_t		type;
	uint8_t		slot;
	uint16_t	pad;
	uint32_t	rkey;
	uint64_t	addr;
	uint64_t	len;
};

struct kv_table {
	uint64_t	*slots;
	size_t		nslots;
	struct ibv_mr	*mr;
	uint32_t	epoch;
};

struct kv_snap {
	int		busy;
	struct ibv_mw	*mw;
	uint32_t	rkey;
	char		*buf;
	size_t		len;
	time_t		born;
	struct ibv_send_wr bind_wr;
	struct ibv_send_wr inv_wr;
};

struct kv_conn {
	struct rdma_cm_id	*id;
	struct ibv_qp		*qp;
	struct ibv_cq		*cq;
	struct ibv_mw		*lease_mw;
	struct kv_msg		tx, rx;
	struct ibv_mr		*msg_mr;	/* covers tx and rx */
	struct ibv_mr		*snap_mr;	/* covers every slot's buf */
	struct kv_snap		snaps[KV_SNAP_SLOTS];
};

struct kv_server {
	struct ibv_pd		*pd;
	struct kv_table		*table;
	char			*log;
	size_t			log_len;
	struct ibv_mr		*log_mr;
	struct kv_conn		*conns[KV_MAX_CONNS];
};

static int kv_send(struct kv_conn *c, struct ibv_send_wr *prev)
{
	struct ibv_sge sge = { (uintptr_t)&c->tx, sizeof(c->tx), c->msg_mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = KV_WRID(KV_WR_SEND, 0), .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	if (prev) {
		prev->next = &wr;
		return ibv_post_send(c->qp, prev, &bad);
	}
	return ibv_post_send(c->qp, &wr, &bad);
}

static int kv_publish_table(struct kv_server *kv, struct kv_table *t)
{
	int i, err = 0;

	for (i = 0; i < KV_MAX_CONNS; i++) {
		struct kv_conn *c = kv->conns[i];
		if (!c)
			continue;
		c->tx = (struct kv_msg){ .type = KV_TABLE, .rkey = t->mr->rkey,
					 .addr = (uintptr_t)t->slots, .len = t->nslots * 8 };
		err |= kv_send(c, NULL);
	}
	return err ? -EIO : 0;
}

static void kv_table_retire(struct kv_table *t)
{
	ibv_dereg_mr(t->mr);
	free(t->slots); /* OK: rdma-invalidation-leak -- deregistered first, the old rkey is dead */
	free(t);
}

static struct kv_table *kv_table_alloc(struct kv_server *kv, size_t nslots)
{
	struct kv_table *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->nslots = nslots;
	t->slots = calloc(nslots, sizeof(uint64_t));
	if (!t->slots)
		goto err_table;
	t->mr = ibv_reg_mr(kv->pd, t->slots, nslots * sizeof(uint64_t), IBV_ACCESS_REMOTE_READ);
	if (!t->mr)
		goto err_slots;
	return t;

err_slots:
	free(t->slots);
err_table:
	free(t);
	return NULL;
}

int kv_server_init(struct kv_server *kv, struct ibv_pd *pd, size_t nslots, size_t log_len)
{
	memset(kv, 0, sizeof(*kv));
	kv->pd = pd;
	kv->log_len = log_len;
	kv->log = aligned_alloc(4096, log_len);
	if (!kv->log)
		return -ENOMEM;
	/* the log itself is never exposed: clients reach it through lease windows */
	kv->log_mr = ibv_reg_mr(pd, kv->log, log_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!kv->log_mr)
		goto err_log;
	kv->table = kv_table_alloc(kv, nslots);
	if (!kv->table)
		goto err_mr;
	return 0;

err_mr:
	ibv_dereg_mr(kv->log_mr);
err_log:
	free(kv->log);
	return -ENOMEM;
}

int kv_resize(struct kv_server *kv, size_t nslots)
{
	struct kv_table *nt, *old = kv->table;

	nt = kv_table_alloc(kv, nslots);
	if (!nt)
		return -ENOMEM;
	nt->epoch = old->epoch + 1;

	/* rehash: entries are (log offset << 16 | tag) */
	for (size_t i = 0; i < old->nslots; i++)
		if (old->slots[i])
			nt->slots[(old->slots[i] >> 16) % nslots] = old->slots[i];

	if (kv_publish_table(kv, nt)) {
		fprintf(stderr, "kv: resize to %zu slots not published\n", nslots);
		free(nt->slots); /* BUG: rdma-invalidation-leak -- the new index is freed while its REMOTE_READ registration (and rkey) stays alive */
		free(nt);
		return -EIO;
	}
	kv->table = nt;
	kv_table_retire(old);
	return 0;
}

int kv_grant_lease(struct kv_server *kv, struct kv_conn *c)
{
	struct ibv_mw_bind bind = {
		.wr_id = KV_WRID(KV_WR_BIND, 0),
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = {
			.mr = kv->log_mr, .addr = (uintptr_t)kv->log,
			.length = kv->log_len, .mw_access_flags = IBV_ACCESS_REMOTE_READ,
		},
	};

	if (!c->lease_mw)
		c->lease_mw = ibv_alloc_mw(kv->pd, IBV_MW_TYPE_1);
	if (!c->lease_mw)
		return -ENOMEM;
	if (ibv_bind_mw(c->qp, c->lease_mw, &bind)) /* OK: rdma-rkey-reuse -- type 1 bind, the library gives the window its next key */
		return -EIO;

	c->tx = (struct kv_msg){ .type = KV_LEASE, .rkey = c->lease_mw->rkey,
				 .addr = (uintptr_t)kv->log, .len = kv->log_len };
	return kv_send(c, NULL);
}

static int kv_wait_wr(struct kv_conn *c, uint32_t type)
{
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n == 1 && KV_WRID_TYPE(wc.wr_id) == type)
			return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;
	}
}

/* revoke every lease, then move the live values to a fresh log */
int kv_compact_log(struct kv_server *kv, char *newlog, size_t newlen, struct ibv_mr *newmr)
{
	struct ibv_mw_bind unbind = { .wr_id = KV_WRID(KV_WR_UNBIND, 0), .send_flags = IBV_SEND_SIGNALED };
	char *old = kv->log;
	int i;

	for (i = 0; i < KV_MAX_CONNS; i++) {
		struct kv_conn *c = kv->conns[i];
		if (!c || !c->lease_mw)
			continue;
		if (ibv_bind_mw(c->qp, c->lease_mw, &unbind) || kv_wait_wr(c, KV_WR_UNBIND)) {
			ibv_dealloc_mw(c->lease_mw);
			c->lease_mw = NULL;
		}
	}

	memcpy(newlog, old, newlen < kv->log_len ? newlen : kv->log_len);
	ibv_dereg_mr(kv->log_mr);
	kv->log = newlog;
	kv->log_len = newlen;
	kv->log_mr = newmr;
	free(old); /* OK: rdma-invalidation-leak -- leases were unbound (zero-length bind, waited for) or deallocated, and the log MR deregistered */

	for (i = 0; i < KV_MAX_CONNS; i++)
		if (kv->conns[i])
			kv_grant_lease(kv, kv->conns[i]);
	return 0;
}

static struct kv_snap *kv_snap_get(struct kv_conn *c, int *slot)
{
	for (int i = 0; i < KV_SNAP_SLOTS; i++) {
		if (!c->snaps[i].busy) {
			c->snaps[i].busy = 1;
			*slot = i;
			return &c->snaps[i];
		}
	}
	return NULL;
}

static void kv_snap_bind_wr(struct kv_conn *c, struct kv_snap *s, int slot)
{
	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.wr_id = KV_WRID(KV_WR_BIND, slot);
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->rkey;
	s->bind_wr.bind_mw.bind_info.mr = c->snap_mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)s->buf;
	s->bind_wr.bind_mw.bind_info.length = s->len;
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
}

static size_t kv_fill_snapshot(struct kv_server *kv, char *dst)
{
	size_t n = kv->log_len < KV_SNAP_BYTES ? kv->log_len : KV_SNAP_BYTES;

	memcpy(dst, kv->log, n);
	return n;
}

static int kv_scan_ready(struct kv_conn *c, struct kv_snap *s, int slot)
{
	c->tx = (struct kv_msg){ .type = KV_SCAN_READY, .slot = slot, .rkey = s->rkey,
				 .addr = (uintptr_t)s->buf, .len = s->len };
	return kv_send(c, &s->bind_wr);
}

int kv_scan_start(struct kv_server *kv, struct kv_conn *c)
{
	struct kv_snap *s;
	int slot;

	s = kv_snap_get(c, &slot);
	if (!s)
		return -EBUSY;
	s->len = kv_fill_snapshot(kv, s->buf);
	s->born = time(NULL);
	s->rkey = ibv_inc_rkey(s->rkey);
	kv_snap_bind_wr(c, s, slot); /* OK: rdma-rkey-reuse -- the key was rotated right before the bind is built */
	if (kv_scan_ready(c, s, slot)) {
		/* the bind may have gone out without the reply: let the
		 * expiry pass invalidate the slot */
		s->born = 0;
		return -EIO;
	}
	return 0;
}

/* client wants a fresh snapshot in the same slot; it already knows the key */
int kv_scan_restart(struct kv_server *kv, struct kv_conn *c, int slot)
{
	struct kv_snap *s = &c->snaps[slot];
	struct ibv_send_wr *bad;

	s->inv_wr.wr_id = KV_WRID(KV_WR_INV, slot);
	s->inv_wr.opcode = IBV_WR_LOCAL_INV;
	s->inv_wr.invalidate_rkey = s->rkey;
	s->inv_wr.send_flags = IBV_SEND_SIGNALED;
	s->inv_wr.next = NULL;
	if (ibv_post_send(c->qp, &s->inv_wr, &bad) || kv_wait_wr(c, KV_WR_INV))
		return -EIO;

	s->len = kv_fill_snapshot(kv, s->buf);
	s->born = time(NULL);
	memset(&s->bind_wr, 0, sizeof(s->bind_wr));
	s->bind_wr.wr_id = KV_WRID(KV_WR_BIND, slot);
	s->bind_wr.opcode = IBV_WR_BIND_MW;
	s->bind_wr.bind_mw.mw = s->mw;
	s->bind_wr.bind_mw.rkey = s->rkey; /* BUG: rdma-rkey-reuse -- rebinds under the key just invalidated; reads still in flight from the old snapshot land in the new one */
	s->bind_wr.bind_mw.bind_info.mr = c->snap_mr;
	s->bind_wr.bind_mw.bind_info.addr = (uintptr_t)s->buf;
	s->bind_wr.bind_mw.bind_info.length = s->len;
	s->bind_wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	return kv_scan_ready(c, s, slot);
}

static void kv_handle_recv(struct kv_conn *c, struct ibv_wc *wc)
{
	struct kv_msg *m = &c->rx;
	struct kv_snap *s;

	if (m->slot >= KV_SNAP_SLOTS)
		return;
	s = &c->snaps[m->slot];

	switch (m->type) {
	case KV_SCAN_DONE:
		if (!(wc->wc_flags & IBV_WC_WITH_INV) || wc->invalidated_rkey != s->rkey) {
			/* peer did not kill this window: do it ourselves */
			s->inv_wr.wr_id = KV_WRID(KV_WR_INV, m->slot);
			s->inv_wr.opcode = IBV_WR_LOCAL_INV;
			s->inv_wr.invalidate_rkey = s->rkey;
			s->inv_wr.send_flags = IBV_SEND_SIGNALED;
			s->inv_wr.next = NULL;
			struct ibv_send_wr *bad;
			if (ibv_post_send(c->qp, &s->inv_wr, &bad))
				fprintf(stderr, "kv: LOCAL_INV post failed, slot %u stays busy\n", m->slot);
			break;
		}
		s->busy = 0; /* OK: rdma-remote-invalidate-unchecked, rdma-invalidation-leak -- the invalidated rkey is this slot's */
		break;
	case KV_BYE:
		/* the goodbye message invalidates the client's last snapshot */
		if (wc->wc_flags & IBV_WC_WITH_INV)
			s->busy = 0; /* BUG: rdma-remote-invalidate-unchecked -- any rkey the client invalidated frees this slot */
		break;
	default:
		break;
	}
}

static void kv_handle_send(struct kv_conn *c, struct ibv_wc *wc)
{
	struct kv_snap *s;

	if (KV_WRID_TYPE(wc->wr_id) != KV_WR_INV)
		return;
	s = &c->snaps[KV_WRID_IDX(wc->wr_id)];
	if (wc->status != IBV_WC_SUCCESS) {
		fprintf(stderr, "kv: LOCAL_INV failed (%s), slot parked\n", ibv_wc_status_str(wc->status));
		return;
	}
	s->busy = 0; /* OK: rdma-invalidation-leak -- the LOCAL_INV completed successfully */
}

void kv_conn_poll(struct kv_conn *c)
{
	struct ibv_wc wc[8];
	int n = ibv_poll_cq(c->cq, 8, wc);

	for (int i = 0; i < n; i++) {
		if (KV_WRID_TYPE(wc[i].wr_id) == KV_WR_RECV && wc[i].status == IBV_WC_SUCCESS)
			kv_handle_recv(c, &wc[i]);
		else
			kv_handle_send(c, &wc[i]);
	}
}

void kv_expire_snapshots(struct kv_conn *c)
{
	time_t now = time(NULL);
	struct ibv_send_wr *bad;

	for (int i = 0; i < KV_SNAP_SLOTS; i++) {
		struct kv_snap *s = &c->snaps[i];

		if (!s->busy || now - s->born < KV_SNAP_TTL)
			continue;
		s->inv_wr.wr_id = KV_WRID(KV_WR_INV, i);
		s->inv_wr.opcode = IBV_WR_LOCAL_INV;
		s->inv_wr.invalidate_rkey = s->rkey;
		s->inv_wr.send_flags = 0;
		s->inv_wr.next = NULL;
		if (ibv_post_send(c->qp, &s->inv_wr, &bad))
			continue;
		s->busy = 0; /* BUG: rdma-unmap-before-invalidate -- unsignaled LOCAL_INV, the slot is handed to the next SCAN before it executed */
	}
}

void kv_conn_destroy(struct kv_conn *c)
{
	for (int i = 0; i < KV_SNAP_SLOTS; i++) {
		if (c->snaps[i].mw)
			ibv_dealloc_mw(c->snaps[i].mw);
		c->snaps[i].mw = NULL;
	}
	if (c->lease_mw)
		ibv_dealloc_mw(c->lease_mw);
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->snap_mr);
	free(c->snaps[0].buf); /* OK: rdma-invalidation-leak -- windows deallocated, snapshot area deregistered */
	ibv_dereg_mr(c->msg_mr);
	rdma_destroy_id(c->id);
	free(c);
}

void kv_server_shutdown(struct kv_server *kv)
{
	for (int i = 0; i < KV_MAX_CONNS; i++)
		if (kv->conns[i])
			kv_conn_destroy(kv->conns[i]);
	free(kv->log); /* OK: rdma-invalidation-leak -- the log MR grants no remote access and the lease windows over it went with their connections */
	ibv_dereg_mr(kv->log_mr);

	free(kv->table->slots); /* BUG: rdma-invalidation-leak -- the published index is freed while its REMOTE_READ registration is still alive */
	ibv_dereg_mr(kv->table->mr);
	free(kv->table);
	ibv_dealloc_pd(kv->pd);
}
