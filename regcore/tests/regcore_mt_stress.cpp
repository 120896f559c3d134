// One struct regcore shared by threads. Each worker has its own QP and
// peer; pairs of workers share a send CQ, so each polls completions of the
// other's QP and hands them over. Workers run rw WRITEs out of a shared
// arena (shared cache entries), rw READs into their own memory, remote
// registrations of a buffer and of an SGL that the peer writes and
// invalidates (or that regcore invalidates), and cache gets of the arena.
// A chaos thread meanwhile maps, caches and unmaps scratch memory (monitor
// events), invalidates parts of the arena, creates and destroys a QP, and
// reads the statistics. Every byte moved is checked.
//
//   regcore_mt_stress [--threads=N] [--ios=N] [--profile=NAME] [--seed=N]
//
// Built a second time with ThreadSanitizer (regcore_mt_stress_tsan).
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "env.hpp"

namespace {

constexpr uint32_t kDepthCtxs = 8;
constexpr size_t kArena = 1 << 20;
constexpr size_t kRemote = 256 * 1024;
constexpr size_t kPrivate = 256 * 1024;
constexpr int kRecvSlots = 16;

struct Config {
  unsigned threads = 4;
  unsigned ios = 2000;
  simverbs_profile profile = SIMVERBS_PROFILE_MLX5;
  unsigned seed = 1;
};

struct Shared {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  regcore *core = nullptr;
  std::vector<uint8_t> arena = std::vector<uint8_t>(kArena);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> failures{0};
};

void failure(Shared &sh, const std::string &what) {
  if (sh.failures.fetch_add(1) < 20) std::printf("VIOLATION %s (regcore: %s)\n", what.c_str(), regcore_last_error());
}

// Completions of a worker's QP that its CQ partner polled.
struct Mailbox {
  std::mutex mu;
  std::deque<ibv_wc> wcs;
};

struct Counts {
  uint64_t writes = 0, reads = 0, regs = 0, reg_iovs = 0, gets = 0, completions = 0, bytes_checked = 0;
};

class Worker {
 public:
  Worker(Shared &sh, unsigned id, ibv_cq *scq, unsigned seed) : sh_(sh), id_(id), scq_(scq), rng_(seed) {}
  void setup();
  void run(unsigned ios, Worker *partner);
  void teardown();
  Mailbox box;
  uint32_t qp_num() const { return qp_->qp_num; }
  Counts counts;

 private:
  void op_write();
  void op_read();
  void op_reg(bool iov);
  void op_get();
  ibv_wc wait_send(uint64_t wr_id);
  ibv_wc wait_recv();
  void post_recv(unsigned slot);
  unsigned rnd(unsigned n) { return static_cast<unsigned>(rng_() % n); }
  uint64_t remote_addr(size_t off) { return reinterpret_cast<uintptr_t>(remote_.data()) + off; }

  Shared &sh_;
  unsigned id_;
  ibv_cq *scq_;
  ibv_cq *rcq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  simverbs_peer *peer_ = nullptr;
  Worker *partner_ = nullptr;
  std::mt19937_64 rng_;
  std::vector<uint8_t> remote_ = std::vector<uint8_t>(kRemote);
  std::vector<uint8_t> mine_ = std::vector<uint8_t>(kPrivate);
  std::vector<uint8_t> recv_ = std::vector<uint8_t>(kRecvSlots * 64);
  uint32_t remote_rkey_ = 0;
  regcore_mr *recv_mr_ = nullptr;
  uint64_t next_wr_ = 1;
};

void Worker::setup() {
  rcq_ = ibv_create_cq(sh_.ctx, 64, nullptr, nullptr, 0);
  ibv_qp_init_attr a{};
  a.send_cq = scq_;
  a.recv_cq = rcq_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 4;
  a.cap.max_recv_wr = kRecvSlots;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = 64;
  if (int err = regcore_qp_create(sh_.core, &a, kDepthCtxs, &qp_)) testenv::die("qp " + std::to_string(err));
  peer_ = simverbs_peer_create(sh_.ctx);
  if (simverbs_peer_connect(peer_, qp_)) testenv::die("peer connect");
  for (size_t i = 0; i < remote_.size(); i++) remote_[i] = static_cast<uint8_t>(i * 31 + id_);
  if (simverbs_peer_expose(peer_, remote_.data(), remote_.size(),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, &remote_rkey_))
    testenv::die("expose");
  if (regcore_mr_get(sh_.core, recv_.data(), recv_.size(), IBV_ACCESS_LOCAL_WRITE, &recv_mr_)) testenv::die("recv mr");
  for (unsigned i = 0; i < kRecvSlots; i++) post_recv(i);
}

void Worker::post_recv(unsigned slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_.data()) + slot * 64, 64, recv_mr_->lkey};
  ibv_recv_wr wr{}, *bad;
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_recv(qp_, &wr, &bad)) testenv::die("post_recv");
}

