// regcore API tests on simverbs: sizing, rw and reg contexts, invalidation,
// the cache, errors and budgets.
#include <rdma/rdma_cma.h>
#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "env.hpp"

using testenv::Env;
using testenv::Options;

namespace {

// Scattered local buffers: run i lives at i * stride, so runs never merge.
struct Scatter {
  std::vector<uint8_t> arena;
  std::vector<ibv_sge> sge;
  uint32_t bytes = 0;
  Scatter(unsigned runs, uint32_t run_len, uint32_t stride, uint8_t seed = 1)
      : arena(static_cast<size_t>(runs) * stride + 64) {
    for (size_t i = 0; i < arena.size(); i++) arena[i] = static_cast<uint8_t>(seed + i * 13);
    for (unsigned i = 0; i < runs; i++) {
      sge.push_back({reinterpret_cast<uintptr_t>(arena.data()) + i * stride, run_len, 0});
      bytes += run_len;
    }
  }
  // Concatenated contents of the runs.
  std::vector<uint8_t> gather() const {
    std::vector<uint8_t> out;
    for (const ibv_sge &s : sge) {
      auto *p = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(s.addr));
      out.insert(out.end(), p, p + s.length);
    }
    return out;
  }
};

bool remote_equals(Env &e, uint64_t off, const std::vector<uint8_t> &data) {
  return std::memcmp(e.remote.data() + off, data.data(), data.size()) == 0;
}

uint64_t raddr(Env &e, uint64_t off) { return reinterpret_cast<uintptr_t>(e.remote.data()) + off; }

// One rw context, start to finish. Returns the strategy; checks the data
// moved and that exactly one completion carrying wr_id arrived.
regcore_rw_strategy run_rw(Env &e, regcore_dir dir, Scatter &s, uint64_t off, uint64_t wr_id) {
  regcore_rw_ctx *ctx = nullptr;
  int nwr = regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), static_cast<unsigned>(s.sge.size()),
                                raddr(e, off), e.remote_rkey, dir);
  CHECK(nwr > 0);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, wr_id, nullptr), 0);
  ibv_wc wc;
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(wc.wr_id, wr_id);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(regcore_poll_cq(e.core, e.scq, 1, &wc), 0);  // nothing else for the ULP
  std::vector<uint8_t> local = s.gather();
  if (dir == REGCORE_DIR_WRITE) CHECK(remote_equals(e, off, local));
  if (dir == REGCORE_DIR_READ) CHECK(remote_equals(e, off, local));
  regcore_rw_strategy st = regcore_rw_ctx_strategy(ctx);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  return st;
}

regcore_policy policy_of(Env &e) {
  regcore_policy p{};
  CHECK_EQ(regcore_policy_get(e.core, &p), 0);
  return p;
}

void post_recv(Env &e, void *buf, uint32_t len, uint64_t wr_id) {
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, buf, len, IBV_ACCESS_LOCAL_WRITE, &mr), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), len, mr->lkey};
  ibv_recv_wr wr{}, *bad;
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK_EQ(ibv_post_recv(e.qp, &wr, &bad), 0);
  e.held.push_back(mr);  // the lkey is valid while the registration is referenced
}

// A signaled SEND of `msg` (inline) to the peer.
ibv_send_wr make_send(const void *msg, uint32_t len, uint64_t wr_id, ibv_sge *sge) {
  *sge = {reinterpret_cast<uintptr_t>(msg), len, 0};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  return wr;
}

int release_count = 0;
void on_release(regcore_reg_ctx *, int status, void *arg) {
  CHECK_EQ(status, 0);
  ++*static_cast<int *>(arg);
  release_count++;
}

}  // namespace

TEST(access_flags_follow_the_transport) {
  using F = ibv_access_flags;
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, REGCORE_ROLE_READ_SINK), IBV_ACCESS_LOCAL_WRITE);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IWARP, REGCORE_ROLE_READ_SINK),
           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, REGCORE_ROLE_REMOTE_WRITE),
           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, REGCORE_ROLE_REMOTE_ATOMIC),
           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, REGCORE_ROLE_REMOTE_READ), IBV_ACCESS_REMOTE_READ);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, REGCORE_ROLE_SEND_SOURCE), 0);
  CHECK_EQ(regcore_access_flags_for(IBV_TRANSPORT_IB, 1u << 20), -EINVAL);
  Env e(SIMVERBS_PROFILE_IWARP);
  CHECK_EQ(regcore_access_flags(e.core, REGCORE_ROLE_READ_SINK | REGCORE_ROLE_REMOTE_READ),
           static_cast<F>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
}

