// regcore core: errors, access flags, the policy table, core lifetime,
// QPs sized by the core, registration-object pools and completion
// processing.
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

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

bool row_matches(const ClassRow &row, const Core *core, bool mlx5dv_ok) {
  const ibv_device_attr &a = core->dev.orig_attr;
  switch (row.match) {
    case Match::kIwarp:
      return core->ctx->device->transport_type == IBV_TRANSPORT_IWARP;
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

// ----------------------------------------------------------------- pools

int acquire_reg_slot(Core *core) {
  if (core->reg_objects < core->attr.max_mrs) {
    core->reg_objects++;
    return 0;
  }
  // Make room by freeing a pooled object of any kind.
  if (!core->free_stages.empty()) {
    StageRec *st = core->free_stages.back();
    core->free_stages.pop_back();
    ibv_dereg_mr(st->mr);
    free(st->buf);
    delete st;
    return 0;
  }
  if (!core->free_mws.empty()) {
    MwRec *mw = core->free_mws.back();
    core->free_mws.pop_back();
    ibv_dealloc_mw(mw->mw);
    delete mw;
    return 0;
  }
#if REGCORE_HAVE_MLX5DV
  if (!core->free_mkeys.empty()) {
    MkeyRec *mk = core->free_mkeys.back();
    core->free_mkeys.pop_back();
    mlx5dv_destroy_mkey(mk->mkey);
    delete mk;
    return 0;
  }
#endif
  core->stats.eagain++;
  return fail(EAGAIN, "registration budget exhausted: max_mrs=%u held", core->attr.max_mrs);
}

void release_reg_slot(Core *core) { core->reg_objects--; }

int acquire_mw(Core *core, MwRec **out) {
  if (!core->free_mws.empty()) {
    *out = core->free_mws.back();
    core->free_mws.pop_back();
    return 0;
  }
  if (int err = acquire_reg_slot(core)) return err;
  ibv_mw *mw = ibv_alloc_mw(core->pd, IBV_MW_TYPE_2);
  if (!mw) {
    release_reg_slot(core);
    return fail(errno ? errno : EIO, "ibv_alloc_mw(type 2) failed");
  }
  *out = new MwRec{mw, mw->rkey};
  return 0;
}

// kill: the window may still be bound (QP error); freeing it is the
// synchronous invalidation.
void release_mw(Core *core, MwRec *mw, bool kill) {
  if (!kill) {
    core->free_mws.push_back(mw);
    return;
  }
  ibv_dealloc_mw(mw->mw);
  delete mw;
  release_reg_slot(core);
}

int acquire_mkey(Core *core, MkeyRec **out) {
#if REGCORE_HAVE_MLX5DV
  if (!core->free_mkeys.empty()) {
    *out = core->free_mkeys.back();
    core->free_mkeys.pop_back();
    return 0;
  }
  if (int err = acquire_reg_slot(core)) return err;
  mlx5dv_mkey_init_attr a{};
  a.pd = core->pd;
  a.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
  a.max_entries = static_cast<uint16_t>(core->attr.max_sge_per_ctx);
  mlx5dv_mkey *mk = mlx5dv_create_mkey(&a);
  if (!mk) {
    release_reg_slot(core);
    return fail(errno ? errno : EIO, "mlx5dv_create_mkey failed");
  }
  *out = new MkeyRec{mk, false};
  return 0;
#else
  (void)core;
  (void)out;
  return fail(EOPNOTSUPP, "built without mlx5dv");
#endif
}

// reset: the mkey's state is unknown (its chain failed): recreate it
// rather than guess whether it needs a LOCAL_INV.
void release_mkey(Core *core, MkeyRec *mk, bool reset) {
#if REGCORE_HAVE_MLX5DV
  if (reset) {
    mlx5dv_destroy_mkey(mk->mkey);
    delete mk;
    release_reg_slot(core);
    return;
  }
#endif
  (void)reset;
  core->free_mkeys.push_back(mk);
}

int acquire_stage(Core *core, StageRec **out) {
  if (!core->free_stages.empty()) {
    *out = core->free_stages.back();
    core->free_stages.pop_back();
    return 0;
  }
  if (int err = acquire_reg_slot(core)) return err;
  void *buf = aligned_alloc(4096, core->policy.stage_bytes);
  ibv_mr *mr = buf ? ibv_reg_mr(core->pd, buf, core->policy.stage_bytes, IBV_ACCESS_LOCAL_WRITE)
                   : nullptr;
  if (!mr) {
    free(buf);
    release_reg_slot(core);
    return fail(ENOMEM, "cannot allocate a staging MR");
  }
  *out = new StageRec{buf, mr};
  return 0;
}

void release_stage(Core *core, StageRec *st) { core->free_stages.push_back(st); }

// --------------------------------------------------------------- contexts

void Ctx::clear_for_reuse() {
  life = kInit;
  ulp_done = false;
  chains[0].reset();
  chains[1].reset();
  nwr = reserved_credits = 0;
  cache_refs.clear();
  own_mrs.clear();
  mkey = nullptr;
  stage = nullptr;
  mw = nullptr;
  runs.clear();
  wr_sges.clear();
  wrs.clear();
  remote_addr = bytes = 0;
  rkey = reg_rkey = 0;
  key = kNoKey;
  reg_addr = nullptr;
  reg_len = 0;
  remote_access = 0;
  cb_owed = false;
  cb = nullptr;
  cb_arg = nullptr;
}

QpState *find_qp(Core *core, ibv_qp *qp) {
  auto it = core->qps.find(qp);
  return it == core->qps.end() ? nullptr : it->second;
}

Ctx *ctx_alloc(Core *core, QpState *qs, Ctx::Kind kind) {
  if (qs->ctxs >= qs->max_ctxs || core->free_ctxs.empty()) {
    core->stats.eagain++;
    fail(EAGAIN, "context budget exhausted: %u of %u on this QP, %zu free in the core", qs->ctxs,
         qs->max_ctxs, core->free_ctxs.size());
    return nullptr;
  }
  Ctx *ctx = core->free_ctxs.back();
  core->free_ctxs.pop_back();
  ctx->clear_for_reuse();
  ctx->kind = kind;
  ctx->qp = qs;
  ctx->chains[0].qp = ctx->chains[1].qp = qs;
  qs->ctxs++;
  core->stats.ctxs_in_use++;
  return ctx;
}

// A context goes back to the pool once the ULP let go of it and the send
// queue retired everything it posted.
void maybe_recycle(Ctx *ctx) {
  if (ctx->kind == Ctx::kFree || !ctx->ulp_done || ctx->cb_owed) return;
  for (const Chain &c : ctx->chains)
    if (c.state == Chain::kPosted) return;
  if (ctx->kind == Ctx::kReg && ctx->key == Ctx::kKeyLive) return;
  Core *core = ctx->core;
  if (ctx->kind == Ctx::kRw)
    rw_release_resources(ctx);
  else
    reg_release_resources(ctx);
  if (ctx->qp) {
    ctx->qp->credits += ctx->reserved_credits;
    ctx->qp->ctxs--;
  }
  ctx->reserved_credits = 0;
  ctx->kind = Ctx::kFree;
  core->stats.ctxs_in_use--;
  core->free_ctxs.push_back(ctx);
}

// ------------------------------------------------------------ chain FIFO

void fifo_append(QpState *qs, Chain *c) {
  c->state = Chain::kPosted;
  c->prev = qs->tail;
  c->next = nullptr;
  if (qs->tail)
    qs->tail->next = c;
  else
    qs->head = c;
  qs->tail = c;
}

// The send queue completes in order: a completion for c retires c and every
// chain posted before it on the same QP, including orphans of a partial post.
void retire_through(Chain *c) {
  QpState *qs = c->qp;
  std::vector<Ctx *> touched;
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
    touched.push_back(h->ctx);
    if (h == c) break;
  }
  for (Ctx *ctx : touched) maybe_recycle(ctx);
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
  uintptr_t base = reinterpret_cast<uintptr_t>(core->pool.data());
  if (p < base || p >= base + core->pool.size() * sizeof(Ctx)) return nullptr;
  uintptr_t rem = (p - base) % sizeof(Ctx);
  if (rem != core->chain0_off && rem != core->chain1_off) return nullptr;
  return reinterpret_cast<Chain *>(p);
}

int process_one(Core *core, ibv_wc *wc) {
  Chain *c = chain_of(core, wc->wr_id);
  if (!c) {
    core->stats.ulp_wcs++;
    return 1;
  }
  if (c->state != Chain::kPosted || !c->qp || c->qp->qp->qp_num != wc->qp_num) {
    core->stats.internal_wcs++;  // stale: its QP was destroyed
    return 0;
  }
  if (wc->status != IBV_WC_SUCCESS) {
    c->qp->error = true;
    if (c->status == IBV_WC_SUCCESS) c->status = wc->status;
  }
  if ((wc->wr_id & kRoleMask) == kRoleUnsignaled) {
    core->stats.internal_wcs++;
    // Orphans of a partial post retire once every accepted WR flushed.
    if (!c->has_final && ++c->unsig_cqes >= c->wr_posted) retire_through(c);
    return 0;
  }
  bool visible = c->ulp_visible;
  Ctx *ctx = c->ctx;
  on_final_completion(ctx, c, wc);
  retire_through(c);
  (visible ? core->stats.ulp_wcs : core->stats.internal_wcs)++;
  return visible ? 1 : 0;
}

}  // namespace

