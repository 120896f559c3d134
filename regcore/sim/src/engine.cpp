// simverbs: posting, execution, completions, faults and the peer.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "sim_internal.hpp"

namespace simverbs {

namespace {

constexpr unsigned kRemoteRights =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

ibv_qp_state state_of(SimQp *qp) { return qp->qpx.ibv.qp_base.state; }
uint32_t qpn_of(SimQp *qp) { return qp->qpx.ibv.qp_base.qp_num; }
bool can_receive(SimQp *qp) {
  return state_of(qp) == IBV_QPS_RTR || state_of(qp) == IBV_QPS_RTS;
}

std::string hex(uint32_t v) {
  char buf[16];
  snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

// ---------------------------------------------------------------- access

bool rights_ok(unsigned have, unsigned need, bool remote) {
  if (remote) return (have & need) == need;
  // Local read is always allowed; local writes need LOCAL_WRITE, and the
  // iWARP READ-sink rule asks for REMOTE_WRITE as well.
  return (have & need) == need;
}

AccessErr resolve_mr(SimMr *mr, SimPd *pd, uint64_t addr, uint64_t len, unsigned need,
                     bool remote, std::vector<Span> &out) {
  if (mr->pd != pd) return AccessErr::kPd;
  if (!rights_ok(mr->access, need, remote)) return AccessErr::kRights;
  uint64_t start = reinterpret_cast<uintptr_t>(mr->box.ibv.addr);
  if (addr < start || len > mr->box.ibv.length || addr - start > mr->box.ibv.length - len)
    return AccessErr::kBounds;
  pin_spans_locked(mr, addr, len, out);
  return AccessErr::kOk;
}

AccessErr resolve_mw(SimMw *mw, SimPd *pd, uint64_t addr, uint64_t len, unsigned need,
                     bool remote, SimQp *via_qp, std::vector<Span> &out) {
  if (!remote) return AccessErr::kRights;  // windows grant remote access only
  if (!mw->bound) return AccessErr::kNoKey;
  if (mw->pd != pd) return AccessErr::kPd;
  if (via_qp && mw->qp != via_qp) return AccessErr::kQp;
  if (!rights_ok(mw->access, need, true)) return AccessErr::kRights;
  if (addr < mw->addr || len > mw->length || addr - mw->addr > mw->length - len)
    return AccessErr::kBounds;
  pin_spans_locked(mw->mr, addr, len, out);
  return AccessErr::kOk;
}

AccessErr resolve_mkey(SimMkey *mk, SimPd *pd, uint64_t off, uint64_t len, unsigned need,
                       bool remote, std::vector<Span> &out) {
  if (!mk->configured) return AccessErr::kNoKey;
  if (mk->pd != pd) return AccessErr::kPd;
  if (!rights_ok(mk->access, need, remote)) return AccessErr::kRights;
  if (len > mk->total || off > mk->total - len) return AccessErr::kBounds;
  // The underlying regions must still grant local access for the data.
  unsigned under = (need & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))
                       ? IBV_ACCESS_LOCAL_WRITE
                       : 0;
  uint64_t pos = 0;
  for (const Segment &seg : mk->segs) {
    if (len == 0) break;
    if (off < pos + seg.length) {
      uint64_t in = off - pos;
      uint64_t chunk = std::min(len, seg.length - in);
      AccessErr e = resolve_locked(pd, seg.lkey, seg.addr + in, chunk, under, false, nullptr, out);
      if (e != AccessErr::kOk) return e;
      off += chunk;
      len -= chunk;
    }
    pos += seg.length;
  }
  return AccessErr::kOk;
}

const char *access_err_name(AccessErr e) {
  switch (e) {
    case AccessErr::kOk: return "ok";
    case AccessErr::kNoKey: return "invalid key";
    case AccessErr::kRights: return "insufficient rights";
    case AccessErr::kBounds: return "out of bounds";
    case AccessErr::kPd: return "key of another protection domain";
    case AccessErr::kQp: return "window bound on another QP";
  }
  return "?";
}

int access_errno(AccessErr e) {
  switch (e) {
    case AccessErr::kOk: return 0;
    case AccessErr::kNoKey: return -ENOKEY;
    case AccessErr::kRights: return -EACCES;
    case AccessErr::kBounds: return -ERANGE;
    case AccessErr::kPd:
    case AccessErr::kQp: return -EPERM;
  }
  return -EIO;
}

size_t total_len(const std::vector<Span> &spans) {
  size_t n = 0;
  for (const Span &s : spans) n += s.len;
  return n;
}

// Copies min(total(dst), total(src)) bytes span to span.
void copy_spans(const std::vector<Span> &dst, const std::vector<Span> &src) {
  size_t di = 0, si = 0, doff = 0, soff = 0;
  while (di < dst.size() && si < src.size()) {
    size_t n = std::min(dst[di].len - doff, src[si].len - soff);
    memmove(dst[di].ptr + doff, src[si].ptr + soff, n);
    doff += n;
    soff += n;
    if (doff == dst[di].len) di++, doff = 0;
    if (soff == src[si].len) si++, soff = 0;
  }
}

// ------------------------------------------------------------ completions

ibv_wc_opcode wc_opcode(Op op) {
  switch (op) {
    case Op::kWrite:
    case Op::kWriteImm: return IBV_WC_RDMA_WRITE;
    case Op::kRead: return IBV_WC_RDMA_READ;
    case Op::kSend:
    case Op::kSendImm:
    case Op::kSendInv: return IBV_WC_SEND;
    case Op::kLocalInv: return IBV_WC_LOCAL_INV;
    case Op::kBindMw: return IBV_WC_BIND_MW;
    case Op::kUmr: return static_cast<ibv_wc_opcode>(MLX5DV_WC_UMR);
  }
  return IBV_WC_SEND;
}

void push_cqe_locked(SimCq *cq, const Cqe &c) {
  Sim &s = sim();
  if (cq->overflowed) return;  // a CQ in error reports nothing more
  if (cq->entries.size() >= static_cast<size_t>(cq->box.ibv.cqe)) {
    cq->overflowed = true;
    s.stats.cq_overflows++;
    set_error_locked("CQ overrun: " + std::to_string(cq->box.ibv.cqe) + " entries");
    for (SimQp *qp : s.qps)
      if (qp->scq == cq || qp->rcq == cq) qp_to_error_locked(qp);
    return;
  }
  cq->entries.push_back(c);
  s.stats.completions++;
}

void complete_send_locked(SimQp *qp, Wqe &w, ibv_wc_status st, uint32_t byte_len) {
  Sim &s = sim();
  if (st == IBV_WC_SUCCESS && !w.signaled) return;
  if (st == IBV_WC_WR_FLUSH_ERR && !w.signaled && !s.flush_unsignaled) return;
  Cqe c;
  c.wc.wr_id = w.wr_id;
  c.wc.status = st;
  c.wc.opcode = wc_opcode(w.op);
  c.wc.byte_len = byte_len;
  c.wc.qp_num = qpn_of(qp);
  c.sq_qp = qp;
  c.sq_seq = w.seq;
  push_cqe_locked(qp->scq, c);
}

void complete_recv_locked(SimQp *qp, uint64_t wr_id, ibv_wc_status st, uint32_t byte_len,
                          uint32_t src_qp, unsigned flags, uint32_t inv_or_imm) {
  Cqe c;
  c.wc.wr_id = wr_id;
  c.wc.status = st;
  c.wc.opcode = (flags & IBV_WC_WITH_IMM) && byte_len == 0 ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  c.wc.byte_len = byte_len;
  c.wc.qp_num = qpn_of(qp);
  c.wc.src_qp = src_qp;
  c.wc.wc_flags = flags;
  if (flags & IBV_WC_WITH_INV) c.wc.invalidated_rkey = inv_or_imm;
  if (flags & IBV_WC_WITH_IMM) c.wc.imm_data = inv_or_imm;
  push_cqe_locked(qp->rcq, c);
}

void flush_pending_locked(SimQp *qp) {
  Sim &s = sim();
  while (qp->sq.has_pending()) {
    Wqe &w = qp->sq.next_pending();
    w.executed = true;
    qp->sq.executed++;
    s.stats.flushed_wqes++;
    complete_send_locked(qp, w, IBV_WC_WR_FLUSH_ERR, 0);
  }
}

void flush_recv_locked(SimQp *qp) {
  while (!qp->rq.empty()) {
    complete_recv_locked(qp, qp->rq.front().wr_id, IBV_WC_WR_FLUSH_ERR, 0, 0, 0, 0);
    qp->rq.pop_front();
  }
}

// ------------------------------------------------------------- delivery

enum class Delivery { kOk, kRnr, kInvFailed, kRecvErr, kNotReady };

Delivery deliver_locked(Endpoint *to, const std::vector<Span> &data, bool has_inv, uint32_t inv,
                        bool has_imm, uint32_t imm, uint32_t src_qpn) {
  SimQp *rqp = to->as_qp();
  if (!rqp) {  // the peer: keep the message
    auto *peer = static_cast<SimPeer *>(to);
    if (has_inv && !invalidate_key_locked(peer->ppd, inv, true, nullptr))
      return Delivery::kInvFailed;
    Message m;
    m.data.resize(total_len(data));
    size_t off = 0;
    for (const Span &s : data) memcpy(m.data.data() + off, s.ptr, s.len), off += s.len;
    peer->inbox.push_back(std::move(m));
    return Delivery::kOk;
  }
  if (!can_receive(rqp)) return Delivery::kNotReady;
  if (rqp->rq.empty()) return Delivery::kRnr;
  if (has_inv && !invalidate_key_locked(rqp->pd_, inv, true, rqp)) return Delivery::kInvFailed;
  RecvWqe r = std::move(rqp->rq.front());
  rqp->rq.pop_front();
  std::vector<Span> sink;
  uint64_t room = 0;
  AccessErr e = AccessErr::kOk;
  for (const ibv_sge &sg : r.sge) {
    if (sg.length == 0) continue;
    e = resolve_locked(rqp->pd_, sg.lkey, sg.addr, sg.length, IBV_ACCESS_LOCAL_WRITE, false,
                       nullptr, sink);
    if (e != AccessErr::kOk) break;
    room += sg.length;
  }
  size_t len = total_len(data);
  if (e != AccessErr::kOk || len > room) {
    sim().stats.local_errors++;
    set_error_locked(e != AccessErr::kOk ? std::string("receive buffer: ") + access_err_name(e)
                                         : "receive buffer too small");
    complete_recv_locked(rqp, r.wr_id, e != AccessErr::kOk ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR,
                         0, src_qpn, 0, 0);
    qp_to_error_locked(rqp);
    return Delivery::kRecvErr;
  }
  copy_spans(sink, data);
  unsigned flags = (has_inv ? IBV_WC_WITH_INV : 0) | (has_imm ? IBV_WC_WITH_IMM : 0);
  complete_recv_locked(rqp, r.wr_id, IBV_WC_SUCCESS, static_cast<uint32_t>(len), src_qpn, flags,
                       has_inv ? inv : imm);
  return Delivery::kOk;
}

ibv_wc_status delivery_status(Delivery d) {
  switch (d) {
    case Delivery::kOk:
    case Delivery::kRnr: return IBV_WC_SUCCESS;
    case Delivery::kInvFailed: return IBV_WC_REM_INV_REQ_ERR;
    case Delivery::kRecvErr: return IBV_WC_REM_OP_ERR;
    case Delivery::kNotReady: return IBV_WC_RETRY_EXC_ERR;
  }
  return IBV_WC_GENERAL_ERR;
}

// ------------------------------------------------------------- execution

struct ExecResult {
  ibv_wc_status status = IBV_WC_SUCCESS;
  uint32_t byte_len = 0;
  bool stall = false;  // RNR: try again later
};

ExecResult fail(ibv_wc_status st, const std::string &why, bool remote) {
  Sim &s = sim();
  (remote ? s.stats.remote_access_errors : s.stats.local_errors)++;
  set_error_locked(why);
  ExecResult r;
  r.status = st;
  return r;
}

// Local SGEs (or inline data) as spans; need = rights the local keys need.
AccessErr local_spans(SimQp *qp, Wqe &w, unsigned need, std::vector<Span> &out) {
  if (w.is_inline) {
    if (!w.inline_data.empty()) out.push_back({w.inline_data.data(), w.inline_data.size()});
    return AccessErr::kOk;
  }
  for (const ibv_sge &sg : w.sge) {
    if (sg.length == 0) continue;
    AccessErr e = resolve_locked(qp->pd_, sg.lkey, sg.addr, sg.length, need, false, nullptr, out);
    if (e != AccessErr::kOk) return e;
  }
  return AccessErr::kOk;
}

ExecResult exec_write(SimQp *qp, Wqe &w) {
  std::vector<Span> src, dst;
  if (AccessErr e = local_spans(qp, w, 0, src); e != AccessErr::kOk)
    return fail(IBV_WC_LOC_PROT_ERR, std::string("RDMA WRITE source: ") + access_err_name(e), false);
  Endpoint *to = qp->remote;
  if (!to || (to->as_qp() && !can_receive(to->as_qp())))
    return fail(IBV_WC_RETRY_EXC_ERR, "RDMA WRITE: no responder", true);
  size_t len = total_len(src);
  AccessErr e = resolve_locked(to->pd(), w.rkey, w.remote_addr, len, IBV_ACCESS_REMOTE_WRITE, true,
                               to->as_qp(), dst);
  if (e != AccessErr::kOk)
    return fail(IBV_WC_REM_ACCESS_ERR,
                "RDMA WRITE to rkey " + hex(w.rkey) + ": " + access_err_name(e), true);
  copy_spans(dst, src);
  ExecResult r;
  r.byte_len = static_cast<uint32_t>(len);
  if (w.op == Op::kWriteImm) {
    Delivery d = deliver_locked(to, {}, false, 0, true, w.imm_or_inv, qpn_of(qp));
    if (d == Delivery::kRnr) r.stall = true;
    r.status = delivery_status(d);
  }
  return r;
}

ExecResult exec_read(SimQp *qp, Wqe &w) {
  std::vector<Span> src, dst;
  unsigned sink_need = IBV_ACCESS_LOCAL_WRITE;
  if (profile_of(qp->ctx).read_sink_needs_remote_write) sink_need |= IBV_ACCESS_REMOTE_WRITE;
  if (AccessErr e = local_spans(qp, w, sink_need, dst); e != AccessErr::kOk)
    return fail(IBV_WC_LOC_PROT_ERR, std::string("RDMA READ sink: ") + access_err_name(e), false);
  Endpoint *to = qp->remote;
  if (!to || (to->as_qp() && !can_receive(to->as_qp())))
    return fail(IBV_WC_RETRY_EXC_ERR, "RDMA READ: no responder", true);
  size_t len = total_len(dst);
  AccessErr e = resolve_locked(to->pd(), w.rkey, w.remote_addr, len, IBV_ACCESS_REMOTE_READ, true,
                               to->as_qp(), src);
  if (e != AccessErr::kOk)
    return fail(IBV_WC_REM_ACCESS_ERR,
                "RDMA READ from rkey " + hex(w.rkey) + ": " + access_err_name(e), true);
  copy_spans(dst, src);
  ExecResult r;
  r.byte_len = static_cast<uint32_t>(len);
  return r;
}

ExecResult exec_send(SimQp *qp, Wqe &w) {
  std::vector<Span> src;
  if (AccessErr e = local_spans(qp, w, 0, src); e != AccessErr::kOk)
    return fail(IBV_WC_LOC_PROT_ERR, std::string("SEND source: ") + access_err_name(e), false);
  if (!qp->remote) return fail(IBV_WC_RETRY_EXC_ERR, "SEND: no responder", true);
  Delivery d = deliver_locked(qp->remote, src, w.op == Op::kSendInv, w.imm_or_inv,
                              w.op == Op::kSendImm, w.imm_or_inv, qpn_of(qp));
  ExecResult r;
  if (d == Delivery::kRnr) {
    r.stall = true;
    return r;
  }
  if (d != Delivery::kOk)
    return fail(delivery_status(d), "SEND rejected by the responder", true);
  r.byte_len = static_cast<uint32_t>(total_len(src));
  return r;
}

ExecResult exec_local_inv(SimQp *qp, Wqe &w) {
  if (!invalidate_key_locked(qp->pd_, w.imm_or_inv, false, qp))
    return fail(IBV_WC_LOC_PROT_ERR, "LOCAL_INV of key " + hex(w.imm_or_inv) + ": not valid",
                false);
  return ExecResult{};
}

ExecResult exec_bind(SimQp *qp, Wqe &w) {
  Sim &s = sim();
  KeySlot &slot = s.keys[w.mw_index];
  if (slot.kind != KeyKind::kMw || slot.obj != w.mw)
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: window was freed", false);
  SimMw *mw = w.mw;
  if (mw->pd != qp->pd_) return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: window of another PD", false);
  if (mw->bound) return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: type-2 window already bound", false);
  if (key_index(w.new_rkey) != mw->index)
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: new rkey does not belong to the window", false);
  KeySlot *mslot = key_lookup_locked(w.bind_mr_key);
  if (!mslot || mslot->kind != KeyKind::kMr)
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: MR is not valid", false);
  auto *mr = static_cast<SimMr *>(mslot->obj);
  if (mr->pd != qp->pd_) return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: MR of another PD", false);
  if (!(mr->access & IBV_ACCESS_MW_BIND))
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: MR lacks IBV_ACCESS_MW_BIND", false);
  if ((w.bind_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(mr->access & IBV_ACCESS_LOCAL_WRITE))
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: remote write needs LOCAL_WRITE on the MR", false);
  uint64_t start = reinterpret_cast<uintptr_t>(mr->box.ibv.addr);
  if (w.bind_addr < start || w.bind_length > mr->box.ibv.length ||
      w.bind_addr - start > mr->box.ibv.length - w.bind_length)
    return fail(IBV_WC_MW_BIND_ERR, "BIND_MW: range outside the MR", false);
  slot.tag = static_cast<uint8_t>(w.new_rkey & 0xff);
  mw->bound = true;
  mw->mr = mr;
  mr->bound_mws++;
  mw->addr = w.bind_addr;
  mw->length = w.bind_length;
  mw->access = w.bind_access & kRemoteRights;
  mw->qp = qp;
  mw->box.ibv.rkey = w.new_rkey;
  return ExecResult{};
}

ExecResult exec_umr(SimQp *qp, Wqe &w) {
  KeySlot *slot = key_lookup_locked(w.mkey_key);
  if (!slot || slot->kind != KeyKind::kMkey)
    return fail(IBV_WC_MW_BIND_ERR, "UMR: mkey is not valid", false);
  auto *mk = static_cast<SimMkey *>(slot->obj);
  if (mk->pd != qp->pd_) return fail(IBV_WC_MW_BIND_ERR, "UMR: mkey of another PD", false);
  if (mk->configured)
    return fail(IBV_WC_MW_BIND_ERR, "UMR: mkey still configured (LOCAL_INV it first)", false);
  if (w.sge.size() > mk->max_entries)
    return fail(IBV_WC_MW_BIND_ERR, "UMR: more entries than the mkey holds", false);
  unsigned under = (w.umr_access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))
                       ? IBV_ACCESS_LOCAL_WRITE
                       : 0;
  std::vector<Span> probe;
  mk->segs.clear();
  mk->total = 0;
  for (const ibv_sge &sg : w.sge) {
    AccessErr e = resolve_locked(qp->pd_, sg.lkey, sg.addr, sg.length, under, false, nullptr, probe);
    if (e != AccessErr::kOk)
      return fail(IBV_WC_MW_BIND_ERR, std::string("UMR entry: ") + access_err_name(e), false);
    mk->segs.push_back({sg.addr, sg.length, sg.lkey});
    mk->total += sg.length;
  }
  mk->access = w.umr_access;
  mk->configured = true;
  return ExecResult{};
}

ExecResult exec_wqe_locked(SimQp *qp, Wqe &w) {
  switch (w.op) {
    case Op::kWrite:
    case Op::kWriteImm: return exec_write(qp, w);
    case Op::kRead: return exec_read(qp, w);
    case Op::kSend:
    case Op::kSendImm:
    case Op::kSendInv: return exec_send(qp, w);
    case Op::kLocalInv: return exec_local_inv(qp, w);
    case Op::kBindMw: return exec_bind(qp, w);
    case Op::kUmr: return exec_umr(qp, w);
  }
  return fail(IBV_WC_LOC_QP_OP_ERR, "unknown opcode", false);
}

// Returns the fault that fires at counter value `now`, if any.
bool take_fault_locked(enum simverbs_fault_kind kind, uint64_t now, int *code) {
  Sim &s = sim();
  for (size_t i = 0; i < s.faults.size(); i++) {
    if (s.faults[i].kind == kind && s.faults[i].at == now) {
      *code = s.faults[i].code;
      s.faults.erase(s.faults.begin() + static_cast<long>(i));
      return true;
    }
  }
  return false;
}

bool has_exec_faults(const Sim &s) {
  for (const Fault &f : s.faults)
    if (f.kind != SIMVERBS_FAULT_POST_FAIL) return true;
  return false;
}

void mark_executed(SimQp *qp, Wqe &w) {
  w.executed = true;
  qp->sq.executed++;
  sim().stats.executed_wqes++;
}

// Runs pending WQEs of one QP in order; stops at RNR or an error.
unsigned progress_qp_locked(SimQp *qp, unsigned budget) {
  Sim &s = sim();
  unsigned n = 0;
  while (qp->sq.has_pending() && (budget == 0 || n < budget)) {
    if (state_of(qp) == IBV_QPS_ERR) {
      flush_pending_locked(qp);
      break;
    }
    Wqe &w = qp->sq.next_pending();
    uint64_t step = s.exec_counter + 1;
    int code = 0;
    if (has_exec_faults(s) && take_fault_locked(SIMVERBS_FAULT_QP_ERROR, step, &code)) {
      s.exec_counter = step;
      s.stats.injected_qp_errors++;
      set_error_locked("injected: QP " + std::to_string(qpn_of(qp)) + " to error");
      qp_to_error_locked(qp);
      n++;
      break;
    }
    if (has_exec_faults(s) && take_fault_locked(SIMVERBS_FAULT_ERROR_CQE, step, &code)) {
      s.exec_counter = step;
      s.stats.injected_error_cqes++;
      set_error_locked("injected: error completion");
      mark_executed(qp, w);
      complete_send_locked(qp, w, static_cast<ibv_wc_status>(code), 0);
      qp_to_error_locked(qp);
      n++;
      break;
    }
    ExecResult r = exec_wqe_locked(qp, w);
    if (r.stall) break;
    s.exec_counter = step;
    mark_executed(qp, w);
    n++;
    complete_send_locked(qp, w, r.status, r.byte_len);
    if (r.status != IBV_WC_SUCCESS) {
      qp_to_error_locked(qp);
      break;
    }
  }
  return n;
}

void retire_locked(SimQp *qp, uint64_t seq) {
  while (qp->sq.count > 0 && qp->sq.executed > 0 && qp->sq.at(0).seq <= seq) qp->sq.pop_retired();
}

// ---------------------------------------------------------------- posting

int check_post_fault_locked() {
  Sim &s = sim();
  uint64_t now = ++s.posted_counter;
  int code = 0;
  if (!s.faults.empty() && take_fault_locked(SIMVERBS_FAULT_POST_FAIL, now, &code)) {
    s.stats.injected_post_failures++;
    set_error_locked("injected: post failure");
    return code;
  }
  return 0;
}

int post_state_error(SimQp *qp) {
  ibv_qp_state st = state_of(qp);
  return (st == IBV_QPS_RTS || st == IBV_QPS_ERR) ? 0 : EINVAL;
}

unsigned max_sge_for(SimQp *qp, Op op) {
  unsigned m = qp->cap.max_send_sge;
  if (op == Op::kRead) m = std::min<unsigned>(m, static_cast<unsigned>(profile_of(qp->ctx).max_sge_rd));
  return m;
}

int validate_locked(SimQp *qp, const Wqe &w) {
  const Profile &p = profile_of(qp->ctx);
  bool mem_mgt = p.cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS;
  if ((w.op == Op::kLocalInv || w.op == Op::kSendInv) && !mem_mgt) {
    set_error_locked("LOCAL_INV/SEND_WITH_INV not supported by the device");
    return EINVAL;
  }
  if (w.op == Op::kBindMw && !(p.cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B)) {
    set_error_locked("BIND_MW not supported by the device");
    return EINVAL;
  }
  if (w.op != Op::kUmr && !w.is_inline && w.sge.size() > max_sge_for(qp, w.op)) {
    set_error_locked("too many SGEs (" + std::to_string(w.sge.size()) + " > " +
                     std::to_string(max_sge_for(qp, w.op)) + ")");
    return EINVAL;
  }
  if (w.is_inline && w.inline_data.size() > qp->cap.max_inline_data) {
    set_error_locked("inline data larger than max_inline_data");
    return EINVAL;
  }
  return 0;
}

bool op_from_wr(ibv_wr_opcode opcode, Op *op) {
  switch (opcode) {
    case IBV_WR_RDMA_WRITE: *op = Op::kWrite; return true;
    case IBV_WR_RDMA_WRITE_WITH_IMM: *op = Op::kWriteImm; return true;
    case IBV_WR_SEND: *op = Op::kSend; return true;
    case IBV_WR_SEND_WITH_IMM: *op = Op::kSendImm; return true;
    case IBV_WR_RDMA_READ: *op = Op::kRead; return true;
    case IBV_WR_LOCAL_INV: *op = Op::kLocalInv; return true;
    case IBV_WR_BIND_MW: *op = Op::kBindMw; return true;
    case IBV_WR_SEND_WITH_INV: *op = Op::kSendInv; return true;
    default: return false;
  }
}

void copy_inline(Wqe &w, const ibv_sge *sg, int n) {
  for (int i = 0; i < n; i++) {
    auto *p = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(sg[i].addr));
    w.inline_data.insert(w.inline_data.end(), p, p + sg[i].length);
  }
}

void fill_bind(Wqe &w, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info &info) {
  w.mw = mw_of(mw);
  w.mw_index = w.mw ? w.mw->index : 0;
  w.new_rkey = rkey;
  w.bind_mr_key = info.mr ? info.mr->lkey : 0;
  w.bind_addr = info.addr;
  w.bind_length = info.length;
  w.bind_access = info.mw_access_flags;
}

int build_from_wr(SimQp *qp, const ibv_send_wr *wr, Wqe &w) {
  w.reset();
  if (!op_from_wr(wr->opcode, &w.op) || wr->num_sge < 0) {
    set_error_locked("unsupported opcode or negative num_sge");
    return EINVAL;
  }
  w.wr_id = wr->wr_id;
  w.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
  w.is_inline = (wr->send_flags & IBV_SEND_INLINE) &&
                (w.op == Op::kSend || w.op == Op::kSendImm || w.op == Op::kSendInv ||
                 w.op == Op::kWrite || w.op == Op::kWriteImm);
  if (w.is_inline)
    copy_inline(w, wr->sg_list, wr->num_sge);
  else if (wr->num_sge > 0)
    w.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
  w.imm_or_inv = wr->imm_data;  // union with invalidate_rkey
  if (w.op == Op::kWrite || w.op == Op::kWriteImm || w.op == Op::kRead) {
    w.remote_addr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
  }
  if (w.op == Op::kBindMw) {
    if (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2) {
      set_error_locked("BIND_MW WR needs a type-2 window");
      return EINVAL;
    }
    fill_bind(w, wr->bind_mw.mw, wr->bind_mw.rkey, wr->bind_mw.bind_info);
  }
  return validate_locked(qp, w);
}

Wqe &push_wqe_locked(SimQp *qp, const Wqe &w) {
  Sim &s = sim();
  Wqe &slot = qp->sq.push();
  slot.reset();
  slot = w;
  slot.seq = qp->next_seq++;
  slot.executed = false;
  s.stats.posted_wrs++;
  s.stats.max_sq_depth_seen = std::max<uint64_t>(s.stats.max_sq_depth_seen, qp->sq.count);
  return slot;
}

int sq_full_error_locked(SimQp *qp) {
  Sim &s = sim();
  s.stats.post_enomem++;
  set_error_locked("send queue full: " + std::to_string(qp->sq.count) + " WQEs outstanding, max_send_wr " +
                   std::to_string(qp->cap.max_send_wr));
  return ENOMEM;
}

// ---------------------------------------------------- ibv_qp_ex builders

SimQp *qpx_owner(ibv_qp_ex *qx) { return owner_of<SimQp>(qx); }

Wqe *batch_add(ibv_qp_ex *qx, Op op, uint64_t flag) {
  SimQp *qp = qpx_owner(qx);
  if (!(qp->send_ops & flag)) {
    qp->batch_err = EOPNOTSUPP;
    return nullptr;
  }
  qp->batch.emplace_back();
  Wqe &w = qp->batch.back();
  w.op = op;
  w.wr_id = qx->wr_id;
  w.signaled = qp->sq_sig_all || (qx->wr_flags & IBV_SEND_SIGNALED);
  w.is_inline = qx->wr_flags & IBV_SEND_INLINE;
  return &w;
}

Wqe *batch_last(ibv_qp_ex *qx) {
  SimQp *qp = qpx_owner(qx);
  return qp->batch.empty() ? nullptr : &qp->batch.back();
}

void wr_start(ibv_qp_ex *qx) {
  SimQp *qp = qpx_owner(qx);
  qp->batch.clear();
  qp->batch_err = 0;
}

void wr_abort(ibv_qp_ex *qx) { qpx_owner(qx)->batch.clear(); }

int wr_complete(ibv_qp_ex *qx) {
  SimQp *qp = qpx_owner(qx);
  std::lock_guard<std::mutex> lock(sim().mu);
  Sim &s = sim();
  int err = qp->batch_err ? qp->batch_err : post_state_error(qp);
  for (size_t i = 0; !err && i < qp->batch.size(); i++) {
    Wqe &w = qp->batch[i];
    if (w.is_inline && w.op != Op::kUmr) copy_inline(w, w.sge.data(), static_cast<int>(w.sge.size())), w.sge.clear();
    err = validate_locked(qp, w);
    if (err) s.stats.post_einval++;
  }
  if (!err && qp->sq.count + qp->batch.size() > qp->sq.ring.size()) err = sq_full_error_locked(qp);
  for (size_t i = 0; !err && i < qp->batch.size(); i++) err = check_post_fault_locked();
  if (!err) {
    for (const Wqe &w : qp->batch) push_wqe_locked(qp, w);
    if (state_of(qp) == IBV_QPS_ERR) flush_pending_locked(qp);
  }
  qp->batch.clear();
  return err;
}

void wr_rdma_write(ibv_qp_ex *qx, uint32_t rkey, uint64_t addr) {
  if (Wqe *w = batch_add(qx, Op::kWrite, IBV_QP_EX_WITH_RDMA_WRITE)) w->rkey = rkey, w->remote_addr = addr;
}
void wr_rdma_write_imm(ibv_qp_ex *qx, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (Wqe *w = batch_add(qx, Op::kWriteImm, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM))
    w->rkey = rkey, w->remote_addr = addr, w->imm_or_inv = imm;
}
void wr_rdma_read(ibv_qp_ex *qx, uint32_t rkey, uint64_t addr) {
  if (Wqe *w = batch_add(qx, Op::kRead, IBV_QP_EX_WITH_RDMA_READ)) w->rkey = rkey, w->remote_addr = addr;
}
void wr_send(ibv_qp_ex *qx) { batch_add(qx, Op::kSend, IBV_QP_EX_WITH_SEND); }
void wr_send_imm(ibv_qp_ex *qx, __be32 imm) {
  if (Wqe *w = batch_add(qx, Op::kSendImm, IBV_QP_EX_WITH_SEND_WITH_IMM)) w->imm_or_inv = imm;
}
void wr_send_inv(ibv_qp_ex *qx, uint32_t rkey) {
  if (Wqe *w = batch_add(qx, Op::kSendInv, IBV_QP_EX_WITH_SEND_WITH_INV)) w->imm_or_inv = rkey;
}
void wr_local_inv(ibv_qp_ex *qx, uint32_t rkey) {
  if (Wqe *w = batch_add(qx, Op::kLocalInv, IBV_QP_EX_WITH_LOCAL_INV)) w->imm_or_inv = rkey;
}
void wr_bind_mw(ibv_qp_ex *qx, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *info) {
  if (Wqe *w = batch_add(qx, Op::kBindMw, IBV_QP_EX_WITH_BIND_MW)) fill_bind(*w, mw, rkey, *info);
}
void wr_set_sge(ibv_qp_ex *qx, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (Wqe *w = batch_last(qx)) w->sge.assign(1, ibv_sge{addr, length, lkey});
}
void wr_set_sge_list(ibv_qp_ex *qx, size_t n, const ibv_sge *list) {
  if (Wqe *w = batch_last(qx)) w->sge.assign(list, list + n);
}
void wr_set_inline_data(ibv_qp_ex *qx, void *addr, size_t length) {
  if (Wqe *w = batch_last(qx)) {
    w->is_inline = true;
    w->sge.clear();
    auto *p = static_cast<uint8_t *>(addr);
    w->inline_data.assign(p, p + length);
  }
}
void wr_set_inline_data_list(ibv_qp_ex *qx, size_t n, const ibv_data_buf *bufs) {
  if (Wqe *w = batch_last(qx)) {
    w->is_inline = true;
    w->sge.clear();
    w->inline_data.clear();
    for (size_t i = 0; i < n; i++) {
      auto *p = static_cast<uint8_t *>(bufs[i].addr);
      w->inline_data.insert(w->inline_data.end(), p, p + bufs[i].length);
    }
  }
}

void unsupported_atomic(ibv_qp_ex *qx, uint32_t, uint64_t, uint64_t, uint64_t) {
  qpx_owner(qx)->batch_err = EOPNOTSUPP;
}
void unsupported_fetch_add(ibv_qp_ex *qx, uint32_t, uint64_t, uint64_t) {
  qpx_owner(qx)->batch_err = EOPNOTSUPP;
}

// mlx5dv_wr_mr_list: an indirect mkey over an SGE list (zero based).
void dv_wr_mr_list(mlx5dv_qp_ex *mqx, mlx5dv_mkey *mkey, uint32_t access, uint16_t n, ibv_sge *sge) {
  SimQp *qp = owner_of<SimQp>(mqx);
  ibv_qp_ex *qx = &qp->qpx.ibv;
  if (!(qp->dv_send_ops & MLX5DV_QP_EX_WITH_MR_LIST)) {
    qp->batch_err = EOPNOTSUPP;
    return;
  }
  // mlx5 needs IBV_SEND_INLINE, and a WQE big enough for > 4 entries.
  if (!(qx->wr_flags & IBV_SEND_INLINE) || (n > 4 && n * 16u > qp->cap.max_inline_data)) {
    qp->batch_err = EINVAL;
    return;
  }
  qp->batch.emplace_back();
  Wqe &w = qp->batch.back();
  w.op = Op::kUmr;
  w.wr_id = qx->wr_id;
  w.signaled = qp->sq_sig_all || (qx->wr_flags & IBV_SEND_SIGNALED);
  w.mkey_key = mkey->lkey;
  w.umr_access = access;
  w.sge.assign(sge, sge + n);
}

}  // namespace

