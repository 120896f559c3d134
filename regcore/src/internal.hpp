// regcore internals shared by core.cpp, ctx.cpp, cache.cpp and monitor.cpp.
//
// Threading model: one struct regcore is shared by any number of threads.
//  - Each QP has a lock (QpState::mu) that guards its contexts, chains,
//    credits, memo and object pools; a context is guarded by its QP's lock
//    (by the core's lock once its QP was destroyed).
//  - The registration cache has its own locks (cache.cpp); it never takes a
//    QP lock, so QP -> cache is the only order.
//  - The core's lock (Core::mu) guards QP creation/destruction, domains and
//    contexts whose QP is gone. Order: Core::mu -> QpState::mu -> cache.
//  - CQs are polled under a striped lock per CQ so completions of a CQ are
//    processed in poll order.
#pragma once

#include <infiniband/verbs.h>
#if REGCORE_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "regcore/regcore.h"

struct mlx5dv_mkey;
struct mlx5dv_qp_ex;

namespace rc {

struct Core;
struct Ctx;
struct Domain;
struct QpState;
class Cache;

// --------------------------------------------------------------- storage

// A vector of trivially copyable T whose first N elements live inside the
// object: a context's SGEs, references and WRs sit next to its other hot
// fields instead of in separate heap blocks (fewer cache misses per I/O).
// Grows onto the heap beyond N and keeps that capacity.
template <typename T, uint32_t N>
class SmallVec {
 public:
  SmallVec() = default;
  SmallVec(const SmallVec &) = delete;
  SmallVec &operator=(const SmallVec &) = delete;
  ~SmallVec() {
    if (data_ != inline_) free(data_);
  }
  uint32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T *data() { return data_; }
  const T *data() const { return data_; }
  T *begin() { return data_; }
  T *end() { return data_ + size_; }
  const T *begin() const { return data_; }
  const T *end() const { return data_ + size_; }
  T &operator[](uint32_t i) { return data_[i]; }
  const T &operator[](uint32_t i) const { return data_[i]; }
  T &back() { return data_[size_ - 1]; }
  void clear() { size_ = 0; }
  void push_back(const T &v) {
    if (size_ == cap_) reserve(cap_ * 2);
    data_[size_++] = v;
  }
  // New elements are left as they are: callers set every field they use.
  void resize(uint32_t n) {
    reserve(n);
    size_ = n;
  }
  void assign(uint32_t n, const T &v) {
    resize(n);
    for (uint32_t i = 0; i < n; i++) data_[i] = v;
  }
  void reserve(uint32_t n) {
    if (n <= cap_) return;
    auto *p = static_cast<T *>(malloc(sizeof(T) * n));
    if (!p) abort();  // a few KiB at most: max_sge_per_ctx entries
    std::copy(data_, data_ + size_, p);
    if (data_ != inline_) free(data_);
    data_ = p;
    cap_ = n;
  }

 private:
  T *data_ = inline_;
  uint32_t size_ = 0, cap_ = N;
  T inline_[N];
};

// ------------------------------------------------------------------ errors

// Records a message for regcore_last_error() and returns -err.
int fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ----------------------------------------------------------------- locking

// Test-and-test-and-set lock for short critical sections; yields to the
// scheduler when the holder is slow (e.g. descheduled on a busy machine).
class SpinLock {
 public:
  void lock() {
    if (!flag_.exchange(true, std::memory_order_acquire)) return;
    lock_slow();
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  void lock_slow();
  std::atomic<bool> flag_{false};
};

// ----------------------------------------------------------------- monitor

struct AddrRange {
  uintptr_t start, end;
};

// How many holders cover each address; says which sub-ranges a change
// covered for the first time or left uncovered. Callers lock.
class RangeCoverage {
 public:
  std::vector<AddrRange> add(uintptr_t a, uintptr_t b) { return change(a, b, +1); }
  std::vector<AddrRange> remove(uintptr_t a, uintptr_t b) { return change(a, b, -1); }

