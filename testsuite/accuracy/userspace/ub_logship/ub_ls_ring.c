/*
 * ub_ls_ring.c - replica log rings.  A ring is 64 MiB of hugepage-backed
 * memory registered for remote write; registering it takes tens of
 * milliseconds, so rings of closed connections are cached and handed to
 * the next connection still registered.
 *
 * Not right: a cached ring keeps its MR, so the rkey the previous primary
 * received stays valid while the ring is given to the next connection.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "ub_logship.h"

static struct ls_ring *ring_cache;
static unsigned int ring_cache_len;

static void *ls_ring_alloc_mem(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);

	if (p == MAP_FAILED)	/* no hugepages configured, fall back */
		p = mmap(NULL, size, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

int ls_ring_get(struct rdma_cm_id *id, struct ls_ring **out)
{
	struct ls_ring *r = ring_cache;

	if (r && r->mr->pd == id->pd) {
		ring_cache = r->next;
		ring_cache_len--;
		r->next = NULL;
		*out = r;
		return 0;
	}

	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->size = LS_RING_SIZE;
	r->base = ls_ring_alloc_mem(r->size);
	if (!r->base) {
		free(r);
		return -ENOMEM;
	}
	r->mr = rdma_reg_write(id, r->base, r->size); // BUG: rdma-local-mr-management -- the ring's rkey goes to the primary in the accept private data
	if (!r->mr) {
		munmap(r->base, r->size);
		free(r);
		return -errno;
	}
	*out = r;
	return 0;
}

void ls_ring_put(struct ls_ring *r)
{
	/* keep the registration, the next connection reuses it as is */
	r->next = ring_cache;
	ring_cache = r; // BUG: rdma-invalidation-leak -- the ring is recycled with its MR still registered: the disconnected primary's rkey keeps write access to the next connection's log
	ring_cache_len++;
}

void ls_ring_cache_drain(void)
{
	struct ls_ring *r;

	while ((r = ring_cache) != NULL) {
		ring_cache = r->next;
		rdma_dereg_mr(r->mr);
		munmap(r->base, r->size); /* OK: rdma-invalidation-leak -- deregistered first, the key is dead */
		free(r);
	}
	ring_cache_len = 0;
}