void install_qpx_ops(SimQp *qp) {
  ibv_qp_ex &x = qp->qpx.ibv;
  x.wr_atomic_cmp_swp = unsupported_atomic;
  x.wr_atomic_fetch_add = unsupported_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  qp->mqpx.ibv.wr_mr_list = dv_wr_mr_list;
}

// ---------------------------------------------------------- shared helpers

AccessErr resolve_locked(SimPd *pd, uint32_t key, uint64_t addr, uint64_t len, unsigned need,
                         bool remote, SimQp *via_qp, std::vector<Span> &out) {
  KeySlot *slot = key_lookup_locked(key);
  if (!slot) return AccessErr::kNoKey;
  switch (slot->kind) {
    case KeyKind::kMr:
      return resolve_mr(static_cast<SimMr *>(slot->obj), pd, addr, len, need, remote, out);
    case KeyKind::kMw:
      return resolve_mw(static_cast<SimMw *>(slot->obj), pd, addr, len, need, remote, via_qp, out);
    case KeyKind::kMkey:
      return resolve_mkey(static_cast<SimMkey *>(slot->obj), pd, addr, len, need, remote, out);
    default:
      return AccessErr::kNoKey;
  }
}

bool invalidate_key_locked(SimPd *pd, uint32_t key, bool remote, SimQp *via_qp) {
  KeySlot *slot = key_lookup_locked(key);
  if (!slot) return false;
  if (slot->kind == KeyKind::kMw) {
    auto *mw = static_cast<SimMw *>(slot->obj);
    if (!mw->bound || mw->pd != pd || (remote && via_qp && mw->qp != via_qp)) return false;
    mw->bound = false;
    mw->mr->bound_mws--;
    mw->mr = nullptr;
    return true;
  }
  if (slot->kind == KeyKind::kMkey) {
    auto *mk = static_cast<SimMkey *>(slot->obj);
    if (!mk->configured || mk->pd != pd || (remote && !mk->remote_inv)) return false;
    mk->configured = false;
    mk->segs.clear();
    mk->total = 0;
    return true;
  }
  return false;  // memory regions from ibv_reg_mr cannot be invalidated
}

