// regcore internals shared by core.cpp, ctx.cpp and cache.cpp.
#pragma once

#include <infiniband/verbs.h>
#if REGCORE_HAVE_MLX5DV
#include <infiniband/mlx5dv.h>
#endif

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "regcore/regcore.h"

struct mlx5dv_mkey;
struct mlx5dv_qp_ex;

namespace rc {

struct Core;
struct Ctx;
struct QpState;

// ------------------------------------------------------------------ errors

// Records a message for regcore_last_error() and returns -err.
int fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ------------------------------------------------------------------- cache

// First member is the public struct, so regcore_mr* converts back.
struct CacheEntry {
  regcore_mr pub;
  uintptr_t start;
  uintptr_t end;
  uint32_t refs;
  bool indexed;  // findable; unindexed entries die on their last put
  uint64_t last_use;
};

class Cache {
 public:
  void init(ibv_pd *pd, uint32_t max_entries, uint64_t max_bytes);
  int get(uintptr_t addr, size_t len, unsigned access, CacheEntry **out, regcore_stats &st);
  void put(CacheEntry *e);
  void invalidate(uintptr_t addr, size_t len);
  // Deregisters everything; -EBUSY if an entry is still referenced.
  int clear();

 private:
  CacheEntry *lookup(uintptr_t addr, size_t len, unsigned access);
  int make_room(uint64_t bytes, regcore_stats &st);
  void unindex(CacheEntry *e);
  void destroy(CacheEntry *e);

  ibv_pd *pd_ = nullptr;
  uint32_t max_entries_ = 0;
  uint64_t max_bytes_ = 0;
  uint64_t bytes_ = 0;
  uint32_t count_ = 0;  // all live entries, indexed or not
  uint64_t tick_ = 0;
  CacheEntry *last_hit_ = nullptr;
  std::multimap<uintptr_t, CacheEntry *> by_end_;
};

// ------------------------------------------------------ registration pools

struct MwRec {
  ibv_mw *mw;
  uint32_t rkey;  // last key used with this window; the next is ibv_inc_rkey
};

struct MkeyRec {
  mlx5dv_mkey *mkey;
  bool need_inval;  // configured by a UMR: LOCAL_INV before the next UMR
};

struct StageRec {
  void *buf;
  ibv_mr *mr;
};

// ------------------------------------------------------------------ chains

// One posted group of WRs of a context, tracked until the send queue has
// retired it. Completions carry (chain address | role) as wr_id.
enum : uint64_t { kRoleFinal = 0, kRoleUnsignaled = 1, kRoleMask = 7 };

struct Chain {
  enum State { kIdle, kPosted, kRetired };
  Ctx *ctx = nullptr;
  QpState *qp = nullptr;
  State state = kIdle;
  uint32_t credits = 0;    // send-queue credits held until retired
  uint32_t wr_posted = 0;  // regcore WRs the provider accepted
  uint32_t unsig_cqes = 0; // their (error/flush) completions seen
  bool has_final = false;  // the signaled WR was accepted
  bool ulp_visible = false;
  uint64_t ulp_wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;  // first error seen
  Chain *prev = nullptr, *next = nullptr;  // per-QP FIFO

  uint64_t tag(uint64_t role) const { return reinterpret_cast<uintptr_t>(this) | role; }
  void reset() {
    state = kIdle;
    credits = wr_posted = unsig_cqes = 0;
    has_final = ulp_visible = false;
    ulp_wr_id = 0;
    status = IBV_WC_SUCCESS;
    prev = next = nullptr;
  }
};

// ---------------------------------------------------------------- contexts

struct Ctx {
  enum Kind { kFree, kRw, kReg };
  enum Life { kInit, kPosted, kCompleted, kFailedPost };
  enum Key { kNoKey, kKeyLive, kKeyDead };

  Core *core = nullptr;
  QpState *qp = nullptr;  // nullptr once regcore_qp_destroy ran
  Kind kind = kFree;
  Life life = kInit;
  bool ulp_done = false;  // destroy/release called
  Chain chains[2];        // [0] the context's post, [1] reg: LOCAL_INV
  uint32_t nwr = 0;       // regcore WRs of chains[0]
  uint32_t reserved_credits = 0;

