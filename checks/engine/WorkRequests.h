//===- WorkRequests.h - Work requests, posts and queue pairs ----*- C++ -*-===//
//
// For each post the engine computes the chain of work requests it may post
// (following .next through struct fields, locals, tail pointers, helpers
// that fill a caller's work request or return a chain, and the callers'
// arguments), the opcodes and signaling of each, how many send-queue entries
// one run of the post takes (arrays of work requests, appends in a loop),
// how often one request runs it, and the QP it posts on. For each QP
// creation it knows the requested capacities and the storage that holds the
// QP. The checks on send-queue accounting read this model.
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
/// function, API and call.
struct WrKey {
  SlotKey Storage;
  const clang::FunctionDecl *Fn = nullptr;
  const FunctionModel *Api = nullptr;
  /// The building call (ibv_wr_rdma_write(...)): two WRITEs of one batch are
  /// two work requests.
  const clang::CallExpr *Site = nullptr;

  bool operator<(const WrKey &O) const {
    if (Storage != O.Storage)
      return Storage < O.Storage;
    return std::tie(Fn, Api, Site) < std::tie(O.Fn, O.Api, O.Site);
  }
  bool operator==(const WrKey &O) const { return !(*this < O) && !(O < *this); }
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
  /// ... or the flags argument of the post (`rdma_post_send(.., flags)`).
  const clang::Expr *FlagsArg = nullptr;
  clang::SourceLocation Loc; // where its opcode is set
  /// Send-queue entries this work request takes in one post: the elements
  /// of a WR array linked to each other, or the appends made in a loop.
  unsigned Count = 1;

  bool mayBe(Opcode O) const { return llvm::is_contained(Ops, O); }
  /// REG_MR, BIND_MW or LOCAL_INV.
  bool isRegistration() const;
};

/// A post of send work requests: ibv_post_send, ib_post_send, the extended
/// API between ibv_wr_start and ibv_wr_complete, librdmacm's rdma_post_*.
struct PostSite {
  const ApiCall *Call = nullptr;
  const clang::FunctionDecl *Fn = nullptr;
  const clang::Expr *Qp = nullptr;
  /// The longest chain among the alternatives the code allows.
  std::vector<WrSlot> Chain;
  /// Every chain the post may submit. A post helper's callers each hand it
  /// their own (`brk_post(c, &wr)` after building a BIND_MW, a LOCAL_INV or
  /// a SEND): Via is the call through which the function that built the
  /// chain reached this post (null: built in the posting function).
  struct Alternative {
    std::vector<WrSlot> Chain;
    const clang::CallExpr *Via = nullptr;
    const clang::FunctionDecl *ViaFn = nullptr;
  };
  std::vector<Alternative> Alternatives;
  bool Complete = true;     // every link of the chain was resolved
  bool CoreManaged = false; // rdma_rw / regcore post their own WRs here
  bool CoreSignals = false; // ... and signal the last one (cqe given)
  /// The storage of the QP posted on (`queue->qp`: nvme_rdma_queue.qp).
  SlotKey QpKey;
  /// How many times one request runs this post: it sits in a loop over the
  /// request's MRs, or its helper is called once per MR.
  unsigned Repeat = 1;
  /// Registers or invalidates only handles of the connection itself (the
  /// struct that holds the QP): set up once, not per request.
  bool Setup = false;
  /// The post waits for free send-queue entries the ULP counts in work
  /// requests (`if (q->sq_free < 2) return -EAGAIN; ... q->sq_free -= 2`).
  bool CreditGated = false;