void qp_to_error_locked(SimQp *qp) {
  if (state_of(qp) == IBV_QPS_ERR) return;
  qp->qpx.ibv.qp_base.state = IBV_QPS_ERR;
  flush_pending_locked(qp);
  flush_recv_locked(qp);
}

void qp_purge_locked(SimQp *qp) {
  uint32_t qpn = qpn_of(qp);
  for (SimCq *cq : {qp->scq, qp->rcq}) {
    auto &e = cq->entries;
    e.erase(std::remove_if(e.begin(), e.end(),
                           [&](const Cqe &c) { return c.sq_qp == qp || c.wc.qp_num == qpn; }),
            e.end());
  }
}

unsigned progress_locked(unsigned budget) {
  Sim &s = sim();
  unsigned total = 0;
  // Index loop: execution may move other QPs to error but never adds QPs.
  for (size_t i = 0; i < s.qps.size(); i++) {
    unsigned left = budget == 0 ? 0 : budget - total;
    if (budget != 0 && left == 0) break;
    total += progress_qp_locked(s.qps[i], left);
  }
  return total;
}

int post_send(ibv_qp *ibv, ibv_send_wr *wr, ibv_send_wr **bad) {
  SimQp *qp = qp_of(ibv);
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  if (int err = post_state_error(qp)) {
    s.stats.post_einval++;
    set_error_locked("post_send: QP not in RTS");
    *bad = wr;
    return err;
  }
  static thread_local Wqe scratch;
  for (; wr; wr = wr->next) {
    int err = build_from_wr(qp, wr, scratch);
    if (err) s.stats.post_einval++;
    if (!err && qp->sq.full()) err = sq_full_error_locked(qp);
    if (!err) err = check_post_fault_locked();
    if (err) {
      *bad = wr;
      if (state_of(qp) == IBV_QPS_ERR) flush_pending_locked(qp);
      return err;
    }
    push_wqe_locked(qp, scratch);
  }
  if (state_of(qp) == IBV_QPS_ERR) flush_pending_locked(qp);
  return 0;
}

