/*
 * rd_shuffle_fetch.c - reduce-side shuffle fetcher over RDMA verbs
 *
 * Pull mode: map output segments are RDMA-READ from the mapper hosts into
 * merge buffers handed in by the merger.  Those buffers are registered
 * through a small registration cache keyed by address; segments above
 * SHF_RCACHE_MAX_LEN bypass the cache.  Index records (offset/length of a
 * partition in the map output file) are READ into a fixed index buffer.
 * READs are chunked by the device's max message size and chained.
 *
 * Push mode: a mapper writes a partition straight into a landing slot.  Each
 * slot has a type 2 memory window bound per request; the rkey travels in the
 * request message, the mapper finishes with SEND_WITH_INV, otherwise we post
 * LOCAL_INV before the slot is reused.
 *
 * Runs on InfiniBand, RoCE and iWARP NICs.
 *
 * NOT-ANNOTATED: rdma-queue-cap-unchecked, rdma-remote-access-overbroad, rdma-remote-invalidate-unchecked, rdma-rkey-reuse, rdma-send-queue-manual-factor, rdma-send-queue-undersized, rdma-unmap-before-invalidate, rdma-unsignaled-send-starvation -- not reviewed in this file
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define SHF_RCACHE_ENTRIES	64
#define SHF_RCACHE_MAX_LEN	(64UL << 20)
#define SHF_MAX_CHUNKS		16
#define SHF_SLOTS		32
#define SHF_SLOT_SIZE		(8UL << 20)
#define SHF_IDX_SIZE		(64 * 1024)
#define SHF_MSG_SIZE		128
#define SHF_CRC_LEN		64
#define SHF_PUSH_TIMEOUT_US	(5 * 1000 * 1000)

enum { SHF_OP_READ = 1, SHF_OP_INDEX, SHF_OP_BIND, SHF_OP_REQ, SHF_OP_RECV, SHF_OP_INV };
#define SHF_WRID(op, i)	(((uint64_t)(op) << 48) | (uint64_t)(i))

struct shf_rcache_ent {
	void		*addr;
	size_t		 len;
	struct ibv_mr	*mr;
	unsigned	 refcnt;
	uint64_t	 lru;
};

struct shf_rcache {
	struct ibv_pd		*pd;
	enum ibv_transport_type	 transport;
	uint64_t		 clock;
	struct shf_rcache_ent	 ent[SHF_RCACHE_ENTRIES];
};

struct shf_slot {
	struct shf_slot	*next;
	struct ibv_mw	*mw;
	uint32_t	 rkey;
	char		*crc_buf;
	uint64_t	 deadline;
	int		 req;		/* owning request, -1 when idle */
};

struct shf_req {
	void		*dst;
	size_t		 len;
	uint64_t	 raddr;
	uint32_t	 rkey;
	struct ibv_mr	*own_mr;	/* bypass registration */
	struct ibv_mr	*cache_mr;
	int		 nchunks;
	struct ibv_sge	 sge[SHF_MAX_CHUNKS];
	struct ibv_send_wr wr[SHF_MAX_CHUNKS];
};

struct shf_push_msg {
	uint64_t	 addr;
	uint32_t	 rkey;
	uint32_t	 len;
	uint32_t	 partition;
	uint32_t	 slot;		/* PUSH_DONE: landing slot */
};

struct shf_fetcher {
	struct ibv_context	*ctx;
	struct ibv_pd		*pd;
	struct ibv_cq		*cq;
	struct ibv_qp		*qp;
	struct ibv_device_attr	 dattr;
	uint32_t		 max_chunk;
	uint32_t		 max_sge_rd;

	struct shf_rcache	 cache;

	void			*idx_buf;
	struct ibv_mr		*idx_mr;
	char			*msg_buf;
	struct ibv_mr		*msg_mr;

	char			*land;
	struct ibv_mr		*land_mr;
	struct shf_slot		 slots[SHF_SLOTS];
	struct shf_slot		*free_slots;

