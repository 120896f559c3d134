// The registration cache against the process's memory: no registration of
// unmapped, remapped or released memory is ever returned.
//
//   pin_*       simverbs shows what a stale registration does on hardware
//   monitor_*   the cache with the userfaultfd monitor (needs it running)
//   fallback_*  the cache without a monitor, and memory it cannot watch
//   fork_*      MADV_DONTFORK of cached ranges, and the cache in a child
//   cache_*     index behaviour: sharing, merging, LRU eviction
//
// `regcore_memory_test --probe` prints whether the monitor runs here (lit
// uses it to mark the monitor tests unsupported where the kernel refuses).
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "env.hpp"

using testenv::Env;
using testenv::Options;

namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// Anonymous pages filled with `fill`; at `hint` if given (MAP_FIXED_NOREPLACE).
void *map_pages(size_t pages, uint8_t fill, void *hint = nullptr) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0);
  void *p = mmap(hint, pages * kPage, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) testenv::die("mmap");
  if (hint && p != hint) testenv::die("mmap did not reuse the address");
  std::memset(p, fill, pages * kPage);
  return p;
}

regcore_stats stats(Env &e) {
  regcore_stats st{};
  regcore_get_stats(e.core, &st);
  return st;
}

bool key_alive(Env &e, uint32_t key) { return simverbs_key_query(e.pd, key, nullptr) == 0; }

// RDMA WRITE of [addr, addr+len) under lkey to the peer's memory at 0;
// returns the first byte the peer received.
int write_to_peer(Env &e, const void *addr, uint32_t len, uint32_t lkey) {
  std::memset(e.remote.data(), 0, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(addr), len, lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(e.remote.data());
  wr.wr.rdma.rkey = e.remote_rkey;
  if (ibv_post_send(e.qp, &wr, &bad)) return -1;
  ibv_wc wc;
  if (!e.poll_one(e.scq, &wc) || wc.status != IBV_WC_SUCCESS) return -1;
  return e.remote[0];
}

// The same through a regcore rw context (the QP's memo path).
int rw_write_to_peer(Env &e, const void *addr, uint32_t len) {
  std::memset(e.remote.data(), 0, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(addr), len, 0};
  regcore_rw_ctx *ctx = nullptr;
  if (regcore_rw_ctx_init(&ctx, e.core, e.qp, &sge, 1, reinterpret_cast<uintptr_t>(e.remote.data()),
                          e.remote_rkey, REGCORE_DIR_WRITE) <= 0)
    return -1;
  if (regcore_rw_ctx_post(ctx, e.qp, 9, nullptr)) return -1;
  ibv_wc wc;
  bool ok = e.poll_one(e.scq, &wc) && wc.status == IBV_WC_SUCCESS;
  regcore_rw_ctx_destroy(ctx);
  return ok ? e.remote[0] : -1;
}

// Caches [p, p+len) (get, then put: the entry stays idle) and returns its lkey.
uint32_t cache_idle(Env &e, void *p, size_t len) {
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p, len, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
  uint32_t lkey = mr->lkey;
  CHECK_EQ(regcore_mr_put(e.core, mr), 0);
  return lkey;
}

// After a memory event on [p, p+len): the next get registers anew and the
// idle entry it replaced is deregistered.
void expect_fresh_registration(Env &e, void *p, size_t len, uint32_t old_lkey) {
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p, len, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
  CHECK(mr->lkey != old_lkey);
  CHECK(!key_alive(e, old_lkey));
  CHECK_EQ(regcore_mr_put(e.core, mr), 0);
}

void require_monitor(Env &e) {
  const char *why = nullptr;
  if (regcore_monitor_state(e.core, &why) != REGCORE_MONITOR_USERFAULTFD) {
    std::printf("  monitor not running: %s\n", why);
    CHECK(false);
  }
}

}  // namespace

// ------------------------------------------------------------- simverbs

TEST(pin_stale_registration_moves_old_data) {
  Env e(SIMVERBS_PROFILE_MLX5);
  void *p = map_pages(4, 'A');
  ibv_mr *mr = ibv_reg_mr(e.pd, p, 4 * kPage, IBV_ACCESS_LOCAL_WRITE);
  CHECK(mr != nullptr);
  CHECK_EQ(write_to_peer(e, p, 64, mr->lkey), 'A');
  simverbs_stats before;
  simverbs_get_stats(&before);
  munmap(p, 4 * kPage);
  map_pages(4, 'B', p);
  // Hardware keeps DMAing to the pages the MR pinned: the old data.
  CHECK_EQ(write_to_peer(e, p, 64, mr->lkey), 'A');
  simverbs_stats after;
  simverbs_get_stats(&after);
  CHECK_EQ(after.detached_pages - before.detached_pages, 4u);
  CHECK(after.stale_accesses > before.stale_accesses);
  CHECK_EQ(ibv_dereg_mr(mr), 0);
  munmap(p, 4 * kPage);
}