TEST(open_needs_a_declared_budget) {
  ibv_context *ctx = testenv::open_device(SIMVERBS_PROFILE_MLX5);
  ibv_pd *pd = ibv_alloc_pd(ctx);
  regcore_attr a{};
  regcore *core = nullptr;
  CHECK_EQ(regcore_open(pd, &a, &core), -EINVAL);
  CHECK(std::string(regcore_last_error()).find("max_ctxs") != std::string::npos);
  a.max_ctxs = 4;
  a.comp_mask = 1;
  CHECK_EQ(regcore_open(pd, &a, &core), -EINVAL);
  a.comp_mask = 0;
  CHECK_EQ(regcore_open(pd, &a, &core), 0);
  CHECK_EQ(regcore_close(core), 0);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

TEST(qp_room_is_computed_from_declared_contexts) {
  // wrs_per_ctx for 16 SGEs per context: mlx5 1+2 (UMR, LOCAL_INV) like
  // rdma_rw_init_qp; mthca 16/max_sge_rd(2) READs; iWARP 16 single-SGE READs;
  // mlx4 BIND_MW + LOCAL_INV.
  const uint32_t expect[] = {8, 2, 3, 16};
  for (simverbs_profile p : testenv::kAllProfiles) {
    Options o;
    o.qp_ctxs = 10;
    o.ulp_send_wr = 7;
    Env e(p, o);
    regcore_policy pol = policy_of(e);
    CHECK_EQ(pol.wrs_per_ctx, expect[p]);
    uint32_t sq = 0;
    CHECK_EQ(regcore_max_send_wr(e.core, 7, 10, &sq), 0);
    CHECK_EQ(sq, 7 + 10 * expect[p]);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    CHECK_EQ(ibv_query_qp(e.qp, &qa, IBV_QP_CAP, &qi), 0);
    CHECK_EQ(qa.cap.max_send_wr, sq);
    CHECK_EQ(regcore_max_send_wr(e.core, 1, UINT32_MAX, &sq), -EOVERFLOW);
  }
}

TEST(qp_create_refuses_instead_of_clamping) {
  Options o;
  o.max_ctxs = 400;
  o.qp_ctxs = 8;
  Env e(SIMVERBS_PROFILE_IWARP, o);  // max_qp_wr 4096, 16 WRs per context
  ibv_cq *big = ibv_create_cq(e.ctx, 60000, nullptr, nullptr, 0);
  ibv_qp_init_attr a{};
  a.send_cq = big;
  a.recv_cq = e.rcq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 16;
  a.cap.max_recv_wr = 4;
  ibv_qp *qp = nullptr;
  CHECK_EQ(regcore_qp_create(e.core, &a, 300, &qp), -ENOSPC);
  std::string msg = regcore_last_error();
  CHECK(msg.find("max_qp_wr 4096") != std::string::npos);
  std::printf("  %s\n", msg.c_str());
  // A send CQ smaller than the queue is refused too.
  a.send_cq = e.rcq;  // 64 entries
  CHECK_EQ(regcore_qp_create(e.core, &a, 8, &qp), -ENOSPC);
  CHECK(std::string(regcore_last_error()).find("send CQ") != std::string::npos);
  a.send_cq = big;
  a.sq_sig_all = 1;
  CHECK_EQ(regcore_qp_create(e.core, &a, 8, &qp), -EINVAL);
  a.sq_sig_all = 0;
  CHECK_EQ(regcore_qp_create(e.core, &a, 393, &qp), -ENOSPC);  // 8 + 393 > max_ctxs 400
  CHECK_EQ(regcore_qp_create(e.core, &a, 250, &qp), 0);
  CHECK_EQ(a.cap.max_send_wr, 16u + 250 * 16);
  CHECK_EQ(regcore_qp_destroy(e.core, qp), 0);
  ibv_destroy_cq(big);
}

TEST(rw_moves_data_on_every_profile) {
  for (simverbs_profile p : testenv::kAllProfiles) {
    Env e(p);
    Scatter w(3, 100, 4096, 5);
    run_rw(e, REGCORE_DIR_WRITE, w, 1000, 11);
    Scatter r(3, 100, 4096, 9);
    run_rw(e, REGCORE_DIR_READ, r, 1000, 12);
    CHECK(r.gather() == w.gather());
  }
}

TEST(strategies_per_device) {
  Scatter big(12, 256, 4096);  // 12 runs: beyond mthca's READ SGE limit
  Scatter many(20, 64, 4096);  // 20 runs: beyond every SGE limit
  {
    Env e(SIMVERBS_PROFILE_MTHCA);
    CHECK_EQ(run_rw(e, REGCORE_DIR_READ, big, 0, 1), REGCORE_RW_MULTI_WR);
    CHECK_EQ(run_rw(e, REGCORE_DIR_WRITE, big, 0, 2), REGCORE_RW_SINGLE_WR);
  }
  Options o;
  o.max_sge_per_ctx = 32;
  {
    Env e(SIMVERBS_PROFILE_MLX4, o);
    CHECK_EQ(run_rw(e, REGCORE_DIR_READ, many, 0, 1), REGCORE_RW_MR_STAGED);
    CHECK_EQ(run_rw(e, REGCORE_DIR_WRITE, many, 8192, 2), REGCORE_RW_MR_STAGED);
  }
  {
    Env e(SIMVERBS_PROFILE_MLX5, o);
    CHECK_EQ(run_rw(e, REGCORE_DIR_READ, many, 0, 1), REGCORE_RW_INDIRECT);
    CHECK_EQ(run_rw(e, REGCORE_DIR_WRITE, many, 8192, 2), REGCORE_RW_INDIRECT);
  }
  {
    Env e(SIMVERBS_PROFILE_IWARP, o);
    CHECK_EQ(run_rw(e, REGCORE_DIR_READ, big, 0, 1), REGCORE_RW_MR_REG);
    CHECK_EQ(run_rw(e, REGCORE_DIR_WRITE, big, 0, 2), REGCORE_RW_MULTI_WR);
  }
}

TEST(indirect_mkey_is_invalidated_before_reuse) {
  Options o;
  o.max_ctxs = o.qp_ctxs = 1;
  o.max_mrs = 2;  // the mkey and the probe window
  o.max_sge_per_ctx = 32;
  Env e(SIMVERBS_PROFILE_MLX5, o);
  Scatter s(20, 32, 4096);
  regcore_rw_ctx *ctx;
  // First use: UMR + RDMA. Reuse of the same mkey: LOCAL_INV + UMR + RDMA.
  for (int want : {2, 3, 3}) {
    CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 20, raddr(e, 0), e.remote_rkey,
                                 REGCORE_DIR_WRITE), want);
    CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 1, nullptr), 0);
    ibv_wc wc;
    CHECK(e.poll_one(e.scq, &wc));
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
    CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  }
  CHECK(remote_equals(e, 0, s.gather()));
}

