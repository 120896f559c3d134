// regcore benchmark (not a test), three sections on simverbs with a model
// of real registration cost (simverbs_set_reg_cost):
//
//  post     per-I/O CPU cost of regcore's post path against a ULP posting
//           the same work requests by hand, as a ratio. Both sides run the
//           same device, memory and WRs; the hand side knows its lkeys and
//           keeps its own windows/mkeys (and, in *_hand_reg_per_io,
//           registers per I/O, as code rdma-registration-in-datapath flags
//           does), regcore looks them up in its cache and pools.
//             post:  building and posting one I/O (regcore: ctx init + post;
//                    hand: filling ibv_send_wr/ibv_wr_* + ibv_post_send)
//             cycle: post + polling its completion + teardown
//  cache    regcore's registration cache against UCX's rcache
//           (bench_ucx.cpp, when libucx-dev is installed) in the same run:
//           hits, the index with many entries, misses, unmapping cached
//           memory, and the mmap/get/put/munmap churn of an allocator
//  scaling  threads sharing one core: cache hits (own buffer, one shared
//           buffer; regcore and UCX) and rw I/Os on a QP per thread
//
//   regcore_bench [--section=post|cache|scaling|all] [--batches=N] [--reps=R]
//                 [--reg-cost=REG_NS,PAGE_NS,DEREG_NS,PAGE_NS|none]
//                 [--json=FILE] [--only=NAME]
#include <infiniband/mlx5dv.h>
#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../tests/env.hpp"
#if REGCORE_BENCH_UCX
#include "bench_ucx.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The registration cost model: microseconds per call and a per-page cost
// for pinning and translation entries, the order of magnitude reported for
// ibv_reg_mr on current hardware. A model, not a measurement: --reg-cost.
simverbs_reg_cost g_reg_cost = {5000, 250, 3000, 100};
constexpr unsigned kDepth = 16;  // I/Os per batch: posted back to back, then polled

struct Scenario {
  const char *name;
  simverbs_profile profile;
  regcore_dir dir;
  unsigned runs;
  uint32_t run_len;
  bool reg;               // remote registration (reg ctx) instead of rw
  bool hand_reg_per_io;   // the hand side registers every I/O's buffer
};

const Scenario kScenarios[] = {
    {"write_1sge", SIMVERBS_PROFILE_MLX5, REGCORE_DIR_WRITE, 1, 4096, false},
    {"write_4sge", SIMVERBS_PROFILE_MLX5, REGCORE_DIR_WRITE, 4, 1024, false},
    {"read_1sge", SIMVERBS_PROFILE_MLX4, REGCORE_DIR_READ, 1, 4096, false},
    {"read_multi_wr_mthca", SIMVERBS_PROFILE_MTHCA, REGCORE_DIR_READ, 8, 512, false},
    {"read_staged_mlx4", SIMVERBS_PROFILE_MLX4, REGCORE_DIR_READ, 20, 256, false},
    {"read_indirect_mlx5", SIMVERBS_PROFILE_MLX5, REGCORE_DIR_READ, 20, 256, false},
    {"read_mr_reg_iwarp", SIMVERBS_PROFILE_IWARP, REGCORE_DIR_READ, 2, 2048, false},
    {"reg_mw_send_inv_mlx5", SIMVERBS_PROFILE_MLX5, REGCORE_DIR_WRITE, 1, 8192, true},
    {"write_1sge_hand_reg_per_io", SIMVERBS_PROFILE_MLX5, REGCORE_DIR_WRITE, 1, 4096, false, true},
};

struct Sample {
  double post_ns = 0, cycle_ns = 0;
};

struct Result {
  const Scenario *sc;
  std::string strategy;
  Sample hand, core;
};

// Everything one scenario needs, on both sides.
class Bench {
 public:
  explicit Bench(const Scenario &sc) : sc_(sc), env_(sc.profile, options()) {
    uint32_t stride = sc.run_len + 128;
    arena_.assign(static_cast<size_t>(kDepth) * sc.runs * stride + 4096, 0x11);
    for (unsigned d = 0; d < kDepth; d++) {
      std::vector<ibv_sge> list;
      for (unsigned r = 0; r < sc.runs; r++)
        list.push_back({reinterpret_cast<uintptr_t>(arena_.data()) + (d * sc.runs + r) * stride,
                        sc.run_len, 0});
      sges_.push_back(list);
    }
    // Both sides start with the arena registered: the hand side with its own
    // MR, regcore with a warm cache entry.
    unsigned access = IBV_ACCESS_LOCAL_WRITE | (sc.reg ? IBV_ACCESS_MW_BIND : 0);
    hand_mr_ = ibv_reg_mr(env_.pd, arena_.data(), arena_.size(), static_cast<int>(access));
    regcore_mr *warm = nullptr;
    regcore_mr_get(env_.core, arena_.data(), arena_.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, &warm);
    regcore_mr_put(env_.core, warm);
    recv_.assign(64 * 64, 0);
    recv_mr_ = ibv_reg_mr(env_.pd, recv_.data(), recv_.size(), IBV_ACCESS_LOCAL_WRITE);
    for (unsigned i = 0; i < 64; i++) post_recv(i);
    setup_hand();
  }

  ~Bench() {
    for (ibv_mw *mw : mws_) ibv_dealloc_mw(mw);
    for (mlx5dv_mkey *mk : mkeys_) mlx5dv_destroy_mkey(mk);
    if (stage_mr_) ibv_dereg_mr(stage_mr_);
    ibv_dereg_mr(recv_mr_);
    ibv_dereg_mr(hand_mr_);
  }

  Sample run_core(unsigned batches);
  Sample run_hand(unsigned batches);