int post_recv(ibv_qp *ibv, ibv_recv_wr *wr, ibv_recv_wr **bad) {
  SimQp *qp = qp_of(ibv);
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  for (; wr; wr = wr->next) {
    if (state_of(qp) == IBV_QPS_RESET || wr->num_sge < 0 ||
        static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) {
      s.stats.post_einval++;
      *bad = wr;
      return EINVAL;
    }
    if (qp->rq.size() >= qp->cap.max_recv_wr) {
      s.stats.post_enomem++;
      set_error_locked("receive queue full");
      *bad = wr;
      return ENOMEM;
    }
    RecvWqe r{wr->wr_id, {}};
    if (wr->num_sge > 0) r.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    qp->rq.push_back(std::move(r));
  }
  if (state_of(qp) == IBV_QPS_ERR) flush_recv_locked(qp);
  return 0;
}

int poll_cq(ibv_cq *ibv, int n, ibv_wc *wc) {
  SimCq *cq = cq_of(ibv);
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  progress_locked(s.exec_budget);
  int got = 0;
  while (got < n && !cq->entries.empty()) {
    Cqe &c = cq->entries.front();
    wc[got++] = c.wc;
    if (c.sq_qp) retire_locked(c.sq_qp, c.sq_seq);
    cq->entries.pop_front();
  }
  return got;
}

}  // namespace simverbs

