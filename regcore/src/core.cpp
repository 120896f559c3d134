// regcore core: errors, access flags, the policy table, domains, core
// lifetime, QPs sized (or adopted) by the core, registration-object pools
// and completion processing.
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#if REGCORE_HAVE_RDMACM
#include <rdma/rdma_cma.h>
#endif

#include "internal.hpp"

namespace rc {

// ------------------------------------------------------------------ errors

namespace {
thread_local char g_last_error[256];
}

int fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  va_end(ap);
  return -err;
}

// ----------------------------------------------------------- policy table

namespace {

enum class Match { kIwarp, kMlx5dv, kVendorPart, kAny };

// One row per device class, matched in order. This table is the policy;
// docs/regcore.md reproduces it.
struct ClassRow {
  const char *name;
  Match match;
  uint32_t vendor_id;
  uint32_t parts[6];
  const char *match_text;
  regcore_rw_strategy beyond_read;   // READ whose SGE list does not fit one WR
  regcore_rw_strategy beyond_write;  // WRITE whose SGE list does not fit one WR
  bool read_always_mr;               // READ sinks always get a per-context MR
  uint32_t stage_bytes;              // MR_STAGED only up to this size
  const char *why;
};

const ClassRow kClassTable[] = {
    {"iwarp", Match::kIwarp, 0, {}, "transport == IBV_TRANSPORT_IWARP", REGCORE_RW_MR_REG,
     REGCORE_RW_MULTI_WR, true, 0,
     "READ responses are tagged writes into the sink STag: every READ sink gets a private MR "
     "with LOCAL_WRITE|REMOTE_WRITE that is deregistered with the context"},
    {"mlx5", Match::kMlx5dv, 0, {}, "mlx5dv_is_supported() and an indirect mkey can be created",
     REGCORE_RW_INDIRECT, REGCORE_RW_INDIRECT, false, 0,
     "a UMR gathers any SGE list into one indirect mkey: LOCAL_INV + UMR + one RDMA WR"},
    {"mlx4", Match::kVendorPart, 0x02c9, {4099, 4100, 4103, 4104}, "vendor 0x02c9, ConnectX-3 parts",
     REGCORE_RW_MR_STAGED, REGCORE_RW_MR_STAGED, false, 64 * 1024,
     "no UMR; one pre-registered MR per context (data staged) beats extra WRs for small I/O"},
    {"mthca", Match::kVendorPart, 0x02c9, {23108, 25204, 25208, 25218, 24204},
     "vendor 0x02c9, InfiniHost parts", REGCORE_RW_MULTI_WR, REGCORE_RW_MULTI_WR, false, 0,
     "registration is expensive and max_sge_rd small: several RDMA READs"},
    {"generic", Match::kAny, 0, {}, "any other device", REGCORE_RW_MULTI_WR, REGCORE_RW_MULTI_WR,
     false, 0, "exhaust the SGE list, then post more WRs"},
};

bool part_listed(const ClassRow &row, uint32_t part) {
  for (uint32_t p : row.parts)
    if (p && p == part) return true;
  return false;
}

bool row_matches(const ClassRow &row, const Domain *d, bool mlx5dv_ok) {
  const ibv_device_attr &a = d->dev.orig_attr;
  switch (row.match) {
    case Match::kIwarp:
      return d->ctx->device->transport_type == IBV_TRANSPORT_IWARP;
    case Match::kMlx5dv:
      return mlx5dv_ok;
    case Match::kVendorPart:
      return a.vendor_id == row.vendor_id && part_listed(row, a.vendor_part_id);
    case Match::kAny:
      return true;
  }
  return false;
}

uint32_t div_up(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// Worst-case send WRs one context may post on this device: what the kernel
// gets from rdma_rw_init_qp (1 + reg + inv) times rdma_rw_mr_factor.
uint32_t wrs_per_ctx(const regcore_policy &p, bool mw) {
  uint32_t s = p.max_sge_per_ctx;
  uint32_t n = std::max(div_up(s, p.max_sge_read), div_up(s, p.max_sge_write));  // MULTI_WR/MR_REG
  if (p.indirect) n = std::max<uint32_t>(n, 3);  // LOCAL_INV + UMR + RDMA
  if (mw) n = std::max<uint32_t>(n, 2);          // BIND_MW + LOCAL_INV
  return n;
}

const char *const kRwNames[] = {"?", "single_wr", "multi_wr", "mr_staged", "mr_reg", "indirect"};

}  // namespace

// ---------------------------------------------------------------- counters

void Counters::add(const Counters &o) {
  for (int i = 0; i < 6; i++) rw_ctxs[i] += o.rw_ctxs[i];
  for (int i = 0; i < 5; i++) reg_ctxs[i] += o.reg_ctxs[i];
  internal_wcs += o.internal_wcs;
  ulp_wcs += o.ulp_wcs;
  remote_inv_matched += o.remote_inv_matched;
  remote_inv_mismatched += o.remote_inv_mismatched;
  local_invs += o.local_invs;
  sync_invalidations += o.sync_invalidations;
  partial_posts += o.partial_posts;
  eagain += o.eagain;
  cache_hits += o.cache_hits;
}

void Counters::add_to(regcore_stats &st) const {
  for (int i = 0; i < 6; i++) st.rw_ctxs[i] += rw_ctxs[i];
  for (int i = 0; i < 5; i++) st.reg_ctxs[i] += reg_ctxs[i];
  st.internal_wcs += internal_wcs;
  st.ulp_wcs += ulp_wcs;
  st.remote_inv_matched += remote_inv_matched;
  st.remote_inv_mismatched += remote_inv_mismatched;
  st.local_invs += local_invs;
  st.sync_invalidations += sync_invalidations;
  st.partial_posts += partial_posts;
  st.eagain += eagain;
  st.cache_hits += cache_hits;
}

// ------------------------------------------------------------------ QPs

void QpTable::init(size_t max_qps) {
  cap_ = 16;
  while (cap_ < 2 * max_qps + 2) cap_ *= 2;
  keys_.reset(new std::atomic<const ibv_qp *>[cap_]);
  vals_.reset(new std::atomic<QpState *>[cap_]);
  for (size_t i = 0; i < cap_; i++) {
    keys_[i].store(nullptr, std::memory_order_relaxed);
    vals_[i].store(nullptr, std::memory_order_relaxed);
  }
}

void QpTable::insert(QpState *qs) {
  size_t target = cap_;
  for (size_t i = slot(qs->qp), n = 0; n < cap_; i = (i + 1) & (cap_ - 1), n++) {
    const ibv_qp *k = keys_[i].load(std::memory_order_relaxed);
    if (k == qs->qp) {  // the tombstone of an earlier QP at this address
      target = i;
      break;
    }
    if (!k) {
      if (target == cap_) target = i;
      break;
    }
    if (target == cap_ && !vals_[i].load(std::memory_order_relaxed)) target = i;
  }
  if (keys_[target].load(std::memory_order_relaxed) != qs->qp) {
    vals_[target].store(nullptr, std::memory_order_relaxed);
    keys_[target].store(qs->qp, std::memory_order_release);
  }
  vals_[target].store(qs, std::memory_order_release);
  size_++;
}

void QpTable::erase(const ibv_qp *qp) {
  for (size_t i = slot(qp), n = 0; n < cap_; i = (i + 1) & (cap_ - 1), n++) {
    const ibv_qp *k = keys_[i].load(std::memory_order_relaxed);
    if (!k) return;
    if (k == qp && vals_[i].load(std::memory_order_relaxed)) {
      vals_[i].store(nullptr, std::memory_order_release);
      size_--;
      return;
    }
  }
}


Domain *Core::domain_of(const ibv_pd *pd) const {
  unsigned n = ndomains.load(std::memory_order_acquire);
  for (unsigned i = 0; i < n; i++)
    if (domains[i]->pd == pd) return domains[i].get();
  return nullptr;
}

// ----------------------------------------------------------------- pools

namespace {

template <typename T>
T *pop(std::vector<T *> &v) {
  if (v.empty()) return nullptr;
  T *x = v.back();
  v.pop_back();
  return x;
}

void destroy_stage(StageRec *st) {
  if (st->mr) ibv_dereg_mr(st->mr);
  free(st->buf);
  delete st;
}

void destroy_mkey(MkeyRec *mk) {
#if REGCORE_HAVE_MLX5DV
  mlx5dv_destroy_mkey(mk->mkey);
#endif
  delete mk;
}

// Frees one pooled object of any kind; its budget slot goes to the caller.
bool free_one_pooled(Pools &p) {
  if (StageRec *st = pop(p.stages)) return destroy_stage(st), true;
  if (StageRec *st = pop(p.bounces)) return destroy_stage(st), true;
  if (MwRec *mw = pop(p.mws)) return ibv_dealloc_mw(mw->mw), delete mw, true;
  for (auto &v : p.mkeys)
    if (MkeyRec *mk = pop(v)) return destroy_mkey(mk), true;
  return false;
}

void free_pools(Pools &p) {
  while (free_one_pooled(p)) {
  }
}

void move_pools(Pools &from, Pools &to) {
  to.mws.insert(to.mws.end(), from.mws.begin(), from.mws.end());
  for (int i = 0; i < 2; i++) to.mkeys[i].insert(to.mkeys[i].end(), from.mkeys[i].begin(), from.mkeys[i].end());
  to.stages.insert(to.stages.end(), from.stages.begin(), from.stages.end());
  to.bounces.insert(to.bounces.end(), from.bounces.begin(), from.bounces.end());
  from = Pools();
}

// An object of the QP's own pool, else of its domain's.
template <typename T>
T *take(QpState *qs, std::vector<T *> Pools::*list) {
  if (T *x = pop(qs->pool.*list)) return x;
  std::lock_guard<std::mutex> lock(qs->dom->mu);
  return pop(qs->dom->pool.*list);
}

}  // namespace

int acquire_reg_slot(QpState *qs) {
  Core *core = qs->core;
  if (core->reg_objects.fetch_add(1, std::memory_order_relaxed) < core->attr.max_mrs) return 0;
  // Over budget: the slot is ours if a pooled object of any kind goes.
  if (free_one_pooled(qs->pool)) return 0;
  {
    std::lock_guard<std::mutex> lock(qs->dom->mu);
    if (free_one_pooled(qs->dom->pool)) return 0;
  }
  core->reg_objects.fetch_sub(1, std::memory_order_relaxed);
  qs->stats.eagain++;
  return fail(EAGAIN, "registration budget exhausted: max_mrs=%u held", core->attr.max_mrs);
}

void release_reg_slot(Core *core) { core->reg_objects.fetch_sub(1, std::memory_order_relaxed); }

int acquire_mw(QpState *qs, MwRec **out) {
  if ((*out = take(qs, &Pools::mws))) return 0;
  if (int err = acquire_reg_slot(qs)) return err;
  ibv_mw *mw = ibv_alloc_mw(qs->dom->pd, IBV_MW_TYPE_2);
  if (!mw) {
    release_reg_slot(qs->core);
    return fail(errno ? errno : EIO, "ibv_alloc_mw(type 2) failed");
  }
  *out = new MwRec{mw, mw->rkey};
  return 0;
}

// A recycled context's objects go to its QP's pool, or to its domain's
// once the QP is gone.
template <typename F>
void to_pool(Ctx *ctx, F f) {
  if (ctx->qp) {
    f(ctx->qp->pool);
    return;
  }
  std::lock_guard<std::mutex> lock(ctx->dom->mu);
  f(ctx->dom->pool);
}

// kill: the window may still be bound (QP error); freeing it is the
// synchronous invalidation.
void release_mw(Ctx *ctx, MwRec *mw, bool kill) {
  if (!kill) {
    to_pool(ctx, [&](Pools &p) { p.mws.push_back(mw); });
    return;
  }
  ibv_dealloc_mw(mw->mw);
  delete mw;
  release_reg_slot(ctx->core);
}

int acquire_mkey(QpState *qs, bool remote, MkeyRec **out) {
#if REGCORE_HAVE_MLX5DV
  if (MkeyRec *mk = pop(qs->pool.mkeys[remote])) return *out = mk, 0;
  {
    std::lock_guard<std::mutex> lock(qs->dom->mu);
    if (MkeyRec *mk = pop(qs->dom->pool.mkeys[remote])) return *out = mk, 0;
  }
  if (int err = acquire_reg_slot(qs)) return err;
  mlx5dv_mkey_init_attr a{};
  a.pd = qs->dom->pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
                   (remote ? MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE : 0);
  a.max_entries = static_cast<uint16_t>(qs->core->attr.max_sge_per_ctx);
  mlx5dv_mkey *mk = mlx5dv_create_mkey(&a);
  if (!mk) {
    release_reg_slot(qs->core);
    return fail(errno ? errno : EIO, "mlx5dv_create_mkey failed");
  }
  *out = new MkeyRec{mk, false, remote};
  return 0;
#else
  (void)qs;
  (void)remote;
  (void)out;
  return fail(EOPNOTSUPP, "built without mlx5dv");
#endif
}

// reset: the mkey's state is unknown (its chain failed): recreate it
// rather than guess whether it needs a LOCAL_INV.
void release_mkey(Ctx *ctx, MkeyRec *mk, bool reset) {
  if (reset) {
    destroy_mkey(mk);
    release_reg_slot(ctx->core);
    return;
  }
  to_pool(ctx, [&](Pools &p) { p.mkeys[mk->remote].push_back(mk); });
}

// A staging buffer: for rw MR_STAGED (an MR with LOCAL_WRITE), or a bounce
// buffer of a reg context over an SGL (an MR windows bind to, or none when
// each use registers its own).
int acquire_stage(QpState *qs, bool bounce, StageRec **out) {
  if ((*out = take(qs, bounce ? &Pools::bounces : &Pools::stages))) return 0;
  if (int err = acquire_reg_slot(qs)) return err;
  Domain *d = qs->dom;
  uint32_t bytes = bounce ? d->bounce_bytes : d->policy.stage_bytes;
  unsigned access = IBV_ACCESS_LOCAL_WRITE | (bounce ? IBV_ACCESS_MW_BIND : 0);
  void *buf = aligned_alloc(4096, (bytes + 4095) & ~4095u);
  ibv_mr *mr = nullptr;
  if (buf && (!bounce || d->mw_ok)) {
    mr = ibv_reg_mr(d->pd, buf, bytes, static_cast<int>(access));
    if (!mr) {
      free(buf);
      buf = nullptr;
    }
  }
  if (!buf) {
    release_reg_slot(qs->core);
    return fail(ENOMEM, "cannot allocate a staging buffer");
  }
  *out = new StageRec{buf, mr, bytes};
  return 0;
}

void release_stage(Ctx *ctx, StageRec *st, bool bounce) {
  to_pool(ctx, [&](Pools &p) { (bounce ? p.bounces : p.stages).push_back(st); });
}

// --------------------------------------------------------------- contexts

// Chains are reset when posted, runs/wrs/wr_sges refilled by init, and
// resources emptied when the context was recycled; rw fields are set by
// every rw init. A recycled context has no callback owed or running, no
// reserved credits and no chain posted (maybe_recycle waits for all of
// them). What remains is the state a context's calls read before setting
// it; clear_reg() adds what only reg contexts read, so that an rw I/O does
// not touch the reg fields' cache line.
void Ctx::clear_reg() {
  chains[1].state = Chain::kIdle;
  chains[1].status = IBV_WC_SUCCESS;
  reg_rkey = 0;
  reg_addr = 0;
  reg_len = 0;
  remote_access = 0;
  cb = nullptr;
  cb_arg = nullptr;
}

void lock_ctx(Ctx *ctx) {
  if (QpState *qs = ctx->qp)
    qs->mu.lock();
  else
    ctx->core->mu.lock();
}

void unlock_ctx(Ctx *ctx) {
  if (QpState *qs = ctx->qp)
    qs->mu.unlock();
  else
    ctx->core->mu.unlock();
}

// ctx_alloc() without a context in the QP's free list, or over budget.
Ctx *ctx_alloc_slow(QpState *qs, Ctx::Kind kind) {
  Ctx *ctx = qs->ctxs < qs->max_ctxs ? pop(qs->free_ctxs) : nullptr;
  if (!ctx && qs->ctxs < qs->max_ctxs) {
    // Contexts of destroyed QPs that were still alive when this QP was made.
    std::lock_guard<std::mutex> lock(qs->core->ctx_mu);
    ctx = pop(qs->core->free_ctxs);
    if (ctx) qs->owned.push_back(ctx);
  }
  if (!ctx) {
    qs->stats.eagain++;
    fail(EAGAIN, "context budget exhausted: %u of %u in use on this QP", qs->ctxs, qs->max_ctxs);
    return nullptr;
  }
  ctx_setup(ctx, qs, kind);
  return ctx;
}

// A context goes back to the pool once the ULP let go of it, the send
// queue retired everything it posted and no callback of it is pending.
// Called with the context's lock held.
void maybe_recycle(Ctx *ctx) {
  if (ctx->kind == Ctx::kFree || !ctx->ulp_done || ctx->cb_owed || ctx->cb_running) return;
  for (const Chain &c : ctx->chains)
    if (c.state == Chain::kPosted) return;
  if (ctx->kind == Ctx::kReg && ctx->key == Ctx::kKeyLive) return;
  if (ctx->kind == Ctx::kRw)
    rw_release_resources(ctx);
  else
    reg_release_resources(ctx);
  ctx->kind = Ctx::kFree;
  if (QpState *qs = ctx->qp) {
    qs->credits += ctx->reserved_credits;
    ctx->reserved_credits = 0;
    qs->ctxs--;
    qs->free_ctxs.push_back(ctx);
    return;
  }
  Core *core = ctx->core;
  std::lock_guard<std::mutex> lock(core->ctx_mu);
  core->orphan_ctxs--;
  core->free_ctxs.push_back(ctx);
}

// ------------------------------------------------------------ chain FIFO

// The send queue completes in order: a completion for c retires c and every
// chain posted before it on the same QP, including orphans of a partial post.
void retire_through(Chain *c) {
  QpState *qs = c->qp.load(std::memory_order_relaxed);
  Ctx *touched[16];
  size_t n = 0;
  while (qs->head) {
    Chain *h = qs->head;
    qs->head = h->next;
    if (qs->head)
      qs->head->prev = nullptr;
    else
      qs->tail = nullptr;
    h->state = Chain::kRetired;
    h->next = h->prev = nullptr;
    qs->credits += h->credits;
    h->credits = 0;
    if (n == 16) {
      for (Ctx *t : touched) maybe_recycle(t);
      n = 0;
    }
    touched[n++] = h->ctx;
    if (h == c) break;
  }
  for (size_t i = 0; i < n; i++) maybe_recycle(touched[i]);
}

void move_qp_to_error(QpState *qs) {
  qs->error = true;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qs->qp, &a, IBV_QP_STATE);
}