 private:
  std::vector<AddrRange> change(uintptr_t a, uintptr_t b, int delta);
  void split(uintptr_t at);
  std::map<uintptr_t, int> cov_;  // coverage from a key to the next key
};

// Process-wide memory-event monitor (monitor.cpp): one userfaultfd in
// non-cooperative mode, ranges registered in write-protect mode (which
// never faults: nothing is write-protected) so that the kernel reports
// UNMAP (munmap, brk shrink, mmap over), REMOVE (madvise DONTNEED/FREE/
// REMOVE) and REMAP (mremap) events for them. A reader thread moves events
// from the kernel into a log; caches apply the log before every lookup.
void monitor_forked();

class Monitor {
 public:
  // Shared by every core of the process; never null.
  static Monitor *acquire();
  static void release(Monitor *m);

  bool active() const;  // events flow (false in a forked child)
  const char *status() const { return status_; }
  // Registers [start, end) (page aligned, or the 2 MiB windows around it)
  // while some entry covers it.
  // False if the kernel refuses (file-backed mappings, holes, another
  // userfaultfd owns the range). unwatch() unregisters what no entry covers
  // any more, so that unmapping memory nothing caches costs nothing.
  // *watched is what was registered, to give back to unwatch().
  bool watch(uintptr_t start, uintptr_t end, AddrRange *watched);
  void unwatch(uintptr_t start, uintptr_t end);

  // True when events were read that `processed` has not applied yet, or
  // the reader holds some it has not published (always in a forked child).
  bool dirty(uint64_t processed) const {
    return (busy_.load(std::memory_order_acquire) & 1) ||
           head_.load(std::memory_order_acquire) != processed;
  }
  uint64_t head() const { return head_.load(std::memory_order_acquire); }
  // Waits until every event the kernel handed out is in the log; returns
  // the log's head.
  uint64_t settle() const;
  // Appends the ranges of events [from, to); false if the log no longer
  // holds all of them (the caller then drops everything).
  bool ranges(uint64_t from, uint64_t to, std::vector<AddrRange> &out) const;

 private:
  Monitor();
  ~Monitor();
  friend void monitor_forked();
  void start();
  void run();
  void publish(uintptr_t start, uintptr_t end);

  static constexpr uint64_t kLog = 4096;
  int fd_ = -1;
  int wake_fd_ = -1;
  std::mutex watch_mu_;  // a leaf lock
  RangeCoverage watched_;
  int users_ = 0;
  const char *status_ = "not started";
  std::atomic<uint64_t> busy_{0};  // odd while the reader holds unpublished events
  std::atomic<uint64_t> head_{0};  // events published
  std::atomic<uintptr_t> log_start_[kLog];
  std::atomic<uintptr_t> log_end_[kLog];
  void *thread_ = nullptr;  // std::thread, kept out of this header
};

// ------------------------------------------------------------------- cache

// A cached registration. The public struct is first so regcore_mr*
// converts back. Entries are never freed while the cache lives: they are
// recycled with a new generation, so a stale pointer is harmless.
struct Entry {
  regcore_mr pub{};
  // generation << 32 | kIndexed | references
  std::atomic<uint64_t> state{0};
  uintptr_t start = 0, end = 0;  // page aligned; fixed while referenced or indexed
  uint16_t klass = 0;
  uint16_t domain = 0;
  uint16_t shards = 0;  // bit per shard whose index holds the entry
  uint8_t home = 0;     // shard keeping it on its idle (LRU) list
  bool monitored = false;
  AddrRange watched{0, 0};  // what the monitor registered for it
  bool lru_linked = false;
  bool fork_protected = false;
  Entry *lru_prev = nullptr, *lru_next = nullptr;
  uint64_t last_use = 0;
  Entry *free_next = nullptr;
};

constexpr uint64_t kIndexed = 1ull << 31;
constexpr uint64_t kRefMask = kIndexed - 1;
inline uint32_t gen_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
inline bool indexed(const Entry *e) { return e->state.load(std::memory_order_acquire) & kIndexed; }

struct HitMemo;

class Cache {
 public:
  Cache();
  ~Cache();
  void init(uint32_t max_entries, uint64_t max_bytes, bool use_monitor, bool fork_protect);
  // A referenced entry covering [addr, addr+len) of domain d with at least
  // `access` (normalized), registered on a miss.
  int get(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out);
  void put(Entry *e);
  void invalidate(uintptr_t addr, size_t len);
  // Applies pending memory events; call before trusting an entry found
  // outside the index (QP memos).
  void sync() {
    if (mon_ && mon_->dirty(processed_.load(std::memory_order_acquire))) sync_slow();
  }
  // Whether idle entries may be kept: memory events are monitored.
  bool caching_idle() const { return mon_ && mon_->active(); }
  const char *monitor_status() const;
  // Deregisters everything; -EBUSY while an entry is referenced.
  int clear();
  void add_stats(regcore_stats &st);