using namespace simverbs;

extern "C" {

void simverbs_set_exec_budget(unsigned wqes) {
  std::lock_guard<std::mutex> lock(sim().mu);
  sim().exec_budget = wqes;
}

void simverbs_set_flush_unsignaled(int on) {
  std::lock_guard<std::mutex> lock(sim().mu);
  sim().flush_unsignaled = on != 0;
}

int simverbs_progress(struct ibv_context *, unsigned budget) {
  std::lock_guard<std::mutex> lock(sim().mu);
  return static_cast<int>(progress_locked(budget));
}

int simverbs_fault_inject(enum simverbs_fault_kind kind, uint64_t after, int code) {
  if (after == 0 || kind < SIMVERBS_FAULT_POST_FAIL || kind > SIMVERBS_FAULT_QP_ERROR) return -EINVAL;
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  uint64_t base = kind == SIMVERBS_FAULT_POST_FAIL ? s.posted_counter : s.exec_counter;
  s.faults.push_back({kind, base + after, code});
  return 0;
}

void simverbs_fault_clear(void) {
  std::lock_guard<std::mutex> lock(sim().mu);
  sim().faults.clear();
}

int simverbs_qp_connect(struct ibv_qp *qp, uint32_t dest_qp_num) {
  ibv_qp_attr a{};
  if (qp->state != IBV_QPS_RESET) {
    a.qp_state = IBV_QPS_RESET;
    if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return -err;
  }
  a = {};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return -err;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = dest_qp_num;
  a.path_mtu = IBV_MTU_4096;
  if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_PATH_MTU)) return -err;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  if (int err = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return -err;
  return 0;
}

