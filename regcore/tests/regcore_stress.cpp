// Randomized fault-schedule stress test of regcore on simverbs.
//
// A ULP keeps up to --depth operations in flight on one QP: RDMA READs and
// WRITEs through rw contexts (some with a chained SEND), and initiator
// requests through reg contexts (the buffer's rkey goes to the simulated
// peer, which RDMA WRITEs into it and answers with SEND or SEND_WITH_INV).
// Faults (post failures, error completions, QP errors) are injected at
// random points; after a QP error the ULP drains, destroys the QP and
// carries on with a new one.
//
// Invariants, checked on every I/O and summarized at the end:
//  - one-completion: every posted context produces exactly one ULP
//    completion, carrying its wr_id; no unknown or duplicate completions.
//  - rkey-dead: once a context is released (reg) or destroyed (iWARP READ
//    sink MRs), its keys are unknown to the device and the peer's access
//    fails.
//  - no-overflow: the device never refused a post for lack of send-queue
//    room, and no CQ overran (only injected post failures happen).
//  - data: every successful READ/WRITE and peer write moved the right bytes.
//  - no-leak: all contexts and registrations are back at the end.
//
//   regcore_stress --profile=NAME [--ios=N] [--seed=S] [--depth=D]
//                  [--flush-unsignaled=0|1] [--fault-rate=R] [--ulp-bug=KIND]
//
// --ulp-bug makes the ULP break the contract on purpose, to show that the
// checks catch it: early-check (treats the buffer as handed back as soon as
// release returns -EINPROGRESS), raw-poll (polls the send CQ with
// ibv_poll_cq, bypassing regcore), extra-sends (posts more WRs of its own
// than it declared at QP creation).
#include <regcore/regcore.h>
#include <simverbs/simverbs.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "env.hpp"

namespace {

struct Config {
  simverbs_profile profile = SIMVERBS_PROFILE_MLX5;
  uint64_t ios = 10000;
  uint64_t seed = 1;
  uint32_t depth = 16;
  int flush_unsignaled = 1;
  double fault_rate = 1.0 / 150;
  std::string ulp_bug;  // "", early-check, raw-poll, extra-sends
};

struct Cmd {  // initiator -> peer
  uint64_t op;
  uint64_t addr;
  uint32_t rkey;
  uint32_t len;
};

struct Resp {  // peer -> initiator
  uint64_t op;
};

constexpr uint64_t kRecvTag = 1ULL << 62;
constexpr uint64_t kNoteTag = 1ULL << 61;  // --ulp-bug=extra-sends WRs
constexpr uint32_t kSlotBytes = 64 * 1024;
constexpr uint32_t kRecvSlots = 64;

enum class Kind { kRead, kWrite, kReg };

struct Op {
  uint64_t id = 0;
  Kind kind = Kind::kRead;
  uint32_t slot = 0;
  regcore_rw_ctx *rw = nullptr;
  regcore_reg_ctx *reg = nullptr;
  bool expect_completion = false;  // a WR carrying id was accepted
  int completions = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  std::vector<ibv_sge> sge;  // rw: local pieces
  uint64_t remote_off = 0;
  std::vector<uint32_t> sink_keys;  // iWARP READ sink MRs
  // reg
  uint32_t rkey = 0;
  uint64_t addr = 0;
  uint32_t len = 0;
  bool remote_inv_ok = false;
  bool response = false;
  uint32_t inv_rkey = 0;
  bool peer_wrote = false;
  bool killed_by_peer = false;  // another op's response invalidated our key
  bool release_started = false;
  bool released = false;
  int release_events = 0;
};

// What a violation breaks; the summary reports each invariant separately.
enum class Inv { kOneCompletion, kKeyDead, kData, kOther };

struct Counters {
  uint64_t started = 0, finished = 0, rw_read = 0, rw_write = 0, reg = 0, chained = 0;
  uint64_t ok = 0, errored = 0, post_refused = 0, eagain = 0;
  uint64_t qp_recreated = 0, faults_scheduled = 0;
  uint64_t keys_checked = 0, keys_refused_live_qp = 0, remote_inv = 0, mismatched_inv = 0;
  uint64_t data_checked = 0, peer_writes = 0;
};

class Stress {
 public:
  explicit Stress(const Config &c) : cfg_(c), rng_(c.seed) {}
  int run();

