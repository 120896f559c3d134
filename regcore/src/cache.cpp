// Registration cache: page-aligned MRs found by range and access, shared by
// reference count and kept while idle, evicted least-recently-used within
// the declared budget. Only memory the monitor watches is cached: without
// it nothing tells the cache that the pages behind an entry changed, so
// every get registers and the last put deregisters.
//
// Index: entries of one class (domain, access) never overlap: a miss
// registers the union of the same-class entries it overlaps and replaces
// them. Each class is then a sorted set of disjoint ranges, so a lookup is
// one O(log n) search for the entry starting at or before the address. The
// index is split into shards by 2 MiB address bucket; an entry is listed in
// the shard of every bucket it touches, so a lookup locks one shard only.
// Changes (misses, invalidation, eviction) lock every shard.
//
// Idle (unreferenced) entries sit on their home shard's LRU list in the
// order they became idle; a lookup does not unlink them (eviction skips
// entries that were referenced again).
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "internal.hpp"

namespace rc {

namespace {

uintptr_t page_size() {
  static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}
uintptr_t page_down(uintptr_t a) { return a & ~(page_size() - 1); }
uintptr_t page_up(uintptr_t a) { return (a + page_size() - 1) & ~(page_size() - 1); }

uint64_t index_key(unsigned klass, uintptr_t start) {
  return (static_cast<uint64_t>(klass) << 48) | start;
}
unsigned klass_of_key(uint64_t key) { return static_cast<unsigned>(key >> 48); }

bool env_disables_monitor() {
  const char *v = getenv("REGCORE_MONITOR");
  return v && (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "none"));
}

// MADV_DONTFORK on cached ranges, as ibv_fork_init() makes rdma-core do for
// every registration, counted so that a range shared by two entries goes
// back to MADV_DOFORK only when the last one is gone.
class ForkGuard {
 public:
  void add(uintptr_t a, uintptr_t b) { advise(a, b, true); }
  void remove(uintptr_t a, uintptr_t b) { advise(a, b, false); }

 private:
  void advise(uintptr_t a, uintptr_t b, bool add) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const AddrRange &r : add ? cov_.add(a, b) : cov_.remove(a, b))
      madvise(reinterpret_cast<void *>(r.start), r.end - r.start, add ? MADV_DONTFORK : MADV_DOFORK);
  }
  std::mutex mu_;
  RangeCoverage cov_;
};

ForkGuard &fork_guard() {
  static ForkGuard *g = new ForkGuard();
  return *g;
}

}  // namespace

struct alignas(64) Cache::Shard {
  SpinLock mu;
  // Recently found entries by page, checked before the tree.
  static constexpr unsigned kLookaside = 256;
  // Written under the lock, read without it (see try_seen): a copy of the
  // entry's range to reject quickly, checked again once referenced.
  struct Seen {
    std::atomic<Entry *> e{nullptr};
    std::atomic<uint32_t> gen{0};
    std::atomic<uintptr_t> start{0}, end{0};
  } seen[kLookaside];
  std::map<uint64_t, Entry *> index;  // index_key(klass, start) -> entry
  Entry *lru_head = nullptr, *lru_tail = nullptr;  // idle entries homed here, oldest first
  uint64_t hits = 0;
};

namespace {
std::atomic<uint64_t> g_cache_uids{0};
}

Cache::Cache() : shards_(new Shard[kShards]), uid_(g_cache_uids.fetch_add(1) + 1) {}

// Entries a thread found lately, by page: a repeated get of the same
// buffer takes one compare-and-swap on the entry, no lock. Each slot says
// which cache it belongs to and where that thread counts its hits there.
struct HitMemo {
  uint64_t cache_uid = 0;
  std::atomic<uint64_t> *hits = nullptr;
  Entry *e = nullptr;
  uint32_t gen = 0;
  uint16_t domain = 0;
  unsigned access = 0;
  uintptr_t start = 0, end = 0;
};