// ------------------------------------------------------------- completions

namespace {

// The chain a wr_id points into, if it is one of ours.
Chain *chain_of(Core *core, uint64_t wr_id) {
  uintptr_t p = static_cast<uintptr_t>(wr_id & ~kRoleMask);
  uintptr_t base = reinterpret_cast<uintptr_t>(core->pool.get());
  if (p < base || p >= base + core->pool_size * sizeof(Ctx)) return nullptr;
  uintptr_t rem = (p - base) % sizeof(Ctx);
  if (rem != core->chain0_off && rem != core->chain1_off) return nullptr;
  return reinterpret_cast<Chain *>(p);
}

}  // namespace

// 1: the ULP's completion (wr_id restored), 0: regcore's. Callbacks that
// became due are appended to `due`; run them once no lock is held.
int process_one(Core *core, ibv_wc *wc, std::vector<DueCallback> &due) {
  Chain *c = chain_of(core, wc->wr_id);
  if (!c) return 1;
  QpState *qs = c->qp.load(std::memory_order_acquire);
  if (!qs) {
    core->loose_internal_wcs.fetch_add(1, std::memory_order_relaxed);  // its QP was destroyed
    return 0;
  }
  qs->mu.lock();
  if (c->qp.load(std::memory_order_relaxed) != qs || c->state != Chain::kPosted ||
      qs->qp->qp_num != wc->qp_num) {
    qs->stats.internal_wcs++;  // stale
    qs->mu.unlock();
    return 0;
  }
  if (wc->status != IBV_WC_SUCCESS) {
    qs->error = true;
    if (c->status == IBV_WC_SUCCESS) c->status = wc->status;
  }
  if ((wc->wr_id & kRoleMask) == kRoleUnsignaled) {
    qs->stats.internal_wcs++;
    // Orphans of a partial post retire once every accepted WR flushed.
    if (!c->has_final && ++c->unsig_cqes >= c->wr_posted) retire_through(c);
    qs->mu.unlock();
    return 0;
  }
  bool visible = c->ulp_visible;
  on_final_completion(c->ctx, c, wc, due);
  retire_through(c);
  (visible ? qs->stats.ulp_wcs : qs->stats.internal_wcs)++;
  qs->mu.unlock();
  return visible ? 1 : 0;
}