 private:
  // setup
  testenv::Options options() const;
  void post_recvs();
  // op lifecycle
  void start_op();
  void start_rw(Op &op, Kind kind);
  void start_reg(Op &op);
  void finish_op(Op &op);
  void try_finish(Op &op);
  void release_reg(Op &op);
  // events
  void poll();
  void on_send_wc(const ibv_wc &wc);
  void on_recv_wc(const ibv_wc &wc);
  void peer_step();
  void recover();
  [[noreturn]] void stalled(const char *where);
  // checks
  void check_key_dead(uint32_t key, uint64_t addr);
  void violation(Inv inv, const std::string &what);
  bool final_checks();
  bool print_summary();
  void maybe_schedule_fault();

  uint64_t rand(uint64_t n) { return n ? rng_() % n : 0; }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  uint8_t *slot_base(uint32_t slot) { return local_.data() + static_cast<size_t>(slot) * kSlotBytes; }

  Config cfg_;
  std::mt19937_64 rng_;
  std::unique_ptr<testenv::Env> env_;
  regcore_policy pol_{};
  uint32_t max_send_wr_ = 0;
  std::vector<uint8_t> local_;
  std::vector<uint8_t> recv_bufs_;
  regcore_mr *recv_mr_ = nullptr;
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;
  std::vector<uint64_t> just_released_;
  std::unordered_set<uint64_t> released_unanswered_;  // after a QP error
  std::vector<Resp> pending_resp_;
  std::vector<uint32_t> pending_inv_;
  uint64_t next_id_ = 1;
  bool broken_ = false;
  Counters n_;
  std::vector<std::pair<Inv, std::string>> violations_;
  uint64_t completions_unknown_ = 0;

  friend void on_released(regcore_reg_ctx *, int, void *);
};

Stress *g_stress = nullptr;

void on_released(regcore_reg_ctx *, int status, void *arg) {
  Op *op = static_cast<Op *>(arg);
  if (status != 0) g_stress->violation(Inv::kOther, "release callback status " + std::to_string(status));
  op->release_events++;
  op->released = true;
  g_stress->just_released_.push_back(op->id);  // finished after the poll returns
}

testenv::Options Stress::options() const {
  testenv::Options o;
  o.max_ctxs = o.qp_ctxs = cfg_.depth;
  o.ulp_send_wr = cfg_.depth;  // at most one SEND of our own per operation
  o.recv_wr = kRecvSlots;
  o.max_sge_per_ctx = 24;  // beyond max_sge: staged/indirect/multi paths run
  o.remote_bytes = static_cast<size_t>(2) * cfg_.depth * kSlotBytes;
  return o;
}

void Stress::violation(Inv inv, const std::string &what) {
  if (violations_.size() < 20) std::printf("VIOLATION %s\n", what.c_str());
  violations_.push_back({inv, what});
}

void Stress::post_recvs() {
  if (!recv_mr_) {
    if (regcore_mr_get(env_->core, recv_bufs_.data(), recv_bufs_.size(), IBV_ACCESS_LOCAL_WRITE, &recv_mr_))
      testenv::die("recv buffers");
    env_->held.push_back(recv_mr_);  // its lkey is used while the receives are posted
  }
  for (uint32_t i = 0; i < kRecvSlots; i++) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_bufs_.data()) + i * 64, 64, recv_mr_->lkey};
    ibv_recv_wr wr{}, *bad;
    wr.wr_id = kRecvTag | i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(env_->qp, &wr, &bad)) testenv::die("post_recv");
  }
}

// A random SGE list inside the slot: 1..max_runs pieces, sometimes adjacent (so
// they coalesce), sometimes in different pages (so they do not).
std::vector<ibv_sge> random_sges(std::mt19937_64 &rng, uint8_t *base, unsigned max_runs) {
  unsigned n = 1 + rng() % max_runs;
  std::vector<ibv_sge> sge;
  uint64_t off = rng() % 512;
  for (unsigned i = 0; i < n; i++) {
    uint32_t len = 1 + static_cast<uint32_t>(rng() % (rng() % 8 ? 512 : 3000));
    if (off + len > kSlotBytes) break;
    sge.push_back({reinterpret_cast<uintptr_t>(base) + off, len, 0});
    off += len + (rng() % 3 == 0 ? 0 : 1 + rng() % 700);
  }
  return sge;
}