unsigned simverbs_qp_sq_outstanding(struct ibv_qp *ibv) {
  std::lock_guard<std::mutex> lock(sim().mu);
  return static_cast<unsigned>(qp_of(ibv)->sq.count);
}

struct simverbs_peer {
  SimPeer impl;
};

struct simverbs_peer *simverbs_peer_create(struct ibv_context *context) {
  SimContext *ctx = ctx_of(context);
  if (!ctx) return nullptr;
  auto *p = new (std::nothrow) simverbs_peer();
  if (!p) return nullptr;
  auto *pd = new SimPd();
  pd->box.self = pd;
  pd->ctx = ctx;
  pd->hidden = true;
  pd->box.ibv.context = context;
  p->impl.ppd = pd;
  std::lock_guard<std::mutex> lock(sim().mu);
  endpoint_register_locked(&p->impl);
  return p;
}

void simverbs_peer_destroy(struct simverbs_peer *p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(sim().mu);
    endpoint_unregister_locked(p->impl.qpn);
    if (p->impl.qp && p->impl.qp->remote == &p->impl) p->impl.qp->remote = nullptr;
  }
  for (SimMr *mr : p->impl.exposed) ibv_dereg_mr(&mr->box.ibv);
  delete p->impl.ppd;
  delete p;
}

