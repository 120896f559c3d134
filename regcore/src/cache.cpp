// Registration cache: page-aligned MRs found by range and access, shared by
// reference count, evicted LRU within the declared budget, and dropped by
// explicit range invalidation (never by guessing).
#include <unistd.h>

#include <cerrno>
#include <new>

#include "internal.hpp"

namespace rc {

namespace {

uintptr_t page_size() {
  static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

unsigned normalize_access(unsigned access) {
  if (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) access |= IBV_ACCESS_LOCAL_WRITE;
  return access;
}

}  // namespace

void Cache::init(ibv_pd *pd, uint32_t max_entries, uint64_t max_bytes) {
  pd_ = pd;
  max_entries_ = max_entries;
  max_bytes_ = max_bytes;
}

CacheEntry *Cache::lookup(uintptr_t addr, size_t len, unsigned access) {
  auto covers = [&](const CacheEntry *e) {
    return e->indexed && e->start <= addr && addr + len <= e->end &&
           (e->pub.access & access) == access;
  };
  if (last_hit_ && covers(last_hit_)) return last_hit_;
  // Candidates end at or after addr+len; the first that starts early enough.
  for (auto it = by_end_.lower_bound(addr + len); it != by_end_.end(); ++it)
    if (covers(it->second)) return last_hit_ = it->second;
  return nullptr;
}

void Cache::unindex(CacheEntry *e) {
  if (!e->indexed) return;
  auto range = by_end_.equal_range(e->end);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == e) {
      by_end_.erase(it);
      break;
    }
  e->indexed = false;
  if (last_hit_ == e) last_hit_ = nullptr;
}

void Cache::destroy(CacheEntry *e) {
  unindex(e);
  if (e->pub.ibv_mr) ibv_dereg_mr(e->pub.ibv_mr);
  bytes_ -= e->end - e->start;
  count_--;
  delete e;
}

// Evicts least recently used unreferenced entries until `bytes` more fit.
int Cache::make_room(uint64_t bytes, regcore_stats &st) {
  while (count_ + 1 > max_entries_ || bytes_ + bytes > max_bytes_) {
    CacheEntry *victim = nullptr;
    for (auto &kv : by_end_)
      if (kv.second->refs == 0 && (!victim || kv.second->last_use < victim->last_use))
        victim = kv.second;
    if (!victim)
      return fail(ENOSPC,
                  "registration cache budget full: %u entries, %llu bytes, all referenced",
                  count_, static_cast<unsigned long long>(bytes_));
    destroy(victim);
    st.cache_evictions++;
  }
  return 0;
}

int Cache::get(uintptr_t addr, size_t len, unsigned access, CacheEntry **out, regcore_stats &st) {
  if (len == 0) return fail(EINVAL, "regcore_mr_get: zero length");
  access = normalize_access(access);
  if (CacheEntry *e = lookup(addr, len, access)) {
    e->refs++;
    e->last_use = ++tick_;
    st.cache_hits++;
    *out = e;
    return 0;
  }
  st.cache_misses++;
  uintptr_t start = addr & ~(page_size() - 1);
  uintptr_t end = (addr + len + page_size() - 1) & ~(page_size() - 1);
  if (int err = make_room(end - start, st)) return err;
  ibv_mr *mr = ibv_reg_mr(pd_, reinterpret_cast<void *>(start), end - start, static_cast<int>(access));
  if (!mr) return fail(errno ? errno : EIO, "ibv_reg_mr(%#lx, %lu, %#x) failed",
                       static_cast<unsigned long>(start), static_cast<unsigned long>(end - start),
                       access);
  auto *e = new (std::nothrow) CacheEntry{};
  if (!e) {
    ibv_dereg_mr(mr);
    return fail(ENOMEM, "out of memory");
  }
  e->pub = {reinterpret_cast<void *>(start), end - start, mr->lkey, mr->rkey, access, mr};
  e->start = start;
  e->end = end;
  e->refs = 1;
  e->indexed = true;
  e->last_use = ++tick_;
  by_end_.emplace(end, e);
  bytes_ += end - start;
  count_++;
  *out = e;
  return 0;
}

void Cache::put(CacheEntry *e) {
  if (--e->refs == 0 && !e->indexed) destroy(e);
}

void Cache::invalidate(uintptr_t addr, size_t len) {
  std::vector<CacheEntry *> hit;
  for (auto &kv : by_end_)
    if (kv.second->start < addr + len && addr < kv.second->end) hit.push_back(kv.second);
  for (CacheEntry *e : hit) {
    unindex(e);
    if (e->refs == 0) destroy(e);
  }
}

int Cache::clear() {
  for (auto &kv : by_end_)
    if (kv.second->refs) return -EBUSY;
  while (!by_end_.empty()) destroy(by_end_.begin()->second);
  return 0;
}

}  // namespace rc

using namespace rc;

extern "C" {

int regcore_mr_get(struct regcore *core, void *addr, size_t length, unsigned access,
                   struct regcore_mr **mr) {
  if (!mr) return fail(EINVAL, "regcore_mr_get: NULL argument");
  // Like ibv_reg_mr: NULL and errno on failure, so that code rewritten from
  // `mr = ibv_reg_mr(...); if (!mr) return -errno;` keeps working.
  *mr = nullptr;
  if (!core) return errno = EINVAL, fail(EINVAL, "regcore_mr_get: NULL argument");
  Core *c = core_of(core);
  CacheEntry *e = nullptr;
  int err = c->cache.get(reinterpret_cast<uintptr_t>(addr), length, access, &e, c->stats);
  if (err) return errno = -err, err;
  c->ulp_cache_refs++;
  *mr = &e->pub;
  return 0;
}

int regcore_mr_put(struct regcore *core, struct regcore_mr *mr) {
  if (!core || !mr) return fail(EINVAL, "regcore_mr_put: NULL argument");
  Core *c = core_of(core);
  auto *e = reinterpret_cast<CacheEntry *>(mr);
  if (e->refs == 0 || c->ulp_cache_refs == 0) return fail(EINVAL, "regcore_mr_put: not referenced");
  c->ulp_cache_refs--;
  c->cache.put(e);
  return 0;
}

int regcore_mr_invalidate_range(struct regcore *core, void *addr, size_t length) {
  if (!core) return fail(EINVAL, "regcore_mr_invalidate_range: NULL core");
  core_of(core)->cache.invalidate(reinterpret_cast<uintptr_t>(addr), length);
  return 0;
}

uint32_t regcore_mr_lkey(const struct regcore_mr *mr) { return mr->lkey; }
uint32_t regcore_mr_rkey(const struct regcore_mr *mr) { return mr->rkey; }

}  // extern "C"