void Stress::start_rw(Op &op, Kind kind) {
  regcore_dir dir = kind == Kind::kRead ? REGCORE_DIR_READ : REGCORE_DIR_WRITE;
  uint8_t *base = slot_base(op.slot);
  op.sge = random_sges(rng_, base, 24);
  if (kind == Kind::kWrite)
    for (const ibv_sge &s : op.sge)
      for (uint32_t i = 0; i < s.length; i++)
        reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(s.addr))[i] = static_cast<uint8_t>(op.id + i);
  // READs come from the lower half of peer memory (never written), WRITEs
  // go to the slot's own window in the upper half.
  uint64_t half = env_->remote.size() / 2;
  op.remote_off = kind == Kind::kRead ? rand(half - kSlotBytes) : half + static_cast<uint64_t>(op.slot) * kSlotBytes;
  int nwr = regcore_rw_ctx_init(&op.rw, env_->core, env_->qp, op.sge.data(),
                                static_cast<unsigned>(op.sge.size()),
                                reinterpret_cast<uintptr_t>(env_->remote.data()) + op.remote_off,
                                env_->remote_rkey, dir);
  if (nwr == -EAGAIN) {
    n_.eagain++;
    op.rw = nullptr;
    return;
  }
  if (nwr <= 0) {
    violation(Inv::kOther, std::string("rw init: ") + regcore_last_error());
    op.rw = nullptr;
    return;
  }
  uint32_t keys[32];
  int nk = regcore_rw_ctx_remote_keys(op.rw, keys, 32);
  op.sink_keys.assign(keys, keys + std::min(nk, 32));
  bool chain = chance(0.3);
  static const char kDone[] = "rw-done";
  ibv_sge s{reinterpret_cast<uintptr_t>(kDone), sizeof kDone, 0};
  ibv_send_wr send{};
  send.wr_id = op.id;
  send.sg_list = &s;
  send.num_sge = 1;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  int err = regcore_rw_ctx_post(op.rw, env_->qp, op.id, chain ? &send : nullptr);
  n_.chained += chain;
  if (err == 0) {
    op.expect_completion = true;
  } else {
    n_.post_refused++;
    if (err == -EAGAIN) n_.eagain++;
    if (env_->qp->state == IBV_QPS_ERR) broken_ = true;
  }
}