// Polls the shared send CQ until this worker's completion arrives; the
// partner's completions go to its mailbox.
ibv_wc Worker::wait_send(uint64_t wr_id) {
  for (long spins = 0; spins < 50000000; spins++) {
    {
      std::lock_guard<std::mutex> lock(box.mu);
      if (!box.wcs.empty()) {
        ibv_wc wc = box.wcs.front();
        box.wcs.pop_front();
        if (wc.wr_id != wr_id) failure(sh_, "unexpected completion " + std::to_string(wc.wr_id));
        return wc;
      }
    }
    ibv_wc wc[4];
    int n = regcore_poll_cq(sh_.core, scq_, 4, wc);
    for (int i = 0; i < n; i++) {
      Worker *to = wc[i].qp_num == qp_num() ? this : partner_;
      if (!to || (to != this && wc[i].qp_num != to->qp_num())) {
        failure(sh_, "completion of an unknown QP");
        continue;
      }
      std::lock_guard<std::mutex> lock(to->box.mu);
      to->box.wcs.push_back(wc[i]);
    }
    if (n == 0) std::this_thread::yield();
  }
  failure(sh_, "no completion for wr_id " + std::to_string(wr_id));
  return ibv_wc{};
}

ibv_wc Worker::wait_recv() {
  ibv_wc wc{};
  for (long spins = 0; spins < 50000000; spins++) {
    if (regcore_poll_cq(sh_.core, rcq_, 1, &wc) == 1) {
      post_recv(static_cast<unsigned>(wc.wr_id));
      return wc;
    }
    std::this_thread::yield();
  }
  failure(sh_, "no response");
  return wc;
}

// 1-6 pieces of the shared arena to the peer.
void Worker::op_write() {
  ibv_sge sge[6];
  unsigned n = 1 + rnd(6);
  size_t total = 0;
  for (unsigned i = 0; i < n; i++) {
    uint32_t len = 64 + rnd(4096);
    size_t off = rnd(static_cast<unsigned>(kArena - len));
    sge[i] = {reinterpret_cast<uintptr_t>(sh_.arena.data()) + off, len, 0};
    total += len;
  }
  size_t roff = rnd(static_cast<unsigned>(kRemote - total));
  regcore_rw_ctx *ctx = nullptr;
  int nwr = regcore_rw_ctx_init(&ctx, sh_.core, qp_, sge, n, remote_addr(roff), remote_rkey_, REGCORE_DIR_WRITE);
  if (nwr <= 0) return failure(sh_, "rw write init " + std::to_string(nwr));
  uint64_t wr_id = (static_cast<uint64_t>(id_) << 32) | next_wr_++;
  if (regcore_rw_ctx_post(ctx, qp_, wr_id, nullptr)) return failure(sh_, "rw write post");
  ibv_wc wc = wait_send(wr_id);
  if (wc.status != IBV_WC_SUCCESS) failure(sh_, "rw write status");
  size_t at = roff;
  for (unsigned i = 0; i < n; i++) {
    if (std::memcmp(&remote_[at], reinterpret_cast<void *>(sge[i].addr), sge[i].length))
      failure(sh_, "write data");
    at += sge[i].length;
  }
  if (regcore_rw_ctx_destroy(ctx)) failure(sh_, "rw write destroy");
  counts.writes++;
  counts.completions++;
  counts.bytes_checked += total;
}