 private:
  static testenv::Options options() {
    testenv::Options o;
    o.max_ctxs = o.qp_ctxs = kDepth;
    o.ulp_send_wr = kDepth;
    o.max_sge_per_ctx = 32;
    o.recv_wr = 64;
    return o;
  }
  void setup_hand();
  void post_recv(unsigned slot);
  void peer_answer_all(bool invalidate);
  void poll_n(ibv_cq *cq, unsigned n, bool via_core, std::vector<ibv_wc> *out = nullptr);
  uint64_t raddr(unsigned d) const {
    return reinterpret_cast<uintptr_t>(env_.remote.data()) + static_cast<uint64_t>(d) * 64 * 1024;
  }
  // hand-side post paths
  void hand_post_rw(unsigned d);
  void hand_post_indirect(unsigned d);
  void hand_post_staged(unsigned d);
  void hand_post_mr_reg(unsigned d);
  void hand_post_reg(unsigned d);

  const Scenario &sc_;
  testenv::Env env_;
  std::vector<uint8_t> arena_;
  std::vector<std::vector<ibv_sge>> sges_;
  ibv_mr *hand_mr_ = nullptr;
  std::vector<uint8_t> recv_;
  ibv_mr *recv_mr_ = nullptr;
  // hand-side state mirroring what regcore would use: one mkey, staging
  // buffer or window per in-flight I/O
  std::vector<mlx5dv_mkey *> mkeys_;
  std::vector<bool> mkey_configured_;
  std::vector<uint8_t> stage_;
  ibv_mr *stage_mr_ = nullptr;
  std::vector<ibv_mw *> mws_;
  std::vector<uint32_t> mw_keys_;
  std::vector<ibv_mr *> iter_mrs_;
  std::vector<uint32_t> sent_keys_;
};

void Bench::post_recv(unsigned slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_.data()) + slot * 64, 64, recv_mr_->lkey};
  ibv_recv_wr wr{}, *bad;
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_post_recv(env_.qp, &wr, &bad);
}