	struct shf_req		 reqs[256];
};

/* Receive ring of PUSH_DONE messages is owned by the connection code. */
extern int shf_repost_recv(struct shf_fetcher *f, unsigned idx);

static struct ibv_mr *shf_rcache_get(struct shf_rcache *rc, void *addr, size_t len)
{
	struct shf_rcache_ent *e, *victim = NULL;
	struct ibv_mr *mr;
	int access, i;

	for (i = 0; i < SHF_RCACHE_ENTRIES; i++) {
		e = &rc->ent[i];
		if (e->mr && (char *)e->addr <= (char *)addr &&
		    (char *)addr + len <= (char *)e->addr + e->len) {
			e->refcnt++;
			e->lru = ++rc->clock;
			return e->mr;
		}
	}

	access = IBV_ACCESS_LOCAL_WRITE;
	if (rc->transport == IBV_TRANSPORT_IWARP)
		access |= IBV_ACCESS_REMOTE_WRITE;	/* BUG: rdma-access-flags-transport -- READ-sink rights decided by an inline iWARP test */
	mr = ibv_reg_mr(rc->pd, addr, len, access); /* OK: rdma-registration-in-datapath -- registration cache, only on a miss */ /* BUG: rdma-local-mr-management -- lkey is the sink of the fetcher's own RDMA READs */ /* OK: rdma-access-flags-invalid -- LOCAL_WRITE on both paths */
	if (!mr)
		return NULL;

	for (i = 0; i < SHF_RCACHE_ENTRIES; i++) {
		e = &rc->ent[i];
		if (!e->mr) {
			victim = e;
			break;
		}
		if (!e->refcnt && (!victim || e->lru < victim->lru))
			victim = e;
	}
	if (!victim) {
		errno = ENOSPC;
		return NULL;	/* BUG: rdma-mr-leak -- every entry is busy and the fresh registration is dropped */
	}
	if (victim->mr)
		ibv_dereg_mr(victim->mr);	/* OK: rdma-registration-in-datapath -- cache eviction on a miss */
	victim->addr = addr;
	victim->len = len;
	victim->mr = mr;
	victim->refcnt = 1;
	victim->lru = ++rc->clock;
	return mr;
}

static void shf_rcache_put(struct shf_rcache *rc, struct ibv_mr *mr)
{
	int i;

	for (i = 0; i < SHF_RCACHE_ENTRIES; i++)
		if (rc->ent[i].mr == mr && rc->ent[i].refcnt) {
			rc->ent[i].refcnt--;
			return;
		}
}

static void shf_req_release(struct shf_fetcher *f, struct shf_req *r)
{
	if (r->own_mr) {
		ibv_dereg_mr(r->own_mr);	/* BUG: rdma-registration-in-datapath -- bypass registrations are torn down per segment */ /* OK: rdma-mr-leak -- released before the pointer is cleared */
		r->own_mr = NULL;
	} else if (r->cache_mr) {
		shf_rcache_put(&f->cache, r->cache_mr);
		r->cache_mr = NULL;
	}
}