TEST(iwarp_read_sink_key_dies_with_the_context) {
  Env e(SIMVERBS_PROFILE_IWARP);
  Scatter s(2, 64, 4096);
  regcore_rw_ctx *ctx;
  CHECK(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 2, raddr(e, 0), e.remote_rkey,
                            REGCORE_DIR_READ) == 2);
  uint32_t keys[4];
  CHECK_EQ(regcore_rw_ctx_remote_keys(ctx, keys, 4), 2);
  unsigned access = 0;
  CHECK_EQ(simverbs_key_query(e.pd, keys[0], &access), 0);
  CHECK(access & IBV_ACCESS_REMOTE_WRITE);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 7, nullptr), 0);
  ibv_wc wc;
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  uint8_t x = 1;
  for (uint32_t k : {keys[0], keys[1]}) {
    CHECK_EQ(simverbs_key_query(e.pd, k, nullptr), -ENOKEY);
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, k, s.sge[0].addr, &x, 1), -ENOKEY);
  }
}

TEST(chained_wr_is_the_one_completion) {
  Env e(SIMVERBS_PROFILE_MTHCA);
  Scatter s(6, 128, 4096);  // 6 runs, max_sge_rd 2: 3 READs
  regcore_rw_ctx *ctx;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 6, raddr(e, 64), e.remote_rkey,
                               REGCORE_DIR_READ), 3);
  ibv_sge sge;
  ibv_send_wr send = make_send("resp", 5, 99, &sge);
  send.send_flags &= ~static_cast<unsigned>(IBV_SEND_SIGNALED);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 1, &send), -EINVAL);  // must be signaled
  send.send_flags |= IBV_SEND_SIGNALED;
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 1, &send), 0);
  CHECK_EQ(send.wr_id, 99u);  // the ULP's WR is left as it was
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), -EBUSY);
  ibv_wc wc[4];
  int n = 0;
  for (int i = 0; i < 100 && n == 0; i++) n = regcore_poll_cq(e.core, e.scq, 4, wc);
  CHECK_EQ(n, 1);
  CHECK_EQ(wc[0].wr_id, 99u);
  CHECK_EQ(wc[0].opcode, IBV_WC_SEND);
  CHECK_EQ(regcore_poll_cq(e.core, e.scq, 4, wc), 0);
  char got[8];
  size_t len = 0;
  CHECK_EQ(simverbs_peer_recv(e.peer, got, sizeof got, &len), 0);
  CHECK_EQ(len, 5u);
  CHECK(remote_equals(e, 64, s.gather()));
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  CHECK_EQ(simverbs_qp_sq_outstanding(e.qp), 0u);
}

TEST(context_budget_is_enforced) {
  Options o;
  o.max_ctxs = o.qp_ctxs = 3;
  Env e(SIMVERBS_PROFILE_MLX4, o);
  Scatter s(1, 64, 4096);
  regcore_rw_ctx *ctx[4];
  for (int i = 0; i < 3; i++)
    CHECK_EQ(regcore_rw_ctx_init(&ctx[i], e.core, e.qp, s.sge.data(), 1, raddr(e, 0), e.remote_rkey,
                                 REGCORE_DIR_WRITE), 1);
  CHECK_EQ(regcore_rw_ctx_init(&ctx[3], e.core, e.qp, s.sge.data(), 1, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_WRITE), -EAGAIN);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx[0]), 0);
  CHECK_EQ(regcore_rw_ctx_init(&ctx[3], e.core, e.qp, s.sge.data(), 1, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_WRITE), 1);
  CHECK_EQ(regcore_close(e.core), -EBUSY);
  for (int i = 1; i < 4; i++) CHECK_EQ(regcore_rw_ctx_destroy(ctx[i]), 0);
  Scatter wide(17, 8, 64);
  CHECK_EQ(regcore_rw_ctx_init(&ctx[0], e.core, e.qp, wide.sge.data(), 17, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_WRITE), -E2BIG);
}

// Initiator flow: register a buffer, SEND its rkey, let the peer WRITE into
// it and answer; release with the invalidated rkey of the answer.
struct RegFlow {
  Env &e;
  std::vector<uint8_t> buf = std::vector<uint8_t>(8192, 0);
  regcore_reg_ctx *ctx = nullptr;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  char resp[64];

  explicit RegFlow(Env &env) : e(env) {}

  void start(uint64_t wr_id) {
    CHECK_EQ(regcore_reg_ctx_init(&ctx, e.core, e.qp, buf.data() + 100, 4000, IBV_ACCESS_REMOTE_WRITE), 0);
    CHECK_EQ(regcore_reg_ctx_rkey(ctx, &rkey, &addr), 0);
    post_recv(e, resp, sizeof resp, 500 + wr_id);
    ibv_sge sge;
    ibv_send_wr send = make_send(&rkey, sizeof rkey, wr_id, &sge);
    CHECK_EQ(regcore_reg_ctx_post(ctx, &send), 0);
    ibv_wc wc;
    CHECK(e.poll_one(e.scq, &wc));
    CHECK_EQ(wc.wr_id, wr_id);
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
    uint32_t got = 0;
    CHECK_EQ(simverbs_peer_recv(e.peer, &got, sizeof got, nullptr), 0);
    CHECK_EQ(got, rkey);
    uint8_t data[16];
    std::memset(data, 0xab, sizeof data);
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, rkey, addr + 10, data, sizeof data), 0);
    CHECK_EQ(buf[110], 0xab);
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, rkey, addr + 3990, data, sizeof data), -ERANGE);
  }

  // The peer answers; returns the answer's invalidated rkey (0 if none).
  uint32_t answer(uint32_t invalidate) {
    CHECK_EQ(simverbs_peer_send(e.peer, "ok", 3, invalidate), 0);
    ibv_wc wc;
    CHECK(e.poll_one(e.rcq, &wc));
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
    return (wc.wc_flags & IBV_WC_WITH_INV) ? wc.invalidated_rkey : 0;
  }

  // The peer's access fails and the device no longer knows the key (the
  // access may also fail earlier because the QP is in error).
  bool key_dead() {
    uint8_t x = 1;
    return simverbs_peer_rdma_write(e.peer, rkey, addr, &x, 1) != 0 &&
           simverbs_key_query(e.pd, rkey, nullptr) == -ENOKEY;
  }
};