  /// Send-queue entries one run of the post takes.
  unsigned entries() const;
  /// Some work request of the post may ask for a completion (or the core
  /// signals, or the chain is not fully known).
  bool asksForCompletion() const;
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
  /// The store that says so, or null when a zeroed userspace attribute
  /// struct leaves sq_sig_all 0.
  const FieldStore *SignalStore = nullptr;
  bool CoreManaged = false; // regcore_qp_create
  /// The storage that holds the QP (`queue->qp`, `id->qp` for rdma_cm), the
  /// name other files of the ULP post on.
  SlotKey QpKey;
  /// Every storage that holds this QP or its ibv_qp_ex (`c->qpx =
  /// ibv_qp_to_qp_ex(c->qp)`).
  std::vector<SlotKey> QpNames;

  bool holds(const SlotKey &K) const { return llvm::is_contained(QpNames, K); }
};

/// What one request keeps on a QP's send queue until its completions are
/// reaped.
struct RequestCost {
  /// The work requests, with the entries each takes per request.
  std::vector<std::pair<const WrSlot *, unsigned>> Slots;
  unsigned Total = 0;
  /// Posts were left out because the ULP gates them by send-queue credits.
  bool Gated = false;
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

  /// The creation whose QP \p Key names; with one creation in the unit, the
  /// posts on QPs of unknown storage are taken to be on it.
  const QpCreation *creationOf(const SlotKey &Key) const;
  /// Posts on \p Q's QP.
  std::vector<const PostSite *> postsOn(const QpCreation &Q) const;
  /// What one request keeps on \p Q's send queue (the posts of this unit).
  RequestCost requestCost(const QpCreation &Q) const;
  /// The same for posts on the QP stored in \p Key, when the unit creates
  /// none (the program's other files size the queue).
  RequestCost requestCost(llvm::ArrayRef<const PostSite *> Posts) const;
  /// Drains of \p Q that need a free entry in the send (receive) queue.
  const clang::CallExpr *sendDrain(const QpCreation &Q) const;
  const clang::CallExpr *recvDrain(const QpCreation &Q) const;
  /// The receive WRs \p Q keeps posted (a refill loop bounded by the depth).
  std::optional<Linear> postedReceives(const QpCreation &Q) const;

  /// The send-queue entries one request may occupy before its completion is
  /// reaped, over every post of the unit.
  std::vector<const WrSlot *> perIoSlots() const;
  /// Some post submits REG_MR, LOCAL_INV or BIND_MW.
  bool postsRegistrations() const;
  /// The unit builds REG_MR, LOCAL_INV or BIND_MW work requests (posted here
  /// or by another file).
  bool buildsRegistrations() const { return BuildsRegistrations; }
  /// The unit moves data with RDMA READ or WRITE work requests of its own.
  bool postsRdma() const { return PostsRdma; }
  /// Some post may ask for a completion (or could not be followed).
  bool mayRequestCompletion() const;
  /// "REG_MR, SEND, LOCAL_INV"
  static std::string describe(llvm::ArrayRef<const WrSlot *> Slots);
  /// "2 x REG_MR, SEND, 2 x LOCAL_INV"
  static std::string describe(const RequestCost &Cost);
  /// The posts and per-I/O slots (--dump-work-requests).
  void dump(llvm::raw_ostream &OS) const;

  /// Facts other files use to judge this unit's queues:
  /// "sq-cost:<qp>:<n>" for n = 1..what one request posts on the QP.
  static std::string costFact(llvm::StringRef Qp, unsigned N);
  static std::string signalsFact(llvm::StringRef Qp);
  static std::string postsFact(llvm::StringRef Qp);
  /// The QP of this unit a post is on, or null when it cannot tell.
  const QpCreation *creationFor(const PostSite &P) const;

private:
  void exportFacts() const;
  void collectCreations();
  const clang::CallExpr *drainOf(const QpCreation &Q, bool Send) const;

  const TuAnalysis &A;
  std::vector<PostSite> Posts;
  std::vector<QpCreation> Creations;
  std::vector<const ApiCall *> DrainCalls;
  std::vector<const ApiCall *> RecvPosts;
  unsigned Drains = 0;
  bool BuildsRegistrations = false;
  bool PostsRdma = false;
};

} // namespace ulplint

#endif
