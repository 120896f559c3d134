// UCX's registration cache (ucs/memory/rcache.h, Debian's libucx-dev) over
// the same simverbs PD as regcore, for regcore_bench's side-by-side. Built
// only when UCX is found (REGCORE_BENCH_UCX).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>

struct UcxCache;

// nullptr when UCX refuses (the reason goes to stderr).
UcxCache *ucx_cache_open(ibv_pd *pd);
void ucx_cache_close(UcxCache *c);
// A referenced region covering [addr, addr+len) (registered on a miss);
// nullptr on failure. *lkey is its key.
void *ucx_cache_get(UcxCache *c, void *addr, size_t len, uint32_t *lkey);
void ucx_cache_put(UcxCache *c, void *region);