void Bench::setup_hand() {
  if (sc_.reg) {
    for (unsigned d = 0; d < kDepth; d++) {
      ibv_mw *mw = ibv_alloc_mw(env_.pd, IBV_MW_TYPE_2);
      mws_.push_back(mw);
      mw_keys_.push_back(mw->rkey);
    }
    sent_keys_.assign(kDepth, 0);
  }
  if (sc_.profile == SIMVERBS_PROFILE_MLX4 && sc_.runs > 16) {
    stage_.assign(64 * 1024 * kDepth, 0);
    stage_mr_ = ibv_reg_mr(env_.pd, stage_.data(), stage_.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  if (sc_.profile == SIMVERBS_PROFILE_MLX5 && sc_.runs > 16) {
    for (unsigned d = 0; d < kDepth; d++) {
      mlx5dv_mkey_init_attr a{env_.pd, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 32};
      mkeys_.push_back(mlx5dv_create_mkey(&a));
      mkey_configured_.push_back(false);
    }
  }
}

void Bench::poll_n(ibv_cq *cq, unsigned n, bool via_core, std::vector<ibv_wc> *out) {
  ibv_wc wc[kDepth];
  unsigned got = 0;
  while (got < n) {
    int k = via_core ? regcore_poll_cq(env_.core, cq, static_cast<int>(std::min(n - got, kDepth)), wc)
                     : ibv_poll_cq(cq, static_cast<int>(std::min(n - got, kDepth)), wc);
    if (k < 0) testenv::die("poll");
    for (int i = 0; i < k; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) testenv::die(std::string("completion: ") + ibv_wc_status_str(wc[i].status));
      if (out) out->push_back(wc[i]);
    }
    got += static_cast<unsigned>(k);
  }
}

// The target side of the reg scenario: read each command, answer with
// SEND_WITH_INV of the advertised key (or a plain SEND).
void Bench::peer_answer_all(bool invalidate) {
  uint32_t key;
  size_t len;
  unsigned n = 0;
  while (simverbs_peer_recv(env_.peer, &key, sizeof key, &len) == 0) {
    if (simverbs_peer_send(env_.peer, "ok", 3, invalidate ? key : 0)) testenv::die("peer send");
    n++;
  }
  std::vector<ibv_wc> wcs;
  poll_n(env_.rcq, n, true, &wcs);
  for (const ibv_wc &wc : wcs) post_recv(static_cast<unsigned>(wc.wr_id));
}

// ------------------------------------------------------------ regcore side

Sample Bench::run_core(unsigned batches) {
  Sample s;
  std::vector<regcore_rw_ctx *> rw(kDepth);
  std::vector<regcore_reg_ctx *> reg(kDepth);
  std::vector<ibv_send_wr> sends(kDepth);
  std::vector<ibv_sge> send_sges(kDepth);
  std::vector<uint32_t> keys(kDepth);
  std::vector<double> post, cycle;  // per batch: robust against preemption
  for (unsigned b = 0; b < batches; b++) {
    auto t0 = Clock::now();
    for (unsigned d = 0; d < kDepth; d++) {
      if (!sc_.reg) {
        if (regcore_rw_ctx_init(&rw[d], env_.core, env_.qp, sges_[d].data(), sc_.runs, raddr(d),
                                env_.remote_rkey, sc_.dir) <= 0 ||
            regcore_rw_ctx_post(rw[d], env_.qp, d, nullptr))
          testenv::die("regcore rw");
        continue;
      }
      ibv_sge &sg = sges_[d][0];
      if (regcore_reg_ctx_init(&reg[d], env_.core, env_.qp, reinterpret_cast<void *>(sg.addr), sg.length,
                               IBV_ACCESS_REMOTE_WRITE))
        testenv::die("regcore reg");
      regcore_reg_ctx_rkey(reg[d], &keys[d], nullptr);
      send_sges[d] = {reinterpret_cast<uintptr_t>(&keys[d]), sizeof keys[d], 0};
      sends[d] = ibv_send_wr{};
      sends[d].wr_id = d;
      sends[d].sg_list = &send_sges[d];
      sends[d].num_sge = 1;
      sends[d].opcode = IBV_WR_SEND;
      sends[d].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
      if (regcore_reg_ctx_post(reg[d], &sends[d])) testenv::die("regcore reg post");
    }
    auto t1 = Clock::now();
    poll_n(env_.scq, kDepth, true);
    if (!sc_.reg) {
      for (unsigned d = 0; d < kDepth; d++) regcore_rw_ctx_destroy(rw[d]);
    } else {
      peer_answer_all(true);
      for (unsigned d = 0; d < kDepth; d++)
        if (regcore_reg_ctx_release(reg[d], keys[d], nullptr, nullptr)) testenv::die("release");
    }
    auto t2 = Clock::now();
    post.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    cycle.push_back(std::chrono::duration<double, std::nano>(t2 - t0).count());
  }
  s.post_ns = median(post) / kDepth;
  s.cycle_ns = median(cycle) / kDepth;
  return s;
}

// --------------------------------------------------------------- hand side

void Bench::hand_post_rw(unsigned d) {
  ibv_sge sge[32];
  unsigned max_sge = sc_.dir == REGCORE_DIR_READ ? (sc_.profile == SIMVERBS_PROFILE_MTHCA ? 2u : 16u) : 16u;
  for (unsigned r = 0; r < sc_.runs; r++) {
    uint32_t lkey = hand_mr_->lkey;
    if (sc_.hand_reg_per_io) {  // deregistered after the completion
      ibv_mr *mr = ibv_reg_mr(env_.pd, reinterpret_cast<void *>(sges_[d][r].addr), sges_[d][r].length,
                              IBV_ACCESS_LOCAL_WRITE);
      iter_mrs_.push_back(mr);
      lkey = mr->lkey;
    }
    sge[r] = {sges_[d][r].addr, sges_[d][r].length, lkey};
  }
  ibv_send_wr wr[16]{};
  unsigned nwr = (sc_.runs + max_sge - 1) / max_sge;
  uint64_t ra = raddr(d);
  for (unsigned i = 0; i < nwr; i++) {
    wr[i].wr_id = d;
    wr[i].opcode = sc_.dir == REGCORE_DIR_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr[i].sg_list = &sge[i * max_sge];
    wr[i].num_sge = static_cast<int>(std::min(max_sge, sc_.runs - i * max_sge));
    wr[i].wr.rdma.remote_addr = ra;
    wr[i].wr.rdma.rkey = env_.remote_rkey;
    for (int k = 0; k < wr[i].num_sge; k++) ra += wr[i].sg_list[k].length;
    wr[i].next = i + 1 < nwr ? &wr[i + 1] : nullptr;
    wr[i].send_flags = i + 1 == nwr ? IBV_SEND_SIGNALED : 0;
  }
  ibv_send_wr *bad;
  if (ibv_post_send(env_.qp, wr, &bad)) testenv::die("hand post");
}

// One pre-registered MR per context, data staged through it.
void Bench::hand_post_staged(unsigned d) {
  uint8_t *stage = stage_.data() + static_cast<size_t>(d) * 64 * 1024;
  uint32_t bytes = sc_.runs * sc_.run_len;
  ibv_sge sge{reinterpret_cast<uintptr_t>(stage), bytes, stage_mr_->lkey};
  ibv_send_wr wr{}, *bad;
  wr.wr_id = d;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = raddr(d);
  wr.wr.rdma.rkey = env_.remote_rkey;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(env_.qp, &wr, &bad)) testenv::die("hand staged post");
}

// LOCAL_INV (after the first use) + UMR + READ through the mkey.
void Bench::hand_post_indirect(unsigned d) {
  ibv_qp_ex *qx = ibv_qp_to_qp_ex(env_.qp);
  mlx5dv_qp_ex *mqx = mlx5dv_qp_ex_from_ibv_qp_ex(qx);
  ibv_sge list[32];
  for (unsigned r = 0; r < sc_.runs; r++) list[r] = {sges_[d][r].addr, sges_[d][r].length, hand_mr_->lkey};
  std::vector<mlx5dv_mkey *> &mkeys = mkeys_;
  ibv_wr_start(qx);
  if (mkey_configured_[d]) {
    qx->wr_id = d;
    qx->wr_flags = 0;
    ibv_wr_local_inv(qx, mkeys[d]->lkey);
  }
  qx->wr_id = d;
  qx->wr_flags = IBV_SEND_INLINE;
  mlx5dv_wr_mr_list(mqx, mkeys[d], IBV_ACCESS_LOCAL_WRITE, static_cast<uint16_t>(sc_.runs), list);
  qx->wr_id = d;
  qx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_read(qx, env_.remote_rkey, raddr(d));
  ibv_wr_set_sge(qx, mkeys[d]->lkey, 0, sc_.runs * sc_.run_len);
  if (ibv_wr_complete(qx)) testenv::die("hand indirect post");
  mkey_configured_[d] = true;
}