 private:
  struct Shard;
  struct Class {
    uint16_t domain;
    unsigned access;
  };
  static constexpr unsigned kShards = 16;
  static constexpr unsigned kMaxClasses = 64;

  int find_class(uint16_t domain, unsigned access) const;
  int add_class(uint16_t domain, unsigned access);
  Entry *find_locked(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access) const;
  Entry *find_in_tree_locked(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access) const;
  int miss(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out);
  int insert_locked(Entry *e, uint64_t since, std::vector<Entry *> &dead);
  AddrRange merge_span_locked(int klass, uintptr_t a, uintptr_t b) const;
  bool overlapping_within_locked(int klass, uintptr_t a, uintptr_t b) const;
  void collect_overlapping_locked(uintptr_t a, uintptr_t b, int klass, std::vector<Entry *> &out) const;
  void unindex_locked(Entry *e, std::vector<Entry *> &dead);
  int make_room_locked(uint64_t bytes, std::vector<Entry *> &dead);
  void lru_unlink_locked(Entry *e);
  void lru_append_locked(Entry *e);
  void sync_slow();
  void sync_locked(std::vector<Entry *> &dead);
  void lock_all();
  void unlock_all();
  void destroy(Entry *e);
  Entry *alloc_entry();
  static unsigned shard_of(uintptr_t addr) { return (addr >> 21) % kShards; }
  static uint16_t shards_of(uintptr_t start, uintptr_t end);

  friend struct HitMemo;
  bool memo_hit(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out);
  HitMemo &memo_remember(uintptr_t addr, Entry *e);
  Entry *try_seen(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access);
  std::atomic<uint64_t> *thread_hits();

  std::unique_ptr<Shard[]> shards_;
  const uint64_t uid_;  // tells this cache's thread memos from a closed one's
  std::mutex stats_mu_;
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> thread_hits_;  // hits through thread memos
  Class classes_[kMaxClasses];
  std::atomic<unsigned> nclasses_{0};
  std::mutex classes_mu_;
  Monitor *mon_ = nullptr;  // set only if it was active at init
  const char *mon_why_ = "";
  std::atomic<bool> fallback_{false};  // the monitor stopped (forked child)
  std::atomic<uint64_t> processed_{0};
  uint32_t max_entries_ = 0;
  uint64_t max_bytes_ = 0;
  std::atomic<uint64_t> count_{0}, bytes_{0};
  std::atomic<uint64_t> tick_{0};
  bool fork_protect_ = false;
  // counters written with all shard locks held (or atomically)
  uint64_t misses_ = 0, evictions_ = 0, monitor_invalidations_ = 0;
  uint64_t unmonitored_ = 0;  // registrations made without caching them
  std::mutex free_mu_;
  Entry *free_ = nullptr;
  std::vector<std::unique_ptr<Entry[]>> slabs_;
};

// ------------------------------------------------------ registration pools

struct MwRec {
  ibv_mw *mw;
  uint32_t rkey;  // last key used with this window; the next is ibv_inc_rkey
};

struct MkeyRec {
  mlx5dv_mkey *mkey;
  bool need_inval;  // configured by a UMR: LOCAL_INV before the next UMR
  bool remote;      // created for remote access (remote invalidation allowed)
};

struct StageRec {
  void *buf;
  ibv_mr *mr;  // nullptr for reg bounce buffers on devices without windows
  uint32_t bytes;
};

// Free registration objects of one kind of a QP or a domain.
struct Pools {
  std::vector<MwRec *> mws;
  std::vector<MkeyRec *> mkeys[2];  // [remote]
  std::vector<StageRec *> stages;   // rw MR_STAGED
  std::vector<StageRec *> bounces;  // reg contexts over an SGL, staged
  size_t size() const {
    return mws.size() + mkeys[0].size() + mkeys[1].size() + stages.size() + bounces.size();
  }
};

// ------------------------------------------------------------------ chains

// One posted group of WRs of a context, tracked until the send queue has
// retired it. Completions carry (chain address | role) as wr_id.
enum : uint64_t { kRoleFinal = 0, kRoleUnsignaled = 1, kRoleMask = 7 };

struct Chain {
  enum State { kIdle, kPosted, kRetired };
  Ctx *ctx = nullptr;
  // Read before the QP's lock is taken (to find it): atomic.
  std::atomic<QpState *> qp{nullptr};
  State state = kIdle;
  uint32_t credits = 0;    // send-queue credits held until retired
  uint32_t wr_posted = 0;  // regcore WRs the provider accepted
  uint32_t unsig_cqes = 0; // their (error/flush) completions seen
  bool has_final = false;  // the signaled WR was accepted
  bool final_seen = false; // its completion was processed
  bool ulp_visible = false;
  uint64_t ulp_wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;  // first error seen
  Chain *prev = nullptr, *next = nullptr;  // per-QP FIFO