TEST(pin_unmapped_memory_cannot_be_registered) {
  Env e(SIMVERBS_PROFILE_MLX5);
  void *p = map_pages(2, 0);
  munmap(p, 2 * kPage);
  errno = 0;
  CHECK(ibv_reg_mr(e.pd, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE) == nullptr);
  CHECK_EQ(errno, EFAULT);
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p, kPage, IBV_ACCESS_LOCAL_WRITE, &mr), -EFAULT);
}

// --------------------------------------------------------------- monitor

// The scenario: get, put, munmap, mmap at the same address, get.
// Repeated, because the monitor's reader thread races with the caller.
TEST(monitor_stale_registration_is_never_returned) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(4, 'A');
  for (int i = 0; i < 200; i++) {
    uint8_t fill = static_cast<uint8_t>('A' + i % 26);
    regcore_mr *mr = nullptr;
    CHECK_EQ(regcore_mr_get(e.core, p, 4 * kPage, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    uint32_t old = mr->lkey;
    CHECK_EQ(write_to_peer(e, p, 64, mr->lkey), fill);
    CHECK_EQ(regcore_mr_put(e.core, mr), 0);
    munmap(p, 4 * kPage);
    uint8_t next = static_cast<uint8_t>('A' + (i + 1) % 26);
    map_pages(4, next, p);
    CHECK_EQ(regcore_mr_get(e.core, p, 4 * kPage, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    CHECK(mr->lkey != old);
    CHECK(!key_alive(e, old));
    CHECK_EQ(write_to_peer(e, p, 64, mr->lkey), next);
    CHECK_EQ(regcore_mr_put(e.core, mr), 0);
  }
  CHECK(stats(e).cache_monitor_invalidations >= 200);
  munmap(p, 4 * kPage);
}

// rw contexts find their keys through the QP's memo: it must not outlive
// the memory either.
TEST(monitor_rw_context_never_uses_a_stale_key) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(2, 'A');
  CHECK_EQ(rw_write_to_peer(e, p, 128), 'A');
  CHECK_EQ(rw_write_to_peer(e, p, 128), 'A');  // memo hit
  munmap(p, 2 * kPage);
  map_pages(2, 'B', p);
  CHECK_EQ(rw_write_to_peer(e, p, 128), 'B');
  munmap(p, 2 * kPage);
}

// A registration still referenced when its memory goes keeps the old pages
// (as on hardware) but is no longer handed to anyone else.
TEST(monitor_referenced_stale_entry_is_not_shared) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(2, 'A');
  regcore_mr *held = nullptr, *fresh = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &held), 0);
  munmap(p, 2 * kPage);
  map_pages(2, 'B', p);
  CHECK_EQ(regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &fresh), 0);
  CHECK(fresh != held);
  CHECK_EQ(write_to_peer(e, p, 64, held->lkey), 'A');
  CHECK_EQ(write_to_peer(e, p, 64, fresh->lkey), 'B');
  uint32_t held_key = held->lkey;
  CHECK_EQ(regcore_mr_put(e.core, held), 0);
  CHECK(!key_alive(e, held_key));  // its last put deregistered it
  CHECK_EQ(regcore_mr_put(e.core, fresh), 0);
  munmap(p, 2 * kPage);
}

TEST(monitor_sees_mremap) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(4, 'A');
  uint32_t old = cache_idle(e, p, 4 * kPage);
  void *q = mremap(p, 4 * kPage, 8 * kPage, MREMAP_MAYMOVE);
  CHECK(q != MAP_FAILED);
  if (q == p) {  // grew in place: move it for real
    void *r = map_pages(8, 0);
    q = mremap(p, 8 * kPage, 8 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, r);
    CHECK(q == r);
  }
  map_pages(4, 'B', p);
  expect_fresh_registration(e, p, 4 * kPage, old);
  munmap(q, 8 * kPage);
  munmap(p, 4 * kPage);
}

TEST(monitor_sees_madvise_dontneed) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(4, 'A');
  uint32_t old = cache_idle(e, p, 4 * kPage);
  CHECK_EQ(madvise(p, kPage, MADV_DONTNEED), 0);
  expect_fresh_registration(e, p, 4 * kPage, old);
  munmap(p, 4 * kPage);
}