static int shf_fetch_segment(struct shf_fetcher *f, int id)
{
	struct shf_req *r = &f->reqs[id];
	struct ibv_send_wr *bad;
	uint32_t lkey;
	size_t off;
	int i, n, ret;

	n = (int)((r->len + f->max_chunk - 1) / f->max_chunk);
	if (n > SHF_MAX_CHUNKS)
		return -EMSGSIZE;

	if (r->len > SHF_RCACHE_MAX_LEN) {
		r->own_mr = ibv_reg_mr(f->pd, r->dst, r->len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE); /* BUG: rdma-registration-in-datapath -- large segments are registered per fetch */ /* BUG: rdma-local-mr-management -- per-I/O registration of a READ sink */ /* OK: rdma-access-flags-invalid -- remote write with local write */
		if (!r->own_mr)
			return -errno;
		lkey = r->own_mr->lkey;
	} else {
		r->cache_mr = shf_rcache_get(&f->cache, r->dst, r->len);
		if (!r->cache_mr)
			return -ENOMEM;
		lkey = r->cache_mr->lkey;
	}

	for (i = 0, off = 0; i < n; i++, off += f->max_chunk) {
		r->sge[i].addr = (uintptr_t)r->dst + off;
		r->sge[i].length = (uint32_t)(r->len - off < f->max_chunk ? r->len - off : f->max_chunk);
		r->sge[i].lkey = lkey;
		memset(&r->wr[i], 0, sizeof(r->wr[i]));
		r->wr[i].wr_id = SHF_WRID(SHF_OP_READ, id);
		r->wr[i].sg_list = &r->sge[i];
		r->wr[i].num_sge = 1;
		r->wr[i].opcode = IBV_WR_RDMA_READ;
		r->wr[i].wr.rdma.remote_addr = r->raddr + off;
		r->wr[i].wr.rdma.rkey = r->rkey;
		r->wr[i].next = i + 1 < n ? &r->wr[i + 1] : NULL;
	}
	r->wr[n - 1].send_flags = IBV_SEND_SIGNALED;
	r->nchunks = n;

	ret = ibv_post_send(f->qp, r->wr, &bad); /* OK: rdma-access-flags-transport -- both sinks carry REMOTE_WRITE where the device is iWARP */
	if (ret) {
		shf_req_release(f, r);
		return -ret;
	}
	return 0;
}

static int shf_fetch_index(struct shf_fetcher *f, uint64_t raddr, uint32_t rkey, uint32_t partition)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;

	sge.addr = (uintptr_t)f->idx_buf + (partition % (SHF_IDX_SIZE / 24)) * 24;
	sge.length = 24;
	sge.lkey = f->idx_mr->lkey;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHF_WRID(SHF_OP_INDEX, partition);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr + (uint64_t)partition * 24;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(f->qp, &wr, &bad); /* BUG: rdma-access-flags-transport -- the index buffer has LOCAL_WRITE only; the READ fails on iWARP */
}

static int shf_landing_init(struct shf_fetcher *f)
{
	int i, j;

	f->land = aligned_alloc(4096, SHF_SLOTS * SHF_SLOT_SIZE);
	if (!f->land)
		return -ENOMEM;
	f->land_mr = ibv_reg_mr(f->pd, f->land, SHF_SLOTS * SHF_SLOT_SIZE, IBV_ACCESS_MW_BIND); /* OK: rdma-local-mr-management -- registered once; only the windows bound over it reach the mapper */
	if (!f->land_mr)
		goto err_buf;

	f->free_slots = NULL;
	for (i = 0; i < SHF_SLOTS; i++) {
		struct shf_slot *s = &f->slots[i];

		s->mw = ibv_alloc_mw(f->pd, IBV_MW_TYPE_2); /* BUG: rdma-local-mr-management -- ULP-managed memory window */
		if (!s->mw)
			goto err_slots;
		s->crc_buf = malloc(SHF_CRC_LEN);
		if (!s->crc_buf)
			goto err_slots;	/* BUG: rdma-mr-leak -- the unwinding stops below i, slot i's window is never deallocated */
		s->req = -1;
		s->next = f->free_slots;
		f->free_slots = s;
	}
	return 0;

err_slots:
	for (j = 0; j < i; j++) {
		ibv_dealloc_mw(f->slots[j].mw);
		free(f->slots[j].crc_buf);
	}
	ibv_dereg_mr(f->land_mr);
err_buf:
	free(f->land);
	return -ENOMEM;
}