void Stress::start_reg(Op &op) {
  uint8_t *base = slot_base(op.slot);
  op.len = 64 + static_cast<uint32_t>(rand(kSlotBytes / 2));
  op.addr = reinterpret_cast<uintptr_t>(base) + rand(kSlotBytes - op.len);
  int err = regcore_reg_ctx_init(&op.reg, env_->core, env_->qp, reinterpret_cast<void *>(op.addr), op.len,
                                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (err == -EAGAIN) {
    n_.eagain++;
    op.reg = nullptr;
    return;
  }
  if (err) {
    violation(Inv::kOther, std::string("reg init: ") + regcore_last_error());
    op.reg = nullptr;
    return;
  }
  uint64_t raddr = 0;
  regcore_reg_ctx_rkey(op.reg, &op.rkey, &raddr);
  if (raddr != op.addr) violation(Inv::kOther, "reg rkey address");
  op.remote_inv_ok = regcore_reg_ctx_remote_inv_ok(op.reg);
  Cmd cmd{op.id, op.addr, op.rkey, op.len};
  ibv_sge s{reinterpret_cast<uintptr_t>(&cmd), sizeof cmd, 0};
  ibv_send_wr send{}, *bad = nullptr;
  send.wr_id = op.id;
  send.sg_list = &s;
  send.num_sge = 1;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  bool chain = chance(0.7);
  n_.chained += chain;
  err = regcore_reg_ctx_post(op.reg, chain ? &send : nullptr);
  if (err == 0 && !chain) {
    // The ULP sends the key with its own WR, after the registration.
    err = ibv_post_send(env_->qp, &send, &bad);
    err = -err;
  }
  if (err == 0 && cfg_.ulp_bug == "extra-sends") {
    // An undeclared extra WR of the ULP's own, unsignaled: it stays in the
    // send queue until a later completion retires it.
    static const char kNote[] = "note";
    ibv_sge ns{reinterpret_cast<uintptr_t>(kNote), sizeof kNote, 0};
    ibv_send_wr note{};
    note.wr_id = kNoteTag;
    note.sg_list = &ns;
    note.num_sge = 1;
    note.opcode = IBV_WR_SEND;
    note.send_flags = IBV_SEND_INLINE;
    for (int i = 0; i < 4; i++)
      if (ibv_post_send(env_->qp, &note, &bad)) n_.post_refused++;
  }
  if (err == 0) {
    op.expect_completion = true;
  } else {
    n_.post_refused++;
    if (err == -EAGAIN) n_.eagain++;
    if (env_->qp->state == IBV_QPS_ERR) broken_ = true;
  }
}

void Stress::maybe_schedule_fault() {
  if (!chance(cfg_.fault_rate)) return;
  n_.faults_scheduled++;
  uint64_t after = 1 + rand(40);
  switch (rand(3)) {
    case 0:
      simverbs_fault_inject(SIMVERBS_FAULT_POST_FAIL, after, rand(2) ? ENOMEM : EIO);
      break;
    case 1: {
      const ibv_wc_status st[] = {IBV_WC_REM_ACCESS_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_LOC_PROT_ERR};
      simverbs_fault_inject(SIMVERBS_FAULT_ERROR_CQE, after, st[rand(3)]);
      break;
    }
    default:
      simverbs_fault_inject(SIMVERBS_FAULT_QP_ERROR, after, 0);
  }
}

void Stress::start_op() {
  auto op = std::make_unique<Op>();
  op->id = next_id_++;
  op->slot = free_slots_.back();
  free_slots_.pop_back();
  maybe_schedule_fault();
  uint64_t r = rand(10);
  op->kind = r < 4 ? Kind::kRead : r < 7 ? Kind::kWrite : Kind::kReg;
  n_.started++;
  if (op->kind == Kind::kReg) {
    n_.reg++;
    start_reg(*op);
  } else {
    (op->kind == Kind::kRead ? n_.rw_read : n_.rw_write)++;
    start_rw(*op, op->kind);
  }
  Op *raw = op.get();
  ops_[raw->id] = std::move(op);
  try_finish(*raw);
}

void Stress::check_key_dead(uint32_t key, uint64_t addr) {
  n_.keys_checked++;
  if (simverbs_key_query(env_->pd, key, nullptr) != -ENOKEY)
    violation(Inv::kKeyDead, "key " + std::to_string(key) + " still valid after release");
  uint8_t x = 0x5a;
  int rc = simverbs_peer_rdma_write(env_->peer, key, addr, &x, 1);
  if (rc == 0) violation(Inv::kKeyDead, "peer wrote through released key " + std::to_string(key));
  if (rc == -ENOKEY) n_.keys_refused_live_qp++;
}

void Stress::release_reg(Op &op) {
  op.release_started = true;
  // Released without its answer (QP error): the answer may still be queued.
  if (!op.response) released_unanswered_.insert(op.id);
  if (op.inv_rkey) {
    n_.remote_inv++;
    if (op.inv_rkey != op.rkey) n_.mismatched_inv++;
  }
  int rc = regcore_reg_ctx_release(op.reg, op.inv_rkey, on_released, &op);
  if (rc == -EINPROGRESS && cfg_.ulp_bug == "early-check") check_key_dead(op.rkey, op.addr);
  if (rc == 0) {
    op.release_events++;
    op.released = true;
  } else if (rc != -EINPROGRESS) {
    violation(Inv::kOther, std::string("release: ") + regcore_last_error());
    op.released = true;
  }
}

// Finishes the operation once everything it waits for happened.
void Stress::try_finish(Op &op) {
  if (op.kind != Kind::kReg) {
    if (op.rw && op.expect_completion && op.completions == 0) return;
    if (op.rw) {
      int rc = regcore_rw_ctx_destroy(op.rw);
      if (rc) violation(Inv::kOther, std::string("rw destroy: ") + regcore_last_error());
      for (uint32_t k : op.sink_keys) check_key_dead(k, op.sge[0].addr);
    }
    finish_op(op);
    return;
  }
  if (!op.reg) {
    finish_op(op);
    return;
  }
  if (!op.release_started) {
    bool sent = !op.expect_completion || op.completions > 0;
    bool answered = op.response || broken_ || op.status != IBV_WC_SUCCESS || !op.expect_completion;
    if (!sent || !answered) return;
    release_reg(op);
  }
  if (!op.released) return;
  check_key_dead(op.rkey, op.addr);
  finish_op(op);
}

void Stress::finish_op(Op &op) {
  if (op.expect_completion && op.completions != 1)
    violation(Inv::kOneCompletion, "op " + std::to_string(op.id) + " saw " + std::to_string(op.completions) + " completions");
  if (!op.expect_completion && op.completions != 0) violation(Inv::kOneCompletion, "completion for an op that was not posted");
  if (op.reg && op.release_events != 1)
    violation(Inv::kOneCompletion, "op " + std::to_string(op.id) + " released " + std::to_string(op.release_events) + " times");
  if (op.expect_completion && op.status == IBV_WC_SUCCESS) n_.ok++;
  if (op.expect_completion && op.status != IBV_WC_SUCCESS) n_.errored++;
  if (chance(0.02)) regcore_mr_invalidate_range(env_->core, slot_base(op.slot), kSlotBytes);
  free_slots_.push_back(op.slot);
  n_.finished++;
  ops_.erase(op.id);
}

void Stress::on_send_wc(const ibv_wc &wc) {
  if (wc.wr_id == kNoteTag) return;
  auto it = ops_.find(wc.wr_id);
  if (it == ops_.end()) {
    completions_unknown_++;
    violation(Inv::kOneCompletion, "completion with unknown wr_id " + std::to_string(wc.wr_id));
    return;
  }
  Op &op = *it->second;
  op.completions++;
  op.status = wc.status;
  if (wc.status != IBV_WC_SUCCESS) {
    broken_ = true;
  } else if (op.kind != Kind::kReg) {
    // The data must be in place when the ULP sees the completion.
    n_.data_checked++;
    uint64_t off = op.remote_off;
    for (const ibv_sge &s : op.sge) {
      auto *p = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(s.addr));
      if (std::memcmp(p, env_->remote.data() + off, s.length) != 0) {
        violation(Inv::kData, "data mismatch op " + std::to_string(op.id));
        break;
      }
      off += s.length;
    }
  }
  try_finish(op);
}