  uint64_t tag(uint64_t role) const { return reinterpret_cast<uintptr_t>(this) | role; }
  void reset() {
    state = kIdle;
    credits = wr_posted = unsig_cqes = 0;
    has_final = final_seen = ulp_visible = false;
    ulp_wr_id = 0;
    status = IBV_WC_SUCCESS;
    prev = next = nullptr;
  }
};

// ---------------------------------------------------------------- contexts

// A cache entry an I/O uses, and how it holds it.
struct RunRef {
  Entry *e;
  int8_t slot;  // QP memo slot holding the reference, or -1: the context's own
};

using SgeVec = SmallVec<ibv_sge, 4>;

// Fields the post path touches come first, close together: an rw I/O
// touches the first seven cache lines (header, chains[0], runs, refs, one
// WR); what only reg contexts and teardown use comes after. Cache-line
// aligned so that this holds for every context of the pool.
struct alignas(64) Ctx {
  enum Kind : uint8_t { kFree, kRw, kReg };
  enum Life : uint8_t { kInit, kPosted, kCompleted, kFailedPost };
  enum Key : uint8_t { kNoKey, kKeyLive, kKeyDead };

  Kind kind = kFree;
  Life life = kInit;
  bool ulp_done = false;  // destroy/release called
  Key key = kNoKey;       // reg: the remote key's state
  bool cb_owed = false;   // reg: release returned -EINPROGRESS; the callback is due
  bool cb_running = false;  // callback handed out, recycling waits for it
  regcore_dir dir = REGCORE_DIR_READ;
  regcore_rw_strategy strategy = REGCORE_RW_SINGLE_WR;
  uint32_t nwr = 0;       // regcore WRs of chains[0]
  uint32_t reserved_credits = 0;
  uint32_t rkey = 0;
  uint64_t remote_addr = 0;
  uint64_t bytes = 0;
  QpState *qp = nullptr;  // nullptr once regcore_qp_destroy ran
  Core *core = nullptr;
  Domain *dom = nullptr;
  Chain chains[2];        // [0] the context's post, [1] reg: LOCAL_INV
  SgeVec runs;            // coalesced ULP SGEs with lkeys resolved
  SmallVec<RunRef, 4> refs;  // one per cache entry the runs use
  SmallVec<ibv_send_wr, 1> wrs;

  // resources, released when the context is recycled
  std::vector<ibv_mr *> own_mrs;
  MkeyRec *mkey = nullptr;
  StageRec *stage = nullptr;
  MwRec *mw = nullptr;
  SgeVec wr_sges;  // SGE storage of wrs when it differs from runs

  // reg
  regcore_reg_strategy reg_strategy = REGCORE_REG_MW;
  uint32_t reg_rkey = 0;
  uint64_t reg_addr = 0;  // what the peer uses: a VA, or 0 for zero-based keys
  size_t reg_len = 0;
  unsigned remote_access = 0;
  regcore_release_cb cb = nullptr;
  void *cb_arg = nullptr;