void run_callbacks(Core *, std::vector<DueCallback> &due) {
  for (const DueCallback &d : due) {
    d.cb(reinterpret_cast<regcore_reg_ctx *>(d.ctx), 0, d.arg);
    lock_ctx(d.ctx);
    d.ctx->cb_running = false;
    maybe_recycle(d.ctx);
    unlock_ctx(d.ctx);
  }
  due.clear();
}

// ------------------------------------------------------------- domains

namespace {

// Probes optional features by creating one object (kept in the pool).
bool probe_mlx5dv(Core *core, Domain *d) {
#if REGCORE_HAVE_MLX5DV
  if (!mlx5dv_is_supported(d->ctx->device) || core->attr.max_sge_per_ctx > 0xffff) return false;
  mlx5dv_mkey_init_attr a{};
  a.pd = d->pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
  a.max_entries = static_cast<uint16_t>(core->attr.max_sge_per_ctx);
  mlx5dv_mkey *mk = mlx5dv_create_mkey(&a);
  if (!mk) return false;
  core->reg_objects.fetch_add(1, std::memory_order_relaxed);
  d->pool.mkeys[0].push_back(new MkeyRec{mk, false, false});
  return true;
#else
  (void)core;
  (void)d;
  return false;
#endif
}

bool probe_mw(Core *core, Domain *d) {
  const unsigned caps = IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  if ((core->attr.flags & REGCORE_F_NO_MW) || !(d->dev.orig_attr.device_cap_flags & caps)) return false;
  ibv_mw *mw = ibv_alloc_mw(d->pd, IBV_MW_TYPE_2);
  if (!mw) return false;
  core->reg_objects.fetch_add(1, std::memory_order_relaxed);
  d->pool.mws.push_back(new MwRec{mw, mw->rkey});
  return true;
}

void build_policy(Core *core, Domain *d) {
  const ibv_device_attr &a = d->dev.orig_attr;
  regcore_policy &p = d->policy;
  bool mlx5dv_ok = probe_mlx5dv(core, d);
  const ClassRow *row = nullptr;
  for (const ClassRow &r : kClassTable)
    if (row_matches(r, d, mlx5dv_ok)) {
      row = &r;
      break;
    }
  p.device_class = row->name;
  p.transport = d->ctx->device->transport_type;
  p.max_sge_write = static_cast<uint32_t>(std::max(a.max_sge, 1));
  // Like ib_create_qp_kernel: not every device keeps max_send_sge <= max_sge_rd.
  p.max_sge_read = std::min(p.max_sge_write, static_cast<uint32_t>(std::max(a.max_sge_rd, 1)));
  p.max_sge_per_ctx = core->attr.max_sge_per_ctx;
  p.beyond_sge_read = row->beyond_read;
  p.beyond_sge_write = row->beyond_write;
  p.read_always_mr = row->read_always_mr;
  p.indirect = (row->match == Match::kMlx5dv) && mlx5dv_ok;
  d->indirect_ok = p.indirect;
  p.stage_bytes = row->stage_bytes ? (core->attr.stage_bytes ? core->attr.stage_bytes : row->stage_bytes) : 0;
  p.read_sink_access = static_cast<unsigned>(regcore_access_flags_for(p.transport, REGCORE_ROLE_READ_SINK));
  d->mw_ok = probe_mw(core, d);
  p.reg_strategy = d->mw_ok ? REGCORE_REG_MW : REGCORE_REG_MR;
  p.wrs_per_ctx = wrs_per_ctx(p, d->mw_ok);
  d->internal_access = IBV_ACCESS_LOCAL_WRITE | (d->mw_ok ? IBV_ACCESS_MW_BIND : 0);
  d->bounce_bytes = core->attr.stage_bytes ? core->attr.stage_bytes : 64 * 1024;
}

// The policy of a QP that cannot post UMRs (adopted, or created elsewhere).
regcore_policy without_indirect(const Domain *d) {
  regcore_policy p = d->policy;
  if (p.indirect) {
    p.indirect = 0;
    if (p.beyond_sge_read == REGCORE_RW_INDIRECT) p.beyond_sge_read = REGCORE_RW_MULTI_WR;
    if (p.beyond_sge_write == REGCORE_RW_INDIRECT) p.beyond_sge_write = REGCORE_RW_MULTI_WR;
    p.wrs_per_ctx = wrs_per_ctx(p, d->mw_ok);
  }
  return p;
}

int add_domain(Core *core, ibv_pd *pd) {
  unsigned n = core->ndomains.load(std::memory_order_relaxed);
  if (core->domain_of(pd)) return fail(EEXIST, "regcore_add_pd: PD already added");
  if (n == Core::kMaxDomains) return fail(ENOSPC, "regcore_add_pd: at most %u PDs", Core::kMaxDomains);
  auto d = std::make_unique<Domain>();
  d->index = static_cast<uint16_t>(n);
  d->pd = pd;
  d->ctx = pd->context;
  if (int err = ibv_query_device_ex(d->ctx, nullptr, &d->dev)) return fail(err, "ibv_query_device_ex failed");
  build_policy(core, d.get());
  core->domains[n] = std::move(d);
  core->ndomains.store(n + 1, std::memory_order_release);
  return 0;
}

}  // namespace

}  // namespace rc

