// Shared test setup: a simverbs device of one profile, a PD, CQs, a regcore
// core with a regcore-sized QP, and a simulated peer connected to it.
#pragma once

#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace testenv {

inline void die(const std::string &what) {
  std::fprintf(stderr, "fatal: %s (regcore: %s, simverbs: %s)\n", what.c_str(), regcore_last_error(),
               simverbs_last_error());
  std::exit(2);
}

inline ibv_context *open_device(simverbs_profile p) {
  if (simverbs_set_profile(p)) die("simverbs_set_profile");
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list || n < 1) die("no device");
  ibv_context *ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) die("ibv_open_device");
  return ctx;
}

struct Options {
  uint32_t max_ctxs = 16;      // core budget
  uint32_t qp_ctxs = 16;       // declared for the QP
  uint32_t ulp_send_wr = 8;    // the ULP's own send WRs
  uint32_t recv_wr = 64;
  uint32_t max_sge_per_ctx = 16;
  uint32_t flags = 0;
  uint32_t max_mrs = 0;
  uint32_t cache_max_entries = 0;
  uint64_t cache_max_bytes = 0;
  size_t remote_bytes = 1 << 20;
};

struct Env {
  simverbs_profile profile;
  Options opt;
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_cq *scq = nullptr, *rcq = nullptr;
  regcore *core = nullptr;
  ibv_qp *qp = nullptr;
  simverbs_peer *peer = nullptr;
  std::vector<uint8_t> remote;  // peer memory the QP's RDMA WRs target
  uint32_t remote_rkey = 0;
  // Cache references whose lkeys posted receives use: put at teardown, as
  // an lkey is only valid while its registration is referenced.
  std::vector<regcore_mr *> held;

  Env(simverbs_profile p, Options o = Options()) : profile(p), opt(o) {
    ctx = open_device(p);
    pd = ibv_alloc_pd(ctx);
    if (!pd) die("ibv_alloc_pd");
    regcore_attr a{};
    a.max_ctxs = opt.max_ctxs;
    a.max_mrs = opt.max_mrs;
    a.max_sge_per_ctx = opt.max_sge_per_ctx;
    a.flags = opt.flags;
    a.cache_max_entries = opt.cache_max_entries;
    a.cache_max_bytes = opt.cache_max_bytes;
    if (int err = regcore_open(pd, &a, &core)) die("regcore_open " + std::to_string(err));
    uint32_t sq = 0;
    if (regcore_max_send_wr(core, opt.ulp_send_wr, opt.qp_ctxs, &sq)) die("regcore_max_send_wr");
    scq = ibv_create_cq(ctx, static_cast<int>(sq), nullptr, nullptr, 0);
    rcq = ibv_create_cq(ctx, static_cast<int>(opt.recv_wr), nullptr, nullptr, 0);
    if (!scq || !rcq) die("ibv_create_cq");
    peer = simverbs_peer_create(ctx);
    remote.resize(opt.remote_bytes);
    for (size_t i = 0; i < remote.size(); i++) remote[i] = static_cast<uint8_t>(i * 7 + 3);
    if (simverbs_peer_expose(peer, remote.data(), remote.size(),
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
                             &remote_rkey))
      die("simverbs_peer_expose");
    new_qp();
  }

  // Creates (or re-creates after an error) the QP and connects the peer.
  void new_qp() {
    if (qp) {
      if (int err = regcore_qp_destroy(core, qp)) die("regcore_qp_destroy " + std::to_string(err));
      drain(rcq);  // flushed receives of the old QP
    }
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = opt.ulp_send_wr;
    a.cap.max_recv_wr = opt.recv_wr;
    a.cap.max_recv_sge = 1;
    a.cap.max_send_sge = 1;
    a.cap.max_inline_data = 64;
    if (int err = regcore_qp_create(core, &a, opt.qp_ctxs, &qp)) die("regcore_qp_create " + std::to_string(err));
    if (simverbs_peer_connect(peer, qp)) die("simverbs_peer_connect");
  }

  void drain(ibv_cq *cq) {
    ibv_wc wc[16];
    while (regcore_poll_cq(core, cq, 16, wc) > 0) {
    }
  }

  // Polls until one ULP completion arrives on cq (or the budget runs out).
  bool poll_one(ibv_cq *cq, ibv_wc *wc, int spins = 1000) {
    for (int i = 0; i < spins; i++)
      if (regcore_poll_cq(core, cq, 1, wc) == 1) return true;
    return false;
  }

  ~Env() {
    if (qp) regcore_qp_destroy(core, qp);
    for (regcore_mr *mr : held)
      if (int err = regcore_mr_put(core, mr)) std::fprintf(stderr, "put: %d %s\n", err, regcore_last_error());
    simverbs_peer_destroy(peer);
    if (int err = regcore_close(core)) std::fprintf(stderr, "regcore_close: %d %s\n", err, regcore_last_error());
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
};

inline const simverbs_profile kAllProfiles[] = {SIMVERBS_PROFILE_MTHCA, SIMVERBS_PROFILE_MLX4,
                                                SIMVERBS_PROFILE_MLX5, SIMVERBS_PROFILE_IWARP};

}  // namespace testenv