uint32_t simverbs_peer_qp_num(const struct simverbs_peer *p) { return p->impl.qpn; }

int simverbs_peer_connect(struct simverbs_peer *p, struct ibv_qp *qp) {
  return simverbs_qp_connect(qp, p->impl.qpn);
}

int simverbs_peer_expose(struct simverbs_peer *p, void *buf, size_t len, unsigned access,
                         uint32_t *rkey) {
  ibv_mr *mr = ibv_reg_mr(&p->impl.ppd->box.ibv, buf, len, static_cast<int>(access));
  if (!mr) return -errno;
  p->impl.exposed.push_back(mr_of(mr));
  *rkey = mr->rkey;
  return 0;
}

static SimQp *peer_target_locked(struct simverbs_peer *p) {
  SimQp *qp = p->impl.qp;
  if (!qp || qp->remote != &p->impl || !can_receive(qp)) return nullptr;
  return qp;
}

static int peer_rdma(struct simverbs_peer *p, uint32_t rkey, uint64_t addr, void *local,
                     size_t len, bool write) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  SimQp *qp = peer_target_locked(p);
  if (!qp) return -ENOTCONN;
  std::vector<Span> remote;
  AccessErr e = resolve_locked(qp->pd_, rkey, addr, len,
                               write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ, true, qp,
                               remote);
  if (e != AccessErr::kOk) {
    s.stats.remote_access_errors++;
    set_error_locked(std::string("peer RDMA ") + (write ? "WRITE" : "READ") + " rkey " + hex(rkey) +
                     ": " + access_err_name(e));
    return access_errno(e);
  }
  std::vector<Span> mine{{static_cast<uint8_t *>(local), len}};
  if (write)
    copy_spans(remote, mine);
  else
    copy_spans(mine, remote);
  return 0;
}