TEST(reg_remote_invalidation_is_verified) {
  Env e(SIMVERBS_PROFILE_MLX5);
  RegFlow f(e);
  f.start(1);
  CHECK_EQ(regcore_reg_ctx_strategy(f.ctx), REGCORE_REG_MW);
  CHECK_EQ(regcore_reg_ctx_remote_inv_ok(f.ctx), 1);
  uint32_t inv = f.answer(f.rkey);
  CHECK_EQ(inv, f.rkey);
  CHECK(f.key_dead());
  CHECK_EQ(regcore_reg_ctx_release(f.ctx, inv, on_release, nullptr), 0);
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.remote_inv_matched, 1u);
  CHECK_EQ(st.local_invs, 0u);
}

TEST(reg_local_invalidation_completes_before_handback) {
  Env e(SIMVERBS_PROFILE_MLX4);
  RegFlow f(e);
  f.start(1);
  CHECK_EQ(f.answer(0), 0u);
  int released = 0;
  CHECK_EQ(regcore_reg_ctx_release(f.ctx, 0, on_release, &released), -EINPROGRESS);
  // Not handed back yet, and the key is not dead before the LOCAL_INV ran.
  CHECK_EQ(released, 0);
  CHECK_EQ(simverbs_key_query(e.pd, f.rkey, nullptr), 0);
  ibv_wc wc;
  CHECK_EQ(regcore_poll_cq(e.core, e.scq, 1, &wc), 0);  // consumed internally
  CHECK_EQ(released, 1);
  CHECK(f.key_dead());
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.local_invs, 1u);
  CHECK_EQ(st.ctxs_in_use, 0u);
}

TEST(reg_mismatched_invalidation_is_caught) {
  Env e(SIMVERBS_PROFILE_MLX5);
  RegFlow a(e), b(e);
  a.start(1);
  b.start(2);
  // The peer answers a's request but invalidates b's key (a peer bug).
  uint32_t inv = a.answer(b.rkey);
  CHECK_EQ(inv, b.rkey);
  int released = 0;
  CHECK_EQ(regcore_reg_ctx_release(a.ctx, inv, on_release, &released), -EINPROGRESS);
  CHECK(std::string(regcore_last_error()).find("expected") != std::string::npos);
  CHECK(b.key_dead());
  CHECK_EQ(regcore_reg_ctx_release(b.ctx, 0, on_release, &released), 0);  // no LOCAL_INV needed
  ibv_wc wc;
  regcore_poll_cq(e.core, e.scq, 1, &wc);
  CHECK_EQ(released, 1);
  CHECK(a.key_dead());
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.remote_inv_mismatched, 1u);
  CHECK_EQ(st.local_invs, 1u);
}

TEST(reg_keys_rotate_on_reuse) {
  Options o;
  o.max_ctxs = o.qp_ctxs = 1;
  o.max_mrs = 1;
  Env e(SIMVERBS_PROFILE_MLX5, o);
  std::vector<uint32_t> seen;
  for (int i = 0; i < 4; i++) {
    RegFlow f(e);
    f.start(10 + i);
    for (uint32_t old : seen) {
      uint8_t x = 0;
      CHECK_EQ(simverbs_peer_rdma_write(e.peer, old, f.addr, &x, 1), -ENOKEY);
    }
    if (!seen.empty()) {
      CHECK_EQ(f.rkey >> 8, seen.back() >> 8);  // same window ...
      CHECK_EQ(f.rkey & 0xff, (seen.back() + 1) & 0xff);  // ... next key
    }
    seen.push_back(f.rkey);
    CHECK_EQ(regcore_reg_ctx_release(f.ctx, f.answer(f.rkey), nullptr, nullptr), 0);
  }
}

TEST(reg_release_after_qp_error_kills_the_key) {
  Env e(SIMVERBS_PROFILE_MLX4);
  RegFlow f(e);
  f.start(1);
  ibv_qp_attr qa{};
  qa.qp_state = IBV_QPS_ERR;
  CHECK_EQ(ibv_modify_qp(e.qp, &qa, IBV_QP_STATE), 0);
  e.drain(e.rcq);
  // regcore has not seen an error yet: it tries LOCAL_INV, which flushes.
  int released = 0;
  CHECK_EQ(regcore_reg_ctx_release(f.ctx, 0, on_release, &released), -EINPROGRESS);
  ibv_wc wc;
  CHECK_EQ(regcore_poll_cq(e.core, e.scq, 1, &wc), 0);
  CHECK_EQ(released, 1);
  CHECK_EQ(simverbs_key_query(e.pd, f.rkey, nullptr), -ENOKEY);
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.sync_invalidations, 1u);
  // Once the error is known, release kills keys at once.
  e.new_qp();
  RegFlow g(e);
  g.start(2);
  CHECK_EQ(ibv_modify_qp(e.qp, &qa, IBV_QP_STATE), 0);
  ibv_sge sge;
  ibv_send_wr send = make_send("x", 1, 77, &sge);
  ibv_send_wr *bad;
  CHECK_EQ(ibv_post_send(e.qp, &send, &bad), 0);  // the ULP's own WR, flushed
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  regcore_rw_ctx *rw;
  Scatter s(1, 8, 64);
  CHECK_EQ(regcore_rw_ctx_init(&rw, e.core, e.qp, s.sge.data(), 1, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_WRITE), 1);
  CHECK_EQ(regcore_rw_ctx_post(rw, e.qp, 5, nullptr), 0);
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(wc.wr_id, 5u);
  CHECK_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  CHECK_EQ(regcore_rw_ctx_destroy(rw), 0);
  CHECK_EQ(regcore_reg_ctx_release(g.ctx, 0, on_release, &released), 0);
  CHECK(g.key_dead());
}