// A private MR per run with LOCAL_WRITE|REMOTE_WRITE, one READ per run.
void Bench::hand_post_mr_reg(unsigned d) {
  ibv_sge sge[32];
  ibv_send_wr wr[32]{};
  uint64_t ra = raddr(d);
  for (unsigned r = 0; r < sc_.runs; r++) {
    ibv_mr *mr = ibv_reg_mr(env_.pd, reinterpret_cast<void *>(sges_[d][r].addr), sges_[d][r].length,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    iter_mrs_.push_back(mr);
    sge[r] = {sges_[d][r].addr, sges_[d][r].length, mr->lkey};
    wr[r].wr_id = d;
    wr[r].opcode = IBV_WR_RDMA_READ;
    wr[r].sg_list = &sge[r];
    wr[r].num_sge = 1;
    wr[r].wr.rdma.remote_addr = ra;
    wr[r].wr.rdma.rkey = env_.remote_rkey;
    ra += sge[r].length;
    wr[r].next = r + 1 < sc_.runs ? &wr[r + 1] : nullptr;
    wr[r].send_flags = r + 1 == sc_.runs ? IBV_SEND_SIGNALED : 0;
  }
  ibv_send_wr *bad;
  if (ibv_post_send(env_.qp, wr, &bad)) testenv::die("hand mr_reg post");
}

// BIND_MW with a rotated key + SEND of the key, one chain.
void Bench::hand_post_reg(unsigned d) {
  mw_keys_[d] = ibv_inc_rkey(mw_keys_[d]);
  sent_keys_[d] = mw_keys_[d];
  ibv_send_wr wr[2]{}, *bad;
  wr[0].opcode = IBV_WR_BIND_MW;
  wr[0].bind_mw.mw = mws_[d];
  wr[0].bind_mw.rkey = mw_keys_[d];
  wr[0].bind_mw.bind_info = {hand_mr_, sges_[d][0].addr, sges_[d][0].length, IBV_ACCESS_REMOTE_WRITE};
  wr[0].next = &wr[1];
  ibv_sge sge{reinterpret_cast<uintptr_t>(&sent_keys_[d]), sizeof(uint32_t), 0};
  wr[1].wr_id = d;
  wr[1].opcode = IBV_WR_SEND;
  wr[1].sg_list = &sge;
  wr[1].num_sge = 1;
  wr[1].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  if (ibv_post_send(env_.qp, wr, &bad)) testenv::die("hand reg post");
}

Sample Bench::run_hand(unsigned batches) {
  Sample s;
  bool staged = stage_mr_ != nullptr, indirect = !mkeys_.empty();
  bool mr_reg = sc_.profile == SIMVERBS_PROFILE_IWARP && sc_.dir == REGCORE_DIR_READ;
  std::vector<double> post, cycle;  // per batch: robust against preemption
  for (unsigned b = 0; b < batches; b++) {
    auto t0 = Clock::now();
    for (unsigned d = 0; d < kDepth; d++) {
      if (sc_.reg) hand_post_reg(d);
      else if (indirect) hand_post_indirect(d);
      else if (staged) hand_post_staged(d);
      else if (mr_reg) hand_post_mr_reg(d);
      else hand_post_rw(d);
    }
    auto t1 = Clock::now();
    std::vector<ibv_wc> wcs;
    poll_n(env_.scq, kDepth, true, &wcs);
    if (staged)  // scatter the staged data, as regcore does at completion
      for (const ibv_wc &wc : wcs) {
        const uint8_t *src = stage_.data() + wc.wr_id * 64 * 1024;
        for (const ibv_sge &sg : sges_[wc.wr_id])
          std::memcpy(reinterpret_cast<void *>(sg.addr), src, sg.length), src += sg.length;
      }
    for (ibv_mr *mr : iter_mrs_) ibv_dereg_mr(mr);
    iter_mrs_.clear();
    if (sc_.reg) peer_answer_all(true);  // the key dies with the answer
    auto t2 = Clock::now();
    post.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    cycle.push_back(std::chrono::duration<double, std::nano>(t2 - t0).count());
  }
  s.post_ns = median(post) / kDepth;
  s.cycle_ns = median(cycle) / kDepth;
  return s;
}


Result measure(const Scenario &sc, unsigned batches, unsigned reps) {
  Result r;
  r.sc = &sc;
  std::vector<double> hp, hc, cp, cc;
  for (unsigned i = 0; i < reps; i++) {
    Bench b(sc);
    b.run_core(batches / 10 + 1);  // warm up caches and pools
    b.run_hand(batches / 10 + 1);
    // Alternate the order so drift does not favour one side.
    Sample c, h;
    if (i % 2) {
      c = b.run_core(batches);
      h = b.run_hand(batches);
    } else {
      h = b.run_hand(batches);
      c = b.run_core(batches);
    }
    cp.push_back(c.post_ns);
    cc.push_back(c.cycle_ns);
    hp.push_back(h.post_ns);
    hc.push_back(h.cycle_ns);
  }
  r.hand = {median(hp), median(hc)};
  r.core = {median(cp), median(cc)};
  // The strategy regcore picked for this shape.
  testenv::Options o;
  o.max_sge_per_ctx = 32;
  testenv::Env e(sc.profile, o);
  if (sc.reg) {
    regcore_policy p;
    regcore_policy_get(e.core, &p);
    r.strategy = std::string("reg_") + regcore_reg_strategy_name(p.reg_strategy);
  } else {
    std::vector<uint8_t> a(sc.runs * (sc.run_len + 128));
    std::vector<ibv_sge> sge;
    for (unsigned i = 0; i < sc.runs; i++)
      sge.push_back({reinterpret_cast<uintptr_t>(a.data()) + i * (sc.run_len + 128), sc.run_len, 0});
    regcore_rw_strategy st;
    regcore_rw_strategy_for(e.core, sc.dir, sge.data(), sc.runs, &st);
    r.strategy = regcore_rw_strategy_name(st);
  }
  return r;
}

// ================================================================= cache

// A registration cache as the measurements see it: regcore's or UCX's.
struct CacheApi {
  const char *name;
  void *self;
  void *(*get)(void *self, void *addr, size_t len);
  void (*put)(void *self, void *handle);
};

void *regcore_get(void *self, void *addr, size_t len) {
  regcore_mr *mr = nullptr;
  regcore_mr_get(static_cast<regcore *>(self), addr, len, IBV_ACCESS_LOCAL_WRITE, &mr);
  return mr;
}
void regcore_put(void *self, void *h) { regcore_mr_put(static_cast<regcore *>(self), static_cast<regcore_mr *>(h)); }

#if REGCORE_BENCH_UCX
void *ucx_get(void *self, void *addr, size_t len) {
  uint32_t lkey;
  return ucx_cache_get(static_cast<UcxCache *>(self), addr, len, &lkey);
}
void ucx_put(void *self, void *h) { ucx_cache_put(static_cast<UcxCache *>(self), h); }
#endif

// libc's munmap: the benchmark's own calls would land in simverbs'
// interposer (a raw syscall), which UCX's libucm hooks do not see.
int libc_munmap(void *p, size_t len) {
  static auto fn = reinterpret_cast<int (*)(void *, size_t)>(dlsym(RTLD_NEXT, "munmap"));
  return fn(p, len);
}

void *map_region(size_t len) {
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) testenv::die("mmap");
  std::memset(p, 1, len);
  return p;
}