int simverbs_peer_rdma_write(struct simverbs_peer *p, uint32_t rkey, uint64_t addr,
                             const void *src, size_t len) {
  return peer_rdma(p, rkey, addr, const_cast<void *>(src), len, true);
}

int simverbs_peer_rdma_read(struct simverbs_peer *p, uint32_t rkey, uint64_t addr, void *dst,
                            size_t len) {
  return peer_rdma(p, rkey, addr, dst, len, false);
}

int simverbs_peer_send(struct simverbs_peer *p, const void *buf, size_t len,
                       uint32_t invalidate_rkey) {
  Sim &s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  SimQp *qp = peer_target_locked(p);
  if (!qp) return -ENOTCONN;
  if (qp->rq.empty()) return -EAGAIN;
  std::vector<Span> data{{static_cast<uint8_t *>(const_cast<void *>(buf)), len}};
  Delivery d = deliver_locked(qp, data, invalidate_rkey != 0, invalidate_rkey, false, 0, p->impl.qpn);
  switch (d) {
    case Delivery::kOk: return 0;
    case Delivery::kRnr: return -EAGAIN;
    case Delivery::kInvFailed:
      s.stats.remote_access_errors++;
      set_error_locked("peer SEND_WITH_INV: rkey " + hex(invalidate_rkey) + " cannot be invalidated");
      return -ENOKEY;
    case Delivery::kRecvErr: return -EIO;
    case Delivery::kNotReady: return -ENOTCONN;
  }
  return -EIO;
}

int simverbs_peer_recv(struct simverbs_peer *p, void *buf, size_t cap, size_t *len) {
  std::lock_guard<std::mutex> lock(sim().mu);
  if (p->impl.inbox.empty()) return -EAGAIN;
  Message &m = p->impl.inbox.front();
  size_t n = std::min(cap, m.data.size());
  memcpy(buf, m.data.data(), n);
  if (len) *len = m.data.size();
  p->impl.inbox.pop_front();
  return 0;
}

}  // extern "C"