TEST(reg_without_windows_uses_a_private_mr) {
  for (simverbs_profile p : {SIMVERBS_PROFILE_MTHCA, SIMVERBS_PROFILE_IWARP}) {
    Env e(p);
    RegFlow f(e);
    f.start(1);
    CHECK_EQ(regcore_reg_ctx_strategy(f.ctx), REGCORE_REG_MR);
    CHECK_EQ(regcore_reg_ctx_remote_inv_ok(f.ctx), 0);
    CHECK_EQ(f.answer(0), 0u);
    CHECK_EQ(regcore_reg_ctx_release(f.ctx, 0, nullptr, nullptr), 0);
    CHECK(f.key_dead());
  }
}

TEST(qp_destroy_waits_for_posted_contexts) {
  Env e(SIMVERBS_PROFILE_MLX5);
  RegFlow f(e);
  f.start(1);
  Scatter s(2, 64, 4096);
  regcore_rw_ctx *ctx;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 2, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_WRITE), 1);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 3, nullptr), 0);
  CHECK_EQ(regcore_qp_destroy(e.core, e.qp), -EBUSY);
  ibv_wc wc;
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  // Destroying the QP kills the reg context's key; its release is immediate.
  CHECK_EQ(regcore_qp_destroy(e.core, e.qp), 0);
  e.qp = nullptr;
  CHECK(simverbs_key_query(e.pd, f.rkey, nullptr) == -ENOKEY);
  CHECK_EQ(regcore_reg_ctx_release(f.ctx, 0, nullptr, nullptr), 0);
  e.drain(e.rcq);
  e.new_qp();
}

TEST(error_completion_reports_the_root_cause_once) {
  Env e(SIMVERBS_PROFILE_MTHCA);
  Scatter s(6, 64, 4096);  // 3 READs, first two unsignaled
  regcore_rw_ctx *ctx;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 6, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_READ), 3);
  simverbs_fault_inject(SIMVERBS_FAULT_ERROR_CQE, 1, IBV_WC_REM_ACCESS_ERR);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 42, nullptr), 0);
  ibv_wc wc[8];
  int n = 0;
  for (int i = 0; i < 10; i++) n += regcore_poll_cq(e.core, e.scq, 8, wc + n);
  CHECK_EQ(n, 1);
  CHECK_EQ(wc[0].wr_id, 42u);
  CHECK_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  simverbs_fault_clear();
}

TEST(partial_post_moves_the_qp_to_error) {
  Env e(SIMVERBS_PROFILE_MTHCA);
  Scatter s(6, 64, 4096);
  regcore_rw_ctx *ctx;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 6, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_READ), 3);
  simverbs_fault_inject(SIMVERBS_FAULT_POST_FAIL, 2, ENOMEM);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 42, nullptr), -ENOMEM);
  CHECK_EQ(e.qp->state, IBV_QPS_ERR);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  ibv_wc wc[8];
  CHECK_EQ(regcore_poll_cq(e.core, e.scq, 8, wc), 0);  // the orphan's flush is internal
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.partial_posts, 1u);
  CHECK_EQ(st.ctxs_in_use, 0u);
  CHECK_EQ(simverbs_qp_sq_outstanding(e.qp), 0u);
  // A failure on the first WR posts nothing: the context can be retried.
  e.new_qp();
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 6, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_READ), 3);
  simverbs_fault_inject(SIMVERBS_FAULT_POST_FAIL, 1, ENOMEM);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 42, nullptr), -ENOMEM);
  CHECK_EQ(e.qp->state, IBV_QPS_RTS);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 42, nullptr), 0);
  CHECK(e.poll_one(e.scq, wc));
  CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
}

TEST(own_poll_loop_and_ulp_lkeys) {
  Env e(SIMVERBS_PROFILE_MTHCA);
  Scatter s(6, 64, 4096);  // 3 READs: two internal completions on a flush
  regcore_mr *mr = nullptr;
  CHECK_EQ(regcore_mr_get(e.core, s.arena.data(), s.arena.size(), IBV_ACCESS_LOCAL_WRITE, &mr), 0);
  for (ibv_sge &g : s.sge) g.lkey = mr->lkey;  // used as given, not looked up
  regcore_stats before;
  regcore_get_stats(e.core, &before);
  regcore_rw_ctx *ctx;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, e.core, e.qp, s.sge.data(), 6, raddr(e, 0), e.remote_rkey,
                               REGCORE_DIR_READ), 3);
  regcore_stats after;
  regcore_get_stats(e.core, &after);
  CHECK_EQ(after.cache_hits + after.cache_misses, before.cache_hits + before.cache_misses);
  simverbs_fault_inject(SIMVERBS_FAULT_QP_ERROR, 2, 0);
  CHECK_EQ(regcore_rw_ctx_post(ctx, e.qp, 77, nullptr), 0);
  // A ULP with its own poll loop hands every completion to regcore.
  int ulp = 0, internal = 0;
  ibv_wc wc[8];
  for (int i = 0; i < 10; i++) {
    int n = ibv_poll_cq(e.scq, 8, wc);
    for (int k = 0; k < n; k++) {
      if (regcore_process_wc(e.core, &wc[k])) {
        ulp++;
        CHECK_EQ(wc[k].wr_id, 77u);
        CHECK_EQ(wc[k].status, IBV_WC_WR_FLUSH_ERR);
      } else {
        internal++;
      }
    }
  }
  CHECK_EQ(ulp, 1);
  CHECK_EQ(internal, 1);  // READ 2 flushed unsignaled; READ 1 ran unsignaled
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  CHECK_EQ(regcore_mr_put(e.core, mr), 0);
  simverbs_fault_clear();
}