  // resources, released when the context is recycled
  std::vector<CacheEntry *> cache_refs;
  std::vector<ibv_mr *> own_mrs;
  MkeyRec *mkey = nullptr;
  StageRec *stage = nullptr;
  MwRec *mw = nullptr;

  // rw
  regcore_dir dir = REGCORE_DIR_READ;
  regcore_rw_strategy strategy = REGCORE_RW_SINGLE_WR;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t bytes = 0;
  std::vector<ibv_sge> runs;     // coalesced ULP SGEs with lkeys resolved
  std::vector<ibv_sge> wr_sges;  // SGE storage of wrs
  std::vector<ibv_send_wr> wrs;

  // reg
  regcore_reg_strategy reg_strategy = REGCORE_REG_MW;
  Key key = kNoKey;
  uint32_t reg_rkey = 0;
  void *reg_addr = nullptr;
  size_t reg_len = 0;
  unsigned remote_access = 0;
  bool cb_owed = false;  // release returned -EINPROGRESS
  regcore_release_cb cb = nullptr;
  void *cb_arg = nullptr;

  void clear_for_reuse();
};

struct QpState {
  ibv_qp *qp = nullptr;
  ibv_qp_ex *qpx = nullptr;
  mlx5dv_qp_ex *mqpx = nullptr;
  uint32_t max_ctxs = 0;
  uint32_t ctxs = 0;     // contexts bound to this QP
  uint32_t credits = 0;  // free send-queue WRs of regcore's share
  bool error = false;    // an error completion or failed post was seen
  Chain *head = nullptr, *tail = nullptr;
};

// -------------------------------------------------------------------- core

struct Core {
  ibv_pd *pd = nullptr;
  ibv_context *ctx = nullptr;
  regcore_attr attr{};
  regcore_policy policy{};
  ibv_device_attr_ex dev{};
  unsigned internal_access = 0;  // access of cache entries regcore uses
  bool mw_ok = false;
  bool indirect_ok = false;

  Cache cache;
  std::vector<Ctx> pool;  // never resized: chain addresses are wr_ids
  std::vector<Ctx *> free_ctxs;
  uintptr_t chain0_off = 0, chain1_off = 0;
  std::unordered_map<ibv_qp *, QpState *> qps;
  uint32_t declared_ctxs = 0;
  std::unordered_map<uint32_t, Ctx *> live_rkeys;

  // registration objects: pooled (free) plus held by contexts
  std::vector<MwRec *> free_mws;
  std::vector<MkeyRec *> free_mkeys;
  std::vector<StageRec *> free_stages;
  uint32_t reg_objects = 0;  // allocated, pooled or held
  uint32_t ulp_cache_refs = 0;
  regcore_stats stats{};
};

// core.cpp
QpState *find_qp(Core *core, ibv_qp *qp);
Ctx *ctx_alloc(Core *core, QpState *qs, Ctx::Kind kind);
void maybe_recycle(Ctx *ctx);
void fifo_append(QpState *qs, Chain *c);
void retire_through(Chain *c);
int acquire_mw(Core *core, MwRec **out);
void release_mw(Core *core, MwRec *mw, bool kill);
int acquire_mkey(Core *core, MkeyRec **out);
void release_mkey(Core *core, MkeyRec *mk, bool reset);
int acquire_stage(Core *core, StageRec **out);
void release_stage(Core *core, StageRec *st);
int acquire_reg_slot(Core *core);  // for a transient per-context MR
void release_reg_slot(Core *core);
void move_qp_to_error(QpState *qs);

// ctx.cpp: completion hooks
void on_final_completion(Ctx *ctx, Chain *c, ibv_wc *wc);
void kill_reg_key_sync(Ctx *ctx);
void finish_reg_release(Ctx *ctx, bool from_completion);
void rw_release_resources(Ctx *ctx);
void reg_release_resources(Ctx *ctx);

// Coalesces adjacent SGEs (same lkey, or both lkey 0) and drops empty ones.
void coalesce(const ibv_sge *sgl, unsigned nsge, std::vector<ibv_sge> &runs, uint64_t *bytes);

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