double elapsed_ns(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}


struct CacheRow {
  std::string what;
  double regcore = 0, ucx = -1;  // ns per operation; -1: not measured
};

constexpr size_t kBuf = 64 * 1024;

// The rows of the cache table. Each implementation gets the same state;
// repetitions alternate between them so that both see the same machine
// (the build machine is shared and noisy).
const char *const kCacheRows[] = {
    "hit: get+put of one 64 KiB buffer",
    "hit: get+put, 64 buffers in turn",
    "hit: 64 buffers in turn, 1024 entries cached",
    "hit: 64 buffers in turn, 16384 entries cached",
    "hit: 1024 buffers in turn, 16384 entries cached",
    "miss: get+put of a new 4 KiB range (registration model included)",
    "miss, registration free",
    "munmap of an uncached 64 KiB buffer, then a hit",
    "munmap of a cached 64 KiB buffer, then the hit that deregisters it",
    "churn: mmap, get, put, munmap of 64 KiB",
};

// One implementation's memory for the measurements.
struct CacheState {
  CacheApi api;
  void *one = nullptr;
  std::vector<std::pair<char *, size_t>> regions;  // unmapped at the end
  std::vector<char *> rotating;                    // per entry count
  char *miss_base = nullptr;
  size_t miss_next = 0;
};

constexpr size_t kPage = 4096;
constexpr unsigned kMissOps = 500, kUnmapOps = 200, kHitOps = 200000;

// 4 KiB buffers two pages apart (never merged).
char *cache_spaced(CacheState &st, size_t entries) {
  auto *base = static_cast<char *>(map_region(entries * 2 * kPage));
  for (size_t i = 0; i < entries; i++) st.api.put(st.api.self, st.api.get(st.api.self, base + i * 2 * kPage, kPage));
  st.regions.push_back({base, entries * 2 * kPage});
  return base;
}

void prepare(CacheState &st, unsigned reps) {
  st.one = map_region(kBuf);
  st.api.put(st.api.self, st.api.get(st.api.self, st.one, kBuf));
  for (size_t entries : {size_t(64), size_t(1024), size_t(16384)}) st.rotating.push_back(cache_spaced(st, entries));
  size_t miss_len = static_cast<size_t>(kMissOps) * 2 * reps * 2 * kPage;
  st.miss_base = static_cast<char *>(map_region(miss_len));
  st.regions.push_back({st.miss_base, miss_len});
}

// One repetition of row `row`, ns per operation.
double cache_rep(CacheState &st, size_t row) {
  const CacheApi &c = st.api;
  // The median of chunks of ops: a preempted chunk does not move it.
  auto per_op = [](unsigned ops, auto body) {
    const unsigned chunk = std::max(1u, ops / 100);
    std::vector<double> v;
    for (unsigned i = 0; i < ops; i += chunk) {
      auto t0 = Clock::now();
      for (unsigned k = i; k < std::min(ops, i + chunk); k++) body(k);
      v.push_back(elapsed_ns(t0) / (std::min(ops, i + chunk) - i));
    }
    return median(v);
  };
  auto hit = [&](void *p, size_t len) { c.put(c.self, c.get(c.self, p, len)); };
  auto rotate = [&](size_t which, size_t entries, size_t buffers) {
    size_t stride = entries / buffers;
    return per_op(kHitOps,
                  [&](unsigned i) { hit(st.rotating[which] + ((i % buffers) * stride) * 2 * kPage, kPage); });
  };
  auto miss = [&] {
    return per_op(kMissOps, [&](unsigned) { hit(st.miss_base + (st.miss_next++) * 2 * kPage, kPage); });
  };
  auto unmap = [&](bool cached) {
    std::vector<void *> bufs(kUnmapOps);
    for (void *&b : bufs) {
      b = map_region(kBuf);
      if (cached) hit(b, kBuf);
    }
    return per_op(kUnmapOps, [&](unsigned i) {
      libc_munmap(bufs[i], kBuf);
      hit(st.one, kBuf);
    });
  };
  switch (row) {
    case 0: return per_op(kHitOps, [&](unsigned) { hit(st.one, kBuf); });
    case 1: return rotate(0, 64, 64);
    case 2: return rotate(1, 1024, 64);
    case 3: return rotate(2, 16384, 64);
    case 4: return rotate(2, 16384, 1024);
    case 5: return miss();
    case 6: {
      simverbs_set_reg_cost(nullptr);
      double ns = miss();
      simverbs_set_reg_cost(&g_reg_cost);
      return ns;
    }
    case 7: return unmap(false);
    case 8: return unmap(true);
    default:
      return per_op(kUnmapOps, [&](unsigned) {
        void *b = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        static_cast<char *>(b)[0] = 1;
        hit(b, kBuf);
        libc_munmap(b, kBuf);
      });
  }
}

