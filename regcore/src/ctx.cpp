// RDMA READ/WRITE contexts and remote-registration contexts: building the
// work requests each strategy needs, posting them as one chain with only
// the last WR signaled, and finishing them from their completion. Every
// public call here runs under the context's QP lock.
#include <cerrno>
#include <cstring>

#include "internal.hpp"

namespace rc {

// ------------------------------------------------------------- QP memo

namespace {

void memo_retire(QpState *qs, MemoSlot &m) {
  m.retiring = true;
  if (m.inflight) return;
  qs->core->cache.put(m.e);
  m = MemoSlot();
}

// Hands the reference of a fresh lookup to a memo slot, if one is free or
// idle; -1 if every slot is busy (the context keeps the reference).
int memo_install(QpState *qs, Entry *e) {
  int victim = -1;
  for (int i = 0; i < QpState::kMemo; i++) {
    MemoSlot &m = qs->memo[i];
    if (!m.e) {
      victim = i;
      break;
    }
    if (m.inflight == 0 && (victim < 0 || m.last < qs->memo[victim].last)) victim = i;
  }
  if (victim < 0) return -1;
  MemoSlot &m = qs->memo[victim];
  if (m.e) qs->core->cache.put(m.e);
  m = MemoSlot();
  m.e = e;
  m.inflight = 1;
  m.last = ++qs->memo_tick;
  return victim;
}

}  // namespace

// The QP's memo keeps a reference on the entries its I/Os used last, so a
// repeated lookup costs a few compares: no cache lock, no shared counter.
// Only where idle entries may be kept (the monitor drops them when their
// memory goes); pending memory events are applied first.
//
// The memo hit is inline in the post path and hands back the entry and its
// slot in registers; the rest (retiring slots, the cache) is out of line.
namespace {

int qp_cache_get_slow(QpState *qs, uintptr_t addr, size_t len, unsigned access, RunRef *out) {
  Cache &cache = qs->core->cache;
  uintptr_t end = addr + len;
  for (int i = 0; i < QpState::kMemo; i++) {
    MemoSlot &m = qs->memo[i];
    Entry *e = m.e;
    if (!e || m.retiring || e->start > addr || end > e->end || (e->pub.access & access) != access) continue;
    if (!indexed(e)) {
      memo_retire(qs, m);
      continue;
    }
    if (e->domain != qs->dom->index) continue;
    m.inflight++;
    m.last = ++qs->memo_tick;
    qs->stats.cache_hits++;
    *out = {e, static_cast<int8_t>(i)};
    return 0;
  }
  Entry *e = nullptr;
  if (int err = cache.get(qs->dom, addr, len, access, &e)) return err;
  *out = {e, static_cast<int8_t>(cache.caching_idle() ? memo_install(qs, e) : -1)};
  return 0;
}

[[gnu::always_inline]] inline int qp_cache_get(QpState *qs, uintptr_t addr, size_t len, unsigned access,
                                               RunRef *out) {
  access = normalize_access(access);
  // Slots are only filled while the monitor runs; events it reported (and a
  // fork, which stops it) unindex their entries before they are trusted.
  qs->core->cache.sync();
  uintptr_t end = addr + len;
  uint16_t dom = qs->dom->index;
  for (int i = 0; i < QpState::kMemo; i++) {
    MemoSlot &m = qs->memo[i];
    Entry *e = m.e;
    if (!e || m.retiring || e->start > addr || end > e->end || (e->pub.access & access) != access ||
        e->domain != dom)
      continue;
    if (!indexed(e)) break;  // retired by the slow path
    m.inflight++;
    m.last = ++qs->memo_tick;
    qs->stats.cache_hits++;
    out->e = e;
    out->slot = static_cast<int8_t>(i);
    return 0;
  }
  return qp_cache_get_slow(qs, addr, len, access, out);
}

}  // namespace

void qp_cache_put(QpState *qs, RunRef r) {
  if (r.slot < 0) {
    qs->core->cache.put(r.e);
    return;
  }
  MemoSlot &m = qs->memo[r.slot];
  m.inflight--;
  if (m.retiring && m.inflight == 0) memo_retire(qs, m);
}

void memo_clear(QpState *qs) {
  for (MemoSlot &m : qs->memo) {
    if (m.e) qs->core->cache.put(m.e);
    m = MemoSlot();
  }
}

namespace {

uint32_t div_up(size_t a, uint32_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

unsigned max_sge_for(const QpState *qs, regcore_dir dir) {
  return dir == REGCORE_DIR_READ ? qs->policy.max_sge_read : qs->policy.max_sge_write;
}

void put_refs(Ctx *ctx) {
  for (RunRef r : ctx->refs) {
    if (ctx->qp)
      qp_cache_put(ctx->qp, r);
    else
      ctx->core->cache.put(r.e);  // detached contexts hold their own references
  }
  ctx->refs.clear();
}

void dereg_own_mrs(Ctx *ctx) {
  for (ibv_mr *mr : ctx->own_mrs) {
    ibv_dereg_mr(mr);
    release_reg_slot(ctx->core);
  }
  ctx->own_mrs.clear();
}

// ------------------------------------------------------------ building

// Runs of one I/O usually share a registration: a run inside the entry the
// previous run found through the QP memo uses it again. The context holds
// one use of the memo slot per entry, not per run; hits still count per run.
int resolve_lkeys(Ctx *ctx) {
  QpState *qs = ctx->qp;
  ibv_sge *r = ctx->runs.data(), *end = r + ctx->runs.size();
  uintptr_t lo = 1, hi = 0;  // the reusable entry's range: none yet
  uint32_t lkey = 0;
  uint64_t reused = 0;
  for (; r != end; r++) {
    if (r->lkey) continue;  // the ULP registered it itself
    uintptr_t a = static_cast<uintptr_t>(r->addr);
    if (lo <= a && a + r->length <= hi) {
      r->lkey = lkey;
      reused++;
      continue;
    }
    RunRef ref;
    if (int err = qp_cache_get(qs, a, r->length, qs->dom->internal_access, &ref)) {
      qs->stats.cache_hits += reused;
      return err;
    }
    ctx->refs.push_back(ref);
    lkey = ref.e->pub.lkey;
    r->lkey = lkey;
    if (ref.slot >= 0) {  // reusable by the next runs
      lo = ref.e->start;
      hi = ref.e->end;
    } else {
      lo = 1;
      hi = 0;
    }
  }
  qs->stats.cache_hits += reused;
  return 0;
}

// RDMA WRs over `list`, max_sge SGEs each, consecutive remote addresses;
// returns their number. Vectors keep their capacity across reuse of the
// context. Counts and the strategy stay in registers: reloading what was
// just stored (size -> nwr -> strategy -> counter) chained store
// forwarding on every init.
uint32_t build_rdma_wrs(Ctx *ctx, const SgeVec &list, unsigned max_sge) {
  const uint32_t nsge = list.size();
  const uint32_t nwr = nsge <= max_sge ? 1 : div_up(nsge, max_sge);
  ctx->wrs.resize(nwr);
  ibv_send_wr *w = ctx->wrs.data();
  const ibv_sge *sge = list.data();
  const ibv_wr_opcode opcode = ctx->dir == REGCORE_DIR_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  const uint32_t rkey = ctx->rkey;
  uint64_t raddr = ctx->remote_addr;
  uint32_t next = 0;
  for (uint32_t k = 0; k < nwr; k++) {
    ibv_send_wr &wr = w[k];
    // Every field a provider reads for RDMA READ/WRITE; wr_id, next and
    // send_flags are set at post.
    uint32_t n = std::min<uint32_t>(max_sge, nsge - next);
    wr.send_flags = 0;
    wr.imm_data = 0;
    wr.opcode = opcode;
    wr.sg_list = const_cast<ibv_sge *>(sge + next);
    wr.num_sge = static_cast<int>(n);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    for (uint32_t i = 0; i < n; i++) raddr += sge[next + i].length;
    next += n;
  }
  ctx->nwr = nwr;
  return nwr;
}

// Each init_* returns the number of WRs the context posts (> 0) or a
// negative errno, and counts the strategy it settled on.
int init_sge_path(Ctx *ctx) {
  if (int err = resolve_lkeys(ctx)) return err;
  uint32_t nwr = build_rdma_wrs(ctx, ctx->runs, max_sge_for(ctx->qp, ctx->dir));
  regcore_rw_strategy st = nwr == 1 ? REGCORE_RW_SINGLE_WR : REGCORE_RW_MULTI_WR;
  ctx->strategy = st;
  ctx->qp->stats.rw_ctxs[st]++;
  return static_cast<int>(nwr);
}

// Private MRs with exactly the rights this I/O needs (iWARP READ sinks get
// REMOTE_WRITE); deregistered when the context is recycled.
int init_mr_reg(Ctx *ctx) {
  QpState *qs = ctx->qp;
  Core *core = ctx->core;
  unsigned access = ctx->dir == REGCORE_DIR_READ ? qs->policy.read_sink_access : 0;
  if (ctx->runs.size() > core->attr.max_mrs)
    return fail(E2BIG, "the context needs %u per-context MRs, more than max_mrs=%u", ctx->runs.size(),
                core->attr.max_mrs);
  ctx->wr_sges.clear();
  for (const ibv_sge &r : ctx->runs) {
    if (int err = acquire_reg_slot(qs)) return err;
    ibv_mr *mr = ibv_reg_mr(qs->dom->pd, reinterpret_cast<void *>(static_cast<uintptr_t>(r.addr)),
                            r.length, static_cast<int>(access));
    if (!mr) {
      release_reg_slot(core);
      return fail(errno ? errno : EIO, "ibv_reg_mr for a per-context MR failed");
    }
    ctx->own_mrs.push_back(mr);
    ctx->wr_sges.push_back({r.addr, r.length, mr->lkey});
  }
  uint32_t nwr = build_rdma_wrs(ctx, ctx->wr_sges, max_sge_for(qs, ctx->dir));
  qs->stats.rw_ctxs[REGCORE_RW_MR_REG]++;
  return static_cast<int>(nwr);
}

int init_staged(Ctx *ctx) {
  int err = acquire_stage(ctx->qp, false, &ctx->stage);
  if (err == -EAGAIN) return init_sge_path(ctx);  // like rdma_rw: no MR, more WRs
  if (err) return err;
  ctx->wr_sges.assign(1, ibv_sge{reinterpret_cast<uintptr_t>(ctx->stage->buf),
                                 static_cast<uint32_t>(ctx->bytes), ctx->stage->mr->lkey});
  uint32_t nwr = build_rdma_wrs(ctx, ctx->wr_sges, 1);
  ctx->qp->stats.rw_ctxs[REGCORE_RW_MR_STAGED]++;
  return static_cast<int>(nwr);
}

int init_indirect(Ctx *ctx) {
  if (int err = resolve_lkeys(ctx)) return err;
  int err = acquire_mkey(ctx->qp, false, &ctx->mkey);
  if (err == -EAGAIN) return init_sge_path(ctx);
  if (err) return err;
  uint32_t nwr = (ctx->mkey->need_inval ? 1 : 0) + 2;  // [LOCAL_INV] + UMR + RDMA
  ctx->nwr = nwr;
  ctx->qp->stats.rw_ctxs[REGCORE_RW_INDIRECT]++;
  return static_cast<int>(nwr);
}

int build_rw(Ctx *ctx, regcore_rw_strategy st) {
  switch (st) {
    case REGCORE_RW_SINGLE_WR:
    case REGCORE_RW_MULTI_WR: return init_sge_path(ctx);
    case REGCORE_RW_MR_REG: return init_mr_reg(ctx);
    case REGCORE_RW_MR_STAGED: return init_staged(ctx);
    case REGCORE_RW_INDIRECT: return init_indirect(ctx);
  }
  return fail(EINVAL, "unknown strategy");
}

// Copies between the context's runs and its staging buffer.
void stage_copy(Ctx *ctx, bool to_stage) {
  auto *stage = static_cast<uint8_t *>(ctx->stage->buf);
  for (const ibv_sge &r : ctx->runs) {
    auto *p = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(r.addr));
    if (to_stage)
      memcpy(stage, p, r.length);
    else
      memcpy(p, stage, r.length);
    stage += r.length;
  }
}

// -------------------------------------------------------------- posting

struct PostResult {
  int err = 0;
  bool any_posted = true;
  uint32_t internal_posted = 0;
};

ibv_send_wr *last_of(ibv_send_wr *wr) {
  while (wr && wr->next) wr = wr->next;
  return wr;
}

// Posts wrs[0..n) unsignaled, then chain_wr. The chain's last WR (ours, or
// the ULP's) carries the chain's final tag; the ULP's wr_id is restored.
// Inline: its result stays in registers (returned through memory it was
// a store-forwarding stall on every post).
[[gnu::always_inline]] inline PostResult post_chain(QpState *qs, Chain &c, ibv_send_wr *wrs, size_t n,
                                                    ibv_send_wr *chain_wr) {
  for (size_t i = 0; i < n; i++) {
    wrs[i].wr_id = c.tag(kRoleUnsignaled);
    wrs[i].send_flags &= ~static_cast<unsigned>(IBV_SEND_SIGNALED);
    wrs[i].next = i + 1 < n ? &wrs[i + 1] : chain_wr;
  }
  ibv_send_wr *ulp_last = last_of(chain_wr);
  uint64_t saved = ulp_last ? ulp_last->wr_id : 0;
  if (ulp_last) {
    ulp_last->wr_id = c.tag(kRoleFinal);
  } else {
    wrs[n - 1].wr_id = c.tag(kRoleFinal);
    wrs[n - 1].send_flags |= IBV_SEND_SIGNALED;
  }
  ibv_send_wr *first = n ? wrs : chain_wr;
  ibv_send_wr *bad = nullptr;
  PostResult r;
  r.err = ibv_post_send(qs->qp, first, &bad);
  if (ulp_last) ulp_last->wr_id = saved;
  if (r.err == 0) {
    r.internal_posted = static_cast<uint32_t>(n);
    return r;
  }
  r.any_posted = bad && bad != first;
  for (ibv_send_wr *w = first; r.any_posted && w && w != bad; w = w->next)
    if (w >= wrs && w < wrs + n) r.internal_posted++;
  return r;
}

// A post the provider refused in part or in whole (cold).
[[gnu::noinline]] int finish_failed_post(Ctx *ctx, QpState *qs, Chain &c, const PostResult &r, uint32_t credits) {
  if (!r.any_posted) return fail(r.err, "ibv_post_send: %s (nothing posted)", strerror(r.err));
  c.credits = credits;
  qs->credits -= credits;
  c.wr_posted = r.internal_posted;
  c.has_final = false;
  fifo_append(qs, &c);
  // Part of the chain is in the send queue without a signaled WR: move the
  // QP to error so that it flushes and those WRs complete.
  ctx->life = Ctx::kFailedPost;
  c.status = IBV_WC_WR_FLUSH_ERR;
  qs->stats.partial_posts++;
  move_qp_to_error(qs);
  if (c.wr_posted == 0) retire_through(&c);
  return fail(r.err, "ibv_post_send accepted part of the chain (%s); QP moved to error",
              strerror(r.err));
}

// Accounts for a post: credits, the FIFO, and the partial-post rule.
[[gnu::always_inline]] inline int finish_post(Ctx *ctx, QpState *qs, Chain &c, const PostResult &r,
                                              uint32_t credits) {
  if (r.err) return finish_failed_post(ctx, qs, c, r, credits);
  c.credits = credits;
  qs->credits -= credits;
  c.wr_posted = r.internal_posted;
  c.has_final = true;
  fifo_append(qs, &c);
  ctx->life = Ctx::kPosted;
  return 0;
}

#if REGCORE_HAVE_MLX5DV
void add_ulp_wr(ibv_qp_ex *qx, const ibv_send_wr *w, std::vector<ibv_data_buf> &bufs) {
  switch (w->opcode) {
    case IBV_WR_SEND: ibv_wr_send(qx); break;
    case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(qx, w->imm_data); break;
    case IBV_WR_SEND_WITH_INV: ibv_wr_send_inv(qx, w->invalidate_rkey); break;
    case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(qx, w->wr.rdma.rkey, w->wr.rdma.remote_addr); break;
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      ibv_wr_rdma_write_imm(qx, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
      break;
    case IBV_WR_RDMA_READ: ibv_wr_rdma_read(qx, w->wr.rdma.rkey, w->wr.rdma.remote_addr); break;
    case IBV_WR_LOCAL_INV: ibv_wr_local_inv(qx, w->invalidate_rkey); return;
    case IBV_WR_BIND_MW: ibv_wr_bind_mw(qx, w->bind_mw.mw, w->bind_mw.rkey, &w->bind_mw.bind_info); return;
    default: return;
  }
  if (w->send_flags & IBV_SEND_INLINE) {
    bufs.clear();
    for (int i = 0; i < w->num_sge; i++)
      bufs.push_back({reinterpret_cast<void *>(static_cast<uintptr_t>(w->sg_list[i].addr)),
                      w->sg_list[i].length});
    ibv_wr_set_inline_data_list(qx, bufs.size(), bufs.data());
  } else {
    ibv_wr_set_sge_list(qx, static_cast<size_t>(w->num_sge), w->sg_list);
  }
}

bool ulp_wr_convertible(const ibv_send_wr *w) {
  switch (w->opcode) {
    case IBV_WR_SEND: case IBV_WR_SEND_WITH_IMM: case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_WRITE: case IBV_WR_RDMA_WRITE_WITH_IMM: case IBV_WR_RDMA_READ:
    case IBV_WR_LOCAL_INV: case IBV_WR_BIND_MW:
      return true;
    default:
      return false;
  }
}

// [LOCAL_INV] + UMR of the context's mkey over its runs, then (rw) the RDMA
// WR through the mkey, then the ULP's WRs, in one ibv_wr_* batch: the UMR
// only exists in that API. The batch is all or nothing.
PostResult post_umr_batch(Ctx *ctx, QpState *qs, Chain &c, unsigned umr_access, bool rdma,
                          ibv_send_wr *chain_wr) {
  PostResult r;
  ibv_qp_ex *qx = qs->qpx;
  mlx5dv_mkey *mk = ctx->mkey->mkey;
  uint64_t unsig = c.tag(kRoleUnsignaled), fin = c.tag(kRoleFinal);
  bool umr_last = !rdma && !chain_wr;
  ibv_wr_start(qx);
  if (ctx->mkey->need_inval) {
    qx->wr_id = unsig;
    qx->wr_flags = 0;
    ibv_wr_local_inv(qx, mk->lkey);
  }
  qx->wr_id = umr_last ? fin : unsig;
  qx->wr_flags = IBV_SEND_INLINE | (umr_last ? IBV_SEND_SIGNALED : 0);  // mlx5 UMRs are inline
  mlx5dv_wr_mr_list(qs->mqpx, mk, umr_access, static_cast<uint16_t>(ctx->runs.size()), ctx->runs.data());
  if (rdma) {
    qx->wr_id = chain_wr ? unsig : fin;
    qx->wr_flags = chain_wr ? 0 : IBV_SEND_SIGNALED;
    if (ctx->dir == REGCORE_DIR_READ)
      ibv_wr_rdma_read(qx, ctx->rkey, ctx->remote_addr);
    else
      ibv_wr_rdma_write(qx, ctx->rkey, ctx->remote_addr);
    ibv_wr_set_sge(qx, mk->lkey, 0, static_cast<uint32_t>(ctx->bytes));  // zero based
  }
  std::vector<ibv_data_buf> bufs;
  for (ibv_send_wr *w = chain_wr; w; w = w->next) {
    qx->wr_id = w->next ? w->wr_id : fin;
    qx->wr_flags = w->send_flags;
    add_ulp_wr(qx, w, bufs);
  }
  r.err = ibv_wr_complete(qx);
  r.any_posted = r.err == 0;
  r.internal_posted = r.err ? 0 : ctx->nwr;
  return r;
}
#endif

bool chain_signaled(const ibv_send_wr *chain_wr) {
  const ibv_send_wr *last = chain_wr;
  while (last->next) last = last->next;
  return last->send_flags & IBV_SEND_SIGNALED;
}

int check_chain_wr(ibv_send_wr *chain_wr, bool via_qpx) {
  if (!chain_wr) return 0;
  if (!chain_signaled(chain_wr))
    return fail(EINVAL, "the last chained WR must be IBV_SEND_SIGNALED: its completion is the "
                        "context's completion");
#if REGCORE_HAVE_MLX5DV
  if (via_qpx)
    for (ibv_send_wr *w = chain_wr; w; w = w->next)
      if (!ulp_wr_convertible(w)) return fail(EINVAL, "chained WR opcode %d not supported", w->opcode);
#endif
  (void)via_qpx;
  return 0;
}

bool take_credits(QpState *qs, uint32_t n) {
  if (qs->credits >= n) return true;
  qs->stats.eagain++;
  fail(EAGAIN, "no send-queue room: %u credits left, context needs %u", qs->credits, n);
  return false;
}

// ---------------------------------------------------------- reg helpers

void mark_key_dead(Ctx *ctx) { ctx->key = Ctx::kKeyDead; }

// The peer invalidated some other key of ours (a protocol error on its
// side). Only windows and mkeys bound through this QP can be invalidated
// by its peer: that key is dead now, so its own release needs no LOCAL_INV.
void note_foreign_invalidation(QpState *qs, uint32_t rkey) {
  for (Ctx *other : qs->owned)
    if (other->kind == Ctx::kReg && other->qp == qs && other->key == Ctx::kKeyLive &&
        other->reg_rkey == rkey && other->reg_strategy != REGCORE_REG_MR) {
      mark_key_dead(other);
      if (other->mkey) other->mkey->need_inval = false;
      maybe_recycle(other);
      return;
    }
}

int post_local_inv(Ctx *ctx) {
  QpState *qs = ctx->qp;
  Chain &c = ctx->chains[1];
  c.reset();
  ctx->wrs.resize(1);
  ibv_send_wr &wr = ctx->wrs[0];
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.invalidate_rkey = ctx->reg_rkey;
  PostResult r = post_chain(qs, c, &wr, 1, nullptr);
  if (r.err) return -r.err;  // one WR: nothing was posted
  c.credits = ctx->reserved_credits;  // reserved when the key was posted
  ctx->reserved_credits = 0;
  c.wr_posted = 1;
  c.has_final = true;
  fifo_append(qs, &c);
  qs->stats.local_invs++;
  return 0;
}

bool staged_reg(const Ctx *ctx) { return ctx->kind == Ctx::kReg && ctx->reg_strategy == REGCORE_REG_STAGED; }

// The ULP's buffers are handed back: what the peer wrote into the bounce
// buffer goes to them first.
void hand_back(Ctx *ctx) {
  if (staged_reg(ctx) && ctx->stage && (ctx->remote_access & IBV_ACCESS_REMOTE_WRITE)) stage_copy(ctx, false);
}

}  // namespace

// ------------------------------------------------- completion & teardown

void rw_release_resources(Ctx *ctx) {
  put_refs(ctx);
  dereg_own_mrs(ctx);
  if (ctx->stage) release_stage(ctx, ctx->stage, false);
  ctx->stage = nullptr;
  if (ctx->mkey) {
    bool unknown = ctx->life == Ctx::kFailedPost || ctx->chains[0].status != IBV_WC_SUCCESS;
    release_mkey(ctx, ctx->mkey, unknown);
  }
  ctx->mkey = nullptr;
}

void reg_release_resources(Ctx *ctx) {
  if (ctx->mw) release_mw(ctx, ctx->mw, false);  // unbound by now
  ctx->mw = nullptr;
  if (ctx->mkey) release_mkey(ctx, ctx->mkey, ctx->mkey->need_inval);
  ctx->mkey = nullptr;
  if (ctx->stage) release_stage(ctx, ctx->stage, true);
  ctx->stage = nullptr;
  dereg_own_mrs(ctx);
  put_refs(ctx);
}

// Kills the key without the QP: freeing the window, the mkey or the MR
// invalidates it synchronously.
void kill_reg_key_sync(Ctx *ctx) {
  if (ctx->key != Ctx::kKeyLive) return;
  if (ctx->mw) {
    release_mw(ctx, ctx->mw, true);
    ctx->mw = nullptr;
  }
  if (ctx->mkey) {
    release_mkey(ctx, ctx->mkey, true);
    ctx->mkey = nullptr;
  }
  dereg_own_mrs(ctx);
  if (ctx->qp) ctx->qp->stats.sync_invalidations++;
  mark_key_dead(ctx);
}

void finish_reg_release(Ctx *ctx, bool from_completion, std::vector<DueCallback> &due) {
  if (from_completion && ctx->cb_owed) {
    hand_back(ctx);
    ctx->cb_owed = false;
    if (ctx->cb) {
      ctx->cb_running = true;
      due.push_back({ctx, ctx->cb, ctx->cb_arg});
    }
  }
  maybe_recycle(ctx);
}

void on_final_completion(Ctx *ctx, Chain *c, ibv_wc *wc, std::vector<DueCallback> &due) {
  bool post_chain_final = c == &ctx->chains[0];
  if (post_chain_final) {
    ctx->life = Ctx::kCompleted;
    if (c->ulp_visible) {
      wc->wr_id = c->ulp_wr_id;
      // The root cause beats the FLUSH_ERR of the signaled WR after it.
      if (c->status != IBV_WC_SUCCESS) wc->status = c->status;
    }
    if (ctx->kind == Ctx::kRw && ctx->strategy == REGCORE_RW_MR_STAGED &&
        ctx->dir == REGCORE_DIR_READ && wc->status == IBV_WC_SUCCESS)
      stage_copy(ctx, false);
    return;
  }
  // chains[1]: the LOCAL_INV of a reg context.
  if (wc->status == IBV_WC_SUCCESS) {
    mark_key_dead(ctx);
    if (ctx->mkey) ctx->mkey->need_inval = false;
  } else {
    kill_reg_key_sync(ctx);
  }
  finish_reg_release(ctx, true, due);
}

}  // namespace rc

using namespace rc;

// =========================================================== public API

namespace {

// Holds a QP's lock for the scope of a call.
class QpLock {
 public:
  explicit QpLock(QpState *qs) : qs_(qs) { qs_->mu.lock(); }
  ~QpLock() { qs_->mu.unlock(); }