static int shf_push_request(struct shf_fetcher *f, int id, uint32_t partition, uint64_t now)
{
	struct shf_slot *s;
	struct shf_push_msg *m;
	struct ibv_sge msge;
	struct ibv_send_wr bind, req, *bad;
	int idx;

	s = f->free_slots;
	if (!s)
		return -EAGAIN;
	f->free_slots = s->next;
	idx = (int)(s - f->slots);

	memset(&bind, 0, sizeof(bind));
	bind.wr_id = SHF_WRID(SHF_OP_BIND, idx);
	bind.opcode = IBV_WR_BIND_MW; /* BUG: rdma-local-mr-management -- ULP binds a window to expose the landing slot */
	bind.bind_mw.mw = s->mw;
	bind.bind_mw.rkey = ibv_inc_rkey(s->mw->rkey);
	bind.bind_mw.bind_info.mr = f->land_mr;
	bind.bind_mw.bind_info.addr = (uintptr_t)f->land + (uint64_t)idx * SHF_SLOT_SIZE;
	bind.bind_mw.bind_info.length = SHF_SLOT_SIZE;
	bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE; /* BUG: rdma-access-flags-invalid -- window grants remote write over land_mr, which has no LOCAL_WRITE */
	bind.next = &req;

	m = (struct shf_push_msg *)(f->msg_buf + (size_t)idx * SHF_MSG_SIZE);
	m->addr = bind.bind_mw.bind_info.addr;
	m->rkey = bind.bind_mw.rkey;
	m->len = SHF_SLOT_SIZE;
	m->partition = partition;
	msge.addr = (uintptr_t)m;
	msge.length = sizeof(*m);
	msge.lkey = f->msg_mr->lkey;

	memset(&req, 0, sizeof(req));
	req.wr_id = SHF_WRID(SHF_OP_REQ, idx);
	req.sg_list = &msge;
	req.num_sge = 1;
	req.opcode = IBV_WR_SEND;
	req.send_flags = IBV_SEND_SIGNALED;

	if (ibv_post_send(f->qp, &bind, &bad)) {
		s->next = f->free_slots;	/* OK: rdma-invalidation-leak -- the post failed, nothing was bound */
		f->free_slots = s;
		return -EIO;
	}
	s->rkey = m->rkey;
	s->req = id;
	s->deadline = now;
	return 0;
}

static void shf_slot_recycle(struct shf_fetcher *f, struct shf_slot *s)
{
	s->req = -1;
	s->next = f->free_slots;
	f->free_slots = s;
}

static int shf_post_local_inv(struct shf_fetcher *f, struct shf_slot *s)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = SHF_WRID(SHF_OP_INV, s - f->slots);
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = s->rkey;
	return ibv_post_send(f->qp, &wr, &bad);
}

static void shf_handle_wc(struct shf_fetcher *f, struct ibv_wc *wc)
{
	unsigned op = (unsigned)(wc->wr_id >> 48);
	unsigned idx = (unsigned)(wc->wr_id & 0xffffffffffffULL);
	struct shf_push_msg *done;
	struct shf_slot *s;

	switch (op) {
	case SHF_OP_READ:
		shf_req_release(f, &f->reqs[idx]);
		break;
	case SHF_OP_RECV:
		done = (struct shf_push_msg *)(f->msg_buf + (size_t)(SHF_SLOTS + idx) * SHF_MSG_SIZE);
		s = &f->slots[done->slot % SHF_SLOTS];
		shf_repost_recv(f, idx);
		if ((wc->wc_flags & IBV_WC_WITH_INV) && wc->invalidated_rkey == s->rkey)
			shf_slot_recycle(f, s);	/* OK: rdma-invalidation-leak -- the mapper invalidated exactly this window */
		else if (shf_post_local_inv(f, s))
			s->req = -2;	/* leave it out of the free list */
		break;
	case SHF_OP_INV:
		s = &f->slots[idx];
		if (wc->status == IBV_WC_SUCCESS)
			shf_slot_recycle(f, s);	/* OK: rdma-invalidation-leak -- released only after the LOCAL_INV completed successfully */
		break;
	default:
		break;
	}
}