TEST(monitor_sees_madvise_free) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(4, 'A');
  uint32_t old = cache_idle(e, p, 4 * kPage);
  CHECK_EQ(madvise(static_cast<char *>(p) + kPage, kPage, MADV_FREE), 0);
  expect_fresh_registration(e, p, 4 * kPage, old);
  munmap(p, 4 * kPage);
}

TEST(monitor_sees_mmap_over_a_range) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(4, 'A');
  uint32_t old = cache_idle(e, p, 4 * kPage);
  CHECK(mmap(p, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == p);
  expect_fresh_registration(e, p, 4 * kPage, old);
  munmap(p, 4 * kPage);
}

// The program's break moves down: the heap's top pages are unmapped.
TEST(monitor_sees_brk_shrink) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  mallopt(M_MMAP_THRESHOLD, 0);  // malloc grows with mmap, never brk, meanwhile
  const intptr_t grow = 64 * 1024;
  auto *top = static_cast<char *>(sbrk(0));
  CHECK(sbrk(grow) == top);
  char *start = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(top) + kPage - 1) & ~(kPage - 1));
  std::memset(start, 'A', 4 * kPage);
  uint32_t old = cache_idle(e, start, 4 * kPage);
  CHECK(sbrk(-grow) != reinterpret_cast<void *>(-1));
  CHECK(sbrk(grow) == top);  // the same addresses, new pages
  std::memset(start, 'B', 4 * kPage);
  expect_fresh_registration(e, start, 4 * kPage, old);
  CHECK(sbrk(-grow) != reinterpret_cast<void *>(-1));
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
}

TEST(monitor_sees_free_of_a_large_block) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // large blocks are their own mappings
  auto *block = static_cast<char *>(malloc(1 << 20));
  std::memset(block, 'A', 1 << 20);
  uint32_t old = cache_idle(e, block, 1 << 20);
  uint64_t before = stats(e).cache_monitor_invalidations;
  free(block);  // munmap inside glibc
  void *p = map_pages(1, 0);
  cache_idle(e, p, kPage);  // any lookup applies pending events
  CHECK(!key_alive(e, old));
  CHECK(stats(e).cache_monitor_invalidations > before);
  munmap(p, kPage);
}

TEST(monitor_leaves_other_ranges_cached) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *a = map_pages(2, 'A'), *b = map_pages(2, 'B');
  uint32_t ka = cache_idle(e, a, 2 * kPage), kb = cache_idle(e, b, 2 * kPage);
  munmap(a, 2 * kPage);
  uint64_t hits = stats(e).cache_hits;
  CHECK_EQ(cache_idle(e, b, 2 * kPage), kb);
  CHECK_EQ(stats(e).cache_hits, hits + 1);
  CHECK(!key_alive(e, ka));
  munmap(b, 2 * kPage);
}

// ----------------------------------------------------------------- cache

TEST(cache_shares_and_invalidates) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  std::vector<uint8_t> buf(3 * 4096);
  regcore_mr *a = nullptr, *b = nullptr, *c = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, buf.data() + 10, 100, IBV_ACCESS_LOCAL_WRITE, &a), 0);
  CHECK_EQ(regcore_mr_get(e.core, buf.data() + 20, 50, 0, &b), 0);
  CHECK(a == b);  // covered, fewer rights asked
  CHECK_EQ(regcore_mr_lkey(a), a->lkey);
  CHECK_EQ(regcore_mr_get(e.core, buf.data() + 20, 50, IBV_ACCESS_REMOTE_WRITE, &c), 0);
  CHECK(c != a);
  CHECK(c->access & IBV_ACCESS_LOCAL_WRITE);  // added for REMOTE_WRITE
  uint32_t old_lkey = a->lkey;
  CHECK_EQ(regcore_mr_invalidate_range(e.core, buf.data(), buf.size()), 0);
  CHECK(key_alive(e, old_lkey));  // still referenced
  CHECK_EQ(regcore_mr_put(e.core, a), 0);
  CHECK_EQ(regcore_mr_put(e.core, b), 0);
  CHECK(!key_alive(e, old_lkey));  // last put deregistered
  CHECK_EQ(regcore_mr_put(e.core, c), 0);
  CHECK_EQ(regcore_mr_get(e.core, buf.data() + 10, 100, IBV_ACCESS_LOCAL_WRITE, &a), 0);
  CHECK(a->lkey != old_lkey);
  CHECK_EQ(regcore_mr_put(e.core, a), 0);
  CHECK_EQ(stats(e).cache_hits, 1u);
}