// -------------------------------------------------- keyed SGLs (one rkey)

namespace {

// Three pieces of `arena`, far enough apart that they never coalesce.
std::vector<iovec> sgl_of(std::vector<uint8_t> &arena, size_t piece) {
  std::vector<iovec> v;
  for (size_t i = 0; i < 3; i++) v.push_back({arena.data() + 100 + i * 8192, piece});
  return v;
}

// The key and address a reg context advertises; the peer uses them for
// the whole SGL as one range.
struct Advertised {
  uint32_t rkey = 0;
  uint64_t addr = 0;
};

Advertised post_key(Env &e, regcore_reg_ctx *ctx, uint64_t wr_id) {
  Advertised a;
  CHECK_EQ(regcore_reg_ctx_rkey(ctx, &a.rkey, &a.addr), 0);
  ibv_sge sge;
  ibv_send_wr send = make_send(&a, sizeof a, wr_id, &sge);
  CHECK_EQ(regcore_reg_ctx_post(ctx, &send), 0);
  ibv_wc wc;
  CHECK(e.poll_one(e.scq, &wc));
  CHECK_EQ(wc.wr_id, wr_id);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  Advertised got;
  CHECK_EQ(simverbs_peer_recv(e.peer, &got, sizeof got, nullptr), 0);
  CHECK_EQ(got.rkey, a.rkey);
  return a;
}

// The peer answers (invalidating the key when the context allows it) and
// the initiator releases; returns once the buffers are handed back.
void answer_and_release(Env &e, regcore_reg_ctx *ctx, const Advertised &a) {
  char resp[64];
  post_recv(e, resp, sizeof resp, 900);
  bool inv = regcore_reg_ctx_remote_inv_ok(ctx);
  CHECK_EQ(simverbs_peer_send(e.peer, "ok", 3, inv ? a.rkey : 0), 0);
  ibv_wc wc;
  CHECK(e.poll_one(e.rcq, &wc));
  uint32_t invalidated = (wc.wc_flags & IBV_WC_WITH_INV) ? wc.invalidated_rkey : 0;
  CHECK_EQ(invalidated, inv ? a.rkey : 0u);
  int released = 0;
  int r = regcore_reg_ctx_release(ctx, invalidated, on_release, &released);
  if (r == -EINPROGRESS) {
    CHECK_EQ(regcore_poll_cq(e.core, e.scq, 1, &wc), 0);  // the LOCAL_INV is regcore's
    CHECK_EQ(released, 1);
  } else {
    CHECK_EQ(r, 0);
  }
  uint8_t x = 0;
  CHECK(simverbs_peer_rdma_write(e.peer, a.rkey, a.addr, &x, 1) != 0);  // the key is dead
}

}  // namespace

// The peer writes the SGL as one range through one key, and reads it back.
TEST(reg_sgl_has_one_key_on_every_profile) {
  const regcore_reg_strategy expected[] = {REGCORE_REG_STAGED, REGCORE_REG_STAGED, REGCORE_REG_INDIRECT,
                                           REGCORE_REG_STAGED};
  for (simverbs_profile p : testenv::kAllProfiles) {
    Env e(p);
    std::vector<uint8_t> arena(32 * 1024, 0);
    std::vector<iovec> v = sgl_of(arena, 1000);
    regcore_reg_ctx *ctx = nullptr;
    CHECK_EQ(regcore_reg_ctx_init_iov(&ctx, e.core, e.qp, v.data(), 3,
                                      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ), 0);
    CHECK_EQ(regcore_reg_ctx_strategy(ctx), expected[p]);
    std::printf("  %s: sgl -> %s remote_inv=%d\n", simverbs_profile_name(p),
                regcore_reg_strategy_name(regcore_reg_ctx_strategy(ctx)), regcore_reg_ctx_remote_inv_ok(ctx));
    Advertised a = post_key(e, ctx, 1);
    std::vector<uint8_t> data(3000);
    for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<uint8_t>(i * 13 + 5);
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, a.rkey, a.addr, data.data(), data.size()), 0);
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, a.rkey, a.addr + 2999, data.data(), 2), -ERANGE);
    std::vector<uint8_t> back(3000);
    CHECK_EQ(simverbs_peer_rdma_read(e.peer, a.rkey, a.addr, back.data(), back.size()), 0);
    CHECK(back == data);
    answer_and_release(e, ctx, a);
    for (size_t i = 0; i < 3; i++)  // scattered into the pieces by the time they are handed back
      CHECK(std::memcmp(v[i].iov_base, data.data() + i * 1000, 1000) == 0);
  }
}

// REMOTE_READ: the peer reads the pieces as one range (staged copies in at post).
TEST(reg_sgl_remote_read_gathers_the_pieces) {
  for (simverbs_profile p : testenv::kAllProfiles) {
    Env e(p);
    std::vector<uint8_t> arena(32 * 1024);
    for (size_t i = 0; i < arena.size(); i++) arena[i] = static_cast<uint8_t>(i * 7 + 1);
    std::vector<iovec> v = sgl_of(arena, 500);
    regcore_reg_ctx *ctx = nullptr;
    CHECK_EQ(regcore_reg_ctx_init_iov(&ctx, e.core, e.qp, v.data(), 3, IBV_ACCESS_REMOTE_READ), 0);
    Advertised a = post_key(e, ctx, 2);
    std::vector<uint8_t> got(1500);
    CHECK_EQ(simverbs_peer_rdma_read(e.peer, a.rkey, a.addr, got.data(), got.size()), 0);
    for (size_t i = 0; i < 3; i++) CHECK(std::memcmp(got.data() + i * 500, v[i].iov_base, 500) == 0);
    uint8_t x = 0;
    CHECK_EQ(simverbs_peer_rdma_write(e.peer, a.rkey, a.addr, &x, 1), -EACCES);
    answer_and_release(e, ctx, a);
  }
}