void Stress::on_recv_wc(const ibv_wc &wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    broken_ = true;
    return;
  }
  uint32_t slot = static_cast<uint32_t>(wc.wr_id & 0xffff);
  Resp r;
  std::memcpy(&r, recv_bufs_.data() + slot * 64, sizeof r);
  auto it = ops_.find(r.op);
  if (it != ops_.end()) {
    Op &op = *it->second;
    op.response = true;
    op.inv_rkey = (wc.wc_flags & IBV_WC_WITH_INV) ? wc.invalidated_rkey : 0;
    try_finish(op);
  } else if (!released_unanswered_.count(r.op)) {
    violation(Inv::kOther, "response for unknown op");
  }
  // Repost the receive.
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_bufs_.data()) + slot * 64, 64, recv_mr_->lkey};
  ibv_recv_wr rwr{}, *bad;
  rwr.wr_id = wc.wr_id;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_post_recv(env_->qp, &rwr, &bad);
}

void Stress::poll() {
  simverbs_set_exec_budget(static_cast<unsigned>(rand(6)));
  ibv_wc wc[8];
  int batch = 1 + static_cast<int>(rand(8));
  int n = cfg_.ulp_bug == "raw-poll" ? ibv_poll_cq(env_->scq, batch, wc)
                                      : regcore_poll_cq(env_->core, env_->scq, batch, wc);
  if (n < 0) violation(Inv::kOther, "regcore_poll_cq failed");
  for (int i = 0; i < n; i++) on_send_wc(wc[i]);
  n = regcore_poll_cq(env_->core, env_->rcq, batch, wc);
  for (int i = 0; i < n; i++) on_recv_wc(wc[i]);
  std::vector<uint64_t> done;
  done.swap(just_released_);
  for (uint64_t id : done) {
    auto it = ops_.find(id);
    if (it != ops_.end()) try_finish(*it->second);
  }
}

