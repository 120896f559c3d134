// UCX's rcache for regcore_bench. Regions are registered with ibv_reg_mr on
// the benchmark's simverbs PD, so both caches pay the same (modelled)
// registration cost. UCX learns about unmapped memory through libucm's
// hooks on mmap/munmap/madvise/brk (UCM_EVENT_VM_UNMAPPED); its malloc
// hooks are left off so that the process's allocator stays glibc's for both
// caches.
#include "bench_ucx.hpp"

#include <sys/mman.h>

#include <cstdio>
#include <new>

extern "C" {
#include <ucm/api/ucm.h>
#include <ucs/memory/rcache.h>
}

struct UcxRegion {
  ucs_rcache_region_t super;
  ibv_mr *mr;
};

struct UcxCache {
  ucs_rcache_t *rcache = nullptr;
  ibv_pd *pd = nullptr;
};

namespace {

ucs_status_t mem_reg(void *context, ucs_rcache_t *, void *, ucs_rcache_region_t *r, uint16_t) {
  auto *c = static_cast<UcxCache *>(context);
  auto *region = reinterpret_cast<UcxRegion *>(r);
  region->mr = ibv_reg_mr(c->pd, reinterpret_cast<void *>(r->super.start), r->super.end - r->super.start,
                          IBV_ACCESS_LOCAL_WRITE);
  return region->mr ? UCS_OK : UCS_ERR_IO_ERROR;
}

void mem_dereg(void *, ucs_rcache_t *, ucs_rcache_region_t *r) {
  auto *region = reinterpret_cast<UcxRegion *>(r);
  if (region->mr) ibv_dereg_mr(region->mr);
  region->mr = nullptr;
}

void dump_region(void *, ucs_rcache_t *, ucs_rcache_region_t *, char *buf, size_t max) {
  if (max) buf[0] = '\0';
}

ucs_rcache_ops_t g_ops = {mem_reg, mem_dereg, dump_region};

}  // namespace

UcxCache *ucx_cache_open(ibv_pd *pd) {
  ucm_global_opts.enable_malloc_hooks = 0;
  auto *c = new UcxCache();
  c->pd = pd;
  ucs_rcache_params_t p{};
  p.region_struct_size = sizeof(UcxRegion);
  p.alignment = 4096;
  p.max_alignment = 4096;
  p.ucm_events = UCM_EVENT_VM_UNMAPPED;
  p.ucm_event_priority = 1000;
  p.ops = &g_ops;
  p.context = c;
  p.flags = 0;
  p.max_regions = static_cast<unsigned long>(-1);
  p.max_size = static_cast<size_t>(-1);
  p.max_unreleased = static_cast<size_t>(-1);
  if (ucs_status_t st = ucs_rcache_create(&p, "regcore_bench", nullptr, &c->rcache); st != UCS_OK) {
    std::fprintf(stderr, "ucs_rcache_create: %d\n", static_cast<int>(st));
    delete c;
    return nullptr;
  }
  return c;
}

void ucx_cache_close(UcxCache *c) {
  if (!c) return;
  ucs_rcache_destroy(c->rcache);
  delete c;
}

void *ucx_cache_get(UcxCache *c, void *addr, size_t len, uint32_t *lkey) {
  ucs_rcache_region_t *r = nullptr;
  if (ucs_rcache_get(c->rcache, addr, len, PROT_READ | PROT_WRITE, nullptr, &r) != UCS_OK) return nullptr;
  *lkey = reinterpret_cast<UcxRegion *>(r)->mr->lkey;
  return r;
}

void ucx_cache_put(UcxCache *c, void *region) {
  ucs_rcache_region_put(c->rcache, static_cast<ucs_rcache_region_t *>(region));
}