using namespace rc;

// =========================================================== public API


extern "C" {

const char *regcore_last_error(void) { return g_last_error; }

const char *regcore_strerror(int err) { return strerror(err < 0 ? -err : err); }

int regcore_access_flags_for(enum ibv_transport_type transport, unsigned roles) {
  const unsigned all = REGCORE_ROLE_SEND_SOURCE | REGCORE_ROLE_RECV_SINK | REGCORE_ROLE_READ_SINK |
                       REGCORE_ROLE_REMOTE_READ | REGCORE_ROLE_REMOTE_WRITE |
                       REGCORE_ROLE_REMOTE_ATOMIC | REGCORE_ROLE_MW_BIND;
  if (roles & ~all) return fail(EINVAL, "unknown role bits %#x", roles & ~all);
  unsigned f = 0;  // local read is always granted: sources need nothing
  if (roles & REGCORE_ROLE_RECV_SINK) f |= IBV_ACCESS_LOCAL_WRITE;
  if (roles & REGCORE_ROLE_READ_SINK) {
    f |= IBV_ACCESS_LOCAL_WRITE;
    // iWARP: RDMA READ responses are placed like RDMA WRITEs into the sink.
    if (transport == IBV_TRANSPORT_IWARP) f |= IBV_ACCESS_REMOTE_WRITE;
  }
  if (roles & REGCORE_ROLE_REMOTE_READ) f |= IBV_ACCESS_REMOTE_READ;
  if (roles & REGCORE_ROLE_REMOTE_WRITE) f |= IBV_ACCESS_REMOTE_WRITE;
  if (roles & REGCORE_ROLE_REMOTE_ATOMIC) f |= IBV_ACCESS_REMOTE_ATOMIC;
  if (roles & REGCORE_ROLE_MW_BIND) f |= IBV_ACCESS_MW_BIND;
  // ibv_reg_mr(3): REMOTE_WRITE or REMOTE_ATOMIC require LOCAL_WRITE.
  if (f & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) f |= IBV_ACCESS_LOCAL_WRITE;
  return static_cast<int>(f);
}

int regcore_access_flags(const struct regcore *core, unsigned roles) {
  if (!core) return fail(EINVAL, "regcore_access_flags: NULL core");
  return regcore_access_flags_for(core_of(core)->domain(0)->policy.transport, roles);
}

const char *regcore_rw_strategy_name(enum regcore_rw_strategy s) {
  return s >= REGCORE_RW_SINGLE_WR && s <= REGCORE_RW_INDIRECT ? kRwNames[s] : "?";
}

const char *regcore_reg_strategy_name(enum regcore_reg_strategy s) {
  switch (s) {
    case REGCORE_REG_MW: return "mw";
    case REGCORE_REG_MR: return "mr";
    case REGCORE_REG_INDIRECT: return "indirect";
    case REGCORE_REG_STAGED: return "staged";
  }
  return "?";
}

enum regcore_rw_strategy regcore_policy_decide(const struct regcore_policy *p,
                                               enum regcore_dir dir, unsigned runs,
                                               uint64_t bytes, unsigned flags) {
  return decide(*p, dir, runs, bytes, flags);
}

int regcore_policy_get(const struct regcore *core, struct regcore_policy *out) {
  if (!core || !out) return fail(EINVAL, "regcore_policy_get: NULL argument");
  *out = core_of(core)->domain(0)->policy;
  return 0;
}

int regcore_policy_get_pd(const struct regcore *core, struct ibv_pd *pd, struct regcore_policy *out) {
  if (!core || !pd || !out) return fail(EINVAL, "regcore_policy_get_pd: NULL argument");
  const Domain *d = core_of(core)->domain_of(pd);
  if (!d) return fail(EINVAL, "regcore_policy_get_pd: PD not added to the core");
  *out = d->policy;
  return 0;
}

int regcore_rw_strategy_for(const struct regcore *core, enum regcore_dir dir, const struct ibv_sge *sgl,
                        unsigned nsge, enum regcore_rw_strategy *out) {
  if (!core || !out || (!sgl && nsge)) return fail(EINVAL, "regcore_rw_strategy: NULL argument");
  const Core *c = core_of(core);
  const regcore_policy &policy = c->domain(0)->policy;
  std::vector<ibv_sge> runs;
  uint64_t bytes = 0;
  coalesce(sgl, nsge, runs, &bytes);
  if (runs.empty()) return fail(EINVAL, "empty SGE list");
  if (runs.size() > policy.max_sge_per_ctx)
    return fail(E2BIG, "%zu SGEs exceed max_sge_per_ctx=%u", runs.size(), policy.max_sge_per_ctx);
  *out = regcore_policy_decide(&policy, dir, static_cast<unsigned>(runs.size()), bytes,
                               c->attr.flags);
  return 0;
}

int regcore_policy_describe(const struct regcore *core, char *buf, size_t len) {
  std::string s = "class    match                                                  READ beyond SGEs  WRITE beyond SGEs  READ sink        stage\n";
  char line[512];
  for (const ClassRow &r : kClassTable) {
    snprintf(line, sizeof line, "%-8s %-54s %-17s %-18s %-16s %u\n         why: %s\n", r.name,
             r.match_text, r.read_always_mr ? "mr_reg (always)" : kRwNames[r.beyond_read],
             kRwNames[r.beyond_write], r.read_always_mr ? "LW|RW private" : "LW cached",
             r.stage_bytes, r.why);
    s += line;
  }
  if (core) {
    const regcore_policy &p = core_of(core)->domain(0)->policy;
    snprintf(line, sizeof line,
             "device: class=%s transport=%s max_sge_write=%u max_sge_read=%u max_sge_per_ctx=%u "
             "wrs_per_ctx=%u indirect=%d reg=%s read_sink_access=%#x stage_bytes=%u\n",
             p.device_class, p.transport == IBV_TRANSPORT_IWARP ? "iwarp" : "ib", p.max_sge_write,
             p.max_sge_read, p.max_sge_per_ctx, p.wrs_per_ctx, p.indirect,
             regcore_reg_strategy_name(p.reg_strategy), p.read_sink_access, p.stage_bytes);
    s += line;
  }
  if (buf && len) snprintf(buf, len, "%s", s.c_str());
  return static_cast<int>(s.size());
}


// ------------------------------------------------------------- open/close

// Default registration budget: one object (window, mkey, staging MR) per
// context, or one MR per SGE where contexts may register every run
// (iWARP READ sinks, REGCORE_F_FORCE_MR).
static void apply_defaults(regcore_attr &a, ibv_transport_type transport) {
  if (!a.max_sge_per_ctx) a.max_sge_per_ctx = 16;
  bool mr_per_run = transport == IBV_TRANSPORT_IWARP || (a.flags & REGCORE_F_FORCE_MR);
  if (!a.max_mrs) a.max_mrs = a.max_ctxs * (mr_per_run ? a.max_sge_per_ctx : 1);
  if (!a.cache_max_entries) a.cache_max_entries = 1024;
  if (!a.cache_max_bytes) a.cache_max_bytes = 1ULL << 30;
  if (!a.port_num) a.port_num = 1;
}

int regcore_open(struct ibv_pd *pd, const struct regcore_attr *attr, struct regcore **out) {
  if (!pd || !attr || !out) return fail(EINVAL, "regcore_open: NULL argument");
  if (attr->comp_mask) return fail(EINVAL, "regcore_open: comp_mask must be 0");
  if (attr->max_ctxs == 0) return fail(EINVAL, "regcore_open: max_ctxs must be declared");
  const uint32_t known = REGCORE_F_FORCE_MR | REGCORE_F_NO_MW | REGCORE_F_NO_MONITOR | REGCORE_F_NO_FORK_PROTECT;
  if (attr->flags & ~known) return fail(EINVAL, "regcore_open: unknown flags");
  auto *core = new (std::nothrow) Core();
  if (!core) return fail(ENOMEM, "out of memory");
  core->attr = *attr;
  apply_defaults(core->attr, pd->context->device->transport_type);
  if (int err = add_domain(core, pd)) {
    delete core;
    return err;
  }
  bool fork_protect = !(attr->flags & REGCORE_F_NO_FORK_PROTECT) && ibv_is_fork_initialized() == IBV_FORK_DISABLED;
  core->cache.init(core->attr.cache_max_entries, core->attr.cache_max_bytes,
                   !(attr->flags & REGCORE_F_NO_MONITOR), fork_protect);
  core->qps.init(core->attr.max_ctxs);
  core->pool.reset(new Ctx[core->attr.max_ctxs]);
  core->pool_size = core->attr.max_ctxs;
  core->chain0_off = reinterpret_cast<uintptr_t>(&core->pool[0].chains[0]) -
                     reinterpret_cast<uintptr_t>(&core->pool[0]);
  core->chain1_off = reinterpret_cast<uintptr_t>(&core->pool[0].chains[1]) -
                     reinterpret_cast<uintptr_t>(&core->pool[0]);
  for (size_t i = core->pool_size; i-- > 0;) {
    Ctx &ctx = core->pool[i];
    ctx.core = core;
    ctx.chains[0].ctx = ctx.chains[1].ctx = &ctx;
    core->free_ctxs.push_back(&ctx);
  }
  *out = handle_of(core);
  return 0;
}

int regcore_add_pd(struct regcore *handle, struct ibv_pd *pd) {
  if (!handle || !pd) return fail(EINVAL, "regcore_add_pd: NULL argument");
  Core *core = core_of(handle);
  std::lock_guard<std::mutex> lock(core->mu);
  return add_domain(core, pd);
}

int regcore_close(struct regcore *handle) {
  if (!handle) return fail(EINVAL, "regcore_close: NULL core");
  Core *core = core_of(handle);
  {
    std::lock_guard<std::mutex> lock(core->mu);
    if (core->qps.size()) return fail(EBUSY, "regcore_close: %zu QPs not destroyed", core->qps.size());
    std::lock_guard<std::mutex> lock2(core->ctx_mu);
    if (core->free_ctxs.size() != core->pool_size)
      return fail(EBUSY, "regcore_close: %zu contexts alive", core->pool_size - core->free_ctxs.size());
  }
  if (uint32_t n = core->ulp_cache_refs.load()) return fail(EBUSY, "regcore_close: %u cache references held", n);
  if (core->cache.clear()) return fail(EBUSY, "regcore_close: cache entries referenced");
  for (unsigned i = 0; i < core->ndomains.load(); i++) free_pools(core->domain(i)->pool);
  delete core;
  return 0;
}

int regcore_get_stats(const struct regcore *handle, struct regcore_stats *out) {
  if (!handle || !out) return fail(EINVAL, "regcore_get_stats: NULL argument");
  Core *core = const_cast<Core *>(core_of(handle));
  regcore_stats st{};
  size_t pooled = 0;
  uint32_t ctxs = 0;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    core->retired.add_to(st);
    core->qps.each([&](QpState *qs) {
      qs->mu.lock();
      qs->stats.add_to(st);
      pooled += qs->pool.size();
      ctxs += qs->ctxs;
      qs->mu.unlock();
    });
    for (unsigned i = 0; i < core->ndomains.load(); i++) {
      std::lock_guard<std::mutex> dl(core->domain(i)->mu);
      pooled += core->domain(i)->pool.size();
    }
    std::lock_guard<std::mutex> cl(core->ctx_mu);
    ctxs += core->orphan_ctxs;
  }
  for (auto &stripe : core->cq_stripes) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    st.ulp_wcs += stripe.ulp_wcs;
  }
  st.ulp_wcs += core->loose_ulp_wcs.load(std::memory_order_relaxed);
  st.internal_wcs += core->loose_internal_wcs.load(std::memory_order_relaxed);
  core->cache.add_stats(st);
  st.ctxs_in_use = ctxs;
  st.mrs_in_use = core->reg_objects.load() - static_cast<uint32_t>(pooled);
  *out = st;
  return 0;
}