// The simulated target: takes commands, writes into the advertised buffer
// and answers, with SEND_WITH_INV when the key allows it.
void Stress::peer_step() {
  Cmd cmd;
  size_t len = 0;
  while (simverbs_peer_recv(env_->peer, &cmd, sizeof cmd, &len) == 0) {
    if (len == sizeof "rw-done" || len == sizeof "note") continue;  // not commands
    if (broken_) continue;
    auto it = ops_.find(cmd.op);
    if (it == ops_.end()) {
      violation(Inv::kOther, "peer got a command for an unknown op");
      continue;
    }
    Op &op = *it->second;
    if (cmd.rkey != op.rkey || cmd.addr != op.addr) violation(Inv::kOther, "peer got a wrong key");
    uint32_t n = std::min<uint32_t>(cmd.len, 256);
    uint64_t at = cmd.addr + rand(cmd.len - n + 1);
    std::vector<uint8_t> data(n, static_cast<uint8_t>(cmd.op));
    int rc = simverbs_peer_rdma_write(env_->peer, cmd.rkey, at, data.data(), n);
    n_.peer_writes++;
    if (rc == -ENOTCONN) {  // the QP went to error before we noticed
      broken_ = true;
      continue;
    }
    if (rc == 0) {
      if (std::memcmp(reinterpret_cast<void *>(at), data.data(), n) != 0) violation(Inv::kData, "peer write lost");
    } else if (!op.killed_by_peer && !broken_) {
      violation(Inv::kData, "peer write through a live key failed: " + std::to_string(rc));
    }
    uint32_t inv = 0;
    if (op.remote_inv_ok && chance(0.6)) inv = cmd.rkey;
    if (inv && chance(0.02)) {
      // A buggy peer invalidates some other live key of ours instead.
      for (auto &kv : ops_) {
        Op &other = *kv.second;
        if (&other != &op && other.kind == Kind::kReg && other.remote_inv_ok && other.reg &&
            !other.release_started && other.expect_completion && other.completions == 1) {
          inv = other.rkey;
          other.killed_by_peer = true;
          break;
        }
      }
    }
    pending_resp_.push_back({cmd.op});
    pending_inv_.push_back(inv);
  }
  for (size_t i = 0; i < pending_resp_.size();) {
    if (broken_) {
      pending_resp_.clear();
      pending_inv_.clear();
      break;
    }
    int rc = simverbs_peer_send(env_->peer, &pending_resp_[i], sizeof(Resp), pending_inv_[i]);
    if (rc == -ENOKEY) rc = simverbs_peer_send(env_->peer, &pending_resp_[i], sizeof(Resp), 0);
    if (rc == -EAGAIN) break;  // no receive posted yet
    if (rc == -ENOTCONN) broken_ = true;
    if (rc != 0 && !broken_) violation(Inv::kOther, "peer send failed: " + std::to_string(rc));
    pending_resp_.erase(pending_resp_.begin() + static_cast<long>(i));
    pending_inv_.erase(pending_inv_.begin() + static_cast<long>(i));
  }
}

// After a QP error: every operation drains (flush completions, releases),
// then the QP is replaced.
void Stress::recover() {
  for (uint64_t spin = 0; !ops_.empty(); spin++) {
    poll();
    peer_step();
    std::vector<Op *> all;
    for (auto &kv : ops_) all.push_back(kv.second.get());
    for (Op *op : all) try_finish(*op);
    if (spin > 200000) stalled("drain");
  }
  env_->new_qp();
  post_recvs();
  broken_ = false;
  n_.qp_recreated++;
}

void Stress::stalled(const char *where) {
  violation(Inv::kOther, std::string(where) + " stalled with " + std::to_string(ops_.size()) + " ops");
  for (auto &kv : ops_)
    std::printf("  stuck op %" PRIu64 " kind=%d expect=%d completions=%d response=%d release=%d/%d "
                "status=%d qp_state=%d\n",
                kv.first, static_cast<int>(kv.second->kind), kv.second->expect_completion,
                kv.second->completions, kv.second->response, kv.second->release_started,
                kv.second->released, kv.second->status, env_->qp->state);
  std::printf("  sq_outstanding=%u broken=%d pending_resp=%zu (regcore: %s; simverbs: %s)\n",
              simverbs_qp_sq_outstanding(env_->qp), broken_, pending_resp_.size(), regcore_last_error(),
              simverbs_last_error());
  print_summary();
  std::exit(1);
}