 private:
  QpState *qs_;
};

class CtxLock {
 public:
  explicit CtxLock(Ctx *ctx) : ctx_(ctx) { lock_ctx(ctx_); }
  ~CtxLock() { unlock_ctx(ctx_); }

 private:
  Ctx *ctx_;
};

// Undoes a context whose init failed.
int abandon(Ctx *ctx, int err) {
  if (ctx->kind == Ctx::kReg) kill_reg_key_sync(ctx);
  ctx->ulp_done = true;
  maybe_recycle(ctx);
  return err;
}

}  // namespace

extern "C" {

int regcore_rw_ctx_init(struct regcore_rw_ctx **out, struct regcore *handle, struct ibv_qp *qp,
                        const struct ibv_sge *sgl, unsigned nsge, uint64_t remote_addr,
                        uint32_t rkey, enum regcore_dir dir) {
  if (!out || !handle || !qp || (!sgl && nsge)) return fail(EINVAL, "regcore_rw_ctx_init: NULL argument");
  if (dir != REGCORE_DIR_READ && dir != REGCORE_DIR_WRITE) return fail(EINVAL, "bad direction");
  QpState *qs = find_qp(core_of(handle), qp);
  if (!qs) return fail(EINVAL, "regcore_rw_ctx_init: QP not created by regcore_qp_create");
  QpLock lock(qs);
  Ctx *ctx = ctx_alloc(qs, Ctx::kRw);
  if (!ctx) return -EAGAIN;
  uint64_t bytes = 0;
  coalesce(sgl, nsge, ctx->runs, &bytes);  // into the context's reused storage
  if (ctx->runs.empty()) return abandon(ctx, fail(EINVAL, "regcore_rw_ctx_init: empty SGE list"));
  if (ctx->runs.size() > qs->policy.max_sge_per_ctx)
    return abandon(ctx, fail(E2BIG, "%u SGEs exceed the declared max_sge_per_ctx=%u", ctx->runs.size(),
                             qs->policy.max_sge_per_ctx));
  if (bytes > UINT32_MAX) return abandon(ctx, fail(EINVAL, "regcore_rw_ctx_init: more than 4 GiB"));
  ctx->dir = dir;
  ctx->remote_addr = remote_addr;
  ctx->rkey = rkey;
  ctx->bytes = bytes;
  regcore_rw_strategy st = decide(qs->policy, dir, ctx->runs.size(), bytes, ctx->core->attr.flags);
  ctx->strategy = st;  // init_sge_path() may refine it (single/multi WR)
  int nwr = build_rw(ctx, st);
  if (nwr < 0) return abandon(ctx, nwr);
  *out = reinterpret_cast<regcore_rw_ctx *>(ctx);
  return nwr;
}

int regcore_rw_ctx_post(struct regcore_rw_ctx *handle, struct ibv_qp *qp, uint64_t wr_id,
                        struct ibv_send_wr *chain_wr) {
  if (!handle) return fail(EINVAL, "regcore_rw_ctx_post: NULL context");
  Ctx *ctx = ctx_of(handle);
  QpState *qs = ctx->qp;
  if (!qs || qs->qp != qp) return fail(EINVAL, "regcore_rw_ctx_post: not the context's QP");
  QpLock lock(qs);
  if (ctx->kind != Ctx::kRw || ctx->ulp_done || ctx->life != Ctx::kInit)
    return fail(EINVAL, "regcore_rw_ctx_post: context not initialized or already posted");
  bool indirect = ctx->strategy == REGCORE_RW_INDIRECT;
  if (chain_wr) if (int err = check_chain_wr(chain_wr, indirect)) return err;
  if (!take_credits(qs, ctx->nwr)) return -EAGAIN;
  Chain &c = ctx->chains[0];
  c.reset();
  c.ulp_visible = true;
  c.ulp_wr_id = chain_wr ? last_of(chain_wr)->wr_id : wr_id;
  if (ctx->strategy == REGCORE_RW_MR_STAGED && ctx->dir == REGCORE_DIR_WRITE) stage_copy(ctx, true);
  PostResult r;
#if REGCORE_HAVE_MLX5DV
  if (indirect) {
    unsigned access = ctx->dir == REGCORE_DIR_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
    r = post_umr_batch(ctx, qs, c, access, true, chain_wr);
    if (r.err == 0) ctx->mkey->need_inval = true;  // set at post, as rdma_rw does
  } else
#endif
  {
    r = post_chain(qs, c, ctx->wrs.data(), ctx->wrs.size(), chain_wr);
  }
  return finish_post(ctx, qs, c, r, ctx->nwr);
}

int regcore_rw_ctx_destroy(struct regcore_rw_ctx *handle) {
  if (!handle) return fail(EINVAL, "regcore_rw_ctx_destroy: NULL context");
  Ctx *ctx = ctx_of(handle);
  CtxLock lock(ctx);
  if (ctx->kind != Ctx::kRw || ctx->ulp_done) return fail(EINVAL, "regcore_rw_ctx_destroy: not a live rw context");
  if (ctx->life == Ctx::kPosted)
    return fail(EBUSY, "regcore_rw_ctx_destroy: the context's completion has not been seen");
  ctx->ulp_done = true;
  // After a partial post the context waits for its orphaned WRs to flush;
  // keys that grant remote access must not outlive this call. The QP is in
  // error already, so nothing executes with them any more.
  if (ctx->life == Ctx::kFailedPost && regcore_rw_ctx_remote_keys(handle, nullptr, 0) > 0) dereg_own_mrs(ctx);
  maybe_recycle(ctx);
  return 0;
}

enum regcore_rw_strategy regcore_rw_ctx_strategy(const struct regcore_rw_ctx *handle) {
  return ctx_of(handle)->strategy;
}

int regcore_rw_ctx_remote_keys(const struct regcore_rw_ctx *handle, uint32_t *keys, unsigned max) {
  const Ctx *ctx = ctx_of(handle);
  unsigned access = ctx->dir == REGCORE_DIR_READ ? ctx->dom->policy.read_sink_access : 0;
  if (ctx->strategy != REGCORE_RW_MR_REG || !(access & IBV_ACCESS_REMOTE_WRITE)) return 0;
  unsigned n = 0;
  for (ibv_mr *mr : ctx->own_mrs) {
    if (keys && n < max) keys[n] = mr->rkey;
    n++;
  }
  return static_cast<int>(n);
}

// ------------------------------------------------------------ reg contexts

// A window over [addr, addr+len) of `mr` with a fresh key.
static int reg_bind_window(Ctx *ctx, ibv_mr *mr, uintptr_t addr, size_t len) {
  if (int err = acquire_mw(ctx->qp, &ctx->mw)) return err;
  ctx->mw->rkey = ibv_inc_rkey(ctx->mw->rkey);  // a fresh key on every reuse
  ctx->reg_rkey = ctx->mw->rkey;
  ctx->reg_addr = addr;
  ctx->wrs.resize(1);
  ibv_send_wr &wr = ctx->wrs[0];
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = ctx->mw->mw;
  wr.bind_mw.rkey = ctx->reg_rkey;
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = addr;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = ctx->remote_access;
  ctx->nwr = 1;
  return 0;
}

static int reg_init_mw(Ctx *ctx, void *addr, size_t len) {
  QpState *qs = ctx->qp;
  RunRef ref;
  if (int err = qp_cache_get(qs, reinterpret_cast<uintptr_t>(addr), len, qs->dom->internal_access, &ref))
    return err;
  ctx->refs.push_back(ref);
  return reg_bind_window(ctx, ref.e->pub.ibv_mr, reinterpret_cast<uintptr_t>(addr), len);
}

// A private MR with exactly the remote rights, valid from registration on.
static int reg_init_mr(Ctx *ctx, void *addr, size_t len) {
  QpState *qs = ctx->qp;
  unsigned roles = ((ctx->remote_access & IBV_ACCESS_REMOTE_READ) ? REGCORE_ROLE_REMOTE_READ : 0) |
                   ((ctx->remote_access & IBV_ACCESS_REMOTE_WRITE) ? REGCORE_ROLE_REMOTE_WRITE : 0) |
                   ((ctx->remote_access & IBV_ACCESS_REMOTE_ATOMIC) ? REGCORE_ROLE_REMOTE_ATOMIC : 0);
  if (int err = acquire_reg_slot(qs)) return err;
  ibv_mr *mr = ibv_reg_mr(qs->dom->pd, addr, len, regcore_access_flags_for(qs->policy.transport, roles));
  if (!mr) {
    release_reg_slot(ctx->core);
    return fail(errno ? errno : EIO, "ibv_reg_mr for a reg context failed");
  }
  ctx->own_mrs.push_back(mr);
  ctx->reg_rkey = mr->rkey;
  ctx->reg_addr = reinterpret_cast<uintptr_t>(addr);
  ctx->key = Ctx::kKeyLive;
  ctx->nwr = 0;
  return 0;
}

// An SGL behind one indirect mkey with remote access, zero based.
static int reg_init_indirect(Ctx *ctx) {
  if (int err = resolve_lkeys(ctx)) return err;
  if (int err = acquire_mkey(ctx->qp, true, &ctx->mkey)) return err;
  ctx->reg_rkey = ctx->mkey->mkey->rkey;
  ctx->reg_addr = 0;
  ctx->nwr = (ctx->mkey->need_inval ? 1 : 0) + 1;  // [LOCAL_INV] + UMR
  return 0;
}

// An SGL staged through a bounce buffer keyed by a window or its own MR.
static int reg_init_staged(Ctx *ctx) {
  if (ctx->bytes > ctx->dom->bounce_bytes)
    return fail(E2BIG, "a staged SGL of %llu bytes exceeds the %u-byte bounce buffer (stage_bytes)",
                static_cast<unsigned long long>(ctx->bytes), ctx->dom->bounce_bytes);
  if (int err = acquire_stage(ctx->qp, true, &ctx->stage)) return err;
  if (ctx->dom->mw_ok) return reg_bind_window(ctx, ctx->stage->mr, reinterpret_cast<uintptr_t>(ctx->stage->buf), ctx->bytes);
  return reg_init_mr(ctx, ctx->stage->buf, ctx->bytes);
}

static int reg_ctx_start(Ctx *ctx, unsigned remote_access) {
  const unsigned remote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  if (!remote_access || (remote_access & ~remote))
    return fail(EINVAL, "regcore_reg_ctx_init: remote_access must be REMOTE_READ/WRITE/ATOMIC bits");
  ctx->remote_access = remote_access;
  return 0;
}

int regcore_reg_ctx_init(struct regcore_reg_ctx **out, struct regcore *handle, struct ibv_qp *qp,
                         void *addr, size_t length, unsigned remote_access) {
  if (!out || !handle || !qp || !addr || !length) return fail(EINVAL, "regcore_reg_ctx_init: bad argument");
  QpState *qs = find_qp(core_of(handle), qp);
  if (!qs) return fail(EINVAL, "regcore_reg_ctx_init: QP not created by regcore_qp_create");
  QpLock lock(qs);
  Ctx *ctx = ctx_alloc(qs, Ctx::kReg);
  if (!ctx) return -EAGAIN;
  if (int err = reg_ctx_start(ctx, remote_access)) return abandon(ctx, err);
  ctx->reg_len = length;
  ctx->reg_strategy = qs->dom->mw_ok ? REGCORE_REG_MW : REGCORE_REG_MR;
  int err = ctx->reg_strategy == REGCORE_REG_MW ? reg_init_mw(ctx, addr, length) : reg_init_mr(ctx, addr, length);
  if (err) return abandon(ctx, err);
  qs->stats.reg_ctxs[ctx->reg_strategy]++;
  *out = reinterpret_cast<regcore_reg_ctx *>(ctx);
  return 0;
}

int regcore_reg_ctx_init_iov(struct regcore_reg_ctx **out, struct regcore *handle, struct ibv_qp *qp,
                             const struct iovec *iov, unsigned iovcnt, unsigned remote_access) {
  if (!out || !handle || !qp || !iov || !iovcnt) return fail(EINVAL, "regcore_reg_ctx_init_iov: bad argument");
  QpState *qs = find_qp(core_of(handle), qp);
  if (!qs) return fail(EINVAL, "regcore_reg_ctx_init_iov: QP not created by regcore_qp_create");
  QpLock lock(qs);
  Ctx *ctx = ctx_alloc(qs, Ctx::kReg);
  if (!ctx) return -EAGAIN;
  if (int err = reg_ctx_start(ctx, remote_access)) return abandon(ctx, err);
  ctx->wr_sges.clear();
  for (unsigned i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len > UINT32_MAX) return abandon(ctx, fail(EINVAL, "an iovec element exceeds 4 GiB"));
    ctx->wr_sges.push_back({reinterpret_cast<uintptr_t>(iov[i].iov_base), static_cast<uint32_t>(iov[i].iov_len), 0});
  }
  coalesce(ctx->wr_sges.data(), iovcnt, ctx->runs, &ctx->bytes);
  if (ctx->runs.empty()) return abandon(ctx, fail(EINVAL, "regcore_reg_ctx_init_iov: empty SGL"));
  if (ctx->runs.size() > qs->policy.max_sge_per_ctx)
    return abandon(ctx, fail(E2BIG, "%u elements exceed the declared max_sge_per_ctx=%u", ctx->runs.size(),
                             qs->policy.max_sge_per_ctx));
  ctx->reg_len = ctx->bytes;
  int err;
  if (ctx->runs.size() == 1) {
    void *addr = reinterpret_cast<void *>(static_cast<uintptr_t>(ctx->runs[0].addr));
    ctx->reg_strategy = qs->dom->mw_ok ? REGCORE_REG_MW : REGCORE_REG_MR;
    err = ctx->reg_strategy == REGCORE_REG_MW ? reg_init_mw(ctx, addr, ctx->bytes) : reg_init_mr(ctx, addr, ctx->bytes);
  } else if (qs->policy.indirect && qs->mqpx) {
    ctx->reg_strategy = REGCORE_REG_INDIRECT;
    err = reg_init_indirect(ctx);
  } else {
    ctx->reg_strategy = REGCORE_REG_STAGED;
    err = reg_init_staged(ctx);
  }
  if (err) return abandon(ctx, err);
  qs->stats.reg_ctxs[ctx->reg_strategy]++;
  *out = reinterpret_cast<regcore_reg_ctx *>(ctx);
  return 0;
}

int regcore_reg_ctx_rkey(const struct regcore_reg_ctx *handle, uint32_t *rkey, uint64_t *remote_addr) {
  if (!handle) return fail(EINVAL, "regcore_reg_ctx_rkey: NULL context");
  const Ctx *ctx = ctx_of(handle);
  if (rkey) *rkey = ctx->reg_rkey;
  if (remote_addr) *remote_addr = ctx->reg_addr;
  return 0;
}

int regcore_reg_ctx_post(struct regcore_reg_ctx *handle, struct ibv_send_wr *chain_wr) {
  if (!handle) return fail(EINVAL, "regcore_reg_ctx_post: NULL context");
  Ctx *ctx = ctx_of(handle);
  QpState *qs = ctx->qp;
  if (!qs) return fail(ENOTCONN, "regcore_reg_ctx_post: the QP was destroyed");
  QpLock lock(qs);
  if (ctx->kind != Ctx::kReg || ctx->ulp_done || ctx->life != Ctx::kInit)
    return fail(EINVAL, "regcore_reg_ctx_post: context not initialized or already posted");
  bool umr = ctx->reg_strategy == REGCORE_REG_INDIRECT;
  if (chain_wr) if (int err = check_chain_wr(chain_wr, umr)) return err;
  if (staged_reg(ctx) && (ctx->remote_access & IBV_ACCESS_REMOTE_READ)) stage_copy(ctx, true);
  bool mw = ctx->mw != nullptr;
  if (!mw && !umr && !chain_wr) {
    ctx->life = Ctx::kPosted;  // registered synchronously: nothing to post
    return 0;
  }
  // Invalidatable keys reserve room for their LOCAL_INV now, so release
  // never waits for queue room.
  bool inval = mw || umr;
  uint32_t posted = mw ? 1 : umr ? ctx->nwr : 0;
  if (!take_credits(qs, posted + (inval ? 1 : 0))) return -EAGAIN;
  Chain &c = ctx->chains[0];
  c.reset();
  c.ulp_visible = chain_wr != nullptr;
  c.ulp_wr_id = chain_wr ? last_of(chain_wr)->wr_id : 0;
  PostResult r;
#if REGCORE_HAVE_MLX5DV
  if (umr) {
    unsigned access = IBV_ACCESS_LOCAL_WRITE | ctx->remote_access;
    r = post_umr_batch(ctx, qs, c, access, false, chain_wr);
    if (r.err == 0) ctx->mkey->need_inval = true;  // until invalidated
  } else
#endif
  {
    r = post_chain(qs, c, mw ? ctx->wrs.data() : nullptr, mw ? 1 : 0, chain_wr);
  }
  if (inval && r.internal_posted) ctx->key = Ctx::kKeyLive;
  if (inval && (r.err == 0 || r.any_posted)) {
    ctx->reserved_credits = 1;
    qs->credits -= 1;
  }
  return finish_post(ctx, qs, c, r, posted);
}

int regcore_reg_ctx_release(struct regcore_reg_ctx *handle, uint32_t invalidated_rkey,
                            regcore_release_cb cb, void *arg) {
  if (!handle) return fail(EINVAL, "regcore_reg_ctx_release: NULL context");
  Ctx *ctx = ctx_of(handle);
  CtxLock lock(ctx);
  if (ctx->kind != Ctx::kReg || ctx->ulp_done)
    return fail(EINVAL, "regcore_reg_ctx_release: not a live reg context");
  QpState *qs = ctx->qp;
  ctx->ulp_done = true;
  bool remote_inv_ok = ctx->reg_strategy != REGCORE_REG_MR && !(staged_reg(ctx) && !ctx->mw);
  if (invalidated_rkey && remote_inv_ok && ctx->key == Ctx::kKeyLive && invalidated_rkey == ctx->reg_rkey) {
    if (qs) qs->stats.remote_inv_matched++;
    mark_key_dead(ctx);  // the peer's SEND_WITH_INV already killed it
    if (ctx->mkey) ctx->mkey->need_inval = false;
  } else if (invalidated_rkey) {
    if (qs) qs->stats.remote_inv_mismatched++;
    fail(EKEYREJECTED, "peer invalidated rkey %#x, expected %#x: invalidating locally",
         invalidated_rkey, ctx->reg_rkey);
    if (qs) note_foreign_invalidation(qs, invalidated_rkey);
  }
  if (ctx->key == Ctx::kKeyLive) {
    if (ctx->own_mrs.size() || !qs || qs->error || post_local_inv(ctx) != 0) {
      kill_reg_key_sync(ctx);
    } else {
      ctx->cb = cb;
      ctx->cb_arg = arg;
      ctx->cb_owed = true;
      return -EINPROGRESS;
    }
  }
  hand_back(ctx);
  std::vector<DueCallback> none;
  finish_reg_release(ctx, false, none);
  return 0;
}

enum regcore_reg_strategy regcore_reg_ctx_strategy(const struct regcore_reg_ctx *handle) {
  return ctx_of(handle)->reg_strategy;
}

int regcore_reg_ctx_remote_inv_ok(const struct regcore_reg_ctx *handle) {
  const Ctx *ctx = ctx_of(handle);
  return ctx->reg_strategy == REGCORE_REG_MW || ctx->reg_strategy == REGCORE_REG_INDIRECT ||
         (ctx->reg_strategy == REGCORE_REG_STAGED && ctx->mw);
}

}  // extern "C"