namespace {

constexpr unsigned kThreadMemo = 256;

// Fibonacci hashing of the page number into `slots` (a power of two).
unsigned page_slot(uintptr_t addr, unsigned slots) {
  return static_cast<unsigned>(((addr >> 12) * 0x9e3779b97f4a7c15ull) >> (64 - __builtin_ctz(slots)));
}

// The table is allocated on first use; a small initial-exec TLS pointer
// keeps the lookup one load away (also in the shared library).
thread_local HitMemo *t_memos __attribute__((tls_model("initial-exec"))) = nullptr;
pthread_key_t g_memo_key;

HitMemo *thread_memos() {
  if (HitMemo *m = t_memos) return m;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] { pthread_key_create(&g_memo_key, [](void *p) { delete[] static_cast<HitMemo *>(p); }); });
  t_memos = new HitMemo[kThreadMemo];
  pthread_setspecific(g_memo_key, t_memos);
  return t_memos;
}

}  // namespace

std::atomic<uint64_t> *Cache::thread_hits() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  thread_hits_.push_back(std::make_unique<std::atomic<uint64_t>>(0));
  return thread_hits_.back().get();
}

// The thread's memo for this page (two ways per page slot), if it covers
// the request and its entry is the same incarnation and still indexed: one
// reference more, atomically.
bool Cache::memo_hit(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out) {
  HitMemo *t = t_memos;
  if (!t) return false;
  unsigned set = page_slot(addr, kThreadMemo) & ~1u;
  for (unsigned way = set; way < set + 2; way++) {
    HitMemo &m = t[way];
    if (m.cache_uid != uid_ || !m.e || m.domain != d->index || addr < m.start || addr + len > m.end ||
        (m.access & access) != access)
      continue;
    uint64_t s = m.e->state.load(std::memory_order_relaxed);
    while (gen_of(s) == m.gen && (s & kIndexed))
      if (m.e->state.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        m.hits->store(m.hits->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        *out = m.e;
        return true;
      }
  }
  return false;
}

// Called with a reference held: the entry's fields are stable.
HitMemo &Cache::memo_remember(uintptr_t addr, Entry *e) {
  HitMemo *t = thread_memos();
  unsigned set = page_slot(addr, kThreadMemo) & ~1u;
  t[set + 1] = t[set];  // the older way goes
  HitMemo &m = t[set];
  if (m.cache_uid != uid_) {
    std::atomic<uint64_t> *hits = nullptr;  // this thread's counter here, if another slot has it
    for (unsigned i = 0; i < kThreadMemo && !hits; i++)
      if (t[i].cache_uid == uid_) hits = t[i].hits;
    m.cache_uid = uid_;
    m.hits = hits ? hits : thread_hits();
  }
  m.e = e;
  m.gen = gen_of(e->state.load(std::memory_order_relaxed));
  m.start = e->start;
  m.end = e->end;
  m.access = e->pub.access;
  m.domain = e->domain;
  return m;
}

Cache::~Cache() {
  if (mon_) Monitor::release(mon_);
}

void Cache::init(uint32_t max_entries, uint64_t max_bytes, bool use_monitor, bool fork_protect) {
  max_entries_ = max_entries;
  max_bytes_ = max_bytes;
  fork_protect_ = fork_protect;
  if (!use_monitor || env_disables_monitor()) {
    mon_why_ = "disabled (REGCORE_F_NO_MONITOR or REGCORE_MONITOR=off)";
    return;
  }
  Monitor *m = Monitor::acquire();
  if (!m->active()) {
    mon_why_ = m->status();
    Monitor::release(m);
    return;
  }
  mon_ = m;
  processed_.store(mon_->settle(), std::memory_order_release);
}

const char *Cache::monitor_status() const {
  if (!mon_) return mon_why_;
  return mon_->active() ? mon_->status() : "forked child: the monitor runs in the parent";
}

uint16_t Cache::shards_of(uintptr_t start, uintptr_t end) {
  uintptr_t first = start >> 21, last = (end - 1) >> 21;
  if (last - first + 1 >= kShards) return static_cast<uint16_t>((1u << kShards) - 1);
  uint16_t mask = 0;
  for (uintptr_t b = first; b <= last; b++) mask |= static_cast<uint16_t>(1u << (b % kShards));
  return mask;
}

void Cache::lock_all() {
  for (unsigned i = 0; i < kShards; i++) shards_[i].mu.lock();
}

void Cache::unlock_all() {
  for (unsigned i = kShards; i-- > 0;) shards_[i].mu.unlock();
}

// ------------------------------------------------------------- classes

int Cache::find_class(uint16_t domain, unsigned access) const {
  unsigned n = nclasses_.load(std::memory_order_acquire);
  for (unsigned i = 0; i < n; i++)
    if (classes_[i].domain == domain && classes_[i].access == access) return static_cast<int>(i);
  return -1;
}

int Cache::add_class(uint16_t domain, unsigned access) {
  std::lock_guard<std::mutex> lock(classes_mu_);
  int k = find_class(domain, access);
  if (k >= 0) return k;
  unsigned n = nclasses_.load(std::memory_order_relaxed);
  if (n == kMaxClasses) return fail(ENOSPC, "registration cache: more than %u access classes", kMaxClasses);
  classes_[n] = {domain, access};
  nclasses_.store(n + 1, std::memory_order_release);
  return static_cast<int>(n);
}

// ---------------------------------------------------------------- lookup

// The entry covering [a, b) with at least `access`: the request's own
// class first, then classes with more rights.
Entry *Cache::find_locked(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access) const {
  Shard::Seen &seen = s.seen[page_slot(a, Shard::kLookaside)];
  if (Entry *e = seen.e.load(std::memory_order_relaxed)) {
    uint64_t st = e->state.load(std::memory_order_acquire);
    if (gen_of(st) == seen.gen.load(std::memory_order_relaxed) && (st & kIndexed) && e->domain == domain &&
        e->start <= a && b <= e->end && (e->pub.access & access) == access)
      return e;
  }
  Entry *e = find_in_tree_locked(s, domain, a, b, access);
  if (e) {
    seen.gen.store(gen_of(e->state.load(std::memory_order_relaxed)), std::memory_order_relaxed);
    seen.start.store(e->start, std::memory_order_relaxed);
    seen.end.store(e->end, std::memory_order_relaxed);
    seen.e.store(e, std::memory_order_release);
  }
  return e;
}

// The shard's lookaside without its lock: a reference is taken only on the
// entry's current incarnation while it is indexed, then the range checked
// (the fields are stable once we hold a reference). Entries are never
// freed while the cache lives, so a stale slot only fails.
Entry *Cache::try_seen(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access) {
  Shard::Seen &seen = s.seen[page_slot(a, Shard::kLookaside)];
  Entry *e = seen.e.load(std::memory_order_acquire);
  if (!e || seen.start.load(std::memory_order_relaxed) > a || b > seen.end.load(std::memory_order_relaxed))
    return nullptr;
  uint32_t gen = seen.gen.load(std::memory_order_relaxed);
  uint64_t st = e->state.load(std::memory_order_relaxed);
  for (;;) {
    if (gen_of(st) != gen || !(st & kIndexed)) return nullptr;
    if (e->state.compare_exchange_weak(st, st + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
  }
  if (e->domain == domain && e->start <= a && b <= e->end && (e->pub.access & access) == access) return e;
  put(e);
  return nullptr;
}

Entry *Cache::find_in_tree_locked(Shard &s, uint16_t domain, uintptr_t a, uintptr_t b, unsigned access) const {
  unsigned n = nclasses_.load(std::memory_order_acquire);
  for (int pass = 0; pass < 2; pass++) {
    for (unsigned k = 0; k < n; k++) {
      const Class &c = classes_[k];
      if (c.domain != domain || (c.access & access) != access) continue;
      if ((pass == 0) != (c.access == access)) continue;
      auto it = s.index.upper_bound(index_key(k, a));
      if (it == s.index.begin()) continue;
      --it;
      if (klass_of_key(it->first) != k) continue;
      if (it->second->end >= b) return it->second;
    }
  }
  return nullptr;
}

int Cache::get(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out) {
  if (len == 0) return fail(EINVAL, "regcore_mr_get: zero length");
  if (addr + len < addr) return fail(EINVAL, "regcore_mr_get: range wraps");
  access = normalize_access(access);
  if (!caching_idle()) return miss(d, addr, len, access, out);
  sync();
  if (memo_hit(d, addr, len, access, out)) return 0;
  Shard &s = shards_[shard_of(addr)];
  if (Entry *e = try_seen(s, d->index, addr, addr + len, access)) {
    HitMemo &m = memo_remember(addr, e);
    m.hits->store(m.hits->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    *out = e;
    return 0;
  }
  s.mu.lock();
  if (Entry *e = find_locked(s, d->index, addr, addr + len, access)) {
    e->state.fetch_add(1, std::memory_order_acq_rel);
    s.hits++;
    s.mu.unlock();
    memo_remember(addr, e);
    *out = e;
    return 0;
  }
  s.mu.unlock();
  int err = miss(d, addr, len, access, out);
  if (!err && indexed(*out)) memo_remember(addr, *out);
  return err;
}

// -------------------------------------------------------------- changes

void Cache::collect_overlapping_locked(uintptr_t a, uintptr_t b, int klass,
                                       std::vector<Entry *> &out) const {
  unsigned n = nclasses_.load(std::memory_order_acquire);
  uint16_t mask = shards_of(a, b);
  for (unsigned si = 0; si < kShards; si++) {
    if (!(mask & (1u << si))) continue;
    const Shard &s = shards_[si];
    for (unsigned k = 0; k < n; k++) {
      if (klass >= 0 && k != static_cast<unsigned>(klass)) continue;
      auto it = s.index.upper_bound(index_key(k, a));
      if (it != s.index.begin() && klass_of_key(std::prev(it)->first) == k) --it;
      for (; it != s.index.end() && it->first < index_key(k, b); ++it) {
        Entry *e = it->second;
        if (e->end <= a || e->start >= b) continue;
        if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
      }
    }
  }
}

AddrRange Cache::merge_span_locked(int klass, uintptr_t a, uintptr_t b) const {
  std::vector<Entry *> v;
  collect_overlapping_locked(a, b, klass, v);
  AddrRange u{a, b};
  for (Entry *e : v) {
    u.start = std::min(u.start, e->start);
    u.end = std::max(u.end, e->end);
  }
  return u;
}

bool Cache::overlapping_within_locked(int klass, uintptr_t a, uintptr_t b) const {
  std::vector<Entry *> v;
  collect_overlapping_locked(a, b, klass, v);
  for (Entry *e : v)
    if (e->start < a || e->end > b) return false;
  return true;
}

void Cache::lru_unlink_locked(Entry *e) {
  if (!e->lru_linked) return;
  Shard &h = shards_[e->home];
  (e->lru_prev ? e->lru_prev->lru_next : h.lru_head) = e->lru_next;
  (e->lru_next ? e->lru_next->lru_prev : h.lru_tail) = e->lru_prev;
  e->lru_prev = e->lru_next = nullptr;
  e->lru_linked = false;
}

void Cache::lru_append_locked(Entry *e) {
  Shard &h = shards_[e->home];
  e->lru_prev = h.lru_tail;
  e->lru_next = nullptr;
  (h.lru_tail ? h.lru_tail->lru_next : h.lru_head) = e;
  h.lru_tail = e;
  e->lru_linked = true;
}

// Removes e from the index; it dies now if unreferenced, else on its last put.
void Cache::unindex_locked(Entry *e, std::vector<Entry *> &dead) {
  for (unsigned si = 0; si < kShards; si++)
    if (e->shards & (1u << si)) shards_[si].index.erase(index_key(e->klass, e->start));
  lru_unlink_locked(e);
  uint64_t old = e->state.fetch_and(~kIndexed, std::memory_order_acq_rel);
  if ((old & kRefMask) == 0) dead.push_back(e);
}

// Evicts idle entries, least recently used first, until an entry of `bytes`
// fits. Entries already in `dead` no longer count.
int Cache::make_room_locked(uint64_t bytes, std::vector<Entry *> &dead) {
  uint64_t n = count_.load(std::memory_order_relaxed), used = bytes_.load(std::memory_order_relaxed);
  for (Entry *e : dead) n--, used -= e->end - e->start;
  while (n + 1 > max_entries_ || used + bytes > max_bytes_) {
    Entry *victim = nullptr;
    for (unsigned si = 0; si < kShards; si++) {
      Shard &s = shards_[si];
      while (s.lru_head && (s.lru_head->state.load(std::memory_order_acquire) & kRefMask))
        lru_unlink_locked(s.lru_head);  // referenced again since it went idle
      if (s.lru_head && (!victim || s.lru_head->last_use < victim->last_use)) victim = s.lru_head;
    }
    if (!victim)
      return fail(ENOSPC, "registration cache budget full: %llu entries, %llu bytes, all referenced",
                  static_cast<unsigned long long>(n), static_cast<unsigned long long>(used));
    unindex_locked(victim, dead);
    evictions_++;
    n--;
    used -= victim->end - victim->start;
  }
  return 0;
}

// Indexes a new registration. It stays unindexed (the caller's alone, gone
// at its last put) when nothing watches its memory, memory events since
// `since` touched it, or another thread cached an overlapping range
// meanwhile.
int Cache::insert_locked(Entry *e, uint64_t since, std::vector<Entry *> &dead) {
  bool indexable = e->monitored && caching_idle() && overlapping_within_locked(e->klass, e->start, e->end);
  if (indexable) {
    std::vector<AddrRange> events;
    if (!mon_->ranges(since, processed_.load(std::memory_order_relaxed), events)) indexable = false;
    for (const AddrRange &r : events)
      if (r.start < e->end && e->start < r.end) indexable = false;
  }
  std::vector<Entry *> subsumed;
  if (indexable) collect_overlapping_locked(e->start, e->end, e->klass, subsumed);
  for (Entry *x : subsumed) unindex_locked(x, dead);
  if (int err = make_room_locked(e->end - e->start, dead)) return err;
  count_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(e->end - e->start, std::memory_order_relaxed);
  uint64_t gen = e->state.load(std::memory_order_relaxed) & ~(kIndexed | kRefMask);
  if (!indexable) {
    e->state.store(gen | 1, std::memory_order_release);
    return 0;
  }
  e->shards = shards_of(e->start, e->end);
  for (unsigned si = 0; si < kShards; si++)
    if (e->shards & (1u << si)) shards_[si].index.emplace(index_key(e->klass, e->start), e);
  e->state.store(gen | kIndexed | 1, std::memory_order_release);
  return 0;
}

int Cache::miss(Domain *d, uintptr_t addr, size_t len, unsigned access, Entry **out) {
  int klass = find_class(d->index, access);
  if (klass < 0) klass = add_class(d->index, access);
  if (klass < 0) return klass;
  std::vector<Entry *> dead;
  AddrRange u{page_down(addr), page_up(addr + len)};
  uint64_t since = 0;
  lock_all();
  sync_locked(dead);
  if (caching_idle()) u = merge_span_locked(klass, u.start, u.end);
  since = processed_.load(std::memory_order_relaxed);
  misses_++;
  unlock_all();
  for (Entry *x : dead) destroy(x);
  dead.clear();

  // Watch first: an unmap between registration and indexing is then an event.
  AddrRange registered{0, 0};
  bool watched = caching_idle() && mon_->watch(u.start, u.end, &registered);
  bool guard = fork_protect_;
  if (guard) fork_guard().add(u.start, u.end);
  ibv_mr *mr = ibv_reg_mr(d->pd, reinterpret_cast<void *>(u.start), u.end - u.start,
                          static_cast<int>(access));
  if (!mr) {
    int err = errno ? errno : EIO;
    if (guard) fork_guard().remove(u.start, u.end);
    if (watched) mon_->unwatch(registered.start, registered.end);
    return fail(err, "ibv_reg_mr(%#lx, %lu, %#x) failed: %s", static_cast<unsigned long>(u.start),
                static_cast<unsigned long>(u.end - u.start), access, strerror(err));
  }
  Entry *e = alloc_entry();
  e->pub = {reinterpret_cast<void *>(u.start), u.end - u.start, mr->lkey, mr->rkey, access, mr};
  e->start = u.start;
  e->end = u.end;
  e->klass = static_cast<uint16_t>(klass);
  e->domain = d->index;
  e->shards = 0;
  e->home = static_cast<uint8_t>(shard_of(u.start));
  e->monitored = watched;
  e->watched = registered;
  e->fork_protected = guard;
  e->last_use = 0;

  lock_all();
  sync_locked(dead);
  int err = insert_locked(e, since, dead);
  if (!err && !indexed(e)) unmonitored_++;
  unlock_all();
  for (Entry *x : dead) destroy(x);
  if (err) {
    count_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(e->end - e->start, std::memory_order_relaxed);
    destroy(e);
    return err;
  }
  *out = e;
  return 0;
}

void Cache::put(Entry *e) {
  // Read what we need while the reference keeps the entry ours.
  unsigned home = e->home;
  uint64_t old = e->state.fetch_sub(1, std::memory_order_acq_rel);
  if ((old & kRefMask) != 1) return;
  if (!(old & kIndexed)) {
    destroy(e);
    return;
  }
  uint32_t gen = gen_of(old);
  // A clock, not a count: concurrent puts may read the same value.
  uint64_t now = tick_.load(std::memory_order_relaxed) + 1;
  tick_.store(now, std::memory_order_relaxed);
  Shard &h = shards_[home];
  h.mu.lock();
  if (e->state.load(std::memory_order_acquire) == ((static_cast<uint64_t>(gen) << 32) | kIndexed)) {
    e->last_use = now;
    if (h.lru_tail != e) {  // already the most recently idle: stays in place
      lru_unlink_locked(e);
      lru_append_locked(e);
    }
  }
  h.mu.unlock();
}

void Cache::invalidate(uintptr_t addr, size_t len) {
  if (len == 0 || addr + len < addr) return;
  std::vector<Entry *> dead, hit;
  lock_all();
  sync_locked(dead);
  collect_overlapping_locked(addr, addr + len, -1, hit);
  for (Entry *e : hit) unindex_locked(e, dead);
  unlock_all();
  for (Entry *e : dead) destroy(e);
}

// ------------------------------------------------------- memory events

void Cache::sync_slow() {
  std::vector<Entry *> dead;
  if (!mon_->active()) {  // forked child: stop trusting idle entries, once
    if (fallback_.exchange(true)) return;
    lock_all();
    std::vector<Entry *> all;
    for (unsigned si = 0; si < kShards; si++)
      for (auto &kv : shards_[si].index)
        if (kv.second->home == si) all.push_back(kv.second);
    for (Entry *e : all) unindex_locked(e, dead);
    unlock_all();
    for (Entry *e : dead) destroy(e);
    return;
  }
  mon_->settle();
  lock_all();
  sync_locked(dead);
  unlock_all();
  for (Entry *e : dead) destroy(e);
}

// Applies the published events the cache has not seen.
void Cache::sync_locked(std::vector<Entry *> &dead) {
  if (!mon_ || fallback_.load(std::memory_order_relaxed)) return;
  uint64_t from = processed_.load(std::memory_order_relaxed);
  uint64_t to = mon_->head();
  if (from == to) return;
  std::vector<AddrRange> events;
  std::vector<Entry *> hit;
  if (mon_->ranges(from, to, events)) {
    for (const AddrRange &r : events) collect_overlapping_locked(r.start, r.end, -1, hit);
  } else {  // the log lapped us: drop everything
    for (unsigned si = 0; si < kShards; si++)
      for (auto &kv : shards_[si].index)
        if (kv.second->home == si) hit.push_back(kv.second);
  }
  for (Entry *e : hit) unindex_locked(e, dead);
  monitor_invalidations_ += hit.size();
  processed_.store(to, std::memory_order_release);
}

// ------------------------------------------------------------ lifetime

Entry *Cache::alloc_entry() {
  std::lock_guard<std::mutex> lock(free_mu_);
  if (!free_) {
    constexpr size_t kSlab = 64;
    slabs_.emplace_back(new Entry[kSlab]);
    for (size_t i = 0; i < kSlab; i++) {
      slabs_.back()[i].free_next = free_;
      free_ = &slabs_.back()[i];
    }
  }
  Entry *e = free_;
  free_ = e->free_next;
  return e;
}

// Deregisters a dead entry and recycles it under a new generation.
void Cache::destroy(Entry *e) {
  if (e->pub.ibv_mr) ibv_dereg_mr(e->pub.ibv_mr);
  if (e->fork_protected) fork_guard().remove(e->start, e->end);
  if (e->monitored && mon_) mon_->unwatch(e->watched.start, e->watched.end);
  count_.fetch_sub(1, std::memory_order_relaxed);
  bytes_.fetch_sub(e->end - e->start, std::memory_order_relaxed);
  e->pub = {};
  std::lock_guard<std::mutex> lock(free_mu_);
  uint64_t gen = gen_of(e->state.load(std::memory_order_relaxed)) + 1ull;
  e->state.store(gen << 32, std::memory_order_release);
  e->free_next = free_;
  free_ = e;
}

int Cache::clear() {
  std::vector<Entry *> all, dead;
  lock_all();
  for (unsigned si = 0; si < kShards; si++)
    for (auto &kv : shards_[si].index)
      if (kv.second->home == si) all.push_back(kv.second);  // once: in its home shard
  bool busy = all.size() != count_.load(std::memory_order_relaxed);
  for (Entry *e : all) busy |= (e->state.load(std::memory_order_acquire) & kRefMask) != 0;
  if (!busy)
    for (Entry *e : all) unindex_locked(e, dead);
  unlock_all();
  for (Entry *e : dead) destroy(e);
  return busy ? -EBUSY : 0;
}

void Cache::add_stats(regcore_stats &st) {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    for (auto &h : thread_hits_) st.cache_hits += h->load(std::memory_order_relaxed);
  }
  for (unsigned si = 0; si < kShards; si++) {
    shards_[si].mu.lock();
    st.cache_hits += shards_[si].hits;
    shards_[si].mu.unlock();
  }
  lock_all();
  st.cache_misses += misses_;
  st.cache_evictions += evictions_;
  st.cache_monitor_invalidations += monitor_invalidations_;
  st.cache_unmonitored += unmonitored_;
  unlock_all();
}

}  // namespace rc

using namespace rc;

extern "C" {

int regcore_mr_get_pd(struct regcore *core, struct ibv_pd *pd, void *addr, size_t length,
                      unsigned access, struct regcore_mr **mr) {
  if (!mr) return fail(EINVAL, "regcore_mr_get: NULL argument");
  // Like ibv_reg_mr: NULL and errno on failure, so that code rewritten from
  // `mr = ibv_reg_mr(...); if (!mr) return -errno;` keeps working.
  *mr = nullptr;
  if (!core) return errno = EINVAL, fail(EINVAL, "regcore_mr_get: NULL argument");
  Core *c = core_of(core);
  Domain *d = pd ? c->domain_of(pd) : c->domain(0);
  if (!d) return errno = EINVAL, fail(EINVAL, "regcore_mr_get: PD not added to the core");
  Entry *e = nullptr;
  int err = c->cache.get(d, reinterpret_cast<uintptr_t>(addr), length, access, &e);
  if (err) return errno = -err, err;
  c->ulp_cache_refs.fetch_add(1, std::memory_order_relaxed);
  *mr = &e->pub;
  return 0;
}

int regcore_mr_get(struct regcore *core, void *addr, size_t length, unsigned access,
                   struct regcore_mr **mr) {
  return regcore_mr_get_pd(core, nullptr, addr, length, access, mr);
}

int regcore_mr_put(struct regcore *core, struct regcore_mr *mr) {
  if (!core || !mr) return fail(EINVAL, "regcore_mr_put: NULL argument");
  Core *c = core_of(core);
  auto *e = reinterpret_cast<Entry *>(mr);
  if ((e->state.load(std::memory_order_acquire) & kRefMask) == 0 ||
      c->ulp_cache_refs.load(std::memory_order_relaxed) == 0)
    return fail(EINVAL, "regcore_mr_put: not referenced");
  c->ulp_cache_refs.fetch_sub(1, std::memory_order_relaxed);
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

int regcore_monitor_state(const struct regcore *core, const char **why) {
  if (!core) return fail(EINVAL, "regcore_monitor_state: NULL core");
  const Cache &cache = core_of(core)->cache;
  if (why) *why = cache.monitor_status();
  return cache.caching_idle() ? REGCORE_MONITOR_USERFAULTFD : REGCORE_MONITOR_NONE;
}

}  // extern "C"