bool Stress::final_checks() {
  simverbs_fault_clear();
  simverbs_set_exec_budget(0);
  recover();
  n_.qp_recreated--;  // the final drain is not a recovery
  return print_summary();
}

bool Stress::print_summary() {
  simverbs_stats st;
  simverbs_get_stats(&st);
  regcore_stats rs;
  regcore_get_stats(env_->core, &rs);
  bool overflow_ok = st.post_enomem == 0 && st.post_einval == 0 && st.cq_overflows == 0;
  bool leak_ok = rs.ctxs_in_use == 0 && rs.mrs_in_use == 0;
  bool one_ok = true, key_ok = true, data_ok = true;
  for (const auto &v : violations_) {
    one_ok &= v.first != Inv::kOneCompletion;
    key_ok &= v.first != Inv::kKeyDead;
    data_ok &= v.first != Inv::kData;
  }
  std::printf("profile=%s seed=%" PRIu64 " depth=%u flush_unsignaled=%d max_send_wr=%u wrs_per_ctx=%u\n",
              simverbs_profile_name(cfg_.profile), cfg_.seed, cfg_.depth, cfg_.flush_unsignaled,
              max_send_wr_, pol_.wrs_per_ctx);
  std::printf("ios=%" PRIu64 " read=%" PRIu64 " write=%" PRIu64 " reg=%" PRIu64 " chained=%" PRIu64
              " ok=%" PRIu64 " errored=%" PRIu64 " refused=%" PRIu64 " eagain=%" PRIu64 "\n",
              n_.finished, n_.rw_read, n_.rw_write, n_.reg, n_.chained, n_.ok, n_.errored,
              n_.post_refused, n_.eagain);
  std::printf("faults scheduled=%" PRIu64 " fired: post=%" PRIu64 " cqe=%" PRIu64 " qp=%" PRIu64
              " qp_recreated=%" PRIu64 " partial_posts=%" PRIu64 "\n",
              n_.faults_scheduled, st.injected_post_failures, st.injected_error_cqes,
              st.injected_qp_errors, n_.qp_recreated, rs.partial_posts);
  std::printf("strategies single=%" PRIu64 " multi=%" PRIu64 " staged=%" PRIu64 " mr_reg=%" PRIu64
              " indirect=%" PRIu64 " reg_mw=%" PRIu64 " reg_mr=%" PRIu64 "\n",
              rs.rw_ctxs[REGCORE_RW_SINGLE_WR], rs.rw_ctxs[REGCORE_RW_MULTI_WR],
              rs.rw_ctxs[REGCORE_RW_MR_STAGED], rs.rw_ctxs[REGCORE_RW_MR_REG], rs.rw_ctxs[REGCORE_RW_INDIRECT],
              rs.reg_ctxs[REGCORE_REG_MW], rs.reg_ctxs[REGCORE_REG_MR]);
  std::printf("invalidation remote=%" PRIu64 " mismatched=%" PRIu64 " local_inv=%" PRIu64 " sync=%" PRIu64 "\n",
              rs.remote_inv_matched, rs.remote_inv_mismatched, rs.local_invs, rs.sync_invalidations);
  std::printf("check one-completion-per-context: %s (%" PRIu64 " ulp completions, %" PRIu64
              " internal consumed, %" PRIu64 " unknown)\n",
              one_ok ? "ok" : "FAILED", rs.ulp_wcs, rs.internal_wcs, completions_unknown_);
  std::printf("check rkey-dead-after-release: %s (%" PRIu64 " keys, %" PRIu64
              " refused by a live QP with ENOKEY)\n",
              key_ok ? "ok" : "FAILED", n_.keys_checked, n_.keys_refused_live_qp);
  std::printf("check no-queue-overflow: %s (post_enomem=%" PRIu64 " post_einval=%" PRIu64
              " cq_overflows=%" PRIu64 " max_sq_depth=%" PRIu64 " of %u)\n",
              overflow_ok ? "ok" : "FAILED", st.post_enomem, st.post_einval, st.cq_overflows,
              st.max_sq_depth_seen, max_send_wr_);
  std::printf("check data: %s (%" PRIu64 " rw checked, %" PRIu64 " peer writes)\n", data_ok ? "ok" : "FAILED",
              n_.data_checked, n_.peer_writes);
  std::printf("check no-leak: %s (ctxs_in_use=%u mrs_in_use=%u)\n", leak_ok ? "ok" : "FAILED",
              rs.ctxs_in_use, rs.mrs_in_use);
  // With faults enabled the run must actually have gone through errors.
  bool faults_ok = cfg_.fault_rate == 0 || (n_.qp_recreated > 0 && st.injected_post_failures > 0);
  std::printf("check faults-exercised: %s\n", faults_ok ? "ok" : "FAILED");
  bool all = overflow_ok && leak_ok && faults_ok && violations_.empty() && n_.finished >= cfg_.ios;
  std::printf("RESULT %s violations=%zu\n", all ? "ok" : "FAILED", violations_.size());
  return all;
}