void release(CacheState &st) {
  for (auto &r : st.regions) libc_munmap(r.first, r.second);
  libc_munmap(st.one, kBuf);
}

std::vector<CacheRow> cache_section(unsigned reps) {
  std::vector<CacheRow> rows;
  for (const char *what : kCacheRows) rows.push_back({what});
  testenv::Options o;
  o.max_ctxs = o.qp_ctxs = 1;
  o.cache_max_entries = 1 << 20;
  o.cache_max_bytes = 64ull << 30;
  testenv::Env e(SIMVERBS_PROFILE_MLX5, o);
  std::vector<CacheState> impls;
  impls.push_back({CacheApi{"regcore", e.core, regcore_get, regcore_put}});
#if REGCORE_BENCH_UCX
  UcxCache *u = ucx_cache_open(e.pd);
  if (u) impls.push_back({CacheApi{"ucx", u, ucx_get, ucx_put}});
#endif
  for (CacheState &st : impls) prepare(st, reps);
  for (size_t row = 0; row < rows.size(); row++) {
    std::vector<std::vector<double>> v(impls.size());
    for (unsigned r = 0; r < reps; r++)
      for (size_t k = 0; k < impls.size(); k++) v[k].push_back(cache_rep(impls[(k + r) % impls.size()], row));
    // v[k] mixes implementations when r is odd: sort them back out.
    std::vector<std::vector<double>> by_impl(impls.size());
    for (unsigned r = 0; r < reps; r++)
      for (size_t k = 0; k < impls.size(); k++) by_impl[(k + r) % impls.size()].push_back(v[k][r]);
    rows[row].regcore = median(by_impl[0]);
    if (impls.size() > 1) rows[row].ucx = median(by_impl[1]);
  }
  for (CacheState &st : impls) release(st);
#if REGCORE_BENCH_UCX
  if (u) ucx_cache_close(u);
#endif
  return rows;
}

// =============================================================== scaling

struct ScaleRow {
  std::string what;
  unsigned threads;
  double regcore = 0, ucx = -1;  // million operations per second, all threads
};

// Threads each doing `ops` get+put hits, on its own buffer or one shared one.
double hits_mops(const CacheApi &c, unsigned threads, bool shared, unsigned ops) {
  std::vector<void *> bufs;
  for (unsigned t = 0; t < (shared ? 1 : threads); t++) {
    bufs.push_back(map_region(kBuf));
    c.put(c.self, c.get(c.self, bufs.back(), kBuf));
  }
  std::atomic<unsigned> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; t++)
    ts.emplace_back([&, t] {
      void *b = bufs[shared ? 0 : t];
      ready++;
      while (!go.load()) std::this_thread::yield();
      for (unsigned i = 0; i < ops; i++) c.put(c.self, c.get(c.self, b, kBuf));
    });
  while (ready.load() < threads) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto &t : ts) t.join();
  double mops = static_cast<double>(ops) * threads / elapsed_ns(t0) * 1e3;
  for (void *b : bufs) libc_munmap(b, kBuf);
  return mops;
}

// Threads each posting write_1sge I/Os on their own QP of one shared core
// (regcore) or posting by hand; batches of kDepth, then poll, then destroy.
double rw_mios(unsigned threads, bool hand, unsigned batches) {
  testenv::Options o;
  o.max_ctxs = (threads + 1) * kDepth;  // the Env's own QP declares kDepth
  o.qp_ctxs = kDepth;
  o.ulp_send_wr = kDepth;
  testenv::Env e(SIMVERBS_PROFILE_MLX5, o);
  struct PerThread {
    ibv_cq *cq;
    ibv_qp *qp;
    simverbs_peer *peer;
    std::vector<uint8_t> local = std::vector<uint8_t>(kDepth * 4096, 3), remote = std::vector<uint8_t>(kDepth * 4096);
    uint32_t rkey;
    ibv_mr *mr;
  };
  std::vector<std::unique_ptr<PerThread>> pt;
  for (unsigned t = 0; t < threads; t++) {
    auto p = std::make_unique<PerThread>();
    uint32_t sq = 0;
    regcore_max_send_wr(e.core, kDepth, kDepth, &sq);
    p->cq = ibv_create_cq(e.ctx, static_cast<int>(sq) + 1, nullptr, nullptr, 0);  // + the receive
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = p->cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = kDepth;
    a.cap.max_send_sge = a.cap.max_recv_sge = a.cap.max_recv_wr = 1;
    if (regcore_qp_create(e.core, &a, kDepth, &p->qp)) testenv::die("qp");
    p->peer = simverbs_peer_create(e.ctx);
    simverbs_peer_connect(p->peer, p->qp);
    simverbs_peer_expose(p->peer, p->remote.data(), p->remote.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                         &p->rkey);
    p->mr = ibv_reg_mr(e.pd, p->local.data(), p->local.size(), IBV_ACCESS_LOCAL_WRITE);
    pt.push_back(std::move(p));
  }
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; t++)
    ts.emplace_back([&, t] {
      PerThread &p = *pt[t];
      regcore_rw_ctx *ctx[kDepth];
      while (!go.load()) std::this_thread::yield();
      for (unsigned b = 0; b < batches; b++) {
        for (unsigned d = 0; d < kDepth; d++) {
          ibv_sge sge{reinterpret_cast<uintptr_t>(p.local.data()) + d * 4096, 4096, hand ? p.mr->lkey : 0};
          uint64_t raddr = reinterpret_cast<uintptr_t>(p.remote.data()) + d * 4096;
          if (hand) {
            ibv_send_wr wr{}, *bad;
            wr.wr_id = d;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.rdma.remote_addr = raddr;
            wr.wr.rdma.rkey = p.rkey;
            if (ibv_post_send(p.qp, &wr, &bad)) testenv::die("post");
          } else if (regcore_rw_ctx_init(&ctx[d], e.core, p.qp, &sge, 1, raddr, p.rkey, REGCORE_DIR_WRITE) != 1 ||
                     regcore_rw_ctx_post(ctx[d], p.qp, d, nullptr)) {
            testenv::die("regcore post");
          }
        }
        ibv_wc wc[kDepth];
        for (unsigned got = 0; got < kDepth;) got += static_cast<unsigned>(regcore_poll_cq(e.core, p.cq, kDepth, wc));
        if (!hand)
          for (unsigned d = 0; d < kDepth; d++) regcore_rw_ctx_destroy(ctx[d]);
      }
    });
  auto t0 = Clock::now();
  go = true;
  for (auto &t : ts) t.join();
  double mios = static_cast<double>(batches) * kDepth * threads / elapsed_ns(t0) * 1e3;
  for (auto &p : pt) {
    regcore_qp_destroy(e.core, p->qp);
    simverbs_peer_destroy(p->peer);
    ibv_dereg_mr(p->mr);
    ibv_destroy_cq(p->cq);
  }
  return mios;
}

