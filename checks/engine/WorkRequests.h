//===- WorkRequests.h - Work requests, posts and queue pairs ----*- C++ -*-===//
//
// For each post the engine computes the chain of work requests it may post
// (following .next through struct fields, locals, helper parameters and the
// callers' arguments), the opcodes and signaling of each, and for each QP
// creation the requested capacities. The checks on send-queue accounting
// read this model.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_WORKREQUESTS_H
#define ULPLINT_ENGINE_WORKREQUESTS_H

#include "Analysis.h"
#include "Linear.h"
#include <map>

namespace ulplint {

/// Identity of a work request across posts: the storage it lives in, or for
/// one built by a call (the extended API, rdma_post_*), the building
/// function and API.
struct WrKey {
  SlotKey Storage;
  const clang::FunctionDecl *Fn = nullptr;
  const FunctionModel *Api = nullptr;

  bool operator<(const WrKey &O) const {
    if (Storage != O.Storage)
      return Storage < O.Storage;
    return std::tie(Fn, Api) < std::tie(O.Fn, O.Api);
  }
  std::string str() const;
};

/// One work request as the code names it, possibly under several names
/// (`first` in a helper is `&req->reg_wr.wr` in its caller).
struct WrSlot {
  llvm::SmallVector<std::pair<Location, const clang::FunctionDecl *>, 2> Names;
  WrKey Key;
  llvm::SmallVector<Opcode, 2> Ops; // possible opcodes; empty if unknown
  enum SignalKind { Never, Sometimes, Always, Unknown };
  SignalKind Signal = Unknown;
  /// Where the signaling decision is made (send_flags store), if anywhere.
  const FieldStore *Flags = nullptr;
  clang::SourceLocation Loc; // where its opcode is set

  bool mayBe(Opcode O) const { return llvm::is_contained(Ops, O); }
};

/// A post of send work requests: ibv_post_send, ib_post_send, the extended
/// API between ibv_wr_start and ibv_wr_complete, librdmacm's rdma_post_*.
struct PostSite {
  const ApiCall *Call = nullptr;
  const clang::FunctionDecl *Fn = nullptr;
  const clang::Expr *Qp = nullptr;
  /// The longest chain among the alternatives the code allows.
  std::vector<WrSlot> Chain;
  bool Complete = true;     // every link of the chain was resolved
  bool CoreManaged = false; // rdma_rw / regcore post their own WRs here
  bool CoreSignals = false; // ... and signal the last one (cqe given)
};

/// A QP creation and what it asks for.
struct QpCreation {
  const ApiCall *Call = nullptr;
  const clang::FunctionDecl *Fn = nullptr;
  /// The capacity stores into the attribute struct, by role
  /// (max_send_wr, max_recv_wr, max_send_sge, ...).
  std::map<FieldRole, const FieldStore *> Caps;
  /// sq_sig_all / sq_sig_type: true when every WR is signaled, false when
  /// only WRs with the SIGNALED flag are, unset when the code never says.
  std::optional<bool> SignalAll;
  const FieldStore *SignalStore = nullptr;
  bool CoreManaged = false; // regcore_qp_create
};

/// Stores with \p Role into the work request \p S names (any of its names).
std::vector<const FieldStore *> slotStores(const TuAnalysis &A, const WrSlot &S,
                                           FieldRole Role);

/// The value a QP creation requests for \p Role (max_send_wr, ...): the value
/// at the creation when the creating function sets it, else the value after
/// the last store elsewhere.
std::optional<Linear> capValue(const TuAnalysis &A, const QpCreation &Q,
                               FieldRole Role);

class WorkRequests {
public:
  static const WorkRequests &of(const TuAnalysis &A);
  explicit WorkRequests(const TuAnalysis &A);

  llvm::ArrayRef<PostSite> posts() const { return Posts; }
  llvm::ArrayRef<QpCreation> creations() const { return Creations; }
  /// ib_drain_qp / ib_drain_sq calls: each needs a free send-queue slot.
  unsigned drains() const { return Drains; }

  /// The send-queue entries one request may occupy before its completion is
  /// reaped: the longest chain any post submits, plus every registration or
  /// invalidation work request posted elsewhere (REG_MR before the SEND,
  /// LOCAL_INV from the completion path).
  std::vector<const WrSlot *> perIoSlots() const;
  /// Some post submits REG_MR, LOCAL_INV or BIND_MW.
  bool postsRegistrations() const;
  /// Some post may ask for a completion (or could not be followed).
  bool mayRequestCompletion() const;
  /// "REG_MR, SEND, LOCAL_INV"
  static std::string describe(llvm::ArrayRef<const WrSlot *> Slots);
  /// The posts and per-I/O slots, for -debug-only=ulplint-wr.
  void dump(llvm::raw_ostream &OS) const;

private:
  void exportFacts() const;

  const TuAnalysis &A;
  std::vector<PostSite> Posts;
  std::vector<QpCreation> Creations;
  unsigned Drains = 0;
};

} // namespace ulplint

#endif