static void shf_reap_timeouts(struct shf_fetcher *f, uint64_t now)
{
	int i;

	for (i = 0; i < SHF_SLOTS; i++) {
		struct shf_slot *s = &f->slots[i];

		if (s->req < 0 || now < s->deadline + SHF_PUSH_TIMEOUT_US)
			continue;
		f->reqs[s->req].len = 0;	/* report the partition as lost */
		shf_slot_recycle(f, s);	/* BUG: rdma-invalidation-leak -- the mapper still holds a live window rkey over a slot that is handed to the next request */
	}
}

int shf_fetcher_init(struct shf_fetcher *f)
{
	if (ibv_query_device(f->ctx, &f->dattr))
		return -errno;
	f->max_chunk = f->dattr.max_mr_size > (1U << 30) ? (1U << 30) : (uint32_t)f->dattr.max_mr_size;
	f->max_sge_rd = f->ctx->device->transport_type == IBV_TRANSPORT_IWARP ? 1 : (uint32_t)f->dattr.max_sge_rd; /* OK: rdma-access-flags-transport -- scatter sizing, no access flags */

	f->cache.pd = f->pd;
	f->cache.transport = f->ctx->device->transport_type;

	f->idx_buf = aligned_alloc(4096, SHF_IDX_SIZE);
	if (!f->idx_buf)
		return -ENOMEM;
	f->idx_mr = ibv_reg_mr(f->pd, f->idx_buf, SHF_IDX_SIZE, IBV_ACCESS_LOCAL_WRITE); /* BUG: rdma-local-mr-management -- lkey is the sink of the fetcher's own RDMA READ */
	if (!f->idx_mr)
		goto err_idx;
	f->msg_buf = calloc(2 * SHF_SLOTS, SHF_MSG_SIZE);
	if (!f->msg_buf)
		goto err_idx_mr;
	f->msg_mr = ibv_reg_mr(f->pd, f->msg_buf, 2 * SHF_SLOTS * SHF_MSG_SIZE, IBV_ACCESS_LOCAL_WRITE); /* OK: rdma-local-mr-management -- request and PUSH_DONE messages, SEND/RECV only */
	if (!f->msg_mr)
		goto err_msg;
	if (shf_landing_init(f))
		goto err_msg_mr;
	return 0;

err_msg_mr:
	ibv_dereg_mr(f->msg_mr);
err_msg:
	free(f->msg_buf);
err_idx_mr:
	ibv_dereg_mr(f->idx_mr);	/* OK: rdma-mr-leak -- the ladder releases every earlier registration */
err_idx:
	free(f->idx_buf);
	return -ENOMEM;
}

void shf_fetcher_fini(struct shf_fetcher *f)
{
	int i;

	for (i = 0; i < SHF_RCACHE_ENTRIES; i++)
		if (f->cache.ent[i].mr)
			ibv_dereg_mr(f->cache.ent[i].mr);	/* OK: rdma-registration-in-datapath -- teardown of the whole cache */
	for (i = 0; i < SHF_SLOTS; i++) {
		ibv_dealloc_mw(f->slots[i].mw);
		free(f->slots[i].crc_buf);
	}
	ibv_dereg_mr(f->land_mr);
	free(f->land);	/* OK: rdma-invalidation-leak -- every window was deallocated and the MR deregistered first */
	ibv_dereg_mr(f->msg_mr);
	free(f->msg_buf);
	ibv_dereg_mr(f->idx_mr);
	free(f->idx_buf);
}

int shf_progress(struct shf_fetcher *f, uint64_t now)
{
	struct ibv_wc wc[32];
	int n, i;

	n = ibv_poll_cq(f->cq, 32, wc);
	for (i = 0; i < n; i++)
		shf_handle_wc(f, &wc[i]);
	shf_reap_timeouts(f, now);
	return n;
}

int shf_fetch(struct shf_fetcher *f, int id, int push, uint64_t idx_raddr, uint32_t idx_rkey,
	      uint32_t partition, uint64_t now)
{
	int ret = shf_fetch_index(f, idx_raddr, idx_rkey, partition);

	if (ret)
		return ret;
	return push ? shf_push_request(f, id, partition, now) : shf_fetch_segment(f, id);
}
