// simverbs internals: object model shared by device.cpp and engine.cpp.
// All state lives behind one global mutex; functions named *_locked expect
// it to be held.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "simverbs/simverbs.h"

namespace simverbs {

// Device limits and quirks of one profile.
struct Profile {
  const char *name;
  const char *dev_name;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  ibv_transport_type transport;
  ibv_node_type node_type;
  uint8_t link_layer;
  int max_qp_wr;
  int max_sge;
  int max_sge_rd;
  int max_cqe;
  int max_mw;
  unsigned cap_flags;
  bool mlx5dv;                 // mlx5dv_* entry points work on this device
  uint16_t max_mkey_entries;   // indirect mkey entries
  bool read_sink_needs_remote_write;  // iWARP: READ responses are tagged writes
  uint32_t max_inline_data;
};

const Profile &profile(enum simverbs_profile p);

struct SimPd;
struct SimQp;

// The verbs object handed out, followed by a pointer to its owner. Box is
// standard-layout, so a pointer to `ibv` converts back to the Box.
template <typename Ibv, typename Owner>
struct Box {
  Ibv ibv;
  Owner *self;
};
template <typename Owner, typename Ibv>
Owner *owner_of(Ibv *p) {
  return p ? reinterpret_cast<Box<Ibv, Owner> *>(p)->self : nullptr;
}

enum class KeyKind : uint8_t { kNone, kMr, kMw, kMkey };

// Result of a key check, mapped to wc status or a peer errno.
enum class AccessErr { kOk, kNoKey, kRights, kBounds, kPd, kQp };

struct SimMr {
  Box<ibv_mr, SimMr> box{};
  SimPd *pd = nullptr;
  unsigned access = 0;
  uint32_t index = 0;
  int bound_mws = 0;
  // Pinning (pin.cpp): pages the process unmapped or dropped while the MR
  // held them, by page address, with the content they had then. The device
  // keeps using these; the process never sees them again. Guarded by
  // Sim::pin_mu; `detached_any` lets accesses skip the lock when empty.
  std::map<uint64_t, std::vector<uint8_t>> detached;
  std::atomic<bool> detached_any{false};
};

struct SimMw {
  Box<ibv_mw, SimMw> box{};
  SimPd *pd = nullptr;
  uint32_t index = 0;
  bool bound = false;
  SimMr *mr = nullptr;
  uint64_t addr = 0, length = 0;
  unsigned access = 0;
  SimQp *qp = nullptr;  // type 2: QP it was bound on
};

struct Segment {
  uint64_t addr;
  uint64_t length;
  uint32_t lkey;
};

struct SimMkey {
  Box<mlx5dv_mkey, SimMkey> box{};
  SimPd *pd = nullptr;
  uint32_t index = 0;
  uint16_t max_entries = 0;
  bool remote_inv = false;
  bool configured = false;
  unsigned access = 0;
  std::vector<Segment> segs;  // zero-based layout
  uint64_t total = 0;
};

struct KeySlot {
  uint8_t tag = 0;
  KeyKind kind = KeyKind::kNone;
  void *obj = nullptr;
};

struct SimDevice {
  Box<ibv_device, SimDevice> box{};
  enum simverbs_profile profile;
};

struct SimContext {
  Box<verbs_context, SimContext> box{};
  SimDevice *dev = nullptr;
  std::vector<SimQp *> qps;
};

struct SimPd {
  Box<ibv_pd, SimPd> box{};
  SimContext *ctx = nullptr;
  bool hidden = false;  // the peer's PD
};

struct Cqe {
  ibv_wc wc{};
  SimQp *sq_qp = nullptr;  // send completion: retire up to sq_seq
  uint64_t sq_seq = 0;
};

struct SimCq {
  Box<ibv_cq, SimCq> box{};
  SimContext *ctx = nullptr;
  std::deque<Cqe> entries;
  bool overflowed = false;
};

// Opcode of a WQE; UMR is the mlx5dv mr_list registration.
enum class Op { kWrite, kWriteImm, kRead, kSend, kSendImm, kSendInv, kLocalInv, kBindMw, kUmr };

struct Wqe {
  uint64_t seq = 0;
  uint64_t wr_id = 0;
  Op op = Op::kSend;
  bool signaled = false;
  bool executed = false;
  bool is_inline = false;
  std::vector<ibv_sge> sge;
  std::vector<uint8_t> inline_data;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm_or_inv = 0;
  // BIND_MW: the window (checked against its key slot at execution), the
  // new rkey, and the MR by key so a freed MR is detected.
  SimMw *mw = nullptr;
  uint32_t mw_index = 0;
  uint32_t new_rkey = 0;
  uint32_t bind_mr_key = 0;
  uint64_t bind_addr = 0, bind_length = 0;
  unsigned bind_access = 0;
  // UMR (mlx5dv_wr_mr_list): the mkey by key and the access to grant.
  uint32_t mkey_key = 0;
  unsigned umr_access = 0;