// Peer memory into 1-4 pieces of this worker's own memory.
void Worker::op_read() {
  ibv_sge sge[4];
  unsigned n = 1 + rnd(4);
  size_t total = 0, slot = kPrivate / 4;
  for (unsigned i = 0; i < n; i++) {
    uint32_t len = 64 + rnd(2048);
    sge[i] = {reinterpret_cast<uintptr_t>(mine_.data()) + i * slot + rnd(1024), len, 0};
    total += len;
  }
  size_t roff = rnd(static_cast<unsigned>(kRemote - total));
  regcore_rw_ctx *ctx = nullptr;
  int nwr = regcore_rw_ctx_init(&ctx, sh_.core, qp_, sge, n, remote_addr(roff), remote_rkey_, REGCORE_DIR_READ);
  if (nwr <= 0) return failure(sh_, "rw read init " + std::to_string(nwr));
  uint64_t wr_id = (static_cast<uint64_t>(id_) << 32) | next_wr_++;
  if (regcore_rw_ctx_post(ctx, qp_, wr_id, nullptr)) return failure(sh_, "rw read post");
  ibv_wc wc = wait_send(wr_id);
  if (wc.status != IBV_WC_SUCCESS) failure(sh_, "rw read status");
  if (regcore_rw_ctx_destroy(ctx)) failure(sh_, "rw read destroy");
  size_t at = roff;
  for (unsigned i = 0; i < n; i++) {
    if (std::memcmp(reinterpret_cast<void *>(sge[i].addr), &remote_[at], sge[i].length)) failure(sh_, "read data");
    at += sge[i].length;
  }
  counts.reads++;
  counts.completions++;
  counts.bytes_checked += total;
}

void on_released(regcore_reg_ctx *, int, void *arg) { static_cast<std::atomic<int> *>(arg)->fetch_add(1); }

// A key for this worker's memory (one buffer, or an SGL of three), sent to
// the peer, which writes through it and answers, invalidating the key when
// it may; then the release.
void Worker::op_reg(bool iov) {
  uint8_t *base = mine_.data() + kPrivate / 2;
  struct iovec v[3];
  unsigned nv = iov ? 3 : 1;
  size_t total = 0;
  for (unsigned i = 0; i < nv; i++) {
    size_t len = 256 + rnd(1024);
    v[i] = {base + i * 8192 + rnd(512), len};
    total += len;
  }
  regcore_reg_ctx *ctx = nullptr;
  int err = iov ? regcore_reg_ctx_init_iov(&ctx, sh_.core, qp_, v, nv, IBV_ACCESS_REMOTE_WRITE)
                : regcore_reg_ctx_init(&ctx, sh_.core, qp_, v[0].iov_base, v[0].iov_len, IBV_ACCESS_REMOTE_WRITE);
  if (err) return failure(sh_, "reg init " + std::to_string(err));
  uint32_t key[3] = {0, 0, 0};
  uint64_t raddr = 0;
  regcore_reg_ctx_rkey(ctx, &key[0], &raddr);
  std::memcpy(&key[1], &raddr, sizeof raddr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(key), sizeof key, 0};
  ibv_send_wr send{};
  uint64_t wr_id = (static_cast<uint64_t>(id_) << 32) | next_wr_++;
  send.wr_id = wr_id;
  send.sg_list = &sge;
  send.num_sge = 1;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  if (regcore_reg_ctx_post(ctx, &send)) return failure(sh_, "reg post");
  if (wait_send(wr_id).status != IBV_WC_SUCCESS) failure(sh_, "reg send status");
  // The peer.
  uint32_t got[3];
  size_t len = 0;
  if (simverbs_peer_recv(peer_, got, sizeof got, &len)) return failure(sh_, "peer recv");
  uint64_t addr;
  std::memcpy(&addr, &got[1], sizeof addr);
  std::vector<uint8_t> data(total);
  for (size_t i = 0; i < total; i++) data[i] = static_cast<uint8_t>(rng_());
  if (simverbs_peer_rdma_write(peer_, got[0], addr, data.data(), total)) failure(sh_, "peer write through the key");
  bool inv = regcore_reg_ctx_remote_inv_ok(ctx) && rnd(2);
  while (simverbs_peer_send(peer_, "ok", 3, inv ? got[0] : 0) == -EAGAIN) std::this_thread::yield();
  ibv_wc rwc = wait_recv();
  uint32_t invalidated = (rwc.wc_flags & IBV_WC_WITH_INV) ? rwc.invalidated_rkey : 0;
  std::atomic<int> released{0};
  err = regcore_reg_ctx_release(ctx, invalidated, on_released, &released);
  if (err == -EINPROGRESS) {
    for (long spins = 0; released.load() == 0 && spins < 50000000; spins++) {
      ibv_wc wc[4];
      int n = regcore_poll_cq(sh_.core, scq_, 4, wc);
      for (int i = 0; i < n; i++) {  // the partner's; ours are never ULP-visible here
        std::lock_guard<std::mutex> lock(partner_->box.mu);
        partner_->box.wcs.push_back(wc[i]);
      }
      if (n == 0) std::this_thread::yield();
    }
    if (released.load() != 1) failure(sh_, "release callback");
  } else if (err) {
    failure(sh_, "release " + std::to_string(err));
  }
  if (simverbs_peer_rdma_write(peer_, got[0], addr, data.data(), 1) == 0) failure(sh_, "key alive after release");
  size_t at = 0;
  for (unsigned i = 0; i < nv; i++) {
    if (std::memcmp(v[i].iov_base, &data[at], v[i].iov_len)) failure(sh_, iov ? "sgl data" : "reg data");
    at += v[i].iov_len;
  }
  (iov ? counts.reg_iovs : counts.regs)++;
  counts.completions += 2;
  counts.bytes_checked += total;
}