// Same-class entries never overlap: a request overlapping cached ranges
// registers their union and replaces them.
TEST(cache_merges_overlapping_registrations) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  auto *p = static_cast<char *>(map_pages(4, 0));
  uint32_t first = cache_idle(e, p, 2 * kPage);
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p + kPage, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
  CHECK(mr->addr == p);
  CHECK_EQ(mr->length, 3 * kPage);
  CHECK(!key_alive(e, first));
  regcore_mr *inside = nullptr;
  uint64_t hits = stats(e).cache_hits;
  CHECK_EQ(regcore_mr_get(e.core, p + 100, 200, IBV_ACCESS_LOCAL_WRITE, &inside), 0);
  CHECK(inside == mr);
  CHECK_EQ(stats(e).cache_hits, hits + 1);
  CHECK_EQ(regcore_mr_put(e.core, inside), 0);
  CHECK_EQ(regcore_mr_put(e.core, mr), 0);
  munmap(p, 4 * kPage);
}

TEST(cache_budget_evicts_least_recently_used_then_refuses) {
  ibv_context *ctx = testenv::open_device(SIMVERBS_PROFILE_MLX4);
  ibv_pd *pd = ibv_alloc_pd(ctx);
  regcore_attr at{};
  at.max_ctxs = 1;
  at.cache_max_entries = 3;
  regcore *core;
  CHECK_EQ(regcore_open(pd, &at, &core), 0);
  CHECK_EQ(regcore_monitor_state(core, nullptr), REGCORE_MONITOR_USERFAULTFD);
  auto *buf = static_cast<char *>(map_pages(8, 0));
  regcore_mr *m[4];
  for (int i = 0; i < 3; i++) CHECK_EQ(regcore_mr_get(core, buf + 2 * i * kPage, 10, 0, &m[i]), 0);
  CHECK_EQ(regcore_mr_get(core, buf + 6 * kPage, 10, 0, &m[3]), -ENOSPC);  // all referenced
  uint32_t keys[3] = {m[0]->lkey, m[1]->lkey, m[2]->lkey};
  for (int i : {1, 0, 2}) CHECK_EQ(regcore_mr_put(core, m[i]), 0);  // idle since: 1, then 0, then 2
  CHECK_EQ(regcore_mr_get(core, buf + 6 * kPage, 10, 0, &m[3]), 0);  // evicts the oldest idle: 1
  CHECK(simverbs_key_query(pd, keys[1], nullptr) == -ENOKEY);
  CHECK(simverbs_key_query(pd, keys[0], nullptr) == 0);
  CHECK(simverbs_key_query(pd, keys[2], nullptr) == 0);
  regcore_stats st;
  regcore_get_stats(core, &st);
  CHECK_EQ(st.cache_evictions, 1u);
  CHECK_EQ(regcore_close(core), -EBUSY);
  CHECK_EQ(regcore_mr_put(core, m[3]), 0);
  CHECK_EQ(regcore_close(core), 0);
  munmap(buf, 8 * kPage);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// -------------------------------------------------------------- fallback

// Without a monitor nothing says the pages stayed: every get registers and
// the last put deregisters, even for concurrent users of one buffer.
TEST(fallback_caches_nothing) {
  Options o;
  o.flags = REGCORE_F_NO_MONITOR;
  Env e(SIMVERBS_PROFILE_MLX5, o);
  const char *why = nullptr;
  CHECK_EQ(regcore_monitor_state(e.core, &why), REGCORE_MONITOR_NONE);
  CHECK(std::strstr(why, "disabled") != nullptr);
  void *p = map_pages(2, 'A');
  regcore_mr *a = nullptr, *b = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &a), 0);
  CHECK_EQ(regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &b), 0);
  CHECK(a != b);
  uint32_t ka = a->lkey;
  CHECK_EQ(regcore_mr_put(e.core, a), 0);
  CHECK(!key_alive(e, ka));
  CHECK_EQ(regcore_mr_put(e.core, b), 0);
  CHECK_EQ(rw_write_to_peer(e, p, 64), 'A');
  munmap(p, 2 * kPage);
  map_pages(2, 'B', p);
  CHECK_EQ(rw_write_to_peer(e, p, 64), 'B');
  regcore_stats st = stats(e);
  CHECK_EQ(st.cache_hits, 0u);
  CHECK_EQ(st.cache_unmonitored, st.cache_misses);
  munmap(p, 2 * kPage);
}