// -------------------------------------------------------------- QP sizing

int regcore_max_send_wr(const struct regcore *core, uint32_t ulp_send_wr, uint32_t max_rdma_ctxs,
                        uint32_t *out) {
  if (!core || !out) return fail(EINVAL, "regcore_max_send_wr: NULL argument");
  uint64_t total = ulp_send_wr + static_cast<uint64_t>(core_of(core)->domain(0)->policy.wrs_per_ctx) * max_rdma_ctxs;
  if (total > UINT32_MAX) return fail(EOVERFLOW, "send queue size overflows");
  *out = static_cast<uint32_t>(total);
  return 0;
}

namespace {

// What a QP of `ctxs` contexts needs: the total send queue, or a refusal.
int size_send_queue(const Core *core, const Domain *d, const regcore_policy &p, ibv_qp_type type,
                    int sq_sig_all, uint32_t ulp_wr, uint32_t ctxs, uint32_t *total) {
  if (type != IBV_QPT_RC) return fail(EINVAL, "regcore_qp_create: only RC QPs");
  if (sq_sig_all) return fail(EINVAL, "regcore_qp_create: sq_sig_all must be 0 (internal WRs stay unsignaled)");
  if (ctxs == 0) return fail(EINVAL, "regcore_qp_create: max_rdma_ctxs must be declared (> 0)");
  if (core->declared_ctxs + ctxs > core->attr.max_ctxs)
    return fail(ENOSPC, "regcore_qp_create: %u contexts declared + %u exceed max_ctxs=%u",
                core->declared_ctxs, ctxs, core->attr.max_ctxs);
  uint64_t t = ulp_wr + static_cast<uint64_t>(p.wrs_per_ctx) * ctxs;
  if (t > UINT32_MAX) return fail(EOVERFLOW, "send queue size overflows");
  *total = static_cast<uint32_t>(t);
  uint32_t max_qp_wr = static_cast<uint32_t>(d->dev.orig_attr.max_qp_wr);
  if (*total > max_qp_wr)
    return fail(ENOSPC,
                "regcore_qp_create: %u ULP WRs + %u contexts x %u WRs = %u > device max_qp_wr %u "
                "(regcore does not clamp)",
                ulp_wr, ctxs, p.wrs_per_ctx, *total, max_qp_wr);
  return 0;
}

int check_send_cq(const ibv_cq *scq, const ibv_cq *rcq, uint32_t send_wr, uint32_t recv_wr) {
  uint32_t need = send_wr + (scq == rcq ? recv_wr : 0);
  if (static_cast<uint32_t>(scq->cqe) < need)
    return fail(ENOSPC, "regcore_qp_create: send CQ has %d entries, the queue needs %u "
                "(size it with regcore_max_send_wr)", scq->cqe, need);
  return 0;
}

ibv_qp *create_verbs_qp(Domain *d, ibv_qp_init_attr_ex *a) {
#if REGCORE_HAVE_MLX5DV
  if (d->indirect_ok) {
    a->comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a->send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                         IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                         IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV |
                         IBV_QP_EX_WITH_SEND_WITH_INV | (d->mw_ok ? IBV_QP_EX_WITH_BIND_MW : 0);
    // mlx5 needs inline room for UMRs of more than 4 entries.
    if (d->policy.max_sge_per_ctx > 4)
      a->cap.max_inline_data = std::max(a->cap.max_inline_data, 16 * d->policy.max_sge_per_ctx);
    mlx5dv_qp_init_attr dv{};
    dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
    dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;
    return mlx5dv_create_qp(d->ctx, a, &dv);
  }
#endif
  return ibv_create_qp_ex(d->ctx, a);
}

// Makes the QP's state and gives it its contexts. Core::mu held.
QpState *attach_qp(Core *core, Domain *d, ibv_qp *qp, const regcore_policy &p, uint32_t ctxs) {
  auto *qs = new (std::nothrow) QpState();
  if (!qs) return nullptr;
  qs->core = core;
  qs->dom = d;
  qs->qp = qp;
  qs->policy = p;
  qs->max_ctxs = ctxs;
  qs->credits = p.wrs_per_ctx * ctxs;
  {
    std::lock_guard<std::mutex> lock(core->ctx_mu);
    for (uint32_t i = 0; i < ctxs && !core->free_ctxs.empty(); i++) {
      Ctx *c = core->free_ctxs.back();
      core->free_ctxs.pop_back();
      qs->owned.push_back(c);
      qs->free_ctxs.push_back(c);
    }
  }
  core->qps.insert(qs);
  core->declared_ctxs += ctxs;
  return qs;
}

}  // namespace