TEST(reg_sgl_contiguous_pieces_use_a_plain_key) {
  Env e(SIMVERBS_PROFILE_MLX4);
  std::vector<uint8_t> arena(8192);
  iovec v[2] = {{arena.data(), 1000}, {arena.data() + 1000, 500}};
  regcore_reg_ctx *ctx = nullptr;
  CHECK_EQ(regcore_reg_ctx_init_iov(&ctx, e.core, e.qp, v, 2, IBV_ACCESS_REMOTE_WRITE), 0);
  CHECK_EQ(regcore_reg_ctx_strategy(ctx), REGCORE_REG_MW);
  Advertised a = post_key(e, ctx, 3);
  CHECK_EQ(a.addr, reinterpret_cast<uintptr_t>(arena.data()));
  answer_and_release(e, ctx, a);
}

TEST(reg_sgl_staging_is_bounded) {
  Env e(SIMVERBS_PROFILE_MTHCA);
  std::vector<uint8_t> arena(256 * 1024);
  iovec v[2] = {{arena.data(), 40000}, {arena.data() + 100000, 40000}};  // 80000 > 64 KiB
  regcore_reg_ctx *ctx = nullptr;
  CHECK_EQ(regcore_reg_ctx_init_iov(&ctx, e.core, e.qp, v, 2, IBV_ACCESS_REMOTE_WRITE), -E2BIG);
  regcore_stats st;
  regcore_get_stats(e.core, &st);
  CHECK_EQ(st.ctxs_in_use, 0u);
}

// ------------------------------------------------------ rdma_cm and adoption

namespace {

ibv_cq *make_cq(ibv_context *ctx, int n) { return ibv_create_cq(ctx, n, nullptr, nullptr, 0); }

// An rw WRITE of a few bytes on qp, answered through scq.
void write_once(regcore *core, ibv_qp *qp, ibv_cq *scq, simverbs_peer *peer) {
  std::vector<uint8_t> remote(4096, 0), local(64, 0x5a);
  uint32_t rkey = 0;
  CHECK_EQ(simverbs_peer_expose(peer, remote.data(), remote.size(),
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &rkey), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(local.data()), 64, 0};
  regcore_rw_ctx *ctx = nullptr;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, core, qp, &sge, 1, reinterpret_cast<uintptr_t>(remote.data()), rkey,
                               REGCORE_DIR_WRITE), 1);
  CHECK_EQ(regcore_rw_ctx_post(ctx, qp, 11, nullptr), 0);
  ibv_wc wc;
  int n = 0;
  for (int i = 0; i < 1000 && n == 0; i++) n = regcore_poll_cq(core, scq, 1, &wc);
  CHECK_EQ(n, 1);
  CHECK_EQ(wc.status, IBV_WC_SUCCESS);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  CHECK_EQ(remote[63], 0x5a);
}

}  // namespace

TEST(rdma_cm_qp_is_created_for_the_core) {
  simverbs_set_profile(SIMVERBS_PROFILE_MLX5);
  rdma_event_channel *ch = rdma_create_event_channel();
  rdma_cm_id *id = nullptr;
  CHECK_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  CHECK_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&sin), 1000), 0);
  ibv_pd *pd = ibv_alloc_pd(id->verbs);
  regcore_attr at{};
  at.max_ctxs = 8;
  at.max_sge_per_ctx = 32;
  regcore *core = nullptr;
  CHECK_EQ(regcore_open(pd, &at, &core), 0);
  ibv_qp_init_attr_ex attr{};
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = 4;
  attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  attr.comp_mask = IBV_QP_INIT_ATTR_PD;
  attr.pd = pd;
  CHECK_EQ(regcore_qp_create_cm(core, id, &attr, 4), 0);  // librdmacm creates the CQs
  CHECK(id->qp != nullptr);
  regcore_policy pol;
  regcore_policy_get(core, &pol);
  CHECK_EQ(attr.cap.max_send_wr, 4 + 4 * 2u);  // without UMRs: window bind + LOCAL_INV per context
  simverbs_peer *peer = simverbs_peer_create(id->verbs);
  CHECK_EQ(simverbs_peer_connect(peer, id->qp), 0);
  write_once(core, id->qp, id->send_cq, peer);
  // Not an mlx5dv QP: SGLs beyond one WR use more WRs instead of a UMR.
  std::vector<uint8_t> big(20 * 512);
  std::vector<ibv_sge> sge;
  for (int i = 0; i < 20; i++) sge.push_back({reinterpret_cast<uintptr_t>(big.data()) + i * 512, 256, 0});
  regcore_rw_ctx *ctx = nullptr;
  CHECK_EQ(regcore_rw_ctx_init(&ctx, core, id->qp, sge.data(), 20, 0, 1, REGCORE_DIR_WRITE), 2);
  CHECK_EQ(regcore_rw_ctx_strategy(ctx), REGCORE_RW_MULTI_WR);
  CHECK_EQ(regcore_rw_ctx_destroy(ctx), 0);
  CHECK_EQ(regcore_qp_destroy(core, id->qp), 0);  // released, not destroyed
  CHECK(id->qp != nullptr);
  rdma_destroy_qp(id);
  simverbs_peer_destroy(peer);
  CHECK_EQ(regcore_close(core), 0);
  ibv_dealloc_pd(pd);
  CHECK_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
}

