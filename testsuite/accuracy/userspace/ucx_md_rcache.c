/*
 * ib_md: an InfiniBand memory domain with a registration cache, in the
 * style of UCX's uct_ib_md.  mem_reg() looks the range up in the cache and
 * registers on a miss; remote keys are packed into a buffer the caller
 * sends to its peers.  The cache holds at most max_regions regions; a miss
 * on a full cache evicts the least recently used region with no users.
 *
 * Access flags come from one helper (remote read/write always, atomics and
 * relaxed ordering when the device supports them).
 *
 * Correct: the helper always includes LOCAL_WRITE; a failed insert
 * deregisters before freeing; the packed rkey is what peers use.
 * Not correct: eviction unlinks and frees the victim region without
 * deregistering its MR -- the MR leaks and keeps its rkey (already packed
 * and sent to peers) valid over memory the application may reuse.
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct ib_md_region {
	struct ib_md_region *prev, *next;	/* LRU, most recent first */
	uintptr_t            start, end;
	struct ibv_mr       *mr;
	int                  refcount;
} ib_md_region_t;

typedef struct ib_md {
	struct ibv_context *dev;
	struct ibv_pd      *pd;
	int                 atomic_support;
	int                 relaxed_order;
	unsigned int        max_regions;
	unsigned int        nregions;
	ib_md_region_t     *lru_head, *lru_tail;
} ib_md_t;

typedef struct ib_md_rkey_buf {
	uint64_t addr;
	uint32_t rkey;
	uint32_t flags;
} ib_md_rkey_buf_t;

static unsigned int ib_md_access_flags(const ib_md_t *md)
{
	unsigned int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ;

	if (md->atomic_support)
		flags |= IBV_ACCESS_REMOTE_ATOMIC;
	if (md->relaxed_order)
		flags |= IBV_ACCESS_RELAXED_ORDERING;
	return flags;
}

static void ib_md_lru_unlink(ib_md_t *md, ib_md_region_t *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		md->lru_head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		md->lru_tail = r->prev;
	r->prev = r->next = NULL;
	md->nregions--;
}

static int ib_md_lru_insert(ib_md_t *md, ib_md_region_t *r)
{
	if (md->nregions >= md->max_regions)
		return -ENOSPC;
	r->prev = NULL;
	r->next = md->lru_head;
	if (md->lru_head)
		md->lru_head->prev = r;
	else
		md->lru_tail = r;
	md->lru_head = r;
	md->nregions++;
	return 0;
}

static ib_md_region_t *ib_md_lookup(ib_md_t *md, uintptr_t start, uintptr_t end)
{
	ib_md_region_t *r;

	for (r = md->lru_head; r; r = r->next) {
		if (r->start <= start && end <= r->end) {
			ib_md_lru_unlink(md, r);
			ib_md_lru_insert(md, r);
			return r;
		}
	}
	return NULL;
}

static void ib_md_evict_one(ib_md_t *md)
{
	ib_md_region_t *victim;

	for (victim = md->lru_tail; victim; victim = victim->prev)
		if (victim->refcount == 0)
			break;
	if (!victim)
		return;
	ib_md_lru_unlink(md, victim);
	// BUG: rdma-mr-leak, rdma-invalidation-leak -- victim->mr is never deregistered; its packed rkey stays valid
	free(victim);
}

int ib_md_mem_reg(ib_md_t *md, void *address, size_t length, ib_md_region_t **memh_p)
{
	uintptr_t start = (uintptr_t)address & ~4095ul;
	uintptr_t end = ((uintptr_t)address + length + 4095) & ~4095ul;
	ib_md_region_t *r;

	r = ib_md_lookup(md, start, end);
	if (r) {
		r->refcount++;
		*memh_p = r;
		return 0;
	}
	if (md->nregions >= md->max_regions)
		ib_md_evict_one(md);

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->start = start;
	r->end = end;
	/* OK: rdma-access-flags-invalid -- ib_md_access_flags() always includes LOCAL_WRITE */
	/* OK: rdma-registration-in-datapath -- registration cache: kept until evicted */
	/* OK: rdma-remote-access-overbroad -- the rkey is packed for peers by ib_md_mkey_pack() */
	r->mr = ibv_reg_mr(md->pd, (void *)start, end - start, ib_md_access_flags(md)); // BUG: rdma-local-mr-management -- rkey packed for peers
	if (!r->mr) {
		free(r);
		return -errno;
	}
	if (ib_md_lru_insert(md, r)) {
		/* OK: rdma-mr-leak, rdma-invalidation-leak -- deregistered (key killed) before the region is freed */
		ibv_dereg_mr(r->mr);
		free(r);
		return -ENOSPC;
	}
	r->refcount = 1;
	*memh_p = r;
	return 0;
}

void ib_md_mem_dereg(ib_md_t *md, ib_md_region_t *r)
{
	(void)md;
	/* stays cached; evicted later */
	r->refcount--;
}

int ib_md_mkey_pack(const ib_md_region_t *r, void *buf)
{
	ib_md_rkey_buf_t *p = buf;

	p->addr = r->start;
	p->rkey = r->mr->rkey;
	p->flags = 0;
	return sizeof(*p);
}

void ib_md_close(ib_md_t *md)
{
	ib_md_region_t *r;

	while ((r = md->lru_head)) {
		ib_md_lru_unlink(md, r);
		ibv_dereg_mr(r->mr);
		free(r);
	}
	ibv_dealloc_pd(md->pd);
}