void Worker::op_get() {
  size_t off = rnd(kArena - 8192);
  regcore_mr *mr = nullptr;
  if (regcore_mr_get(sh_.core, sh_.arena.data() + off, 8192, IBV_ACCESS_LOCAL_WRITE, &mr))
    return failure(sh_, "mr get");
  auto start = reinterpret_cast<uintptr_t>(mr->addr);
  if (start > reinterpret_cast<uintptr_t>(sh_.arena.data()) + off ||
      start + mr->length < reinterpret_cast<uintptr_t>(sh_.arena.data()) + off + 8192)
    failure(sh_, "mr does not cover the range");
  if (simverbs_key_query(sh_.pd, mr->lkey, nullptr)) failure(sh_, "mr key dead while referenced");
  regcore_mr_put(sh_.core, mr);
  counts.gets++;
}

void Worker::run(unsigned ios, Worker *partner) {
  partner_ = partner;
  for (unsigned i = 0; i < ios && sh_.failures.load() == 0; i++) {
    switch (rnd(10)) {
      case 0: case 1: case 2: op_write(); break;
      case 3: case 4: op_read(); break;
      case 5: case 6: op_reg(false); break;
      case 7: op_reg(true); break;
      default: op_get(); break;
    }
  }
}

void Worker::teardown() {
  regcore_mr_put(sh_.core, recv_mr_);
  if (int err = regcore_qp_destroy(sh_.core, qp_)) failure(sh_, "qp destroy " + std::to_string(err));
  simverbs_peer_destroy(peer_);
  ibv_destroy_cq(rcq_);
}

struct Chaos {
  uint64_t unmapped = 0, invalidations = 0, qp_cycles = 0, stats_reads = 0;
};

// Memory events and QP churn while the workers run.
void chaos(Shared &sh, Chaos &c, unsigned seed) {
  std::mt19937_64 rng(seed);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ibv_cq *cq = ibv_create_cq(sh.ctx, 64, nullptr, nullptr, 0);
  while (!sh.done.load()) {
    void *p = mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memset(p, 1, 16 * page);
    regcore_mr *mr = nullptr;
    if (regcore_mr_get(sh.core, p, 16 * page, IBV_ACCESS_LOCAL_WRITE, &mr) == 0) regcore_mr_put(sh.core, mr);
    munmap(p, 16 * page);
    c.unmapped++;
    if (rng() % 4 == 0) {
      size_t off = rng() % (kArena - 64 * 1024);
      regcore_mr_invalidate_range(sh.core, sh.arena.data() + off, 64 * 1024);
      c.invalidations++;
    }
    if (rng() % 16 == 0) {
      ibv_qp_init_attr a{};
      a.send_cq = a.recv_cq = cq;
      a.qp_type = IBV_QPT_RC;
      a.cap.max_send_wr = 1;
      a.cap.max_recv_wr = 1;
      a.cap.max_send_sge = a.cap.max_recv_sge = 1;
      ibv_qp *qp = nullptr;
      if (regcore_qp_create(sh.core, &a, 1, &qp) == 0 && regcore_qp_destroy(sh.core, qp) == 0) c.qp_cycles++;
      else failure(sh, "chaos qp");
    }
    regcore_stats st;
    regcore_get_stats(sh.core, &st);
    c.stats_reads++;
  }
  ibv_destroy_cq(cq);
}

}  // namespace