int regcore_qp_create_ex(struct regcore *handle, struct ibv_qp_init_attr_ex *a,
                         uint32_t max_rdma_ctxs, struct ibv_qp **out) {
  if (!handle || !a || !out) return fail(EINVAL, "regcore_qp_create: NULL argument");
  Core *core = core_of(handle);
  if (!a->send_cq || !a->recv_cq) return fail(EINVAL, "regcore_qp_create: send_cq and recv_cq are required");
  Domain *d = (a->comp_mask & IBV_QP_INIT_ATTR_PD) ? core->domain_of(a->pd) : core->domain(0);
  if (!d) return fail(EINVAL, "regcore_qp_create: the QP must use one of the core's PDs");
  std::lock_guard<std::mutex> lock(core->mu);
  uint32_t total = 0;
  if (int err = size_send_queue(core, d, d->policy, a->qp_type, a->sq_sig_all, a->cap.max_send_wr,
                                max_rdma_ctxs, &total))
    return err;
  if (int err = check_send_cq(a->send_cq, a->recv_cq, total, a->cap.max_recv_wr)) return err;
  ibv_qp_init_attr_ex req = *a;
  req.comp_mask |= IBV_QP_INIT_ATTR_PD;
  req.pd = d->pd;
  req.cap.max_send_wr = total;
  req.cap.max_send_sge = std::max(req.cap.max_send_sge, d->policy.max_sge_write);
  ibv_qp *qp = create_verbs_qp(d, &req);
  if (!qp) return fail(errno ? errno : EIO, "QP creation failed (max_send_wr=%u)", total);
  QpState *qs = attach_qp(core, d, qp, d->policy, max_rdma_ctxs);
  if (!qs) {
    ibv_destroy_qp(qp);
    return fail(ENOMEM, "out of memory");
  }
  if (req.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) qs->qpx = ibv_qp_to_qp_ex(qp);
#if REGCORE_HAVE_MLX5DV
  if (d->indirect_ok && qs->qpx) qs->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(qs->qpx);
#endif
  a->cap = req.cap;
  *out = qp;
  return 0;
}