TEST(adopted_qp_is_checked) {
  ibv_context *ctx = testenv::open_device(SIMVERBS_PROFILE_MLX4);
  ibv_pd *pd = ibv_alloc_pd(ctx);
  regcore_attr at{};
  at.max_ctxs = 8;
  regcore *core = nullptr;
  CHECK_EQ(regcore_open(pd, &at, &core), 0);
  ibv_cq *cq = make_cq(ctx, 256);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 4;
  a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  ibv_qp *small = ibv_create_qp(pd, &a);  // sized by hand: no room for regcore
  CHECK_EQ(regcore_qp_adopt(core, small, 4), -ENOSPC);
  CHECK(std::string(regcore_last_error()).find("regcore_qp_init_attr") != std::string::npos);
  CHECK_EQ(regcore_qp_init_attr(core, pd, &a, 4), 0);
  ibv_qp *qp = ibv_create_qp(pd, &a);
  CHECK_EQ(regcore_qp_adopt(core, qp, 4), 0);
  CHECK_EQ(regcore_qp_adopt(core, qp, 4), -EEXIST);
  simverbs_peer *peer = simverbs_peer_create(ctx);
  CHECK_EQ(simverbs_peer_connect(peer, qp), 0);
  write_once(core, qp, cq, peer);
  ibv_qp_init_attr sig = a;
  sig.sq_sig_all = 1;
  ibv_qp *all_signaled = ibv_create_qp(pd, &sig);
  CHECK_EQ(regcore_qp_adopt(core, all_signaled, 1), -EINVAL);
  CHECK_EQ(regcore_qp_destroy(core, qp), 0);
  CHECK_EQ(ibv_destroy_qp(qp), 0);  // still the owner's
  ibv_destroy_qp(small);
  ibv_destroy_qp(all_signaled);
  simverbs_peer_destroy(peer);
  ibv_destroy_cq(cq);
  CHECK_EQ(regcore_close(core), 0);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// Two devices and three PDs behind one core: one budget, one cache, each
// QP with its device's policy, registrations per PD.
TEST(several_pds_and_devices_share_one_core) {
  CHECK_EQ(simverbs_set_profile_by_name("all"), 0);
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  CHECK_EQ(n, 4);
  ibv_context *mlx5 = ibv_open_device(list[SIMVERBS_PROFILE_MLX5]);
  ibv_context *mlx4 = ibv_open_device(list[SIMVERBS_PROFILE_MLX4]);
  ibv_free_device_list(list);
  ibv_pd *pds[3] = {ibv_alloc_pd(mlx5), ibv_alloc_pd(mlx5), ibv_alloc_pd(mlx4)};
  regcore_attr at{};
  at.max_ctxs = 12;
  regcore *core = nullptr;
  CHECK_EQ(regcore_open(pds[0], &at, &core), 0);
  CHECK_EQ(regcore_add_pd(core, pds[1]), 0);
  CHECK_EQ(regcore_add_pd(core, pds[2]), 0);
  CHECK_EQ(regcore_add_pd(core, pds[2]), -EEXIST);
  regcore_policy p4;
  CHECK_EQ(regcore_policy_get_pd(core, pds[2], &p4), 0);
  CHECK(std::string(p4.device_class) == "mlx4");
  std::vector<uint8_t> buf(8192, 0x11);
  regcore_mr *mr[3];
  for (int i = 0; i < 3; i++) {
    CHECK_EQ(regcore_mr_get_pd(core, pds[i], buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE, &mr[i]), 0);
    CHECK_EQ(simverbs_key_query(pds[i], mr[i]->lkey, nullptr), 0);
  }
  CHECK(mr[0] != mr[1] && mr[1] != mr[2]);  // one registration per PD
  CHECK_EQ(simverbs_key_query(pds[0], mr[2]->lkey, nullptr), -ENOKEY);
  for (regcore_mr *m : mr) CHECK_EQ(regcore_mr_put(core, m), 0);
  for (int i = 0; i < 3; i++) {
    ibv_context *ctx = pds[i]->context;
    ibv_cq *cq = make_cq(ctx, 256);
    ibv_qp_init_attr_ex a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = 2;
    a.cap.max_recv_wr = 2;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD;
    a.pd = pds[i];
    ibv_qp *qp = nullptr;
    CHECK_EQ(regcore_qp_create_ex(core, &a, 4, &qp), 0);
    simverbs_peer *peer = simverbs_peer_create(ctx);
    CHECK_EQ(simverbs_peer_connect(peer, qp), 0);
    write_once(core, qp, cq, peer);
    CHECK_EQ(regcore_qp_destroy(core, qp), 0);
    simverbs_peer_destroy(peer);
    ibv_destroy_cq(cq);
  }
  ibv_pd *stranger = ibv_alloc_pd(mlx4);
  regcore_mr *m = nullptr;
  CHECK_EQ(regcore_mr_get_pd(core, stranger, buf.data(), 64, 0, &m), -EINVAL);
  CHECK_EQ(regcore_close(core), 0);
  for (ibv_pd *pd : pds) ibv_dealloc_pd(pd);
  ibv_dealloc_pd(stranger);
  ibv_close_device(mlx5);
  ibv_close_device(mlx4);
  simverbs_set_profile(SIMVERBS_PROFILE_MLX5);
}

TEST(policy_text_lists_every_class) {
  Env e(SIMVERBS_PROFILE_MLX5);
  int need = regcore_policy_describe(e.core, nullptr, 0);
  CHECK(need > 0);
  std::string text(static_cast<size_t>(need) + 1, '\0');
  regcore_policy_describe(e.core, &text[0], text.size());
  for (const char *name : {"iwarp", "mlx5", "mlx4", "mthca", "generic", "device: class=mlx5"})
    CHECK(text.find(name) != std::string::npos);
}

int main(int argc, char **argv) { return check::run_all(argc, argv); }