// Repetitions alternate between the two columns, as in the cache section.
std::vector<ScaleRow> scaling_section(unsigned reps) {
  std::vector<ScaleRow> rows;
  const unsigned kThreads[] = {1, 2, 4};
  auto alternate = [&](ScaleRow &row, auto left, auto right) {
    std::vector<double> l, r;
    for (unsigned i = 0; i < reps; i++) {
      if (i % 2) {
        l.push_back(left());
        if (right) r.push_back(right());
      } else {
        if (right) r.push_back(right());
        l.push_back(left());
      }
    }
    row.regcore = median(l);
    if (!r.empty()) row.ucx = median(r);
  };
  {
    testenv::Env e(SIMVERBS_PROFILE_MLX5);
    CacheApi mine{"regcore", e.core, regcore_get, regcore_put};
    CacheApi ucx{"ucx", nullptr, nullptr, nullptr};
#if REGCORE_BENCH_UCX
    UcxCache *u = ucx_cache_open(e.pd);
    if (u) ucx = {"ucx", u, ucx_get, ucx_put};
#endif
    for (bool shared : {false, true})
      for (unsigned t : kThreads) {
        ScaleRow row{shared ? "cache hits, one shared buffer" : "cache hits, a buffer per thread", t};
        std::function<double()> other;
        if (ucx.get) other = [&] { return hits_mops(ucx, t, shared, 500000); };
        alternate(row, [&] { return hits_mops(mine, t, shared, 500000); }, other);
        rows.push_back(row);
      }
#if REGCORE_BENCH_UCX
    if (u) ucx_cache_close(u);
#endif
  }
  for (unsigned t : kThreads) {
    ScaleRow row{"write_1sge I/Os, a QP per thread (right: by hand)", t};
    std::function<double()> hand = [&] { return rw_mios(t, true, 2000); };
    alternate(row, [&] { return rw_mios(t, false, 2000); }, hand);
    rows.push_back(row);
  }
  return rows;
}

// ================================================================ output

void print_post(const std::vector<Result> &results, unsigned batches, unsigned reps) {
  std::printf("\n== post path (per I/O: median over batches of %u, median of %u reps of %u I/Os; post = build + "
              "post, cycle = post + completion + teardown)\n",
              kDepth,
              reps, batches * kDepth);
  std::printf("%-26s %-6s %-12s %10s %10s %7s %11s %11s %7s\n", "scenario", "device", "strategy", "hand post",
              "core post", "ratio", "hand cycle", "core cycle", "ratio");
  for (const Result &r : results)
    std::printf("%-26s %-6s %-12s %8.0fns %8.0fns %6.2fx %9.0fns %9.0fns %6.2fx\n", r.sc->name,
                simverbs_profile_name(r.sc->profile), r.strategy.c_str(), r.hand.post_ns, r.core.post_ns,
                r.core.post_ns / r.hand.post_ns, r.hand.cycle_ns, r.core.cycle_ns, r.core.cycle_ns / r.hand.cycle_ns);
}

void print_cache(const std::vector<CacheRow> &rows) {
  std::printf("\n== registration cache, ns per operation (median)\n%-70s %10s %10s\n", "operation", "regcore", "ucx");
  for (const CacheRow &r : rows) {
    std::printf("%-70s %10.0f ", r.what.c_str(), r.regcore);
    if (r.ucx < 0)
      std::printf("%10s\n", "-");
    else
      std::printf("%10.0f\n", r.ucx);
  }
}

void print_scaling(const std::vector<ScaleRow> &rows) {
  std::printf("\n== threads sharing one core, million operations per second (all threads; %u CPUs)\n",
              std::thread::hardware_concurrency());
  std::printf("%-56s %7s %10s %10s\n", "workload", "threads", "regcore", "ucx|hand");
  for (const ScaleRow &r : rows) std::printf("%-56s %7u %10.2f %10.2f\n", r.what.c_str(), r.threads, r.regcore, r.ucx);
}