int regcore_qp_create(struct regcore *handle, struct ibv_qp_init_attr *attr, uint32_t max_rdma_ctxs,
                      struct ibv_qp **out) {
  if (!handle || !attr) return fail(EINVAL, "regcore_qp_create: NULL argument");
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = core_of(handle)->domain(0)->pd;
  int err = regcore_qp_create_ex(handle, &ex, max_rdma_ctxs, out);
  if (!err) attr->cap = ex.cap;
  return err;
}

int regcore_qp_init_attr(const struct regcore *handle, struct ibv_pd *pd, struct ibv_qp_init_attr *attr,
                         uint32_t max_rdma_ctxs) {
  if (!handle || !attr) return fail(EINVAL, "regcore_qp_init_attr: NULL argument");
  Core *core = const_cast<Core *>(core_of(handle));
  const Domain *d = pd ? core->domain_of(pd) : core->domain(0);
  if (!d) return fail(EINVAL, "regcore_qp_init_attr: PD not added to the core");
  regcore_policy p = without_indirect(d);
  uint32_t total = 0;
  std::lock_guard<std::mutex> lock(core->mu);
  if (int err = size_send_queue(core, d, p, attr->qp_type, attr->sq_sig_all, attr->cap.max_send_wr,
                                max_rdma_ctxs, &total))
    return err;
  attr->cap.max_send_wr = total;
  attr->cap.max_send_sge = std::max(attr->cap.max_send_sge, p.max_sge_write);
  return 0;
}

int regcore_qp_adopt(struct regcore *handle, struct ibv_qp *qp, uint32_t max_rdma_ctxs) {
  if (!handle || !qp) return fail(EINVAL, "regcore_qp_adopt: NULL argument");
  Core *core = core_of(handle);
  Domain *d = core->domain_of(qp->pd);
  if (!d) return fail(EINVAL, "regcore_qp_adopt: the QP's PD is not one of the core's (regcore_add_pd)");
  ibv_qp_attr qa{};
  ibv_qp_init_attr ia{};
  if (int err = ibv_query_qp(qp, &qa, IBV_QP_CAP, &ia)) return fail(err, "ibv_query_qp failed");
  regcore_policy p = without_indirect(d);
  std::lock_guard<std::mutex> lock(core->mu);
  if (core->qps.find(qp)) return fail(EEXIST, "regcore_qp_adopt: QP already managed by the core");
  uint32_t own = 0;
  if (int err = size_send_queue(core, d, p, qp->qp_type, ia.sq_sig_all, 0, max_rdma_ctxs, &own)) return err;
  if (qa.cap.max_send_wr < own)
    return fail(ENOSPC, "regcore_qp_adopt: the QP has %u send WRs, %u contexts x %u WRs need %u "
                "(size it with regcore_qp_init_attr)", qa.cap.max_send_wr, max_rdma_ctxs, p.wrs_per_ctx, own);
  if (int err = check_send_cq(qp->send_cq, qp->recv_cq, qa.cap.max_send_wr, qa.cap.max_recv_wr)) return err;
  QpState *qs = attach_qp(core, d, qp, p, max_rdma_ctxs);
  if (!qs) return fail(ENOMEM, "out of memory");
  qs->adopted = true;
  return 0;
}

