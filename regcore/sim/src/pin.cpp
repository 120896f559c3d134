// simverbs: pinning and registration cost.
//
// Hardware DMAs to the physical pages an MR pinned at registration. If the
// process unmaps them and maps new memory at the same address, the MR keeps
// the old pages: the device reads and writes memory the process no longer
// sees. simverbs resolves keys to process addresses, so it models this by
// interposing the calls that take pages away from a mapping (munmap, mremap,
// madvise(MADV_DONTNEED/REMOVE), mmap(MAP_FIXED)): before the real call it
// copies the pages live MRs cover, and from then on the device uses the
// copies. glibc's internal calls (free() of large blocks, heap trimming)
// bypass the interposition; for those the model does not apply.
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstring>

#include "sim_internal.hpp"

namespace simverbs {

namespace {

constexpr uint64_t kPage = 4096;

uint64_t page_down(uint64_t a) { return a & ~(kPage - 1); }

#ifndef SIMVERBS_NO_INTERPOSE
// The interposers run inside arbitrary code, including our own while it
// holds pin_mu (a large free() may unmap): never re-enter.
thread_local bool t_in_pin = false;

// Copies a page of our own address space without faulting on pages that
// are not readable.
void copy_page(uint64_t page, std::vector<uint8_t> &out) {
  out.assign(kPage, 0);
  iovec local{out.data(), kPage}, remote{reinterpret_cast<void *>(page), kPage};
  if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(kPage))
    out.assign(kPage, 0);
}

// Keeps the content of every page of [start, end) that a live MR covers,
// read `moved_by` bytes further (where mremap moved the pages).
void detach_range_locked(Sim &s, uint64_t start, uint64_t end, int64_t moved_by) {
  if (s.pinned.empty()) return;
  uint64_t from = start > s.max_pinned_len ? start - s.max_pinned_len : 0;
  for (auto it = s.pinned.lower_bound(from); it != s.pinned.end() && it->first < end; ++it) {
    SimMr *mr = it->second;
    uint64_t mr_end = it->first + mr->box.ibv.length;
    if (mr_end <= start) continue;
    uint64_t lo = page_down(std::max(start, it->first));
    uint64_t hi = std::min(end, mr_end);
    for (uint64_t p = lo; p < hi; p += kPage) {
      if (mr->detached.count(p)) continue;
      copy_page(p + static_cast<uint64_t>(moved_by), mr->detached[p]);
      s.stats.detached_pages++;
    }
    mr->detached_any.store(true, std::memory_order_release);
  }
}

// Runs around a call that takes [addr, addr+len) away from the process;
// the pages' content is now `moved_by` bytes further.
void release_pages(const void *addr, size_t len, int64_t moved_by = 0) {
  if (t_in_pin || len == 0) return;
  Sim &s = sim();
  t_in_pin = true;
  {
    std::lock_guard<std::mutex> lock(s.pin_mu);
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    detach_range_locked(s, page_down(a), a + len, moved_by);
  }
  t_in_pin = false;
}
#endif

}  // namespace

void spend_ns(uint64_t ns) {
  if (ns == 0) return;
  auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

void pin_add_locked(SimMr *mr) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.pin_mu);
  s.pinned.emplace(reinterpret_cast<uintptr_t>(mr->box.ibv.addr), mr);
  s.max_pinned_len = std::max<uint64_t>(s.max_pinned_len, mr->box.ibv.length + kPage);
}

void pin_remove_locked(SimMr *mr) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.pin_mu);
  auto range = s.pinned.equal_range(reinterpret_cast<uintptr_t>(mr->box.ibv.addr));
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == mr) {
      s.pinned.erase(it);
      break;
    }
}

void pin_spans_locked(SimMr *mr, uint64_t addr, uint64_t len, std::vector<Span> &out) {
  if (!mr->detached_any.load(std::memory_order_acquire)) {
    out.push_back({reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(addr)), len});
    return;
  }
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.pin_mu);
  bool stale = false;
  for (uint64_t a = addr, end = addr + len; a < end;) {
    uint64_t page = page_down(a);
    uint64_t n = std::min(end, page + kPage) - a;
    auto it = mr->detached.find(page);
    uint8_t *p = it == mr->detached.end() ? reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(a))
                                          : it->second.data() + (a - page);
    stale |= it != mr->detached.end();
    if (!out.empty() && out.back().ptr + out.back().len == p)
      out.back().len += n;
    else
      out.push_back({p, n});
    a += n;
  }
  if (stale) s.stats.stale_accesses++;
}

#ifndef SIMVERBS_NO_INTERPOSE
template <typename F>
F next_fn(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
#endif

}  // namespace simverbs

using namespace simverbs;

extern "C" {

void simverbs_set_reg_cost(const struct simverbs_reg_cost *c) {
  Sim &s = sim();
  s.reg_ns = c ? c->reg_ns : 0;
  s.reg_ns_per_page = c ? c->reg_ns_per_page : 0;
  s.dereg_ns = c ? c->dereg_ns : 0;
  s.dereg_ns_per_page = c ? c->dereg_ns_per_page : 0;
}

void simverbs_set_fork_status(enum ibv_fork_status status) {
  std::lock_guard<std::mutex> lock(sim().mu);
  sim().fork_status = status;
}

int ibv_fork_init(void) {
  std::lock_guard<std::mutex> lock(sim().mu);
  if (sim().fork_status == IBV_FORK_DISABLED) sim().fork_status = IBV_FORK_ENABLED;
  return 0;
}

enum ibv_fork_status ibv_is_fork_initialized(void) {
  std::lock_guard<std::mutex> lock(sim().mu);
  return sim().fork_status;
}

#ifndef SIMVERBS_NO_INTERPOSE
// The interposers: the process's calls land here (the program links
// simverbs statically), then in libc's functions, so that other hooks on
// them (UCX's libucm) still see every call.

int munmap(void *addr, size_t len) {
  static auto real = next_fn<int (*)(void *, size_t)>("munmap");
  release_pages(addr, len);
  return real(addr, len);
}

void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  void *fixed = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    fixed = va_arg(ap, void *);
    va_end(ap);
  }
  // A shrunk tail is unmapped: keep it first. Moved pages are copied from
  // their new place right after the move (the device does not see later
  // writes there: an approximation of the pages being the same).
  static auto real = next_fn<void *(*)(void *, size_t, size_t, int, ...)>("mremap");
  if (new_len < old_len) release_pages(static_cast<char *>(old) + new_len, old_len - new_len);
  void *r = real(old, old_len, new_len, flags, fixed);
  if (r != MAP_FAILED && r != old)
    release_pages(old, std::min(old_len, new_len),
                  static_cast<char *>(r) - static_cast<char *>(old));
  return r;
}

int madvise(void *addr, size_t len, int advice) {
  static auto real = next_fn<int (*)(void *, size_t, int)>("madvise");
  // MADV_FREE is not here: the kernel does not reclaim pinned pages.
  if (advice == MADV_DONTNEED || advice == MADV_REMOVE) release_pages(addr, len);
  return real(addr, len, advice);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  static auto real = next_fn<void *(*)(void *, size_t, int, int, int, off_t)>("mmap");
  if ((flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE)) release_pages(addr, len);
  return real(addr, len, prot, flags, fd, off);
}
#endif

}  // extern "C"