  void clear_for_reuse();
  void clear_reg();
};

// A release callback to run once no lock is held.
struct DueCallback {
  Ctx *ctx;
  regcore_release_cb cb;
  void *arg;
};

// ------------------------------------------------------------------ domain

// One protection domain behind the core, with its device's policy and the
// pools of registration objects no QP holds.
struct Domain {
  uint16_t index = 0;
  ibv_pd *pd = nullptr;
  ibv_context *ctx = nullptr;
  ibv_device_attr_ex dev{};
  regcore_policy policy{};  // for QPs regcore creates
  unsigned internal_access = 0;  // access of cache entries regcore uses
  bool mw_ok = false;
  bool indirect_ok = false;
  uint32_t bounce_bytes = 0;  // staging size of reg contexts over an SGL
  std::mutex mu;
  Pools pool;
};

// Per-QP counters, summed by regcore_get_stats.
// The ones every I/O and completion bumps come first.
struct Counters {
  uint64_t cache_hits = 0;
  uint64_t rw_ctxs[6] = {}, reg_ctxs[5] = {};
  uint64_t internal_wcs = 0, ulp_wcs = 0;
  uint64_t remote_inv_matched = 0, remote_inv_mismatched = 0;
  uint64_t local_invs = 0, sync_invalidations = 0, partial_posts = 0, eagain = 0;
  void add_to(regcore_stats &st) const;
  void add(const Counters &o);
};

// A cache entry a QP keeps referenced for its I/Os, so repeated I/Os on the
// same buffers touch neither the cache's locks nor shared reference counts.
struct MemoSlot {
  Entry *e = nullptr;
  uint32_t inflight = 0;  // contexts using it
  bool retiring = false;  // invalidated: dropped when inflight reaches 0
  uint64_t last = 0;
};

// The state the post path uses comes first (lock, policy, credits, FIFO,
// free contexts, memo, counters); cache-line aligned.
struct alignas(64) QpState {
  SpinLock mu;
  Core *core = nullptr;
  Domain *dom = nullptr;
  ibv_qp *qp = nullptr;
  ibv_qp_ex *qpx = nullptr;
  mlx5dv_qp_ex *mqpx = nullptr;
  regcore_policy policy{};  // the domain's, without indirect mkeys if the QP cannot post UMRs
  bool adopted = false;
  uint32_t max_ctxs = 0;
  uint32_t ctxs = 0;     // contexts in use on this QP
  uint32_t credits = 0;  // free send-queue WRs of regcore's share
  bool error = false;    // an error completion or failed post was seen
  Chain *head = nullptr, *tail = nullptr;
  std::vector<Ctx *> free_ctxs;
  static constexpr int kMemo = 4;
  MemoSlot memo[kMemo];
  uint64_t memo_tick = 0;
  Counters stats;
  Pools pool;
  std::vector<Ctx *> owned;  // contexts assigned to this QP
};

// Lock-free map from ibv_qp to its state: lookups on every context init.
class QpTable {
 public:
  void init(size_t max_qps);
  QpState *find(const ibv_qp *qp) const;
  void insert(QpState *qs);  // Core::mu held
  void erase(const ibv_qp *qp);  // Core::mu held
  template <typename F> void each(F f) const {  // Core::mu held
    for (size_t i = 0; i < cap_; i++) {
      QpState *qs = vals_[i].load(std::memory_order_acquire);
      if (qs && keys_[i].load(std::memory_order_acquire) == qs->qp) f(qs);
    }
  }
  size_t size() const { return size_; }

 private:
  size_t slot(const ibv_qp *qp) const;
  size_t cap_ = 0, size_ = 0;
  std::unique_ptr<std::atomic<const ibv_qp *>[]> keys_;
  std::unique_ptr<std::atomic<QpState *>[]> vals_;
};

// -------------------------------------------------------------------- core

struct Core {
  regcore_attr attr{};
  std::mutex mu;
  static constexpr unsigned kMaxDomains = 16;
  std::unique_ptr<Domain> domains[kMaxDomains];
  std::atomic<unsigned> ndomains{0};

  Cache cache;
  std::unique_ptr<Ctx[]> pool;  // fixed: chain addresses are wr_ids
  size_t pool_size = 0;
  std::mutex ctx_mu;  // a leaf lock: free_ctxs, orphan_ctxs
  std::vector<Ctx *> free_ctxs;  // not assigned to any QP
  uint32_t orphan_ctxs = 0;  // contexts alive after their QP was destroyed
  uintptr_t chain0_off = 0, chain1_off = 0;
  QpTable qps;
  uint32_t declared_ctxs = 0;  // (mu)
  std::atomic<uint32_t> reg_objects{0};  // registration objects allocated (budget max_mrs)
  std::atomic<uint32_t> ulp_cache_refs{0};