void write_json(const char *path, const std::vector<Result> &post, const std::vector<CacheRow> &cache,
                const std::vector<ScaleRow> &scale, unsigned batches, unsigned reps) {
  FILE *f = std::fopen(path, "w");
  if (!f) testenv::die(std::string("cannot write ") + path);
  std::fprintf(f, "{\n  \"benchmark\": \"regcore on simverbs\",\n  \"reps\": %u,\n  \"statistic\": \"median of reps\",\n", reps);
  std::fprintf(f, "  \"reg_cost_ns\": {\"reg\": %u, \"reg_per_page\": %u, \"dereg\": %u, \"dereg_per_page\": %u},\n",
               g_reg_cost.reg_ns, g_reg_cost.reg_ns_per_page, g_reg_cost.dereg_ns, g_reg_cost.dereg_ns_per_page);
  std::fprintf(f, "  \"post\": {\"ios_per_rep\": %u, \"results\": [\n", batches * kDepth);
  for (size_t i = 0; i < post.size(); i++) {
    const Result &r = post[i];
    std::fprintf(f,
                 "    {\"scenario\": \"%s\", \"profile\": \"%s\", \"strategy\": \"%s\", \"hand_post_ns\": %.1f, "
                 "\"regcore_post_ns\": %.1f, \"post_ratio\": %.3f, \"hand_cycle_ns\": %.1f, \"regcore_cycle_ns\": %.1f, "
                 "\"cycle_ratio\": %.3f}%s\n",
                 r.sc->name, simverbs_profile_name(r.sc->profile), r.strategy.c_str(), r.hand.post_ns, r.core.post_ns,
                 r.core.post_ns / r.hand.post_ns, r.hand.cycle_ns, r.core.cycle_ns, r.core.cycle_ns / r.hand.cycle_ns,
                 i + 1 < post.size() ? "," : "");
  }
  std::fprintf(f, "  ]},\n  \"cache_ns_per_op\": [\n");
  for (size_t i = 0; i < cache.size(); i++)
    std::fprintf(f, "    {\"operation\": \"%s\", \"regcore\": %.1f, \"ucx\": %.1f}%s\n", cache[i].what.c_str(),
                 cache[i].regcore, cache[i].ucx, i + 1 < cache.size() ? "," : "");
  std::fprintf(f, "  ],\n  \"scaling_mops\": [\n");
  for (size_t i = 0; i < scale.size(); i++)
    std::fprintf(f, "    {\"workload\": \"%s\", \"threads\": %u, \"regcore\": %.3f, \"other\": %.3f}%s\n",
                 scale[i].what.c_str(), scale[i].threads, scale[i].regcore, scale[i].ucx,
                 i + 1 < scale.size() ? "," : "");
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

bool parse_reg_cost(const char *arg) {
  if (!std::strcmp(arg, "none")) {
    g_reg_cost = simverbs_reg_cost{};
    return true;
  }
  return std::sscanf(arg, "%u,%u,%u,%u", &g_reg_cost.reg_ns, &g_reg_cost.reg_ns_per_page, &g_reg_cost.dereg_ns,
                     &g_reg_cost.dereg_ns_per_page) == 4;
}

}  // namespace

int main(int argc, char **argv) {
  unsigned batches = 2000, reps = 5;
  std::string json, only, section = "all";
  for (int i = 1; i < argc; i++) {
    if (!std::strncmp(argv[i], "--batches=", 10)) batches = static_cast<unsigned>(std::atoi(argv[i] + 10));
    else if (!std::strncmp(argv[i], "--reps=", 7)) reps = static_cast<unsigned>(std::atoi(argv[i] + 7));
    else if (!std::strncmp(argv[i], "--json=", 7)) json = argv[i] + 7;
    else if (!std::strncmp(argv[i], "--only=", 7)) only = argv[i] + 7;
    else if (!std::strncmp(argv[i], "--section=", 10)) section = argv[i] + 10;
    else if (!std::strncmp(argv[i], "--reg-cost=", 11) && parse_reg_cost(argv[i] + 11)) continue;
    else {
      std::fprintf(stderr,
                   "usage: %s [--section=post|cache|scaling|all] [--batches=N] [--reps=R]\n"
                   "          [--reg-cost=REG_NS,PAGE_NS,DEREG_NS,PAGE_NS|none] [--json=FILE] [--only=NAME]\n",
                   argv[0]);
      return 2;
    }
  }
  if (batches == 0 || reps == 0) return 2;
  simverbs_set_reg_cost(&g_reg_cost);
  std::printf("registration model: ibv_reg_mr %u ns + %u ns/page, ibv_dereg_mr %u ns + %u ns/page\n",
              g_reg_cost.reg_ns, g_reg_cost.reg_ns_per_page, g_reg_cost.dereg_ns, g_reg_cost.dereg_ns_per_page);
  std::vector<Result> post;
  std::vector<CacheRow> cache;
  std::vector<ScaleRow> scale;
  if (section == "all" || section == "post") {
    for (const Scenario &sc : kScenarios)
      if (only.empty() || only == sc.name) post.push_back(measure(sc, batches, reps));
    print_post(post, batches, reps);
  }
  if (section == "all" || section == "cache") {
    cache = cache_section(reps);
    print_cache(cache);
  }
  if (section == "all" || section == "scaling") {
    scale = scaling_section(reps);
    print_scaling(scale);
  }
  std::fflush(stdout);
  if (!json.empty()) write_json(json.c_str(), post, cache, scale, batches, reps);
  return 0;
}
