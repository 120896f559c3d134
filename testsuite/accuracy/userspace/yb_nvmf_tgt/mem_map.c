/*
 * mem_map.c - per-poll-group memory map of the yb NVMe-oF RDMA target.
 *
 * The env layer hands the target hugepage regions (at start-up and when
 * it grows its heap).  Each poll group owns one map per protection domain
 * in which every region is registered once; the I/O path only translates
 * a buffer address to the lkey of the region that covers it.
 *
 * The target only reads into these buffers from the host (RDMA READ) and
 * writes out of them (RDMA WRITE), so the regions need local write access
 * and, on iWARP, remote write for the READ responses.
 *
 * The runtime-add path unwinds with a forward loop that stops below the
 * region it was working on, and forgets the registration it just made.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <pthread.h>

#include "nvmf_rdma.h"

struct nvmf_hugepage {
	void	*vaddr;
	size_t	len;
};

static struct nvmf_hugepage g_hugepages[NVMF_MAX_HUGEPAGES];
static int g_nr_hugepages;
static pthread_mutex_t g_hugepage_lock = PTHREAD_MUTEX_INITIALIZER;

struct nvmf_mem_region {
	uintptr_t	start;
	uintptr_t	end;
	struct ibv_mr	*mr;
};

struct nvmf_mem_map {
	struct ibv_pd		*pd;
	int			access;
	int			nr_regions;
	struct nvmf_mem_region	regions[NVMF_MAX_HUGEPAGES];
};

int
nvmf_env_add_hugepage(void *vaddr, size_t len)
{
	int rc = 0;

	pthread_mutex_lock(&g_hugepage_lock);
	if (g_nr_hugepages == NVMF_MAX_HUGEPAGES) {
		rc = -ENOSPC;
	} else {
		g_hugepages[g_nr_hugepages].vaddr = vaddr;
		g_hugepages[g_nr_hugepages].len = len;
		g_nr_hugepages++;
	}
	pthread_mutex_unlock(&g_hugepage_lock);
	return rc;
}

static int
nvmf_mem_map_overlaps(const struct nvmf_mem_map *map, int upto,
		      uintptr_t start, uintptr_t end)
{
	int i;

	for (i = 0; i < upto; i++) {
		if (start < map->regions[i].end && map->regions[i].start < end)
			return 1;
	}
	return 0;
}

struct nvmf_mem_map *
nvmf_mem_map_create(struct ibv_pd *pd)
{
	struct nvmf_mem_map *map;
	struct nvmf_mem_region *r;
	int access;
	int i;

	map = calloc(1, sizeof(*map));
	if (!map)
		return NULL;

	map->pd = pd;
	access = IBV_ACCESS_LOCAL_WRITE;
	/* iWARP requires REMOTE_WRITE permission for RDMA_READ operation */
	if (pd->context->device->transport_type == IBV_TRANSPORT_IWARP) // BUG: rdma-access-flags-transport -- the registration's rights are chosen by an inline iWARP test
		access |= IBV_ACCESS_REMOTE_WRITE;
	map->access = access;

	pthread_mutex_lock(&g_hugepage_lock);
	for (i = 0; i < g_nr_hugepages; i++) {
		r = &map->regions[i];
		r->start = (uintptr_t)g_hugepages[i].vaddr;
		r->end = r->start + g_hugepages[i].len;
		// OK: rdma-access-flags-invalid, rdma-remote-access-overbroad -- REMOTE_WRITE only ever joins LOCAL_WRITE, and only on iWARP, where these buffers are RDMA READ sinks
		r->mr = ibv_reg_mr(pd, g_hugepages[i].vaddr, g_hugepages[i].len, access);
		if (!r->mr) {
			NVMF_ERRLOG("ibv_reg_mr of hugepage %d failed: %s\n",
				    i, strerror(errno));
			goto err_unwind;
		}
	}
	map->nr_regions = g_nr_hugepages;
	pthread_mutex_unlock(&g_hugepage_lock);
	return map;

err_unwind:
	pthread_mutex_unlock(&g_hugepage_lock);
	while (i--) // OK: rdma-mr-leak -- the failing index holds no MR, every earlier region is deregistered
		ibv_dereg_mr(map->regions[i].mr);
	free(map);
	return NULL;
}

/*
 * Called from the env thread when the heap grew by 'count' hugepages.
 * All of them are added or none is.
 */
int
nvmf_mem_map_notify_add(struct nvmf_mem_map *map, void **vaddrs,
			const size_t *lens, int count)
{
	struct nvmf_mem_region *r;
	int base = map->nr_regions;
	int i, j;

	if (base + count > NVMF_MAX_HUGEPAGES)
		return -ENOSPC;

	for (i = 0; i < count; i++) {
		r = &map->regions[base + i];
		r->start = (uintptr_t)vaddrs[i];
		r->end = r->start + lens[i];
		// OK: rdma-remote-access-overbroad -- same rights as the map: remote write only when the map was created on iWARP
		r->mr = ibv_reg_mr(map->pd, vaddrs[i], lens[i], map->access);
		if (!r->mr)
			goto unwind;
		if (nvmf_mem_map_overlaps(map, base + i, r->start, r->end)) {
			NVMF_ERRLOG("region %p overlaps an existing one\n", vaddrs[i]);
			goto unwind; // BUG: rdma-mr-leak -- r->mr was registered in this iteration but the unwind loop stops below i
		}
	}
	map->nr_regions = base + count;
	return 0;

unwind:
	for (j = 0; j < i; j++) {
		ibv_dereg_mr(map->regions[base + j].mr);
		map->regions[base + j].mr = NULL;
	}
	return -EINVAL;
}

int
nvmf_mem_map_translate(const struct nvmf_mem_map *map, const void *addr,
		       size_t len, uint32_t *lkey)
{
	uintptr_t start = (uintptr_t)addr;
	int i;

	for (i = 0; i < map->nr_regions; i++) {
		const struct nvmf_mem_region *r = &map->regions[i];

		if (start >= r->start && start + len <= r->end) {
			*lkey = r->mr->lkey;
			return 0;
		}
	}
	return -ENOENT;
}

void
nvmf_mem_map_destroy(struct nvmf_mem_map *map)
{
	int i;

	if (!map)
		return;
	for (i = 0; i < map->nr_regions; i++) {
		if (map->regions[i].mr)
			ibv_dereg_mr(map->regions[i].mr);
	}
	free(map);
}