  // CQs are polled under a lock per stripe: completions in poll order.
  static constexpr unsigned kCqStripes = 64;
  struct alignas(64) CqStripe {
    std::mutex mu;
    uint64_t ulp_wcs = 0;
  } cq_stripes[kCqStripes];
  Counters retired;  // counters of destroyed QPs (mu)
  std::atomic<uint64_t> loose_ulp_wcs{0}, loose_internal_wcs{0};

  Domain *domain(unsigned i) const { return domains[i].get(); }
  Domain *domain_of(const ibv_pd *pd) const;
};

// ------------------------------------------- inline parts of core.cpp

inline size_t QpTable::slot(const ibv_qp *qp) const {
  auto h = reinterpret_cast<uintptr_t>(qp);
  h ^= h >> 17;
  h *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(h >> 20) & (cap_ - 1);
}

// Tombstones keep probe chains intact: a key stays once inserted and only
// its value goes back to null.
inline QpState *QpTable::find(const ibv_qp *qp) const {
  for (size_t i = slot(qp), n = 0; n < cap_; i = (i + 1) & (cap_ - 1), n++) {
    const ibv_qp *k = keys_[i].load(std::memory_order_acquire);
    if (!k) return nullptr;
    if (k == qp) return vals_[i].load(std::memory_order_acquire);
  }
  return nullptr;
}

inline QpState *find_qp(Core *core, ibv_qp *qp) { return core->qps.find(qp); }

// Chains are reset when posted, runs/wrs/wr_sges refilled by init, and
// resources emptied when the context was recycled (see core.cpp).
inline void Ctx::clear_for_reuse() {
  life = kInit;
  ulp_done = false;
  key = kNoKey;
  cb_owed = cb_running = false;  // the header's line: as cheap as checking
  chains[0].state = Chain::kIdle;
  chains[0].status = IBV_WC_SUCCESS;
  nwr = reserved_credits = 0;
}

inline void ctx_setup(Ctx *ctx, QpState *qs, Ctx::Kind kind) {
  ctx->clear_for_reuse();
  if (kind == Ctx::kReg) ctx->clear_reg();
  ctx->kind = kind;
  ctx->qp = qs;
  ctx->dom = qs->dom;
  ctx->chains[0].qp.store(qs, std::memory_order_relaxed);
  ctx->chains[1].qp.store(qs, std::memory_order_relaxed);
  qs->ctxs++;
}

Ctx *ctx_alloc_slow(QpState *qs, Ctx::Kind kind);

// A context of the QP's budget, or nullptr (-EAGAIN recorded). The QP's
// lock is held.
inline Ctx *ctx_alloc(QpState *qs, Ctx::Kind kind) {
  if (qs->ctxs >= qs->max_ctxs || qs->free_ctxs.empty()) return ctx_alloc_slow(qs, kind);
  Ctx *ctx = qs->free_ctxs.back();
  qs->free_ctxs.pop_back();
  ctx_setup(ctx, qs, kind);
  return ctx;
}

// core.cpp
void maybe_recycle(Ctx *ctx);
inline void fifo_append(QpState *qs, Chain *c) {
  c->state = Chain::kPosted;
  c->prev = qs->tail;
  c->next = nullptr;
  if (qs->tail)
    qs->tail->next = c;
  else
    qs->head = c;
  qs->tail = c;
}
void retire_through(Chain *c);
int acquire_mw(QpState *qs, MwRec **out);
void release_mw(Ctx *ctx, MwRec *mw, bool kill);
int acquire_mkey(QpState *qs, bool remote, MkeyRec **out);
void release_mkey(Ctx *ctx, MkeyRec *mk, bool reset);
int acquire_stage(QpState *qs, bool bounce, StageRec **out);
void release_stage(Ctx *ctx, StageRec *st, bool bounce);
int acquire_reg_slot(QpState *qs);  // for a transient per-context MR
void release_reg_slot(Core *core);
void move_qp_to_error(QpState *qs);
int process_one(Core *core, ibv_wc *wc, std::vector<DueCallback> &due);
void run_callbacks(Core *core, std::vector<DueCallback> &due);
void lock_ctx(Ctx *ctx);
void unlock_ctx(Ctx *ctx);

// ctx.cpp: completion hooks
void on_final_completion(Ctx *ctx, Chain *c, ibv_wc *wc, std::vector<DueCallback> &due);
void kill_reg_key_sync(Ctx *ctx);
void finish_reg_release(Ctx *ctx, bool from_completion, std::vector<DueCallback> &due);
void rw_release_resources(Ctx *ctx);
void reg_release_resources(Ctx *ctx);
// Cache lookups for a QP's I/O: through its memo when idle entries are kept
// (qp_cache_get, in ctx.cpp).
void qp_cache_put(QpState *qs, RunRef r);
void memo_clear(QpState *qs);

// Coalesces adjacent SGEs (same lkey, or both lkey 0) and drops empty ones.
// The run being grown stays in registers and is stored once complete: no
// read back of the element just written (a store-forwarding stall per SGE
// on current cores) and no size/capacity check per element.
template <typename Vec>
[[gnu::always_inline]] inline void coalesce(const ibv_sge *sgl, unsigned nsge, Vec &runs, uint64_t *bytes) {
  runs.resize(nsge);
  ibv_sge *out = runs.data();
  uint32_t n = 0;
  uint64_t total = 0;
  unsigned i = 0;
  while (i < nsge && sgl[i].length == 0) i++;
  if (i < nsge) {
    ibv_sge cur = sgl[i];
    total = cur.length;
    for (i++; i < nsge; i++) {
      const ibv_sge s = sgl[i];
      if (s.length == 0) continue;
      total += s.length;
      if (cur.lkey == s.lkey && cur.addr + cur.length == s.addr &&
          static_cast<uint64_t>(cur.length) + s.length <= UINT32_MAX) {
        cur.length += s.length;
        continue;
      }
      out[n++] = cur;
      cur = s;
    }
    out[n++] = cur;
  }
  runs.resize(n);
  *bytes = total;
}

// Remote write and atomic access need local write (verbs' rule).
inline unsigned normalize_access(unsigned access) {
  if (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) access |= IBV_ACCESS_LOCAL_WRITE;
  return access;
}

// The decision table (regcore_policy_decide), inline for the post path.
inline regcore_rw_strategy decide(const regcore_policy &policy, regcore_dir dir, unsigned runs, uint64_t bytes,
                                  unsigned flags) {
  const regcore_policy *p = &policy;
  if (dir == REGCORE_DIR_READ && p->read_always_mr) return REGCORE_RW_MR_REG;
  regcore_rw_strategy rule = dir == REGCORE_DIR_READ ? p->beyond_sge_read : p->beyond_sge_write;
  unsigned max_sge = dir == REGCORE_DIR_READ ? p->max_sge_read : p->max_sge_write;
  bool force = flags & REGCORE_F_FORCE_MR;
  if (runs <= max_sge && !force) return REGCORE_RW_SINGLE_WR;
  switch (rule) {
    case REGCORE_RW_INDIRECT:
      if (p->indirect && runs <= p->max_sge_per_ctx) return REGCORE_RW_INDIRECT;
      break;
    case REGCORE_RW_MR_STAGED:
      if (bytes <= p->stage_bytes) return REGCORE_RW_MR_STAGED;
      break;
    default:
      break;
  }
  if (force) return REGCORE_RW_MR_REG;
  return runs <= max_sge ? REGCORE_RW_SINGLE_WR : REGCORE_RW_MULTI_WR;
}

}  // namespace rc

// The opaque public handles are the internal objects.
namespace rc {
inline Core *core_of(regcore *c) { return reinterpret_cast<Core *>(c); }
inline const Core *core_of(const regcore *c) { return reinterpret_cast<const Core *>(c); }
inline regcore *handle_of(Core *c) { return reinterpret_cast<regcore *>(c); }
inline Ctx *ctx_of(regcore_rw_ctx *c) { return reinterpret_cast<Ctx *>(c); }
inline const Ctx *ctx_of(const regcore_rw_ctx *c) { return reinterpret_cast<const Ctx *>(c); }
inline Ctx *ctx_of(regcore_reg_ctx *c) { return reinterpret_cast<Ctx *>(c); }
inline const Ctx *ctx_of(const regcore_reg_ctx *c) { return reinterpret_cast<const Ctx *>(c); }
}  // namespace rc