// REGCORE_MONITOR=off in the environment does the same (lit runs this case
// with it set).
TEST(fallback_environment_turns_the_monitor_off) {
  Env e(SIMVERBS_PROFILE_MLX5);
  const char *why = nullptr;
  const char *env = getenv("REGCORE_MONITOR");
  int state = regcore_monitor_state(e.core, &why);
  std::printf("  REGCORE_MONITOR=%s: %s\n", env ? env : "(unset)", why);
  if (env && !std::strcmp(env, "off")) CHECK_EQ(state, REGCORE_MONITOR_NONE);
}

// userfaultfd watches anonymous memory and shmem only: a file mapping is
// registered per get and never cached.
TEST(fallback_file_mappings_are_not_cached) {
  Env e(SIMVERBS_PROFILE_MLX5);
  char path[] = "/tmp/regcore-memXXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  CHECK_EQ(ftruncate(fd, static_cast<off_t>(2 * kPage)), 0);
  void *p = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(p != MAP_FAILED);
  uint64_t before = stats(e).cache_unmonitored;
  uint32_t k1 = cache_idle(e, p, 2 * kPage);
  CHECK(!key_alive(e, k1));
  uint32_t k2 = cache_idle(e, p, 2 * kPage);
  CHECK(k2 != k1);
  CHECK_EQ(stats(e).cache_unmonitored, before + 2);
  munmap(p, 2 * kPage);
  close(fd);
}

// ------------------------------------------------------------------ fork

namespace {

// Runs `child` in a forked child; true if it returned true.
template <typename F>
bool in_child(F child) {
  pid_t pid = fork();
  if (pid == 0) _exit(child() ? 0 : 1);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool mapped(void *p) {
  unsigned char v;
  return mincore(p, kPage, &v) == 0;
}

}  // namespace

// Where rdma-core would need ibv_fork_init() (old kernels), cached ranges
// are MADV_DONTFORK while cached: a child never shares (and copy-on-write
// never splits) pages the device uses.
TEST(fork_cached_ranges_are_not_inherited_when_fork_needs_care) {
  simverbs_set_fork_status(IBV_FORK_DISABLED);
  {
    Env e(SIMVERBS_PROFILE_MLX5);
    void *p = map_pages(2, 'A');
    regcore_mr *mr = nullptr;
    CHECK_EQ(regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
    CHECK(in_child([&] { return !mapped(p); }));
    CHECK_EQ(regcore_mr_put(e.core, mr), 0);
    CHECK_EQ(regcore_mr_invalidate_range(e.core, p, 2 * kPage), 0);  // deregistered
    CHECK(in_child([&] { return mapped(p); }));
    munmap(p, 2 * kPage);
  }
  simverbs_set_fork_status(IBV_FORK_UNNEEDED);
  Env e(SIMVERBS_PROFILE_MLX5);
  void *p = map_pages(2, 'A');
  cache_idle(e, p, 2 * kPage);
  CHECK(in_child([&] { return mapped(p); }));  // the kernel copies pinned pages itself
  munmap(p, 2 * kPage);
}

// A child has no monitor (its mappings are not watched and the reader
// thread stayed in the parent): it must not trust what the parent cached.
TEST(fork_child_does_not_trust_the_cache) {
  Env e(SIMVERBS_PROFILE_MLX5);
  require_monitor(e);
  void *p = map_pages(2, 'A');
  uint32_t parent_key = cache_idle(e, p, 2 * kPage);
  CHECK(in_child([&] {
    const char *why = nullptr;
    if (regcore_monitor_state(e.core, &why) != REGCORE_MONITOR_NONE) return false;
    regcore_mr *mr = nullptr;
    if (regcore_mr_get(e.core, p, 2 * kPage, IBV_ACCESS_LOCAL_WRITE, &mr)) return false;
    return mr->lkey != parent_key;
  }));
  CHECK_EQ(cache_idle(e, p, 2 * kPage), parent_key);  // the parent's cache is intact
  munmap(p, 2 * kPage);
}

int main(int argc, char **argv) {
  if (argc > 1 && !std::strcmp(argv[1], "--probe")) {
    Env e(SIMVERBS_PROFILE_MLX5);
    const char *why = nullptr;
    int state = regcore_monitor_state(e.core, &why);
    std::printf("monitor: %s\n", state == REGCORE_MONITOR_USERFAULTFD ? "userfaultfd" : why);
    return 0;
  }
  return check::run_all(argc, argv);
}