int main(int argc, char **argv) {
  Config cfg;
  for (int i = 1; i < argc; i++) {
    if (!std::strncmp(argv[i], "--threads=", 10)) cfg.threads = static_cast<unsigned>(std::atoi(argv[i] + 10));
    else if (!std::strncmp(argv[i], "--ios=", 6)) cfg.ios = static_cast<unsigned>(std::atoi(argv[i] + 6));
    else if (!std::strncmp(argv[i], "--seed=", 7)) cfg.seed = static_cast<unsigned>(std::atoi(argv[i] + 7));
    else if (!std::strncmp(argv[i], "--profile=", 10)) {
      int p = simverbs_profile_from_name(argv[i] + 10);
      if (p < 0) return 2;
      cfg.profile = static_cast<simverbs_profile>(p);
    } else {
      std::fprintf(stderr, "usage: %s [--threads=N] [--ios=N] [--profile=NAME] [--seed=N]\n", argv[0]);
      return 2;
    }
  }
  if (cfg.threads < 2 || cfg.threads % 2) return std::fprintf(stderr, "--threads: an even number >= 2\n"), 2;
  Shared sh;
  sh.ctx = testenv::open_device(cfg.profile);
  sh.pd = ibv_alloc_pd(sh.ctx);
  regcore_attr attr{};
  attr.max_ctxs = cfg.threads * kDepthCtxs + 1;
  if (int err = regcore_open(sh.pd, &attr, &sh.core)) testenv::die("open " + std::to_string(err));
  for (size_t i = 0; i < kArena; i++) sh.arena[i] = static_cast<uint8_t>(i * 7 + 1);
  const char *why = nullptr;
  int mon = regcore_monitor_state(sh.core, &why);
  std::printf("threads=%u profile=%s ios=%u monitor=%s\n", cfg.threads, simverbs_profile_name(cfg.profile),
              cfg.ios, mon == REGCORE_MONITOR_USERFAULTFD ? "userfaultfd" : "none");

  std::vector<ibv_cq *> cqs;
  std::vector<std::unique_ptr<Worker>> workers;
  for (unsigned t = 0; t < cfg.threads; t++) {
    if (t % 2 == 0) cqs.push_back(ibv_create_cq(sh.ctx, 512, nullptr, nullptr, 0));
    workers.push_back(std::make_unique<Worker>(sh, t, cqs.back(), cfg.seed * 1000 + t));
    workers.back()->setup();
  }
  Chaos c;
  std::thread chaos_thread(chaos, std::ref(sh), std::ref(c), cfg.seed);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < cfg.threads; t++)
    threads.emplace_back([&, t] { workers[t]->run(cfg.ios, workers[t ^ 1].get()); });
  for (std::thread &t : threads) t.join();
  sh.done = true;
  chaos_thread.join();

  Counts sum;
  for (auto &w : workers) {
    sum.writes += w->counts.writes;
    sum.reads += w->counts.reads;
    sum.regs += w->counts.regs;
    sum.reg_iovs += w->counts.reg_iovs;
    sum.gets += w->counts.gets;
    sum.completions += w->counts.completions;
    sum.bytes_checked += w->counts.bytes_checked;
    w->teardown();
  }
  uint64_t ops = sum.writes + sum.reads + sum.regs + sum.reg_iovs + sum.gets;
  std::printf("ops write=%llu read=%llu reg=%llu reg_iov=%llu get=%llu\n", (unsigned long long)sum.writes,
              (unsigned long long)sum.reads, (unsigned long long)sum.regs, (unsigned long long)sum.reg_iovs,
              (unsigned long long)sum.gets);
  std::printf("chaos unmapped=%llu invalidations=%llu qp_cycles=%llu stats_reads=%llu\n",
              (unsigned long long)c.unmapped, (unsigned long long)c.invalidations, (unsigned long long)c.qp_cycles,
              (unsigned long long)c.stats_reads);
  regcore_stats st;
  regcore_get_stats(sh.core, &st);
  bool all_ops = ops == static_cast<uint64_t>(cfg.ios) * cfg.threads;
  std::printf("check all-operations: %s (%llu of %u)\n", all_ops ? "ok" : "FAILED", (unsigned long long)ops,
              cfg.ios * cfg.threads);
  std::printf("check data: %s (%llu bytes)\n", sh.failures ? "FAILED" : "ok", (unsigned long long)sum.bytes_checked);
  bool leak_free = st.ctxs_in_use == 0 && st.mrs_in_use == 0;
  std::printf("check no-leak: %s (ctxs_in_use=%u mrs_in_use=%u)\n", leak_free ? "ok" : "FAILED", st.ctxs_in_use,
              st.mrs_in_use);
  int close_err = regcore_close(sh.core);
  std::printf("check close: %s\n", close_err ? regcore_last_error() : "ok");
  for (ibv_cq *cq : cqs) ibv_destroy_cq(cq);
  ibv_dealloc_pd(sh.pd);
  ibv_close_device(sh.ctx);
  bool ok = all_ops && !sh.failures && leak_free && !close_err;
  std::printf("RESULT %s failures=%llu\n", ok ? "ok" : "FAILED", (unsigned long long)sh.failures.load());
  return ok ? 0 : 1;
}