int regcore_qp_create_cm(struct regcore *handle, struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr,
                         uint32_t max_rdma_ctxs) {
#if REGCORE_HAVE_RDMACM
  if (!handle || !id || !attr) return fail(EINVAL, "regcore_qp_create_cm: NULL argument");
  ibv_pd *pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : id->pd;
  if (!pd) return fail(EINVAL, "regcore_qp_create_cm: no PD (attr->pd or id->pd)");
  ibv_qp_init_attr sized{};
  sized.qp_type = attr->qp_type;
  sized.sq_sig_all = attr->sq_sig_all;
  sized.cap = attr->cap;
  if (int err = regcore_qp_init_attr(handle, pd, &sized, max_rdma_ctxs)) return err;
  ibv_qp_init_attr_ex a = *attr;
  a.comp_mask |= IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  a.cap = sized.cap;
  if (rdma_create_qp_ex(id, &a)) return fail(errno ? errno : EIO, "rdma_create_qp_ex failed");
  if (int err = regcore_qp_adopt(handle, id->qp, max_rdma_ctxs)) {
    rdma_destroy_qp(id);
    return err;
  }
  attr->cap = a.cap;
  return 0;
#else
  (void)handle;
  (void)id;
  (void)attr;
  (void)max_rdma_ctxs;
  return fail(EOPNOTSUPP, "regcore built without librdmacm");
#endif
}

namespace {

// The QP is gone: its contexts keep living until the ULP lets go, under
// the core's lock, and give up the QP memo's references for their own.
void detach_ctx(QpState *qs, Ctx *ctx, std::vector<DueCallback> &due) {
  for (RunRef &r : ctx->refs)
    if (r.slot >= 0) {
      r.e->state.fetch_add(1, std::memory_order_acq_rel);
      qs->memo[r.slot].inflight--;
      r.slot = -1;
    }
  qs->ctxs--;
  ctx->reserved_credits = 0;
  ctx->qp = nullptr;
  ctx->chains[0].qp.store(nullptr, std::memory_order_release);
  ctx->chains[1].qp.store(nullptr, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(qs->core->ctx_mu);
    qs->core->orphan_ctxs++;
  }
  if (ctx->kind == Ctx::kReg && ctx->cb_owed) finish_reg_release(ctx, true, due);
  maybe_recycle(ctx);
}

}  // namespace

int regcore_qp_destroy(struct regcore *handle, struct ibv_qp *qp) {
  if (!handle || !qp) return fail(EINVAL, "regcore_qp_destroy: NULL argument");
  Core *core = core_of(handle);
  std::vector<DueCallback> due;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    QpState *qs = find_qp(core, qp);
    if (!qs) return fail(EINVAL, "regcore_qp_destroy: QP not created by this core");
    qs->mu.lock();
    for (Ctx *ctx : qs->owned)
      if (ctx->kind == Ctx::kRw && ctx->qp == qs && ctx->life == Ctx::kPosted) {
        qs->mu.unlock();
        return fail(EBUSY, "regcore_qp_destroy: a posted context has not completed (drain the CQ)");
      }
    // Keys first: freeing a window or MR does not need the QP.
    for (Ctx *ctx : qs->owned)
      if (ctx->kind == Ctx::kReg && ctx->qp == qs && ctx->key == Ctx::kKeyLive) kill_reg_key_sync(ctx);
    if (!qs->adopted) {
      if (int err = ibv_destroy_qp(qp)) {
        qs->mu.unlock();
        return fail(err, "ibv_destroy_qp failed");
      }
    }
    // Nothing of this QP completes for regcore any more.
    for (Chain *c = qs->head; c; c = c->next) c->state = Chain::kRetired;
    qs->head = qs->tail = nullptr;
    for (Ctx *ctx : qs->owned)
      if (ctx->kind != Ctx::kFree && ctx->qp == qs) detach_ctx(qs, ctx, due);
    memo_clear(qs);
    {
      std::lock_guard<std::mutex> cl(core->ctx_mu);
      core->free_ctxs.insert(core->free_ctxs.end(), qs->free_ctxs.begin(), qs->free_ctxs.end());
    }
    {
      std::lock_guard<std::mutex> dl(qs->dom->mu);
      move_pools(qs->pool, qs->dom->pool);
    }
    core->retired.add(qs->stats);
    core->declared_ctxs -= qs->max_ctxs;
    core->qps.erase(qp);
    qs->mu.unlock();
    delete qs;
  }
  run_callbacks(core, due);
  return 0;
}

// ------------------------------------------------------------- completions

int regcore_process_wc(struct regcore *handle, struct ibv_wc *wc) {
  if (!handle || !wc) return fail(EINVAL, "regcore_process_wc: NULL argument");
  Core *core = core_of(handle);
  std::vector<DueCallback> due;
  int r = process_one(core, wc, due);
  if (r == 1 && !chain_of(core, wc->wr_id)) core->loose_ulp_wcs.fetch_add(1, std::memory_order_relaxed);
  run_callbacks(core, due);
  return r;
}

int regcore_poll_cq(struct regcore *handle, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
  if (!handle || !cq || num_entries < 0 || (!wc && num_entries))
    return fail(EINVAL, "regcore_poll_cq: bad argument");
  Core *core = core_of(handle);
  auto &stripe = core->cq_stripes[(reinterpret_cast<uintptr_t>(cq) >> 6) % Core::kCqStripes];
  std::vector<DueCallback> due;
  int kept = 0;
  bool poll_failed = false;
  {
    std::lock_guard<std::mutex> lock(stripe.mu);
    // Keep polling while internal completions made room, so a return of 0
    // means the CQ is empty.
    while (kept < num_entries) {
      int n = ibv_poll_cq(cq, num_entries - kept, wc + kept);
      if (n < 0) poll_failed = true;
      if (n <= 0) break;
      int got = 0;
      for (int i = 0; i < n; i++) {
        ibv_wc w = wc[kept + i];
        bool ours = chain_of(core, w.wr_id) != nullptr;
        if (process_one(core, &w, due)) {
          wc[kept + got++] = w;
          if (!ours) stripe.ulp_wcs++;
        }
      }
      kept += got;
    }
  }
  run_callbacks(core, due);
  if (poll_failed && kept == 0) return fail(EIO, "ibv_poll_cq failed");
  return kept;
}

}  // extern "C"