  // Reuses the vectors' storage: posting allocates nothing in steady state.
  void reset() {
    sge.clear();
    inline_data.clear();
    seq = wr_id = remote_addr = bind_addr = bind_length = 0;
    op = Op::kSend;
    signaled = executed = is_inline = false;
    rkey = imm_or_inv = mw_index = new_rkey = bind_mr_key = mkey_key = 0;
    bind_access = umr_access = 0;
    mw = nullptr;
  }
};

// Fixed ring of max_send_wr slots: [head, head+executed) ran and wait to be
// retired by a polled completion, [head+executed, head+count) wait to run.
struct SendQueue {
  std::vector<Wqe> ring;
  size_t head = 0, count = 0, executed = 0;
  Wqe &at(size_t i) { return ring[(head + i) % ring.size()]; }
  bool full() const { return count == ring.size(); }
  Wqe &push() {
    Wqe &w = ring[(head + count) % ring.size()];
    count++;
    return w;
  }
  void pop_retired() {
    head = (head + 1) % ring.size();
    count--;
    executed--;
  }
  bool has_pending() const { return executed < count; }
  Wqe &next_pending() { return at(executed); }
  void clear() { head = count = executed = 0; }
};

struct RecvWqe {
  uint64_t wr_id;
  std::vector<ibv_sge> sge;
};

// Something that can answer a request: a QP of this process or the peer.
struct Endpoint {
  virtual ~Endpoint() = default;
  virtual SimPd *pd() = 0;
  virtual SimQp *as_qp() { return nullptr; }
  uint32_t qpn = 0;
};

struct SimQp : Endpoint {
  Box<ibv_qp_ex, SimQp> qpx{};
  Box<mlx5dv_qp_ex, SimQp> mqpx{};
  SimContext *ctx = nullptr;
  SimPd *pd_ = nullptr;
  SimCq *scq = nullptr, *rcq = nullptr;
  ibv_qp_cap cap{};
  bool sq_sig_all = false;
  bool has_qpx = false, is_mlx5dv = false;
  uint64_t send_ops = 0, dv_send_ops = 0;
  SendQueue sq;
  std::deque<RecvWqe> rq;
  Endpoint *remote = nullptr;
  uint32_t dest_qpn = 0;
  uint64_t next_seq = 1;
  std::vector<Wqe> batch;   // ibv_wr_* batch between wr_start and wr_complete
  int batch_err = 0;
  SimPd *pd() override { return pd_; }
  SimQp *as_qp() override { return this; }
};

struct Message {
  std::vector<uint8_t> data;
};

struct SimPeer : Endpoint {
  SimPd *ppd = nullptr;
  SimQp *qp = nullptr;
  std::deque<Message> inbox;
  std::vector<SimMr *> exposed;
  SimPd *pd() override { return ppd; }
};

struct Fault {
  enum simverbs_fault_kind kind;
  uint64_t at;  // absolute counter value that triggers it
  int code;
};

// The device: one instance per process.
struct Sim {
  std::mutex mu;
  bool profile_chosen = false;
  bool list_all = false;
  enum simverbs_profile active = SIMVERBS_PROFILE_MLX5;
  SimDevice devices[SIMVERBS_PROFILE_COUNT];
  std::vector<KeySlot> keys{1};  // index 0 unused: keys are never 0
  std::vector<uint32_t> free_keys;
  std::vector<Endpoint *> endpoints;  // by qpn; [0] unused
  std::vector<SimQp *> qps;           // every QP, for progress
  std::vector<Fault> faults;
  uint64_t posted_counter = 0, exec_counter = 0;
  unsigned exec_budget = 0;
  bool flush_unsignaled = true;
  simverbs_stats stats{};
  std::string last_error;
  // Registration cost model, applied outside `mu`.
  std::atomic<uint32_t> reg_ns{0}, reg_ns_per_page{0}, dereg_ns{0}, dereg_ns_per_page{0};
  enum ibv_fork_status fork_status = IBV_FORK_UNNEEDED;
  // Live MRs of every PD by start address, for the pinning model; lock
  // order: mu before pin_mu.
  std::mutex pin_mu;
  std::multimap<uint64_t, SimMr *> pinned;
  uint64_t max_pinned_len = 0;
};

Sim &sim();

// Keys (device.cpp)
uint32_t key_alloc_locked(KeyKind kind, void *obj);
void key_free_locked(uint32_t index);
KeySlot *key_lookup_locked(uint32_t key);
uint32_t key_make(uint32_t index, uint8_t tag);
inline uint32_t key_index(uint32_t key) { return key >> 8; }

// Conversions from the verbs objects (device.cpp)
inline SimPd *pd_of(ibv_pd *pd) { return owner_of<SimPd>(pd); }
inline SimCq *cq_of(ibv_cq *cq) { return owner_of<SimCq>(cq); }
inline SimMr *mr_of(ibv_mr *mr) { return owner_of<SimMr>(mr); }
inline SimMw *mw_of(ibv_mw *mw) { return owner_of<SimMw>(mw); }
inline SimQp *qp_of(ibv_qp *qp) {
  return qp ? owner_of<SimQp>(reinterpret_cast<ibv_qp_ex *>(qp)) : nullptr;
}
SimContext *ctx_of(ibv_context *ctx);
const Profile &profile_of(const SimContext *ctx);
uint32_t endpoint_register_locked(Endpoint *ep);
void endpoint_unregister_locked(uint32_t qpn);
Endpoint *endpoint_lookup_locked(uint32_t qpn);
void set_error_locked(const std::string &msg);

// Access checks (engine.cpp): translate [addr, addr+len) under `key` into
// process addresses, appending to out.
struct Span {
  uint8_t *ptr;
  uint64_t len;
};
// Pinning (pin.cpp). pin_add/pin_remove run with `mu` held.
void pin_add_locked(SimMr *mr);
void pin_remove_locked(SimMr *mr);
// Appends the device's view of [addr, addr+len) of mr: the live memory, or
// the content of detached pages. Runs with `mu` held.
void pin_spans_locked(SimMr *mr, uint64_t addr, uint64_t len, std::vector<Span> &out);
// Busy-waits `ns` nanoseconds: the modelled cost of a registration.
void spend_ns(uint64_t ns);

AccessErr resolve_locked(SimPd *pd, uint32_t key, uint64_t addr, uint64_t len, unsigned need,
                         bool remote, SimQp *via_qp, std::vector<Span> &out);
bool invalidate_key_locked(SimPd *pd, uint32_t key, bool remote, SimQp *via_qp);

// Engine entry points installed in the ops tables (engine.cpp)
int post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad);
int post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad);
int poll_cq(ibv_cq *cq, int n, ibv_wc *wc);
void install_qpx_ops(SimQp *qp);
void qp_to_error_locked(SimQp *qp);
void qp_purge_locked(SimQp *qp);
unsigned progress_locked(unsigned budget);

}  // namespace simverbs