// ------------------------------------------------------------- coalescing

void coalesce(const ibv_sge *sgl, unsigned nsge, std::vector<ibv_sge> &runs, uint64_t *bytes) {
  runs.clear();
  uint64_t total = 0;
  for (unsigned i = 0; i < nsge; i++) {
    if (sgl[i].length == 0) continue;
    total += sgl[i].length;
    if (!runs.empty()) {
      ibv_sge &last = runs.back();
      if (last.lkey == sgl[i].lkey && last.addr + last.length == sgl[i].addr &&
          static_cast<uint64_t>(last.length) + sgl[i].length <= UINT32_MAX) {
        last.length += sgl[i].length;
        continue;
      }
    }
    runs.push_back(sgl[i]);
  }
  *bytes = total;
}

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
  return regcore_access_flags_for(core_of(core)->policy.transport, roles);
}

const char *regcore_rw_strategy_name(enum regcore_rw_strategy s) {
  return s >= REGCORE_RW_SINGLE_WR && s <= REGCORE_RW_INDIRECT ? kRwNames[s] : "?";
}

const char *regcore_reg_strategy_name(enum regcore_reg_strategy s) {
  return s == REGCORE_REG_MW ? "mw" : s == REGCORE_REG_MR ? "mr" : "?";
}

enum regcore_rw_strategy regcore_policy_decide(const struct regcore_policy *p,
                                               enum regcore_dir dir, unsigned runs,
                                               uint64_t bytes, unsigned flags) {
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

int regcore_policy_get(const struct regcore *core, struct regcore_policy *out) {
  if (!core || !out) return fail(EINVAL, "regcore_policy_get: NULL argument");
  *out = core_of(core)->policy;
  return 0;
}

int regcore_rw_strategy_for(const struct regcore *core, enum regcore_dir dir, const struct ibv_sge *sgl,
                        unsigned nsge, enum regcore_rw_strategy *out) {
  if (!core || !out || (!sgl && nsge)) return fail(EINVAL, "regcore_rw_strategy: NULL argument");
  const Core *c = core_of(core);
  std::vector<ibv_sge> runs;
  uint64_t bytes = 0;
  coalesce(sgl, nsge, runs, &bytes);
  if (runs.empty()) return fail(EINVAL, "empty SGE list");
  if (runs.size() > c->policy.max_sge_per_ctx)
    return fail(E2BIG, "%zu SGEs exceed max_sge_per_ctx=%u", runs.size(), c->policy.max_sge_per_ctx);
  *out = regcore_policy_decide(&c->policy, dir, static_cast<unsigned>(runs.size()), bytes,
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
    const regcore_policy &p = core_of(core)->policy;
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

// Probes optional features by creating one object (kept in the pool).
static bool probe_mlx5dv(Core *core) {
#if REGCORE_HAVE_MLX5DV
  if (!mlx5dv_is_supported(core->ctx->device) || core->attr.max_sge_per_ctx > 0xffff) return false;
  MkeyRec *mk = nullptr;
  if (acquire_mkey(core, &mk)) return false;
  release_mkey(core, mk, false);
  return true;
#else
  (void)core;
  return false;
#endif
}

static bool probe_mw(Core *core) {
  const unsigned caps = IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  if ((core->attr.flags & REGCORE_F_NO_MW) || !(core->dev.orig_attr.device_cap_flags & caps))
    return false;
  MwRec *mw = nullptr;
  if (acquire_mw(core, &mw)) return false;
  release_mw(core, mw, false);
  return true;
}

static int build_policy(Core *core) {
  const ibv_device_attr &a = core->dev.orig_attr;
  regcore_policy &p = core->policy;
  bool mlx5dv_ok = probe_mlx5dv(core);
  const ClassRow *row = nullptr;
  for (const ClassRow &r : kClassTable)
    if (row_matches(r, core, mlx5dv_ok)) {
      row = &r;
      break;
    }
  p.device_class = row->name;
  p.transport = core->ctx->device->transport_type;
  p.max_sge_write = static_cast<uint32_t>(std::max(a.max_sge, 1));
  // Like ib_create_qp_kernel: not every device keeps max_send_sge <= max_sge_rd.
  p.max_sge_read = std::min(p.max_sge_write, static_cast<uint32_t>(std::max(a.max_sge_rd, 1)));
  p.max_sge_per_ctx = core->attr.max_sge_per_ctx;
  p.beyond_sge_read = row->beyond_read;
  p.beyond_sge_write = row->beyond_write;
  p.read_always_mr = row->read_always_mr;
  p.indirect = (row->match == Match::kMlx5dv) && mlx5dv_ok;
  core->indirect_ok = p.indirect;
  p.stage_bytes = row->stage_bytes ? (core->attr.stage_bytes ? core->attr.stage_bytes : row->stage_bytes) : 0;
  p.read_sink_access = static_cast<unsigned>(regcore_access_flags_for(p.transport, REGCORE_ROLE_READ_SINK));
  core->mw_ok = probe_mw(core);
  p.reg_strategy = core->mw_ok ? REGCORE_REG_MW : REGCORE_REG_MR;
  p.wrs_per_ctx = wrs_per_ctx(p, core->mw_ok);
  core->internal_access = IBV_ACCESS_LOCAL_WRITE | (core->mw_ok ? IBV_ACCESS_MW_BIND : 0);
  return 0;
}

static void free_pools(Core *core) {
  for (MwRec *mw : core->free_mws) ibv_dealloc_mw(mw->mw), delete mw;
#if REGCORE_HAVE_MLX5DV
  for (MkeyRec *mk : core->free_mkeys) mlx5dv_destroy_mkey(mk->mkey), delete mk;
#endif
  for (StageRec *st : core->free_stages) ibv_dereg_mr(st->mr), free(st->buf), delete st;
  core->free_mws.clear();
  core->free_mkeys.clear();
  core->free_stages.clear();
}

int regcore_open(struct ibv_pd *pd, const struct regcore_attr *attr, struct regcore **out) {
  if (!pd || !attr || !out) return fail(EINVAL, "regcore_open: NULL argument");
  if (attr->comp_mask) return fail(EINVAL, "regcore_open: comp_mask must be 0");
  if (attr->max_ctxs == 0) return fail(EINVAL, "regcore_open: max_ctxs must be declared");
  if (attr->flags & ~static_cast<uint32_t>(REGCORE_F_FORCE_MR | REGCORE_F_NO_MW))
    return fail(EINVAL, "regcore_open: unknown flags");
  auto *core = new (std::nothrow) Core();
  if (!core) return fail(ENOMEM, "out of memory");
  core->pd = pd;
  core->ctx = pd->context;
  core->attr = *attr;
  apply_defaults(core->attr, core->ctx->device->transport_type);
  if (int err = ibv_query_device_ex(core->ctx, nullptr, &core->dev)) {
    delete core;
    return fail(err, "ibv_query_device_ex failed");
  }
  build_policy(core);
  core->cache.init(pd, core->attr.cache_max_entries, core->attr.cache_max_bytes);
  core->pool.resize(core->attr.max_ctxs);
  core->chain0_off = reinterpret_cast<uintptr_t>(&core->pool[0].chains[0]) -
                     reinterpret_cast<uintptr_t>(&core->pool[0]);
  core->chain1_off = reinterpret_cast<uintptr_t>(&core->pool[0].chains[1]) -
                     reinterpret_cast<uintptr_t>(&core->pool[0]);
  for (size_t i = core->pool.size(); i-- > 0;) {
    Ctx &ctx = core->pool[i];
    ctx.core = core;
    ctx.chains[0].ctx = ctx.chains[1].ctx = &ctx;
    core->free_ctxs.push_back(&ctx);
  }
  *out = handle_of(core);
  return 0;
}

int regcore_close(struct regcore *handle) {
  if (!handle) return fail(EINVAL, "regcore_close: NULL core");
  Core *core = core_of(handle);
  if (core->free_ctxs.size() != core->pool.size())
    return fail(EBUSY, "regcore_close: %zu contexts alive", core->pool.size() - core->free_ctxs.size());
  if (!core->qps.empty()) return fail(EBUSY, "regcore_close: %zu QPs not destroyed", core->qps.size());
  if (core->ulp_cache_refs) return fail(EBUSY, "regcore_close: %u cache references held", core->ulp_cache_refs);
  if (core->cache.clear()) return fail(EBUSY, "regcore_close: cache entries referenced");
  free_pools(core);
  delete core;
  return 0;
}

int regcore_get_stats(const struct regcore *core, struct regcore_stats *out) {
  if (!core || !out) return fail(EINVAL, "regcore_get_stats: NULL argument");
  const Core *c = core_of(core);
  *out = c->stats;
  out->mrs_in_use = c->reg_objects - static_cast<uint32_t>(c->free_mws.size() + c->free_mkeys.size() +
                                                           c->free_stages.size());
  return 0;
}

// -------------------------------------------------------------- QP sizing

int regcore_max_send_wr(const struct regcore *core, uint32_t ulp_send_wr, uint32_t max_rdma_ctxs,
                        uint32_t *out) {
  if (!core || !out) return fail(EINVAL, "regcore_max_send_wr: NULL argument");
  uint64_t total = ulp_send_wr + static_cast<uint64_t>(core_of(core)->policy.wrs_per_ctx) * max_rdma_ctxs;
  if (total > UINT32_MAX) return fail(EOVERFLOW, "send queue size overflows");
  *out = static_cast<uint32_t>(total);
  return 0;
}

static int check_qp_request(Core *core, const ibv_qp_init_attr_ex *a, uint32_t ctxs, uint32_t *total) {
  if (!a->send_cq || !a->recv_cq) return fail(EINVAL, "regcore_qp_create: send_cq and recv_cq are required");
  if (a->qp_type != IBV_QPT_RC) return fail(EINVAL, "regcore_qp_create: only RC QPs");
  if (a->sq_sig_all)
    return fail(EINVAL, "regcore_qp_create: sq_sig_all must be 0 (internal WRs stay unsignaled)");
  if (ctxs == 0) return fail(EINVAL, "regcore_qp_create: max_rdma_ctxs must be declared (> 0)");
  if ((a->comp_mask & IBV_QP_INIT_ATTR_PD) && a->pd != core->pd)
    return fail(EINVAL, "regcore_qp_create: the QP must use the core's PD");
  if (core->declared_ctxs + ctxs > core->attr.max_ctxs)
    return fail(ENOSPC, "regcore_qp_create: %u contexts declared + %u exceed max_ctxs=%u",
                core->declared_ctxs, ctxs, core->attr.max_ctxs);
  if (int err = regcore_max_send_wr(handle_of(core), a->cap.max_send_wr, ctxs, total)) return err;
  uint32_t max_qp_wr = static_cast<uint32_t>(core->dev.orig_attr.max_qp_wr);
  if (*total > max_qp_wr)
    return fail(ENOSPC,
                "regcore_qp_create: %u ULP WRs + %u contexts x %u WRs = %u > device max_qp_wr %u "
                "(regcore does not clamp)",
                a->cap.max_send_wr, ctxs, core->policy.wrs_per_ctx, *total, max_qp_wr);
  uint32_t cq_need = *total + (a->send_cq == a->recv_cq ? a->cap.max_recv_wr : 0);
  if (static_cast<uint32_t>(a->send_cq->cqe) < cq_need)
    return fail(ENOSPC, "regcore_qp_create: send CQ has %d entries, the queue needs %u "
                "(size it with regcore_max_send_wr)", a->send_cq->cqe, cq_need);
  return 0;
}

static ibv_qp *create_verbs_qp(Core *core, ibv_qp_init_attr_ex *a) {
#if REGCORE_HAVE_MLX5DV
  if (core->indirect_ok) {
    a->comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a->send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                         IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                         IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV |
                         IBV_QP_EX_WITH_SEND_WITH_INV | (core->mw_ok ? IBV_QP_EX_WITH_BIND_MW : 0);
    // mlx5 needs inline room for UMRs of more than 4 entries.
    if (core->policy.max_sge_per_ctx > 4)
      a->cap.max_inline_data = std::max(a->cap.max_inline_data, 16 * core->policy.max_sge_per_ctx);
    mlx5dv_qp_init_attr dv{};
    dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
    dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_LIST;
    return mlx5dv_create_qp(core->ctx, a, &dv);
  }
#endif
  return ibv_create_qp_ex(core->ctx, a);
}

int regcore_qp_create_ex(struct regcore *handle, struct ibv_qp_init_attr_ex *a,
                         uint32_t max_rdma_ctxs, struct ibv_qp **out) {
  if (!handle || !a || !out) return fail(EINVAL, "regcore_qp_create: NULL argument");
  Core *core = core_of(handle);
  uint32_t total = 0;
  if (int err = check_qp_request(core, a, max_rdma_ctxs, &total)) return err;
  ibv_qp_init_attr_ex req = *a;
  req.comp_mask |= IBV_QP_INIT_ATTR_PD;
  req.pd = core->pd;
  req.cap.max_send_wr = total;
  req.cap.max_send_sge = std::max(req.cap.max_send_sge, core->policy.max_sge_write);
  ibv_qp *qp = create_verbs_qp(core, &req);
  if (!qp) return fail(errno ? errno : EIO, "QP creation failed (max_send_wr=%u)", total);
  auto *qs = new (std::nothrow) QpState();
  if (!qs) {
    ibv_destroy_qp(qp);
    return fail(ENOMEM, "out of memory");
  }
  qs->qp = qp;
  qs->max_ctxs = max_rdma_ctxs;
  qs->credits = core->policy.wrs_per_ctx * max_rdma_ctxs;
  if (req.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) qs->qpx = ibv_qp_to_qp_ex(qp);
#if REGCORE_HAVE_MLX5DV
  if (core->indirect_ok && qs->qpx) qs->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(qs->qpx);
#endif
  core->qps[qp] = qs;
  core->declared_ctxs += max_rdma_ctxs;
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
  ex.pd = core_of(handle)->pd;
  int err = regcore_qp_create_ex(handle, &ex, max_rdma_ctxs, out);
  if (!err) attr->cap = ex.cap;
  return err;
}

int regcore_qp_destroy(struct regcore *handle, struct ibv_qp *qp) {
  if (!handle || !qp) return fail(EINVAL, "regcore_qp_destroy: NULL argument");
  Core *core = core_of(handle);
  QpState *qs = find_qp(core, qp);
  if (!qs) return fail(EINVAL, "regcore_qp_destroy: QP not created by this core");
  for (Ctx &ctx : core->pool)
    if (ctx.kind == Ctx::kRw && ctx.qp == qs && ctx.life == Ctx::kPosted)
      return fail(EBUSY, "regcore_qp_destroy: a posted context has not completed (drain the CQ)");
  // Keys first: freeing a window or MR does not need the QP.
  for (Ctx &ctx : core->pool)
    if (ctx.kind == Ctx::kReg && ctx.qp == qs && ctx.key == Ctx::kKeyLive) kill_reg_key_sync(&ctx);
  if (int err = ibv_destroy_qp(qp)) return fail(err, "ibv_destroy_qp failed");
  // Nothing of this QP will complete any more.
  for (Chain *c = qs->head; c; c = c->next) c->state = Chain::kRetired;
  qs->head = qs->tail = nullptr;
  for (Ctx &ctx : core->pool) {
    if (ctx.kind == Ctx::kFree || ctx.qp != qs) continue;
    ctx.qp->ctxs--;
    ctx.reserved_credits = 0;
    ctx.qp = nullptr;
    ctx.chains[0].qp = ctx.chains[1].qp = nullptr;
    if (ctx.kind == Ctx::kReg && ctx.cb_owed) finish_reg_release(&ctx, true);
    maybe_recycle(&ctx);
  }
  core->declared_ctxs -= qs->max_ctxs;
  core->qps.erase(qp);
  delete qs;
  return 0;
}

// ------------------------------------------------------------- completions

int regcore_process_wc(struct regcore *core, struct ibv_wc *wc) {
  if (!core || !wc) return fail(EINVAL, "regcore_process_wc: NULL argument");
  return process_one(core_of(core), wc);
}

int regcore_poll_cq(struct regcore *handle, struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
  if (!handle || !cq || num_entries < 0 || (!wc && num_entries))
    return fail(EINVAL, "regcore_poll_cq: bad argument");
  Core *core = core_of(handle);
  int kept = 0;
  // Keep polling while internal completions made room, so a return of 0
  // means the CQ is empty.
  while (kept < num_entries) {
    int n = ibv_poll_cq(cq, num_entries - kept, wc + kept);
    if (n < 0) return fail(EIO, "ibv_poll_cq failed");
    if (n == 0) break;
    int got = 0;
    for (int i = 0; i < n; i++) {
      ibv_wc w = wc[kept + i];
      if (process_one(core, &w)) wc[kept + got++] = w;
    }
    kept += got;
  }
  return kept;
}

}  // extern "C"