int Stress::run() {
  g_stress = this;
  simverbs_reset_stats();
  simverbs_fault_clear();
  simverbs_set_flush_unsignaled(cfg_.flush_unsignaled);
  env_ = std::make_unique<testenv::Env>(cfg_.profile, options());
  regcore_policy_get(env_->core, &pol_);
  regcore_max_send_wr(env_->core, cfg_.depth, cfg_.depth, &max_send_wr_);
  local_.assign(static_cast<size_t>(cfg_.depth) * kSlotBytes, 0);
  recv_bufs_.assign(kRecvSlots * 64, 0);
  for (uint32_t i = cfg_.depth; i-- > 0;) free_slots_.push_back(i);
  post_recvs();
  uint64_t idle = 0, last_finished = 0;
  while (n_.started < cfg_.ios) {
    if (broken_) recover();
    // Bursts of new operations, and iterations without polling (the device
    // only runs WQEs when polled), so the send queue really fills up.
    for (uint64_t k = rand(5); k > 0 && !free_slots_.empty() && !broken_ && n_.started < cfg_.ios; k--)
      start_op();
    if (chance(0.75)) poll();
    peer_step();
    idle = n_.finished == last_finished ? idle + 1 : 0;
    last_finished = n_.finished;
    if (idle > 200000) stalled("workload");
  }
  bool ok = final_checks();
  env_.reset();
  return ok ? 0 : 1;
}

bool parse(int argc, char **argv, Config &c) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!std::strncmp(a, "--profile=", 10)) {
      int p = simverbs_profile_from_name(a + 10);
      if (p < 0) return false;
      c.profile = static_cast<simverbs_profile>(p);
    } else if (!std::strncmp(a, "--ios=", 6)) {
      c.ios = std::strtoull(a + 6, nullptr, 10);
    } else if (!std::strncmp(a, "--seed=", 7)) {
      c.seed = std::strtoull(a + 7, nullptr, 10);
    } else if (!std::strncmp(a, "--depth=", 8)) {
      c.depth = static_cast<uint32_t>(std::strtoul(a + 8, nullptr, 10));
    } else if (!std::strncmp(a, "--flush-unsignaled=", 19)) {
      c.flush_unsignaled = std::atoi(a + 19);
    } else if (!std::strncmp(a, "--fault-rate=", 13)) {
      c.fault_rate = std::strtod(a + 13, nullptr);
    } else if (!std::strncmp(a, "--ulp-bug=", 10)) {
      c.ulp_bug = a + 10;
      if (c.ulp_bug != "early-check" && c.ulp_bug != "raw-poll" && c.ulp_bug != "extra-sends") return false;
    } else {
      return false;
    }
  }
  return c.depth >= 1 && c.depth <= 64;
}

}  // namespace

int main(int argc, char **argv) {
  Config cfg;
  if (!parse(argc, argv, cfg)) {
    std::fprintf(stderr,
                 "usage: %s --profile=mthca|mlx4|mlx5|iwarp [--ios=N] [--seed=S] [--depth=D<=64] "
                 "[--flush-unsignaled=0|1] [--fault-rate=R] [--ulp-bug=early-check|raw-poll|extra-sends]\n",
                 argv[0]);
    return 2;
  }
  Stress s(cfg);
  return s.run();
}
