//===- LifeSolver.cpp - Walking each function's paths per handle ----------===//
//
// The third part of the lifecycle model: a path-sensitive walk over Clang's
// CFG of each function for each handle slot, compositional across the unit
// the way Infer's Pulse is. A helper's walk, from each state its caller can
// be in, is its summary: the states it may leave the slot in, split by
// whether it returns an error, and the incidents it meets on the way. A
// caller applies the summary at the call, binding the helper's parameters
// to its arguments; the incidents become real in the functions nothing in
// the unit calls (the roots: submit paths, completion handlers, callbacks).
//
// Shared slots (a field of a request, a global) outlive one activation: a
// root starts from the states the roots leave them in (resting states), so a
// completion handler that recycles a request sees the rkey its submit path
// exposed. A LOCAL_INV's done callback starts from an invalidated key.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "llvm/Support/CommandLine.h"
#include <deque>

using namespace clang;

namespace ulplint {

/// For developers: every event and incident of each unit, on stderr.
static llvm::cl::opt<bool> DumpLifecycle(
    "dump-lifecycle", llvm::cl::Hidden,
    llvm::cl::desc("Print the lifecycle model's events and incidents"));

namespace budget {
/// Blocks one walk may process.
constexpr unsigned SolverSteps = 20000;
/// Distinct path states kept at a block's entry.
constexpr unsigned StatesPerBlock = 48;
/// Helpers applied inside helpers.
constexpr unsigned CallDepth = 8;
/// Rounds of the resting-state fixpoint (the lattice is small).
constexpr unsigned RestingRounds = 8;
/// Resting states kept per slot.
constexpr unsigned RestingStates = 12;
/// Outcomes of repeated setting tests a path remembers.
constexpr unsigned DecidedSettings = 2;
} // namespace budget

namespace {

enum class Life : uint8_t {
  Unknown,     // from outside the unit
  None,        // holds nothing (NULL, or before production)
  Live,        // holds a handle with no remote rights
  Exposed,     // key valid for a peer
  Claimed,     // the peer reports it invalidated the key; not yet compared
  InvalPosted, // LOCAL_INV posted
  Invalidated, // invalidated (LOCAL_INV done, or a checked remote invalidation)
  Released,
  Escaped,
};

bool holds(Life L) {
  return L == Life::Live || L == Life::Exposed || L == Life::Claimed ||
         L == Life::InvalPosted || L == Life::Invalidated;
}

/// A test of a setting: its storage, and the constant it is compared
/// with for equality (none: tested for truth).
struct SettingTest {
  SlotKey Setting;
  std::optional<int64_t> Equals;
  auto tie() const { return std::tie(Setting, Equals); }
  bool operator<(const SettingTest &O) const { return tie() < O.tie(); }
  bool operator==(const SettingTest &O) const { return tie() == O.tie(); }
};

/// Stands for "whatever the caller had" in a summary's states and
/// incidents; applying the summary puts the caller's value in its place.
const LifeEvent EntryMarker;

struct PathState {
  Life L = Life::None;
  bool Signaled = true; // InvalPosted: the LOCAL_INV asks for a completion
  bool Waited = false;  // completions were waited for since the LOCAL_INV
  int8_t Outcome = 0;   // Tag's outcome here: 1 failed, -1 succeeded, 0 unknown
  Life Undo = Life::None; // the state before Tag, restored if it failed
  const LifeEvent *Produced = nullptr;
  const LifeEvent *Exposed = nullptr;
  const LifeEvent *Inval = nullptr;
  const LifeEvent *UndoExposed = nullptr;
  const Stmt *ErrorBranch = nullptr;
  /// The last call (a post, or a helper with distinct outcomes) whose
  /// failure changes what happened to the slot.
  const Stmt *Tag = nullptr;
  /// The branch where the invalidated rkey turned out to be another key.
  const Stmt *Mismatch = nullptr;
  /// A helper returned an error still holding a handle it produced: the
  /// caller releases it, or the helper leaked it.
  const LifeIncident *Pending = nullptr;
  /// The registration or mapping that put the current memory behind the
  /// handle (null: not known here).
  const Stmt *Bound = nullptr;
  /// The rkey went into a message that the next post sends.
  const LifeEvent *Staged = nullptr;
  /// An invalidation incident was reported on this path already: one
  /// finding per missing invalidation, not one per later release.
  bool Reported = false;
  /// The loop whose current iteration produced the handle held now (an
  /// element of an array), until the path leaves that loop normally.
  const Stmt *ProducingLoop = nullptr;
  /// The completion this function handles failed on this path
  /// (`wc->status != IB_WC_SUCCESS`).
  bool WcFailed = false;
  /// Entered a LOCAL_INV's own done callback: the key is dead only once the
  /// completion's status says the invalidation succeeded.
  bool InvUnconfirmed = false;
  /// Tag failed because a post inside it failed (`return ib_post_send()`
  /// in a helper): nothing it would have sent went out.
  bool PostFailed = false;
  /// The memory behind a registration with remote rights was freed while
  /// the registration may still stand: a deregistration later on this path
  /// proves it did.
  const LifeEvent *FreedLive = nullptr;
  /// The call of this function through which FreedLive happened.
  const Stmt *FreedVia = nullptr;
  /// Where this path learned that a handle it did not produce is there:
  /// the slot tested non-null, its key read, its memory freed.
  const Stmt *HeldAt = nullptr;
  /// The loop that takes another object of the slot's struct each time
  /// round (`list_for_each_entry(mw, ..)`, `r = wc[k].wr_id`) in whose
  /// iteration the state was last set.
  const Stmt *IterLoop = nullptr;
  /// Round that loop again: the state describes an earlier iteration's
  /// object, not the one this iteration releases.
  bool Carried = false;
  /// Carried and Waited before the post Tag: a failed post leaves the
  /// state as it was.
  bool UndoCarried = false, UndoWaited = false;
  /// Outcomes of tests on settings this function never writes
  /// (`user_param->aes_xts`, `p->verb == SEND`) that it tests more than
  /// once: a later test of the same setting goes the same way.
  llvm::SmallVector<std::pair<SettingTest, bool>, 2> Decided;

  auto tie() const {
    return std::tie(L, Signaled, Waited, Outcome, Undo, Produced, Exposed,
                    Inval, UndoExposed, ErrorBranch, Tag, Mismatch, Pending,
                    Bound, Staged, Reported, ProducingLoop, WcFailed, InvUnconfirmed,
                    PostFailed, FreedLive, FreedVia, HeldAt, IterLoop, Carried,
                    UndoCarried, UndoWaited, Decided);
  }
  bool operator<(const PathState &O) const { return tie() < O.tie(); }
  bool operator==(const PathState &O) const { return tie() == O.tie(); }
};

/// Parameters a call passes as constants, in parameter order.
using ArgConstants = std::vector<std::pair<const ParmVarDecl *, int64_t>>;

/// The part of a state a summary depends on.
struct EntryKey {
  Life L;
  bool Signaled, Waited;
  bool Carried = false;
  bool InvUnconfirmed = false;
  bool operator<(const EntryKey &O) const {
    return std::tie(L, Signaled, Waited, Carried, InvUnconfirmed) <
           std::tie(O.L, O.Signaled, O.Waited, O.Carried, O.InvUnconfirmed);
  }
};

EntryKey keyOf(const PathState &S) {
  return {S.L, S.Signaled, S.Waited, S.Carried, S.InvUnconfirmed};
}

PathState entryState(EntryKey K) {
  PathState S;
  S.L = K.L;
  S.Signaled = K.Signaled;
  S.Waited = K.Waited;
  S.Carried = K.Carried;
  S.InvUnconfirmed = K.InvUnconfirmed;
  S.Produced = S.Exposed = S.Inval = &EntryMarker;
  return S;
}

/// Replaces the entry markers of a summary's pointers by the caller's.
template <typename T> T bind(T Callee, T Caller, T Marker) {
  return Callee == Marker ? Caller : Callee;
}

/// What a walk does at the function's exits.
enum class Mode {
  Summary, // a helper seen from its caller: leaks of shared slots wait
  Commit,  // a root, or a function's own locals: incidents are real
};

} // namespace

class LifeSolver {
public:
  explicit LifeSolver(Lifecycle &LC) : LC(LC), A(LC.A) { index(); }

  void run() {
    for (const FunctionDecl *Fn : A.functions())
      solveOwnSlots(Fn);
    for (const SlotKey &Slot : SharedSlots)
      solveShared(Slot);
    for (const FunctionDecl *Fn : Roots)
      for (const SlotKey &Slot : ParamSlots[Fn])
        commit(summary(Fn, Slot, entryState({Life::Unknown, true, false}), 0,
                       rootConstants(Fn)),
               entryState({Life::Unknown, true, false}), nullptr);
  }

private:
  struct Exit {
    PathState S;
    bool Error = false;
    /// `return ib_post_send(..)` on the branch where the post failed.
    bool NotPosted = false;
  };
  struct Result {
    std::vector<Exit> Exits;
    std::vector<LifeIncident> Incidents;
  };

  //===-- Indexes ---------------------------------------------------------===//

  void index() {
    for (const LifeEvent &E : LC.Events) {
      if (E.K == LifeEventKind::Call) {
        Callees[E.Fn].push_back(&E);
        continue;
      }
      if (!E.Slot.valid())
        continue;
      if (E.Slot.isShared())
        SharedSlots.insert(E.Slot);
      else if (isParamSlot(E.Slot))
        ParamSlots[E.Fn].insert(E.Slot);
      else
        OwnSlots[E.Fn].insert(E.Slot);
      if (E.K == LifeEventKind::InvalidatePost) {
        Invalidated.insert(E.Slot);
        LocallyInvalidated.insert(E.Slot);
        Invalidators.insert(E.Fn);
        InvalidatesIn[E.Fn].insert(E.Slot);
      }
      if (E.K == LifeEventKind::Produce || E.K == LifeEventKind::Bind ||
          E.K == LifeEventKind::Expose)
        Prepares[E.Fn].insert(E.Slot);
      Touches[E.Fn].insert(E.Slot);
    }
    for (const FunctionDecl *Fn : A.functions()) {
      bool Called = llvm::any_of(A.callersOf(Fn), [&](const auto &C) {
        return C.second != Fn;
      });
      if (!Called)
        Roots.push_back(Fn);
    }
    for (const Lifecycle::RemoteInvalidation &R : LC.RemoteInvs) {
      Invalidated.insert(R.Slots.begin(), R.Slots.end());
      AfterUse.insert(R.Slots.begin(), R.Slots.end());
    }
    // A LOCAL_INV outside the functions that register the slot runs after
    // the I/O (not chained before the next REG_MR, as a lazy scheme does).
    for (const auto &[Fn, Slots] : InvalidatesIn)
      for (const SlotKey &Slot : Slots)
        if (!Prepares[Fn].count(Slot))
          AfterUse.insert(Slot);
    findInvalidationCallbacks();
    findInvalidationTags();
  }

  /// `inv.wr_id = (uintptr_t)f | PG_WR_INV`: the constant a LOCAL_INV's
  /// wr_id carries, which its completion is recognised by.
  void findInvalidationTags() {
    for (const FieldStore &S : A.stores()) {
      if (S.Role != FieldRole::WrId || !S.Value)
        continue;
      bool Inv = false;
      if (S.Struct->Role == StructRole::SendWr) {
        for (const FieldStore &Op : A.stores())
          if (Op.Role == FieldRole::Opcode &&
              A.sameStorage(Op.Object, Op.Fn, S.Object, S.Fn) &&
              llvm::is_contained(opcodesOf(A, Op), Opcode::LocalInv))
            Inv = true;
      } else if (S.Struct->Role == StructRole::QpEx) {
        // qpx->wr_id set for the ibv_wr_local_inv() that follows.
        Inv = llvm::any_of(A.calls(), [&](const ApiCall &C) {
          return C.Caller == S.Fn && C.Model->E == Effect::WrxOp &&
                 C.Model->Op == Opcode::LocalInv;
        });
      }
      if (!Inv)
        continue;
      const Expr *V = stripExpr(S.Value);
      if (auto C = A.values(S.Fn).constant(V))
        InvTags.insert(*C);
      else if (const auto *BO = dyn_cast<BinaryOperator>(V))
        if (BO->getOpcode() == BO_Or || BO->getOpcode() == BO_Add)
          for (const Expr *Side : {BO->getLHS(), BO->getRHS()})
            if (auto C = A.values(S.Fn).constant(Side))
              InvTags.insert(*C);
    }
  }

  static bool isParamSlot(const SlotKey &S) {
    return S.isLocal() && isa_and_nonnull<ParmVarDecl>(S.variable());
  }

  /// Shared slots \p Fn or a helper it calls has events for.
  const std::set<SlotKey> &sharedTouched(const FunctionDecl *Fn) {
    auto [It, New] = SharedTouched.try_emplace(Fn);
    if (!New)
      return It->second;
    std::set<SlotKey> Out;
    std::vector<const FunctionDecl *> Work = {Fn};
    std::set<const FunctionDecl *> Seen = {Fn};
    while (!Work.empty()) {
      const FunctionDecl *F = Work.back();
      Work.pop_back();
      for (const SlotKey &S : Touches[F])
        if (S.isShared())
          Out.insert(S);
      for (const LifeEvent *C : Callees[F])
        if (Seen.insert(C->Callee).second)
          Work.push_back(C->Callee);
    }
    return SharedTouched[Fn] = std::move(Out);
  }

  /// Does \p Fn (or a helper it calls) prepare \p Slot for an I/O:
  /// produce, map or expose it? Such a root runs on an object whose earlier
  /// I/O is over (the submit path), not on one whose key is still out.
  bool prepares(const FunctionDecl *Fn, const SlotKey &Slot) {
    std::vector<const FunctionDecl *> Work = {Fn};
    std::set<const FunctionDecl *> Seen = {Fn};
    while (!Work.empty()) {
      const FunctionDecl *F = Work.back();
      Work.pop_back();
      if (Prepares[F].count(Slot))
        return true;
      for (const LifeEvent *C : Callees[F])
        if (Seen.insert(C->Callee).second)
          Work.push_back(C->Callee);
    }
    return false;
  }

  /// `req->inv_cqe.done = ulp_inv_done` where `inv_cqe` is the wr_cqe of a
  /// LOCAL_INV: the callback runs once the invalidation completed.
  void findInvalidationCallbacks() {
    std::vector<const FieldStore *> Dones, WrCqes;
    for (const FieldStore &S : A.stores()) {
      if (S.Role == FieldRole::CqeDone)
        Dones.push_back(&S);
      else if (S.Role == FieldRole::WrCqe && S.Value)
        WrCqes.push_back(&S);
    }
    for (const FieldStore *Done : Dones) {
      const auto *DRE = dyn_cast_or_null<DeclRefExpr>(stripExpr(Done->Value));
      const auto *Fn = DRE ? dyn_cast<FunctionDecl>(DRE->getDecl()) : nullptr;
      if (!Fn || !(Fn = Fn->getDefinition()))
        continue;
      DoneCallbacks.insert(Fn);
      for (const FieldStore *Cqe : WrCqes) {
        std::optional<Location> Target = locationOf(Cqe->Value);
        if (!Target || !A.sameStorage(Done->Object, Done->Fn, *Target, Cqe->Fn))
          continue;
        if (invalidatesWr(*Cqe))
          InvalidationCallbacks.insert(Fn);
      }
    }
  }

  /// Is the work request that \p WrCqe belongs to a LOCAL_INV?
  bool invalidatesWr(const FieldStore &WrCqe) {
    for (const FieldStore &Op : A.stores())
      if (Op.Role == FieldRole::Opcode &&
          A.sameStorage(Op.Object, Op.Fn, WrCqe.Object, WrCqe.Fn) &&
          llvm::is_contained(opcodesOf(A, Op), Opcode::LocalInv))
        return true;
    return false;
  }

  //===-- Top level -------------------------------------------------------===//

  void solveOwnSlots(const FunctionDecl *Fn) {
    for (const SlotKey &Slot : OwnSlots[Fn]) {
      PathState Start;
      Start.L = Life::None;
      Result R = walk(Fn, Slot, {Start}, 0, Mode::Commit, rootConstants(Fn));
      commitIncidents(R.Incidents, nullptr);
    }
  }

  /// Roots that touch \p Slot start from its resting states (the states
  /// roots leave it in); their incidents are real.
  void solveShared(const SlotKey &Slot) {
    std::vector<const FunctionDecl *> Touching;
    for (const FunctionDecl *Fn : Roots)
      if (sharedTouched(Fn).count(Slot))
        Touching.push_back(Fn);
    // A handle no function here produces comes from another unit.
    bool ProducedHere = LC.has(Slot, LifeEventKind::Produce);
    std::vector<PathState> Resting = {
        entryState({ProducedHere ? Life::None : Life::Unknown, true, false})};
    // A key the unit invalidates is out between I/Os, wherever it was
    // exposed (perhaps by another unit).
    if (Invalidated.count(Slot))
      Resting.push_back(entryState({Life::Exposed, true, false}));
    for (unsigned Round = 0; Round < budget::RestingRounds; ++Round) {
      size_t Before = Resting.size();
      for (const FunctionDecl *Fn : Touching)
        for (const PathState &Entry : entries(Fn, Slot, Resting))
          for (const Exit &X : summary(Fn, Slot, Entry, 0, rootConstants(Fn)).Exits)
            addResting(Resting, applied(X.S, Entry), !X.Error);
      if (Resting.size() == Before)
        break;
    }
    for (const FunctionDecl *Fn : Touching)
      for (const PathState &Entry : entries(Fn, Slot, Resting))
        commit(summary(Fn, Slot, Entry, 0, rootConstants(Fn)), Entry, nullptr);
  }

  /// A static function's integer parameters that every caller in the unit
  /// passes the same constant (`complete_req(req, true)` everywhere): the
  /// function is judged as it is called.
  ArgConstants rootConstants(const FunctionDecl *Fn) {
    auto [It, New] = RootConstants.try_emplace(Fn);
    if (!New || Fn->isExternallyVisible())
      return It->second;
    auto Calls = A.callersOf(Fn);
    if (Calls.empty())
      return It->second;
    for (unsigned I = 0; I < Fn->getNumParams(); ++I) {
      const ParmVarDecl *P = Fn->getParamDecl(I);
      if (!P->getType()->isIntegralOrEnumerationType())
        continue;
      std::optional<int64_t> Agreed;
      bool Same = true;
      for (const auto &[CE, Caller] : Calls) {
        std::optional<int64_t> V =
            I < CE->getNumArgs() ? A.values(Caller).constant(CE->getArg(I)) : std::nullopt;
        if (!V || (Agreed && *Agreed != *V)) {
          Same = false;
          break;
        }
        Agreed = V;
      }
      if (Same && Agreed)
        It->second.push_back({P, *Agreed});
    }
    return It->second;
  }

  /// The states root \p Fn may find \p Slot in: invalidated for a
  /// LOCAL_INV's done callback; without a key still out for a root that
  /// prepares the slot for an I/O; any resting state otherwise.
  std::vector<PathState> entries(const FunctionDecl *Fn, const SlotKey &Slot,
                                 llvm::ArrayRef<PathState> Resting) {
    // The key the LOCAL_INV names is still good until the completion says
    // it succeeded: a flushed or failed one left it valid.
    if (InvalidationCallbacks.count(Fn))
      return {LocallyInvalidated.count(Slot) && !keepsStatus(Fn)
                  ? entryState({Life::Exposed, true, false, false, true})
                  : entryState({Life::Invalidated, true, false})};
    std::vector<PathState> Out(Resting.begin(), Resting.end());
    if (prepares(Fn, Slot) || releasesAfterUse(Fn, Slot))
      llvm::erase_if(Out, [](const PathState &S) {
        return S.L == Life::Exposed || S.L == Life::Claimed;
      });
    return Out;
  }

  /// `m->state = wc->status ? MR_ERROR : MR_FREE;`: the completion's
  /// status is kept in a variable or field and tested there, which the
  /// paths do not follow; the handler is taken to have looked.
  bool keepsStatus(const FunctionDecl *Fn) {
    auto [It, New] = KeepsStatus.try_emplace(Fn, false);
    if (!New)
      return It->second;
    const ParentMap &PM = A.flow(Fn).parents();
    std::function<bool(const Stmt *)> Visit = [&](const Stmt *S) {
      if (!S)
        return false;
      if (const auto *ME = dyn_cast<MemberExpr>(S)) {
        std::optional<FieldStore> F = A.classifyMember(ME);
        if (F && F->Role == FieldRole::WcStatus)
          for (const Stmt *P = PM.getParent(ME); P; P = PM.getParent(P)) {
            if (isa<CallExpr, IfStmt>(P))
              break; // logged, or tested where the paths see it
            const auto *BO = dyn_cast<BinaryOperator>(P);
            if ((BO && BO->isAssignmentOp()) ||
                isa<DeclStmt, ConditionalOperator, ReturnStmt, SwitchStmt>(P))
              return true;
          }
      }
      return llvm::any_of(S->children(), Visit);
    };
    return It->second = Visit(Fn->getBody());
  }

  /// A root that only gives \p Slot back (nvme-rdma's unmap_data, reached
  /// from the request's end in another unit), in a unit that invalidates
  /// the slot after each I/O: it runs after that invalidation.
  /// Event handlers that reach the release through a helper (a timeout
  /// handler, a completion) are not such roots: they decide when.
  bool releasesAfterUse(const FunctionDecl *Fn, const SlotKey &Slot) {
    if (!AfterUse.count(Slot) || InvalidatesIn[Fn].count(Slot) ||
        Prepares[Fn].count(Slot) || onCompletionPath(Fn))
      return false;
    return llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return E.Fn == Fn && E.Slot == Slot &&
             (E.K == LifeEventKind::Release || E.K == LifeEventKind::Deregister);
    });
  }

  /// A resting state: what a root leaves behind, without the root's own
  /// path details.
  static void addResting(std::vector<PathState> &Resting, PathState S,
                         bool Success) {
    if (S.L == Life::Unknown || S.L == Life::Escaped ||
        Resting.size() >= budget::RestingStates)
      return;
    PathState R = entryState({S.L, S.Signaled, false});
    // A root that succeeded with the key written into its caller's memory
    // (`d->rkey = htobe32(s->mr->rkey)` in an out-parameter) handed it on.
    if (Success && R.L == Life::Live && S.Staged && S.Staged->Outward)
      R.L = Life::Exposed;
    R.Exposed = S.L == Life::Exposed ? S.Exposed : &EntryMarker;
    // A LOCAL_INV posted by an earlier activation has completed by the next.
    if (R.L == Life::InvalPosted || R.L == Life::Claimed)
      R.L = Life::Invalidated;
    if (!llvm::is_contained(Resting, R))
      Resting.push_back(R);
  }

  /// Incidents and leaking exits of a root's summary, made real.
  void commit(const Result &R, const PathState &Entry, const Stmt *Via) {
    for (const LifeIncident &I : R.Incidents)
      commitIncident(boundIncident(I, Entry, Via));
    for (const Exit &X : R.Exits)
      if (X.Error && X.S.Pending) {
        commitIncident(boundIncident(*X.S.Pending, Entry, Via));
        if (std::optional<LifeIncident> I =
                outlivedMemory(X.S.Pending->Slot, X.S.Pending->Fn, X.S))
          commitIncident(boundIncident(*I, Entry, Via));
      }
  }

  void commitIncidents(llvm::ArrayRef<LifeIncident> Incidents, const Stmt *Via) {
    for (const LifeIncident &I : Incidents) {
      LifeIncident J = I;
      if (!J.Via)
        J.Via = Via;
      commitIncident(J);
    }
  }

  void commitIncident(LifeIncident I) {
    for (const LifeEvent **P : {&I.Produced, &I.Exposed, &I.Invalidation})
      if (*P == &EntryMarker)
        *P = nullptr;
    for (const LifeIncident &O : LC.Incidents)
      if (sameIncident(O, I))
        return;
    LC.Incidents.push_back(I);
  }

  static bool sameIncident(const LifeIncident &O, const LifeIncident &I) {
    return O.K == I.K && O.Slot == I.Slot && O.At == I.At && O.Exit == I.Exit &&
           O.Anchor == I.Anchor;
  }

  /// Does \p Fn itself produce a handle into \p Slot?
  bool producesInto(const FunctionDecl *Fn, const SlotKey &Slot) const {
    return llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return E.K == LifeEventKind::Produce && E.Fn == Fn && E.Slot == Slot;
    });
  }

  /// The loop of \p Helper that points at \p I's object, if any.
  const Stmt *ownLoop(const FunctionDecl *Helper, const LifeIncident &I) {
    const Stmt *Where = I.Anchor && I.AnchorFn == Helper ? I.Anchor
                        : I.At && I.At->Fn == Helper     ? I.At->S
                                                         : nullptr;
    return Where ? objectLoop(Helper, Where, I.Slot) : nullptr;
  }

  /// Is \p I about an object \p Helper's own loop points at?
  bool picksOwnObject(const FunctionDecl *Helper, const LifeIncident &I) {
    return ownLoop(Helper, I) != nullptr;
  }

  /// Does the helper's loop take \p I's object from a table of the
  /// connection or a global (`s = &c->pool.slots[i]`: a reaper's own
  /// requests), rather than from the parts of the object it was handed
  /// (`desc = task->rdma_reg[dir].desc`)?
  bool picksFromConnection(const FunctionDecl *Helper, const LifeIncident &I) {
    const Stmt *Loop = ownLoop(Helper, I);
    return Loop && llvm::any_of(A.flow(Helper).defs(), [&](const Def &D) {
             return D.K == Def::Assign && D.Value && D.S && within(Loop, D.S) &&
                    D.Target.Steps.empty() &&
                    isa_and_nonnull<VarDecl>(D.Target.Root) &&
                    (readsWrId(D.Value) || A.ownedByConnection(D.Value));
           });
  }

  /// Does the incident depend on the state its function was entered in?
  static bool fromEntry(const LifeIncident &I) {
    if (I.OwnFailure)
      return false;
    switch (I.K) {
    case LifeIncident::ReleaseWhileExposed:
    case LifeIncident::ReleaseAfterMismatch:
      return I.Exposed == &EntryMarker;
    case LifeIncident::ReleaseBeforeInvalidated:
      return I.Invalidation == &EntryMarker;
    case LifeIncident::LeakOverwrite:
      return I.Produced == &EntryMarker;
    default:
      return false;
    }
  }

  static LifeIncident boundIncident(LifeIncident I, const PathState &Caller,
                                    const Stmt *Via) {
    I.Produced = bind(I.Produced, Caller.Produced, &EntryMarker);
    I.Exposed = bind(I.Exposed, Caller.Exposed, &EntryMarker);
    I.Invalidation = bind(I.Invalidation, Caller.Inval, &EntryMarker);
    if (!I.Via)
      I.Via = Via;
    return I;
  }

  /// A summary's exit state seen from the caller whose state was \p Caller.
  static PathState applied(PathState X, const PathState &Caller) {
    X.Decided = Caller.Decided; // the helper's tests are of its own settings
    X.Produced = bind(X.Produced, Caller.Produced, &EntryMarker);
    X.Exposed = bind(X.Exposed, Caller.Exposed, &EntryMarker);
    X.Inval = bind(X.Inval, Caller.Inval, &EntryMarker);
    X.UndoExposed = Caller.Exposed;
    X.ErrorBranch = Caller.ErrorBranch;
    X.Mismatch = X.Mismatch ? X.Mismatch : Caller.Mismatch;
    X.Pending = X.Pending ? X.Pending : Caller.Pending;
    X.Staged = X.Staged ? X.Staged : Caller.Staged;
    X.Reported = X.Reported || Caller.Reported;
    // What only the caller can know survives a helper that left the
    // caller's handle in place: the loop iteration that produced it, the
    // evidence that it holds one.
    if (X.Produced == Caller.Produced && !X.ProducingLoop)
      X.ProducingLoop = Caller.ProducingLoop;
    if (X.Produced == Caller.Produced && !X.HeldAt)
      X.HeldAt = Caller.HeldAt;
    return X;
  }

  //===-- Summaries ---------------------------------------------------------===//

  const Result &summary(const FunctionDecl *Fn, const SlotKey &Slot,
                        const PathState &From, unsigned Depth,
                        const ArgConstants &Consts = {}) {
    auto Key = std::make_tuple(Fn, Slot, keyOf(From), Consts);
    auto It = Memo.find(Key);
    if (It != Memo.end())
      return It->second;
    Result R = walk(Fn, Slot, {entryState(keyOf(From))}, Depth, Mode::Summary,
                    Consts);
    return Memo[Key] = std::move(R);
  }

  /// The slot a caller's \p Slot is inside \p Callee at \p CE: the
  /// parameter that receives it (or the struct holding it), the same slot
  /// when it is shared, nothing when the callee cannot name it.
  std::optional<SlotKey> calleeSlot(const FunctionDecl *Fn, const SlotKey &Slot,
                                    const LifeEvent &Call) {
    const auto *CE = cast<CallExpr>(Call.S);
    const FunctionDecl *Callee = Call.Callee;
    // `inv_rkey(req, mr->rkey)`: the helper knows the handle only by its
    // key, and posts the LOCAL_INV of that parameter.
    for (const LifeEvent::KeyArg &K : Call.KeyArgs)
      if (K.Slot == Slot) {
        Location Param;
        Param.Root = Callee->getParamDecl(K.Param);
        SlotKey In = SlotKey::of(Param, Callee);
        if (ParamSlots[Callee].count(In))
          return In;
      }
    for (unsigned I = 0; I < CE->getNumArgs() && I < Callee->getNumParams(); ++I) {
      std::optional<Location> Arg = locationOf(CE->getArg(I));
      if (!Arg)
        continue;
      SlotKey ArgSlot = slotOf(A, *Arg, Fn);
      if (!Slot.isWithin(ArgSlot))
        continue;
      Location Inside;
      Inside.Root = Callee->getParamDecl(I);
      llvm::ArrayRef<Location::Step> Path = Slot.path();
      Inside.Steps.append(Path.begin() + ArgSlot.path().size(), Path.end());
      return SlotKey::of(Inside, Callee);
    }
    // `alloc_res(dev, &desc->rsc)`: the helper's `res->mr` is this
    // caller's `desc->rsc.mr`, followed under that name; the embedded
    // struct's own type-level slot is not what this call changes.
    if (Slot.isShared() && passesEmbedded(CE, Slot.record()))
      return std::nullopt;
    if (Slot.isShared())
      return Slot;
    return std::nullopt;
  }

  /// Does \p CE pass the address of a struct of type \p RD embedded in
  /// another object (`&desc->rsc`)?
  static bool passesEmbedded(const CallExpr *CE, const RecordDecl *RD) {
    if (!RD)
      return false;
    for (const Expr *Arg : CE->arguments()) {
      const auto *UO = dyn_cast<UnaryOperator>(stripExpr(Arg));
      const auto *ME = UO && UO->getOpcode() == UO_AddrOf
                           ? dyn_cast<MemberExpr>(stripExpr(UO->getSubExpr()))
                           : nullptr;
      const RecordDecl *Inner = ME ? ME->getType()->getAsRecordDecl() : nullptr;
      if (Inner && Inner->getCanonicalDecl() == RD->getCanonicalDecl())
        return true;
    }
    return false;
  }

  //===-- One walk ----------------------------------------------------------===//

  struct Walk {
    const FunctionDecl *Fn;
    SlotKey Slot;
    bool Own;   // a local of Fn: Fn alone decides its fate
    bool Param; // Fn's parameter: the caller's handle
    Mode M;
    unsigned Depth;
    Result R;
    std::map<const LifeEvent *, std::pair<bool, std::optional<PathState>>> Releases;
    /// Parameters the caller passes as constants (`finish_req(r, true)`).
    ArgConstants Consts;
  };

  Result walk(const FunctionDecl *Fn, const SlotKey &Slot,
              std::vector<PathState> Entries, unsigned Depth, Mode M,
              ArgConstants Consts = {}) {
    Walk W{Fn, Slot, Slot.isLocal() && !isParamSlot(Slot), isParamSlot(Slot), M,
           Depth, {}, {}, std::move(Consts)};
    const CFG *G = A.flow(Fn).cfg();
    if (!G)
      return W.R;
    Active.insert(Fn);
    std::map<unsigned, std::set<PathState>> In;
    In[G->getEntry().getBlockID()].insert(Entries.begin(), Entries.end());
    std::vector<const CFGBlock *> Work = {&G->getEntry()};
    unsigned Steps = 0;
    bool Truncated = false;
    while (!Work.empty() && ++Steps < budget::SolverSteps) {
      const CFGBlock *B = Work.back();
      Work.pop_back();
      std::vector<PathState> Out;
      for (const PathState &S : In[B->getBlockID()])
        block(W, *B, S, Out);
      if (B == &G->getExit())
        for (const PathState &S : In[B->getBlockID()])
          exit(W, nullptr, S);
      unsigned Index = 0;
      for (const auto &Succ : B->succs()) {
        const CFGBlock *SB = Succ.getReachableBlock();
        unsigned ThisIndex = Index++;
        if (!SB)
          continue;
        std::set<PathState> &Target = In[SB->getBlockID()];
        size_t Before = Target.size();
        for (PathState S : Out) {
          if (!edge(W, *B, ThisIndex, *SB, S))
            continue;
          forgetDead(S);
          if (Target.size() < budget::StatesPerBlock || Target.count(S))
            Target.insert(S);
          else if (!S.Decided.empty() && Target.count(undecided(S)))
            ; // a state that knows less of the settings stands for it
          else
            Truncated = true;
        }
        if (Target.size() != Before)
          Work.push_back(SB);
      }
    }
    if (!Work.empty() || Truncated)
      LC.Incomplete.insert(Fn);
    Active.erase(Fn);
    flushReleases(W);
    return std::move(W.R);
  }

  /// Clears what can no longer matter on this path, so that states that
  /// differ only there are one (the path budget): what a failed call would
  /// have undone once it is known to have failed, a key staged for a handle
  /// not live, and everything about a handle once nothing is held.
  static void forgetDead(PathState &S) {
    if (S.Outcome == 1) {
      S.Undo = Life::None;
      S.UndoExposed = nullptr;
      S.UndoCarried = S.UndoWaited = false;
    }
    if (S.L != Life::Live)
      S.Staged = nullptr;
    if (S.L != Life::InvalPosted)
      S.Waited = false; // see remember()
    if (S.L != Life::None && S.L != Life::Released)
      return;
    if (S.Outcome == 1 || !S.Tag) {
      S.WcFailed = false;
      S.InvUnconfirmed = false;
    }
    S.Signaled = true;
    S.Produced = S.Exposed = S.Inval = nullptr;
    S.Mismatch = S.HeldAt = nullptr;
    S.Bound = nullptr;
    S.ProducingLoop = S.IterLoop = nullptr;
    S.Carried = false;
    if (!S.FreedLive)
      S.Reported = false;
  }

  static PathState undecided(PathState S) {
    S.Decided.clear();
    return S;
  }

  /// Runs one state through a block; the states that leave it go to \p Out.
  void block(Walk &W, const CFGBlock &B, const PathState &Start,
             std::vector<PathState> &Out) {
    std::vector<PathState> States = {Start};
    for (const CFGElement &El : B) {
      auto CS = El.getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *St = CS->getStmt();
      auto It = LC.AtStmt.find(St);
      if (It != LC.AtStmt.end())
        for (size_t I : It->second) {
          const LifeEvent &E = LC.Events[I];
          if (E.Fn != W.Fn)
            continue;
          std::vector<PathState> Next;
          for (PathState &S : States) {
            if (E.K == LifeEventKind::Call) {
              call(W, E, S, Next);
            } else if (E.Slot == W.Slot && S.Carried &&
                       (endsHandle(E.K) || E.K == LifeEventKind::Clear)) {
              Next.push_back(S); // another object than the state's
            } else {
              apply(W, E, S);
              if (E.Slot == W.Slot)
                enterIteration(W, E.S, S);
              Next.push_back(S);
            }
          }
          States = dedup(std::move(Next));
        }
      if (const auto *RS = dyn_cast<ReturnStmt>(St)) {
        for (const PathState &S : States)
          exit(W, RS, S);
        return;
      }
    }
    Out.insert(Out.end(), States.begin(), States.end());
  }

  static std::vector<PathState> dedup(std::vector<PathState> V) {
    llvm::sort(V);
    V.erase(std::unique(V.begin(), V.end()), V.end());
    return V;
  }

  void apply(Walk &W, const LifeEvent &E, PathState &S) {
    if (E.K == LifeEventKind::Wait) {
      if (E.Post && S.L == Life::InvalPosted) {
        remember(S, E); // a wait that may time out: undone on that branch
        S.Undo = S.L;
      }
      S.Waited = true;
      return;
    }
    if (E.K == LifeEventKind::Post) {
      // The message carrying a staged key goes out with this post.
      if (S.Staged && S.L == Life::Live) {
        remember(S, E);
        S.L = Life::Exposed;
        S.InvUnconfirmed = false;
        S.Exposed = S.Staged;
      }
      S.Staged = nullptr;
      return;
    }
    if (E.Slot != W.Slot)
      return;
    // A new exposure or invalidation replaces the one whose completion
    // this callback handles.
    if (E.K == LifeEventKind::Expose || E.K == LifeEventKind::InvalidatePost ||
        E.K == LifeEventKind::InvalidateRemote)
      S.InvUnconfirmed = false;
    switch (E.K) {
    case LifeEventKind::Produce:
      if (holds(S.L) && ownProduced(S) && E.Stable && S.Produced->Stable)
        incident(W, LifeIncident::LeakOverwrite, &E, S);
      else if (holds(S.L) && !ownProduced(S) && S.HeldAt && !W.Own)
        incident(W, LifeIncident::LeakOverwrite, &E, S);
      S = restarted(S);
      S.L = Life::Live;
      S.Produced = &E;
      S.Bound = E.Binding;
      if (!E.Stable)
        S.ProducingLoop = enclosingLoop(W.Fn, E.S);
      break;
    case LifeEventKind::Bind:
      S.Bound = E.Binding;
      break;
    case LifeEventKind::Fresh:
      S = restarted(S);
      break;
    case LifeEventKind::Repoint:
      S = restarted(S);
      S.L = Life::Unknown;
      break;
    case LifeEventKind::KeyStaged:
      provenHeld(W, S, E.S);
      if (S.L == Life::Live)
        S.Staged = &E;
      break;
    case LifeEventKind::Expose:
      provenHeld(W, S, E.S);
      remember(S, E);
      // A handle already handed to a struct stays the struct's to release.
      if (S.L != Life::Escaped)
        S.L = Life::Exposed;
      S.Exposed = &E;
      break;
    case LifeEventKind::InvalidatePost:
      // As for an exposure: the struct it was handed to answers for it.
      if (S.L == Life::Escaped)
        break;
      // Invalidating its key says the struct holds the handle.
      provenHeld(W, S, E.S);
      remember(S, E);
      S.L = Life::InvalPosted;
      S.Inval = &E;
      S.Signaled = E.Signaled;
      S.Waited = false;
      break;
    case LifeEventKind::InvalidateRemote:
      S.L = Life::Invalidated;
      break;
    case LifeEventKind::Deregister:
      // Destroying the MR under a LOCAL_INV still queued for it.
      if (S.L == Life::InvalPosted && !S.Waited && !S.Reported) {
        incident(W, LifeIncident::ReleaseBeforeInvalidated, &E, S);
        S.Reported = true;
      }
      freedBeforeDeregister(W, E, S);
      S.L = Life::Released;
      S.Pending = nullptr;
      break;
    case LifeEventKind::Release:
    case LifeEventKind::BufferRelease:
    case LifeEventKind::ContainerRelease:
      release(W, E, S);
      break;
    case LifeEventKind::Clear:
    case LifeEventKind::Overwrite:
      if (holds(S.L) && ownProduced(S) && S.Produced->Stable &&
          (E.K == LifeEventKind::Clear || E.Stable))
        incident(W, LifeIncident::LeakOverwrite, &E, S);
      // A handle this path found there (`if (!r->mr) continue; ...
      // r->mr = NULL;`), dropped without its release. A local holding a
      // handle it did not produce borrowed it (`mr = path->mrs[i]`). A
      // store into an element by a moving index (`pool[n++] = mw`, a
      // push) writes another element than the one found.
      else if (holds(S.L) && !ownProduced(S) && S.HeldAt && !W.Own &&
               (E.K == LifeEventKind::Clear || E.Stable || !W.Slot.isElement()))
        incident(W, LifeIncident::LeakOverwrite, &E, S);
      S.HeldAt = nullptr;
      S.L = E.K == LifeEventKind::Clear ? Life::None : Life::Unknown;
      S.Produced = nullptr;
      S.Pending = nullptr;
      break;
    case LifeEventKind::Escape:
      S.L = Life::Escaped;
      S.Pending = nullptr;
      break;
    case LifeEventKind::Rotate:
    case LifeEventKind::Wait:
    case LifeEventKind::Call:
    case LifeEventKind::Post:
      break;
    }
  }

  /// Is \p S a call of a posting API (`ibv_post_send`, `ibv_wr_complete`)?
  bool isPost(const Stmt *S) const {
    const auto *CE = dyn_cast<CallExpr>(S);
    const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
    return M && (M->E == Effect::PostSend || M->E == Effect::PostCm ||
                 M->E == Effect::WrxComplete || M->E == Effect::RwPost);
  }

  /// The tagged call failed: what it did to the slot did not happen.
  static void undoTag(PathState &S) {
    S.L = S.Undo;
    S.Exposed = S.UndoExposed;
    S.Carried = S.UndoCarried;
    S.Waited = S.UndoWaited;
  }

  /// A post's effect is undone on the branch that finds the post failed.
  static void remember(PathState &S, const LifeEvent &E) {
    const Stmt *Post = E.K == LifeEventKind::Post ? E.S : E.Post;
    // Several events of one post (a chain, a WR seen two ways) share the
    // state before the post.
    if (!Post || (S.Tag == Post && S.Outcome == 0))
      return;
    S.Tag = Post;
    S.Outcome = 0;
    S.PostFailed = false;
    S.Undo = S.L;
    S.UndoExposed = S.Exposed;
    S.UndoCarried = S.Carried;
    // Waited means something only for a posted invalidation; elsewhere it
    // would only split states.
    S.UndoWaited = S.L == Life::InvalPosted && S.Waited;
  }

  /// The handle was produced on this walk's path (not before the function).
  static bool ownProduced(const PathState &S) {
    return S.Produced && S.Produced != &EntryMarker;
  }

  /// Evidence at \p At that the slot holds a handle this path did not
  /// produce: the resting state it started from is real here. Kept only
  /// where the function may drop the handle, so as not to split paths.
  void provenHeld(const Walk &W, PathState &S, const Stmt *At) {
    if (holds(S.L) && !ownProduced(S) && !S.HeldAt && dropsSlot(W.Fn, W.Slot))
      S.HeldAt = At;
  }

  /// Does \p Fn overwrite, clear or re-produce \p Slot itself?
  bool dropsSlot(const FunctionDecl *Fn, const SlotKey &Slot) {
    auto [It, New] = Drops.try_emplace({Fn, Slot}, false);
    if (New)
      It->second = llvm::any_of(LC.Events, [&](const LifeEvent &E) {
        return E.Fn == Fn && E.Slot == Slot &&
               (E.K == LifeEventKind::Clear || E.K == LifeEventKind::Overwrite ||
                E.K == LifeEventKind::Produce);
      });
    return It->second;
  }

  /// A handle produced here that nothing else keeps: not a cache entry
  /// filled on first use.
  static bool ownFresh(const PathState &S) {
    return ownProduced(S) && !S.Produced->Lazy;
  }

  /// `free(b->host); ...; ibv_dereg_mr(b->mr)`: the registration stood
  /// when its memory was freed, and the peer's key with it.
  void freedBeforeDeregister(Walk &W, const LifeEvent &Dereg, PathState &S) {
    const LifeEvent *Freed = S.FreedLive;
    S.FreedLive = nullptr;
    S.FreedVia = nullptr;
    if (!Freed)
      return;
    // Already reported at the free (the key was out): say where the
    // deregistration came too late.
    if (S.Reported) {
      for (LifeIncident &I : W.R.Incidents)
        if (I.At == Freed && I.K == LifeIncident::ReleaseWhileExposed && !I.Anchor)
          I.Invalidation = &Dereg;
      return;
    }
    LifeIncident I;
    I.K = LifeIncident::ReleaseWhileExposed;
    I.Slot = W.Slot;
    I.Fn = W.Fn;
    I.At = Freed;
    I.Invalidation = &Dereg;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = W.Own;
    addIncident(W, I);
    S.Reported = true;
  }

  /// Is \p Slot registered with remote rights by a registration whose key
  /// stays valid until deregistration (ibv_reg_mr, not a fast-reg MR)?
  bool remoteUntilDeregistered(const SlotKey &Slot) {
    auto [It, New] = RemoteRegistered.try_emplace(Slot, false);
    if (New)
      It->second = llvm::any_of(LC.Events, [&](const LifeEvent &E) {
        return E.K == LifeEventKind::Produce && E.Slot == Slot && E.Remote &&
               !E.Reusable && !E.Window && E.By == Effect::MrRegister;
      });
    return It->second;
  }

  void release(Walk &W, const LifeEvent &E, PathState &S) {
    bool Parked = E.Parked || (E.ListParam && llvm::is_contained(W.Consts, std::make_pair(
                                                   E.ListParam, int64_t(1))));
    if (Parked) { // kept by the list: neither leaked nor reused
      S.L = Life::Released;
      S.Pending = nullptr;
      return;
    }
    // Memory allocated on this path, while the handle was bound over other
    // memory elsewhere: not the handle's.
    if (E.FreshMemory)
      return;
    if (E.K == LifeEventKind::BufferRelease && !S.FreedLive &&
        (S.L == Life::Unknown || S.L == Life::Live || S.L == Life::Exposed) &&
        remoteUntilDeregistered(W.Slot))
      S.FreedLive = &E, S.FreedVia = nullptr;
    // Memory that is no longer (or never was, on this path) behind the
    // handle: `ibv_rereg_mr()` moved it, or another buffer was mapped.
    if (E.K == LifeEventKind::BufferRelease && S.Bound && E.Binding &&
        S.Bound != E.Binding)
      return;
    // Memory that may be behind the handle: wrong only while its
    // invalidation is still in flight.
    if (E.Guessed) {
      if (S.L == Life::InvalPosted && !S.Waited && !S.Reported) {
        incident(W, LifeIncident::ReleaseBeforeInvalidated, &E, S);
        S.Reported = true;
      }
      return;
    }
    if (E.K == LifeEventKind::BufferRelease)
      provenHeld(W, S, E.S);
    auto &[Invalidated, Bare] = W.Releases[&E];
    if (holds(S.L) || S.L == Life::Unknown)
      LC.Holding.insert(&E);
    switch (S.L) {
    case Life::Exposed:
      if (trustsCompletion(W, S)) {
        Invalidated = true;
        break;
      }
      if (!S.Reported)
        incident(W, S.Mismatch ? LifeIncident::ReleaseAfterMismatch
                               : LifeIncident::ReleaseWhileExposed,
                 &E, S);
      S.Reported = true;
      break;
    case Life::InvalPosted:
      if (!S.Waited && !S.Reported) {
        incident(W, LifeIncident::ReleaseBeforeInvalidated, &E, S);
        S.Reported = true;
      }
      Invalidated = true;
      break;
    case Life::Claimed:
    case Life::Invalidated:
      Invalidated = true;
      break;
    case Life::Unknown:
      if (!Bare)
        Bare = S;
      break;
    default:
      break;
    }
    // The holder of a handle freed (not put back on a free list with its
    // handle): the handle leaks with it.
    if (E.K == LifeEventKind::ContainerRelease && !E.Recycle && holds(S.L) &&
        S.Produced) {
      // A helper's error return left the handle for this caller to release
      // (latent leak): freeing the holder makes the helper's return the leak.
      if (S.Pending)
        addIncident(W, *S.Pending);
      else
        incident(W, LifeIncident::LeakOverwrite, &E, S);
      keyOutlivesMemory(W, S);
    }
    // Unmapping the memory does not end the handle; the rest do.
    if (E.K != LifeEventKind::BufferRelease) {
      S.L = Life::Released;
      S.Pending = nullptr;
    }
  }

  /// A release reached both with and without an invalidation on the way.
  void flushReleases(Walk &W) {
    for (const auto &[E, Seen] : W.Releases)
      if (Seen.first && Seen.second)
        incident(W, LifeIncident::ReleaseSkipsInvalidation, E, *Seen.second);
  }

  /// An unwinding loop over an array of handles (`while (i--)
  /// ibv_dereg_mr(mr[i])`) releases every element, however often it runs.
  void loopReleases(Walk &W, const Stmt *Loop, PathState &S) {
    if (!holds(S.L))
      return;
    // Left the producing loop from inside an iteration that already holds
    // its element: an unwinding loop that starts below the current index
    // (`while (--i >= 0)`, `while (i--)`, `j < i`) misses that element.
    if (S.ProducingLoop && !coversCurrent(Loop))
      return;
    if (!isa<ForStmt>(Loop) && !isa<WhileStmt>(Loop) && !isa<DoStmt>(Loop))
      return;
    if (const LifeEvent *E = releaseInLoop(W, Loop))
      if (E->K == LifeEventKind::Deregister || E->K == LifeEventKind::Release ||
          E->K == LifeEventKind::ContainerRelease || E->K == LifeEventKind::Call) {
        S.L = Life::Released;
        S.Pending = nullptr;
      }
  }

  /// A loop that posts a LOCAL_INV for each element of an array of handles
  /// (`for (i = n, pfr = list; i > 0; i--, pfr++) inv_rkey((*pfr)->mr->rkey)`)
  /// leaves every element with its invalidation posted, however often it
  /// ran; only a post that failed inside it left a key valid.
  void loopInvalidates(Walk &W, const Stmt *Loop, PathState &S) {
    if (S.L != Life::Exposed && S.L != Life::Live && S.L != Life::Unknown)
      return;
    if (S.Outcome == 1 && S.Tag && within(Loop, S.Tag))
      return;
    if (LoopInvalidationFact F = invalidationInLoop(W, Loop); F.Inval) {
      S.L = Life::InvalPosted;
      S.Inval = F.Inval;
      S.Signaled = F.Signaled;
      S.Waited = F.Waited;
    }
  }

  bool within(const Stmt *Outer, const Stmt *Inner) const {
    SourceRange R = Outer->getSourceRange();
    return A.sources().isPointWithin(Inner->getBeginLoc(), R.getBegin(), R.getEnd());
  }

  /// Is \p S followed, in a block of \p Loop's body, by a return, goto or
  /// break?
  bool leavesLoopAfter(const FunctionDecl *Fn, const Stmt *Loop, const Stmt *S) {
    const ParentMap &PM = A.flow(Fn).parents();
    const Stmt *Child = S;
    for (const Stmt *P = PM.getParent(S); P && Child != Loop; Child = P, P = PM.getParent(P)) {
      const auto *Block = dyn_cast<CompoundStmt>(P);
      if (!Block)
        continue;
      bool After = false;
      for (const Stmt *Sub : Block->body()) {
        if (After && (isa<ReturnStmt>(Sub) || isa<GotoStmt>(Sub) || isa<BreakStmt>(Sub)))
          return true;
        After |= Sub == Child;
      }
    }
    return false;
  }

  /// `while (pending > 0) ibv_poll_cq(..)` after the LOCAL_INVs: a loop
  /// that waits for completions until its condition says none is missing
  /// has, when it ends, what it waited for, even on a path that never ran
  /// it (the count it tests is what tells, not the path).
  bool waitLoop(Walk &W, const Stmt *Loop, const PathState &S) {
    if (S.Inval && S.Inval->S && S.Inval->Fn == W.Fn && within(Loop, S.Inval->S))
      return false; // the loop that posts: its own rounds are judged
    return llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return E.K == LifeEventKind::Wait && E.Fn == W.Fn && E.S && within(Loop, E.S);
    });
  }

  /// The element-wise invalidation of the walk's slot in a loop's body:
  /// whether it asks for a completion, and whether the body waits for it
  /// (a helper that posts and then sleeps until the LOCAL_INV completed).
  struct LoopInvalidationFact {
    const LifeEvent *Inval = nullptr;
    bool Signaled = false, Waited = false;
  };

  LoopInvalidationFact invalidationInLoop(Walk &W, const Stmt *Loop) {
    auto Key = std::make_pair(Loop, W.Slot);
    auto [It, New] = LoopInvalidation.try_emplace(Key);
    if (!New)
      return It->second;
    for (const LifeEvent &E : LC.Events) {
      if (E.Fn != W.Fn || !E.S || !within(Loop, E.S))
        continue;
      if (E.K == LifeEventKind::InvalidatePost && E.Slot == W.Slot && !E.Stable)
        return It->second = {&E, E.Signaled, false};
      if (E.K != LifeEventKind::Call || Active.count(E.Callee) ||
          W.Depth >= budget::CallDepth)
        continue;
      // The helper gets the key of each round's handle (`inv(q->reqs[i].rkey)`)
      // or the struct the loop points at each round
      // (`list_for_each_entry(mr, &batch, entry) post_inv(mr)`).
      bool EachRound = llvm::any_of(E.KeyArgs, [&](const LifeEvent::KeyArg &K) {
        return K.Slot == W.Slot && !K.Stable;
      });
      if (!EachRound && E.KeyArgs.empty())
        EachRound = objectLoop(W.Fn, E.S, W.Slot, /*Dispatch=*/false) == Loop ||
                    passesElement(cast<CallExpr>(E.S), W.Slot);
      if (!EachRound)
        continue;
      std::optional<SlotKey> In = calleeSlot(W.Fn, W.Slot, E);
      if (!In)
        continue;
      const Result &R = summary(E.Callee, *In, entryState({Life::Live, true, false}),
                                W.Depth + 1, argConstants(W, E));
      LoopInvalidationFact F;
      for (const Exit &X : R.Exits)
        if (X.S.L == Life::InvalPosted && (!F.Inval || (F.Waited && !X.S.Waited)))
          F = {X.S.Inval && X.S.Inval != &EntryMarker ? X.S.Inval : &E,
               X.S.Signaled, X.S.Waited};
      if (F.Inval)
        return It->second = F;
    }
    return It->second;
  }

  /// The innermost loop around \p S in \p Fn.
  const Stmt *enclosingLoop(const FunctionDecl *Fn, const Stmt *S) {
    return ulplint::enclosingLoop(A.flow(Fn).parents(), S);
  }

  /// Does an unwinding loop's first round use the index the path stopped
  /// at? `while (i >= 0) { ...; i--; }` and `j <= i` do; `while (--i >=
  /// 0)`, `while (i--)` and `j < i` start one below.
  static bool coversCurrent(const Stmt *Loop) {
    const Expr *Cond = nullptr;
    if (const auto *W = dyn_cast<WhileStmt>(Loop))
      Cond = W->getCond();
    else if (const auto *F = dyn_cast<ForStmt>(Loop))
      Cond = F->getCond();
    if (!Cond)
      return true;
    bool Decrements = false, Strict = false;
    std::function<void(const Stmt *)> Scan = [&](const Stmt *S) {
      if (!S)
        return;
      if (const auto *UO = dyn_cast<UnaryOperator>(S))
        Decrements |= UO->isDecrementOp();
      if (const auto *BO = dyn_cast<BinaryOperator>(S))
        Strict |= BO->getOpcode() == BO_LT;
      for (const Stmt *Sub : S->children())
        Scan(Sub);
    };
    Scan(Cond);
    return !Decrements && !(isa<ForStmt>(Loop) && Strict);
  }

  /// An event in \p Loop's body that releases the walk's slot.
  const LifeEvent *releaseInLoop(Walk &W, const Stmt *Loop) {
    auto Key = std::make_pair(Loop, W.Slot);
    auto It = LoopRelease.find(Key);
    if (It != LoopRelease.end())
      return It->second;
    const LifeEvent *Found = nullptr;
    for (const LifeEvent &E : LC.Events) {
      if (E.Fn != W.Fn || !E.S || !within(Loop, E.S))
        continue;
      // A release on a branch that then leaves the loop undoes one round
      // (`if (map fails) { put(d); return; }`), it unwinds nothing.
      if (leavesLoopAfter(W.Fn, Loop, E.S))
        continue;
      // Named through the loop's index (`mrs[i]`, a cursor): each round
      // releases another one.
      if ((E.K == LifeEventKind::Deregister || E.K == LifeEventKind::Release ||
           E.K == LifeEventKind::ContainerRelease) &&
          E.Slot == W.Slot && !E.Stable)
        Found = &E;
      if (E.K == LifeEventKind::Call && callReleases(W, E))
        Found = &E;
    }
    return LoopRelease[Key] = Found;
  }

  /// Does the helper call \p E release the walk's slot on every path?
  bool callReleases(Walk &W, const LifeEvent &E) {
    std::optional<SlotKey> In = calleeSlot(W.Fn, W.Slot, E);
    if (!In || Active.count(E.Callee) || W.Depth >= budget::CallDepth)
      return false;
    const Result &R = summary(E.Callee, *In, entryState({Life::Live, true, false}),
                              W.Depth + 1, argConstants(W, E));
    return !R.Exits.empty() && llvm::all_of(R.Exits, [](const Exit &X) {
      return X.S.L == Life::Released;
    });
  }

  /// A root that does nothing to the slot but call \p Call's helper, which
  /// nothing else calls (`check_timeouts()` -> `rma_timeout(w)`, `exit()` ->
  /// `region_destroy(srv)`): the path that goes wrong is the helper's own,
  /// and its finding stays in the helper.
  bool helperAlone(const Walk &W, const LifeEvent &Call) {
    if (!llvm::is_contained(Roots, W.Fn) || Touches[W.Fn].count(W.Slot) ||
        A.callersOf(Call.Callee).size() != 1)
      return false;
    return llvm::none_of(Callees[W.Fn], [&](const LifeEvent *C) {
      return C != &Call && sharedTouched(C->Callee).count(W.Slot);
    });
  }

  /// Applies the helper's summary at its call.
  void call(Walk &W, const LifeEvent &E, const PathState &S,
            std::vector<PathState> &Out) {
    const auto *CE = cast<CallExpr>(E.S);
    std::optional<SlotKey> In = calleeSlot(W.Fn, W.Slot, E);
    if (!In || Active.count(E.Callee)) {
      Out.push_back(S); // the helper cannot name the slot, or recursion
      return;
    }
    if (W.Depth >= budget::CallDepth) {
      LC.Incomplete.insert(W.Fn);
      Out.push_back(S);
      return;
    }
    const Result &R = summary(E.Callee, *In, S, W.Depth + 1,
                              argConstants(W, E));
    for (const LifeIncident &I : R.Incidents) {
      // Wrong because of the state the helper was called in: this call is
      // where the mistake is made.
      LifeIncident J = boundIncident(I, S, CE);
      if (fromEntry(I) && J.K == LifeIncident::ReleaseWhileExposed &&
          trustsCompletion(W, S))
        continue;
      // This path already reported its missing or unawaited invalidation:
      // the helper's release is the same mistake.
      if (fromEntry(I) && S.Reported && J.K != LifeIncident::LeakAtReturn &&
          J.K != LifeIncident::LeakOverwrite)
        continue;
      if (fromEntry(I) && unconfirmed(S) != LifeIncident::Confirmed)
        J.Unconfirmed = unconfirmed(S);
      // A handle this function did not produce either, overwritten by the
      // helper: the helper's statement is the mistake (dlm_space_grow's
      // `s->mr = nmr` reached from a poll loop), not this call.
      // So is a helper's that replaces the handle itself (a grow: free the
      // old memory, register the new, store it over the old handle).
      bool Replaces = (I.K == LifeIncident::LeakOverwrite ||
                       I.K == LifeIncident::ReleaseWhileExposed) &&
                      I.At && producesInto(I.At->Fn, I.Slot);
      bool HelpersOwn = (I.K == LifeIncident::LeakOverwrite && S.Produced == &EntryMarker) ||
                        (I.K == LifeIncident::ReleaseWhileExposed && helperAlone(W, E)) ||
                        Replaces;
      // A timeout or reaper loop in the helper picks its own objects
      // (`for (..) { s = &pool->slots[i]; if (expired) put(s); }`): the
      // state it found them in is theirs, not this caller's.
      // Unless this path posted or saw something for the object itself
      // (`isx_task_release(task)` right after the task's LOCAL_INV).
      if (fromEntry(I) && !HelpersOwn &&
          (!picksOwnObject(E.Callee, I) ||
           (S.L != Life::Unknown && !picksFromConnection(E.Callee, I)))) {
        J.Anchor = CE;
        J.AnchorFn = W.Fn;
        J.OwnFailure = failedHere(W, S);
        // Released by the helper after this function saw another key
        // invalidated: the completion is finished after the mismatch.
        if (J.K == LifeIncident::ReleaseWhileExposed && S.Mismatch) {
          J.K = LifeIncident::ReleaseAfterMismatch;
          J.Mismatch = S.Mismatch;
        }
      }
      addIncident(W, J);
    }
    bool Both = llvm::any_of(R.Exits, [](const Exit &X) { return X.Error; }) &&
                llvm::any_of(R.Exits, [](const Exit &X) { return !X.Error; });
    // The helper is given the registration this path staged
    // (`rtrs_post_send_rdma(.., &rwr.wr)`): when it fails, none went out.
    bool HandOff = S.Tag == CE && S.Outcome == 0;
    // `if (post(..) || wait_for(..))`: a waiting helper that fails saw the
    // request this path posted complete in error, or not at all. Only for
    // a post that changed the slot: otherwise undoing it would split paths
    // for nothing (qperf's loops hit the budget).
    bool WaitFailed = Both && S.Tag && S.Tag != CE && S.Outcome != 1 &&
                      S.Undo != S.L && isPost(S.Tag) && waitsFor(E.Callee);
    // `inv_rkey(q, req->rkey); end_request(req);`: a caller that drops the
    // helper's result never learns that it failed, so the path where it
    // failed before changing the handle (the post failed, no credit was
    // left) is not one this function takes apart from the other.
    bool Discarded = Both && discardsResult(W.Fn, CE) &&
                     llvm::any_of(R.Exits, [&](const Exit &X) {
                       return !X.Error && X.S.L != S.L;
                     });
    for (const Exit &X : R.Exits) {
      if (Discarded && X.Error && (X.NotPosted || X.S.PostFailed || X.S.L == S.L))
        continue;
      PathState N = applied(X.S, S);
      N.FreedVia = !N.FreedLive ? nullptr
                   : N.FreedLive != S.FreedLive ? CE : S.FreedVia;
      if (N.Pending && N.Pending != S.Pending)
        N.Pending = latent(boundIncident(*N.Pending, S, CE));
      bool Undone = false;
      if (Both) {
        if ((HandOff || WaitFailed) && X.Error && N.L == S.L) {
          N.L = S.Undo; // as undoTag(S): the caller's state before the call
          N.Exposed = S.UndoExposed;
          N.Carried = S.UndoCarried;
          N.Waited = S.UndoWaited;
          N.PostFailed = true;
          Undone = true;
        }
        N.Tag = CE;
        N.Outcome = X.Error ? 1 : -1;
      } else {
        N.Tag = S.Tag;
        N.Outcome = S.Outcome;
        N.Undo = S.Undo;
        N.UndoExposed = S.UndoExposed;
        N.PostFailed = S.PostFailed;
      }
      N.IterLoop = S.IterLoop;
      if (!Undone && (N.L != S.L || (S.Carried && !N.Carried)))
        enterIteration(W, CE, N);
      Out.push_back(N);
    }
  }

  /// Is the value of \p CE thrown away (a statement of its own, or cast to
  /// void)?
  bool discardsResult(const FunctionDecl *Fn, const CallExpr *CE) {
    const ParentMap &PM = A.flow(Fn).parents();
    const Stmt *P = PM.getParentIgnoreParenCasts(CE);
    if (const auto *C = dyn_cast_or_null<CStyleCastExpr>(PM.getParent(CE)))
      if (C->getType()->isVoidType())
        return true;
    return !P || isa<CompoundStmt>(P) || isa<LabelStmt>(P) || isa<CaseStmt>(P) ||
           isa<DefaultStmt>(P) ||
           ((isa<IfStmt>(P) || isa<ForStmt>(P) || isa<WhileStmt>(P)) &&
            !isConditionOf(P, CE));
  }

  static bool isConditionOf(const Stmt *P, const Expr *E) {
    const Expr *Cond = conditionOf(P);
    return Cond && Cond->IgnoreParenImpCasts() == E;
  }

  /// The loop \p Term (an `&&` or `||` of its condition) jumps out of
  /// when it goes to \p To, or null.
  const Stmt *loopLeftEarly(Walk &W, const Stmt *Term, const CFGBlock &To) {
    const auto *BO = dyn_cast_or_null<BinaryOperator>(Term);
    if (!BO || !BO->isLogicalOp())
      return nullptr;
    const ParentMap &PM = A.flow(W.Fn).parents();
    const Stmt *Child = BO;
    for (const Stmt *P = PM.getParent(BO); P; Child = P, P = PM.getParent(P)) {
      if (!isa<ForStmt, WhileStmt>(P)) {
        if (!isa<Expr>(P))
          return nullptr;
        continue;
      }
      if (const Expr *Cond = conditionOf(P))
        return Cond == Child && loopExit(W.Fn, P) == &To ? P : nullptr;
    }
    return nullptr;
  }

  /// The block a loop goes to when its condition fails.
  const CFGBlock *loopExit(const FunctionDecl *Fn, const Stmt *Loop) {
    auto [It, New] = LoopExits.try_emplace(Loop, nullptr);
    if (New)
      for (const CFGBlock *B : *A.flow(Fn).cfg())
        if (B && B->getTerminatorStmt() == Loop && B->succ_size() == 2)
          It->second = B->succ_begin()[1].getReachableBlock();
    return It->second;
  }

  /// Is \p Cond part of a macro that also waits (`wait_event(wq, cond)`)?
  bool inWaitMacro(const Expr *Cond) {
    if (!Cond->getBeginLoc().isMacroID())
      return false;
    const SourceManager &SM = A.sources();
    if (!WaitMacros) {
      WaitMacros.emplace();
      for (const LifeEvent &E : LC.Events)
        if (E.K == LifeEventKind::Wait && E.S && E.S->getBeginLoc().isMacroID())
          WaitMacros->insert(SM.getExpansionLoc(E.S->getBeginLoc()));
    }
    return WaitMacros->count(SM.getExpansionLoc(Cond->getBeginLoc()));
  }

  /// Round a loop that takes another object: what the last iteration
  /// learned about its own post and completion does not carry over.
  static void startNextObject(PathState &S) {
    S.Tag = nullptr;
    S.Outcome = 0;
    S.Undo = Life::None;
    S.UndoExposed = nullptr;
    S.UndoCarried = S.UndoWaited = false;
    S.PostFailed = false;
    S.ErrorBranch = nullptr;
    S.Mismatch = nullptr;
    S.WcFailed = false;
  }

  static bool endsHandle(LifeEventKind K) {
    return K == LifeEventKind::Deregister || K == LifeEventKind::Release ||
           K == LifeEventKind::BufferRelease || K == LifeEventKind::ContainerRelease;
  }

  /// The slot's state was set at \p At: by this iteration, if \p At is in
  /// a loop that takes another object each time round.
  void enterIteration(const Walk &W, const Stmt *At, PathState &S) {
    S.Carried = false;
    // Only a state a later release could be judged against needs to know
    // its iteration; the others stay one state (path budget).
    bool Matters = holds(S.L) || S.L == Life::Unknown;
    S.IterLoop = At && Matters ? objectLoop(W.Fn, At, W.Slot) : nullptr;
  }

  /// The innermost loop around \p At that points a local at another struct
  /// of \p Slot's type each time round, or null. \p Dispatch: also a loop
  /// that hands each completion to a handler (it takes another object each
  /// time round too, but not every object: it says nothing of all of them).
  const Stmt *objectLoop(const FunctionDecl *Fn, const Stmt *At, const SlotKey &Slot,
                         bool Dispatch = true) {
    const RecordDecl *RD = Slot.record();
    if (!RD)
      return nullptr;
    const ParentMap &PM = A.flow(Fn).parents();
    for (const Stmt *P = PM.getParent(At); P; P = PM.getParent(P)) {
      if (!isa<ForStmt>(P) && !isa<WhileStmt>(P) && !isa<DoStmt>(P))
        continue;
      if (Dispatch && handsOutCompletions(P, Slot))
        return P;
      auto [It, New] = ObjectLoops.try_emplace({P, RD}, false);
      if (New)
        It->second = llvm::any_of(A.flow(Fn).defs(), [&](const Def &D) {
          const auto *VD = dyn_cast_or_null<VarDecl>(D.Target.Root);
          if (!VD || isa<ParmVarDecl>(VD) || !D.Target.Steps.empty() || !D.S ||
              !within(P, D.S))
            return false;
          // `void *ctx = WRID_PTR(wc[i].wr_id)`: each completion of a poll
          // loop names its own object, whatever it is cast to later.
          if (D.K == Def::Assign && readsWrId(D.Value))
            return true;
          if (!VD->getType()->isPointerType())
            return false;
          const RecordDecl *Pointee = VD->getType()->getPointeeType()->getAsRecordDecl();
          return Pointee && Pointee->getCanonicalDecl() == RD->getCanonicalDecl();
        });
      if (It->second)
        return P;
    }
    return nullptr;
  }

  /// A loop handing completions to handlers, and the structs it hands
  /// them unchanged each time round (`c` in `handle_wc(c, &wc[i])`).
  struct DispatchLoop {
    llvm::SmallPtrSet<const clang::TagDecl *, 4> Fixed;
  };

  /// `for (i = 0; i < n; i++) handle_wc(q, &wc[i]);`, `while
  /// (ibv_poll_cq(cq, 1, &wc) > 0) handle_wc(&wc);`: each time round a
  /// handler of the unit gets another completion, so another request; not
  /// another `q`, nor a struct of q's type. Only the innermost loop around
  /// the handler call counts.
  bool handsOutCompletions(const Stmt *Loop, const SlotKey &Slot) {
    auto [It, New] = DispatchLoops.try_emplace(Loop);
    if (New)
      It->second = findHandlersOfEachCompletion(Loop);
    const std::optional<DispatchLoop> &D = It->second;
    if (!D)
      return false;
    const RecordDecl *RD = Slot.record();
    return Slot.isElement() || !RD || !D->Fixed.count(RD->getCanonicalDecl());
  }

  std::optional<DispatchLoop> findHandlersOfEachCompletion(const Stmt *Loop) {
    bool Polls = false, Indexed = false, Handler = false;
    DispatchLoop D;
    auto Pointee = [](QualType T) {
      return T->isPointerType() ? T->getPointeeType() : T;
    };
    std::function<void(const Stmt *)> Visit = [&](const Stmt *St) {
      if (!St)
        return;
      if (const auto *CE = dyn_cast<CallExpr>(St)) {
        const FunctionModel *M = A.modelOf(CE);
        if (M && M->E == Effect::CqPoll)
          Polls = true;
        const FunctionDecl *Callee = CE->getDirectCallee();
        if (!M && Callee && Callee->hasBody())
          for (const Expr *Arg : CE->arguments()) {
            QualType T = Pointee(Arg->getType());
            const StructModel *SM = A.structOf(T);
            if (SM && SM->Role == StructRole::Wc) {
              Handler = true;
              Indexed |= indexes(Arg);
            } else if (const RecordDecl *RD = T->getAsRecordDecl();
                       RD && !varies(Arg)) {
              D.Fixed.insert(RD->getCanonicalDecl());
            }
          }
      }
      for (const Stmt *C : St->children())
        if (C && !isa<ForStmt>(C) && !isa<WhileStmt>(C) && !isa<DoStmt>(C))
          Visit(C); // an inner loop is the one that takes them one by one
    };
    Visit(Loop);
    if (!Handler || !(Indexed || Polls))
      return std::nullopt;
    return D;
  }

  /// Might \p E name another object each time round (`&q->reqs[i]`,
  /// `lookup(q, tag)`)? `q`, `&q->conn` do not.
  static bool varies(const Stmt *E) {
    if (isa<ArraySubscriptExpr>(E) || isa<CallExpr>(E))
      return true;
    return llvm::any_of(E->children(),
                        [](const Stmt *C) { return C && varies(C); });
  }

  /// `post_inv(ctx, &ctx->slots[i], 0)`: the helper gets another struct of
  /// the slot's type each time round.
  static bool passesElement(const CallExpr *CE, const SlotKey &Slot) {
    const RecordDecl *RD = Slot.record();
    if (!RD)
      return false;
    return llvm::any_of(CE->arguments(), [&](const Expr *Arg) {
      QualType T = Arg->getType();
      const RecordDecl *Pointee =
          T->isPointerType() ? T->getPointeeType()->getAsRecordDecl() : nullptr;
      return Pointee && Pointee->getCanonicalDecl() == RD->getCanonicalDecl() &&
             indexes(Arg);
    });
  }

  /// `&wc[i]`, `wc + i`, `wc[i]`.
  static bool indexes(const Expr *E) {
    E = E->IgnoreParenImpCasts();
    if (const auto *UO = dyn_cast<UnaryOperator>(E))
      E = UO->getSubExpr()->IgnoreParenImpCasts();
    if (const auto *BO = dyn_cast<BinaryOperator>(E))
      return BO->isAdditiveOp();
    return isa<ArraySubscriptExpr>(E);
  }

  /// A fresh state for a new handle; what the path learned of the
  /// settings it tested stays.
  static PathState restarted(const PathState &S) {
    PathState N;
    N.Decided = S.Decided;
    return N;
  }

  /// Records, or checks against the record, the outcome of a test of a
  /// setting this function tests more than once and never writes: the
  /// creation under `if (user_param->aes_xts)` and the unwinding under the
  /// same test go the same way. False when this edge contradicts it.
  bool decideSetting(const Walk &W, const Expr *Cond, bool Then, PathState &S) {
    bool Negated = false;
    std::optional<SettingTest> T = settingTest(W.Fn, stripNegation(Cond, Negated));
    if (!T || settingsOf(W.Fn).Counts.count(*T) < 2)
      return true;
    // Only settings that guard something done to the walk's slot somewhere
    // are worth the states they split.
    if (!guardingSettings(W).count(*T))
      return true;
    bool Holds = Then != Negated;
    for (const auto &[Known, Value] : S.Decided)
      if (Known == *T)
        return Value == Holds;
    if (S.Decided.size() < budget::DecidedSettings) {
      S.Decided.push_back({*T, Holds});
      llvm::sort(S.Decided);
    }
    return true;
  }

  /// The settings some `if` of the walk's function tests around an event
  /// of the walk's slot.
  const std::set<SettingTest> &guardingSettings(const Walk &W) {
    auto [It, New] = GuardingSettings.try_emplace({W.Fn, W.Slot});
    if (New)
      for (const auto &[Branch, T] : settingsOf(W.Fn).Branches)
        if (isa<IfStmt>(Branch) && guardsSlot(W, Branch))
          It->second.insert(T);
    return It->second;
  }

  /// Does the statement \p Term branches in hold an event of the walk's
  /// slot, or a call of a helper that has one?
  bool guardsSlot(const Walk &W, const Stmt *Term) {
    auto [It, New] = Guards.try_emplace({Term, W.Slot}, false);
    if (!New)
      return It->second;
    return It->second = llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      if (E.Fn != W.Fn || !E.S || !within(Term, E.S))
        return false;
      if (E.Slot == W.Slot)
        return true;
      return E.K == LifeEventKind::Call && E.Callee && W.Slot.isShared() &&
             sharedTouched(E.Callee).count(W.Slot) != 0;
    });
  }

  /// `p->use_odp`, `user_param->verb == SEND`, `!c->oneshot`: a test of an
  /// integer field or variable against nothing or a constant. Asked on
  /// every branch a path takes, so remembered per condition.
  std::optional<SettingTest> settingTest(const FunctionDecl *Fn, const Expr *E) {
    if (auto It = SettingOfCond.find(E); It != SettingOfCond.end())
      return It->second;
    // Not emplaced before computing: building settingsOf(Fn) asks again.
    std::optional<SettingTest> T = computeSettingTest(Fn, E);
    return SettingOfCond[E] = T;
  }

  std::optional<SettingTest> computeSettingTest(const FunctionDecl *Fn, const Expr *E) {
    E = stripExpr(E);
    std::optional<int64_t> Equals;
    if (const auto *BO = dyn_cast<BinaryOperator>(E); BO && BO->getOpcode() == BO_EQ) {
      if (auto C = A.values(Fn).constant(BO->getRHS()))
        Equals = *C, E = stripExpr(BO->getLHS());
      else if (auto C = A.values(Fn).constant(BO->getLHS()))
        Equals = *C, E = stripExpr(BO->getRHS());
      else
        return std::nullopt;
    }
    if (!isa<MemberExpr, DeclRefExpr>(E) || !E->getType()->isIntegralOrEnumerationType())
      return std::nullopt;
    std::optional<Location> L = locationOf(E);
    if (!L || (L->Steps.empty() && !isa<ParmVarDecl>(L->Root) &&
               !(isa<VarDecl>(L->Root) && cast<VarDecl>(L->Root)->hasGlobalStorage())))
      return std::nullopt;
    SlotKey Key = SlotKey::of(A.flow(Fn).resolve(*L), Fn);
    if (settingsOf(Fn).Written.count(Key))
      return std::nullopt;
    return SettingTest{Key, Equals};
  }

  /// What \p Fn writes, and the branches (`if`, `?:`) in which it tests a
  /// setting, built once per function.
  struct Settings {
    std::set<SlotKey> Written;
    std::vector<std::pair<const Stmt *, SettingTest>> Branches;
    std::multiset<SettingTest> Counts;
  };

  const Settings &settingsOf(const FunctionDecl *Fn) {
    auto [It, New] = SettingsOf.try_emplace(Fn);
    if (!New)
      return It->second;
    for (const Def &D : A.flow(Fn).defs())
      It->second.Written.insert(SlotKey::of(A.flow(Fn).resolve(D.Target), Fn));
    std::vector<std::pair<const Stmt *, const Expr *>> Conds;
    std::function<void(const Stmt *)> Visit = [&](const Stmt *St) {
      if (!St)
        return;
      if (const auto *If = dyn_cast<IfStmt>(St))
        Conds.push_back({If, If->getCond()});
      else if (const auto *CO = dyn_cast<ConditionalOperator>(St))
        Conds.push_back({CO, CO->getCond()});
      for (const Stmt *C : St->children())
        Visit(C);
    };
    Visit(Fn->getBody());
    // settingTest() looks at Written only, which is complete by now.
    for (const auto &[Branch, Cond] : Conds) {
      bool Negated = false;
      if (std::optional<SettingTest> T = settingTest(Fn, stripNegation(Cond, Negated))) {
        It->second.Branches.push_back({Branch, *T});
        It->second.Counts.insert(*T);
      }
    }
    return It->second;
  }

  /// Does \p Fn return the constant 0 somewhere?
  bool returnsZero(const FunctionDecl *Fn) {
    auto [It, New] = ReturnsZero.try_emplace(Fn, false);
    if (New)
      It->second = llvm::any_of(returnValues(Fn), [&](const Expr *V) {
        std::optional<int64_t> C = A.values(Fn).constant(stripExpr(V));
        return C && *C == 0;
      });
    return It->second;
  }

  /// Does \p E read a work completion's wr_id?
  bool readsWrId(const Stmt *E) {
    if (!E)
      return false;
    if (const auto *ME = dyn_cast<MemberExpr>(E))
      if (std::optional<FieldStore> F = A.classifyMember(ME);
          F && F->Role == FieldRole::WcWrId)
        return true;
    return llvm::any_of(E->children(), [&](const Stmt *C) { return readsWrId(C); });
  }

  /// The integer arguments of \p CE that are constants here: literals, or
  /// this function's own parameters when its caller passed constants.
  ArgConstants argConstants(const Walk &W, const LifeEvent &Call) {
    const auto *CE = cast<CallExpr>(Call.S);
    const FunctionDecl *Callee = Call.Callee;
    ArgConstants Out;
    // A list the caller passes that the unit only walks: 1 (see release()).
    for (unsigned I : Call.WalkedListArgs)
      if (I < Callee->getNumParams())
        Out.push_back({Callee->getParamDecl(I), 1});
    for (unsigned I = 0; I < CE->getNumArgs() && I < Callee->getNumParams(); ++I) {
      const ParmVarDecl *P = Callee->getParamDecl(I);
      if (!P->getType()->isIntegralOrEnumerationType())
        continue;
      const Expr *Arg = stripExpr(CE->getArg(I));
      std::optional<int64_t> V = A.values(W.Fn).constant(Arg);
      if (const auto *DRE = dyn_cast<DeclRefExpr>(Arg); !V && DRE)
        for (const auto &[Q, C] : W.Consts)
          if (Q == DRE->getDecl())
            V = C;
      if (V)
        Out.push_back({P, *V});
    }
    return Out;
  }

  /// `if (can_wait)` / `if (!force)` on a parameter the caller passed as a
  /// constant: whether the test holds.
  std::optional<bool> constantTest(const Walk &W, const Expr *Cond) {
    if (W.Consts.empty())
      return std::nullopt;
    bool Negated = false;
    Cond = stripNegation(Cond, Negated);
    const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Cond));
    if (!DRE)
      return std::nullopt;
    for (const auto &[P, V] : W.Consts)
      if (P == DRE->getDecl())
        return (V != 0) != Negated;
    return std::nullopt;
  }

  //===-- Branches ----------------------------------------------------------===//

  /// Follows a branch; false when this state cannot take it.
  bool edge(Walk &W, const CFGBlock &From, unsigned Index, const CFGBlock &To,
            PathState &S) {
    const Stmt *Term = From.getTerminatorStmt();
    // `for (i = 0; q->reqs && i < n; i++)`: leaving from the first half of
    // the condition leaves the loop as well.
    const Stmt *Loop = Term;
    unsigned Way = Index; // 1: out of the loop
    if (const Stmt *Left = loopLeftEarly(W, Term, To)) {
      Loop = Left;
      Way = 1;
    }
    // Leaving an unwinding loop: every element it releases is released,
    // whatever the count (the body's own path reports its incidents).
    bool LoopTest = Loop && (isa<ForStmt>(Loop) || isa<WhileStmt>(Loop) || isa<DoStmt>(Loop));
    // An element seen in one iteration says nothing of the next one's.
    if (LoopTest && W.Slot.isElement())
      S.HeldAt = nullptr;
    // Round a loop that takes another object each time, the state is the
    // last object's; leaving it, it holds for every object the loop took.
    if (LoopTest && Loop == S.IterLoop) {
      if (Way == 0)
        startNextObject(S);
      else
        S.IterLoop = nullptr;
      S.Carried = Way == 0;
    }
    // Around again: the element held now belongs to a finished iteration.
    if (LoopTest && Way == 0 && Loop == S.ProducingLoop)
      S.ProducingLoop = nullptr;
    if (LoopTest && Way == 1) {
      if (S.L == Life::InvalPosted && !S.Waited && waitLoop(W, Loop, S))
        S.Waited = true;
      if (Loop == S.ProducingLoop)
        S.ProducingLoop = nullptr; // every iteration completed
      else
        loopReleases(W, Loop, S);
      loopInvalidates(W, Loop, S);
    }
    const Expr *Cond = From.succ_size() == 2 ? From.getLastCondition() : nullptr;
    if (const auto *Switch = dyn_cast_or_null<SwitchStmt>(Term))
      return switchEdge(W, Switch, To, S);
    if (!Cond)
      return true;
    // `wait_event(wq, cond)` tests its condition before it waits: a path
    // that finds it true has what it would have waited for.
    if (inWaitMacro(Cond))
      S.Waited = true;
    bool Then = Index == 0;
    if (std::optional<bool> Holds = constantTest(W, Cond); Holds && *Holds != Then)
      return false; // `if (can_wait)` with the caller's `true`
    if (!decideSetting(W, Cond, Then, S))
      return false; // `if (p->aes_xts)` went the other way before
    if (auto Null = nullTest(W, Cond)) {
      if (*Null == Then && S.L != Life::Escaped) {
        S.L = Life::None;
        S.Produced = nullptr;
        S.Pending = nullptr;
      } else if (*Null != Then) {
        provenHeld(W, S, Cond);
      }
    }
    if (S.Tag)
      if (auto Failed = failedCall(W, Cond, S.Tag)) {
        bool FailedHere = *Failed == Then;
        if ((S.Outcome == 1 && !FailedHere) || (S.Outcome == -1 && FailedHere))
          return false; // the helper's other outcome takes this branch
        if (S.Outcome == 0 && FailedHere) {
          undoTag(S); // the post that changed the slot failed
          if (waitsWithTimeout(S.Tag))
            S.Waited = false; // the wait gave up
        }
        S.Outcome = FailedHere ? 1 : -1;
      }
    if (const auto *If = dyn_cast_or_null<IfStmt>(Term)) {
      acceptRemoteInvalidation(W, If, Then, S);
      trustInvalidationFlag(W, If, Then, S);
      if (Then && (exitsEarly(To) || endsInExit(If->getThen())))
        S.ErrorBranch = If;
    }
    compareKeys(W, Cond, Term, Then, S);
    if (std::optional<bool> Failed = completionFailed(Cond, Then)) {
      S.WcFailed = *Failed;
      if (!*Failed && S.InvUnconfirmed) {
        S.InvUnconfirmed = false;
        if (S.L == Life::Exposed)
          S.L = Life::Invalidated;
      }
    }
    // `if (wc->opcode == IBV_WC_LOCAL_INV)`, `if ((wc->wr_id & 3) == INV)`
    if (holds(S.L))
      if (const auto *BO = dyn_cast<BinaryOperator>(stripExpr(Cond)); BO && BO->isEqualityOp())
        if ((BO->getOpcode() == BO_EQ) == Then &&
            (invalidationCompleted(W, BO->getLHS(), BO->getRHS()) ||
             invalidationCompleted(W, BO->getRHS(), BO->getLHS())))
          S.L = Life::Invalidated;
    return true;
  }

  /// `switch (wc->opcode) { case IB_WC_LOCAL_INV: ... }`: the invalidation
  /// of the request's key completed in that case.
  bool switchEdge(Walk &W, const SwitchStmt *Switch, const CFGBlock &To,
                  PathState &S) {
    const auto *Case = dyn_cast_or_null<CaseStmt>(To.getLabel());
    if (Case && holds(S.L) && invalidationCompleted(W, Switch->getCond(), Case->getLHS()))
      S.L = Life::Invalidated;
    return true;
  }

  /// Does `Subject == Value` hold for the completion of a LOCAL_INV: its
  /// opcode (IB_WC_LOCAL_INV), or the tag its wr_id carries?
  bool invalidationCompleted(Walk &W, const Expr *Subject, const Expr *Value) {
    if (completionOpcode(W, Subject, Value) == Opcode::LocalInv)
      return true;
    if (InvTags.empty() || !readsWrId(W, Subject))
      return false;
    auto C = A.values(W.Fn).constant(Value);
    return C && InvTags.count(*C);
  }

  /// `wc->wr_id`, `wc->wr_id & 3`, a cast or copy of it.
  bool readsWrId(Walk &W, const Expr *E, unsigned Depth = 0) {
    E = stripExpr(E);
    if (!E || Depth > 4)
      return false;
    if (const auto *BO = dyn_cast<BinaryOperator>(E))
      return (BO->getOpcode() == BO_And || BO->getOpcode() == BO_Shr) &&
             readsWrId(W, BO->getLHS(), Depth + 1);
    std::optional<Location> L = locationOf(E);
    if (!L)
      return false;
    if (auto F = A.classify(*L); F && F->Role == FieldRole::WcWrId)
      return true;
    if (L->Steps.empty())
      for (const Def *D : A.flow(W.Fn).reaching(*L, E))
        if (D && D->K == Def::Assign && D->Value && readsWrId(W, D->Value, Depth + 1))
          return true;
    return false;
  }

  /// The completion opcode \p Value names when \p Subject reads one.
  std::optional<Opcode> completionOpcode(Walk &W, const Expr *Subject,
                                         const Expr *Value) {
    if (!Fields.isCompletionOpcode(W.Fn, Subject))
      return std::nullopt;
    const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Value));
    if (!DRE)
      return std::nullopt;
    return A.rules().completionOpcodeOf(DRE->getDecl()->getName());
  }

  /// `if (req->need_inv) post_local_inv(req); else complete(req);`: a flag
  /// the ULP keeps for whether the key still needs invalidating (nvme-rdma's
  /// mr->need_inval), or a state compared with a constant
  /// (`if (t->state == T_EXPOSED) local_inv(t);`, no else). Where the flag
  /// says no, the key is taken as dead.
  void trustInvalidationFlag(Walk &W, const IfStmt *If, bool Then, PathState &S) {
    if (S.L != Life::Exposed)
      return;
    bool Negated = false;
    const Expr *Cond = stripNegation(If->getCond(), Negated);
    // A compared state guards the invalidation only when nothing else is
    // done otherwise: `if (op->kind == LEASE) inv(op); else put(op);`
    // dispatches on the kind of I/O, and its else is not a dead key.
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond);
        BO && BO->isEqualityOp()) {
      if (If->getElse())
        return;
      const Expr *L = stripExpr(BO->getLHS()), *R = stripExpr(BO->getRHS());
      if (A.values(W.Fn).constant(L))
        std::swap(L, R);
      if (!A.values(W.Fn).constant(R))
        return;
      Cond = L;
      Negated ^= BO->getOpcode() == BO_NE;
    }
    std::optional<Location> Flag = locationOf(Cond);
    if (!Flag || Flag->Steps.empty() || isHandleType(A, Cond->getType()) ||
        !Cond->getType()->isScalarType())
      return;
    const Stmt *Invalidating = Negated ? If->getElse() : If->getThen();
    bool TakesOther = Negated ? Then : !Then;
    if (!Invalidating || !TakesOther || !invalidatesIn(W, Invalidating))
      return;
    S.L = Life::Invalidated;
  }

  /// Does \p Branch post a LOCAL_INV of the walk's slot (itself or through a
  /// helper)?
  bool invalidatesIn(Walk &W, const Stmt *Branch) {
    const SourceManager &SM = A.sources();
    SourceRange R = Branch->getSourceRange();
    for (const LifeEvent &E : LC.Events) {
      if (E.Fn != W.Fn || !E.S ||
          !SM.isPointWithin(E.S->getBeginLoc(), R.getBegin(), R.getEnd()))
        continue;
      if (E.K == LifeEventKind::InvalidatePost && E.Slot == W.Slot)
        return true;
      if (E.K == LifeEventKind::Call && Invalidators.count(E.Callee))
        return true;
    }
    return false;
  }

  /// The accepting branch of a WITH_INVALIDATE test.
  void acceptRemoteInvalidation(Walk &W, const IfStmt *If, bool Then,
                                PathState &S) {
    for (const Lifecycle::RemoteInvalidation &R : LC.RemoteInvs) {
      if (R.If != If || R.AcceptThen != Then || !holds(S.L))
        continue;
      if (!R.Checked) {
        S.L = Life::Invalidated; // trusted (rdma-remote-invalidate-unchecked)
        continue;
      }
      if (R.Slots.empty() || llvm::is_contained(R.Slots, W.Slot))
        if (S.L == Life::Exposed || S.L == Life::Live)
          S.L = Life::Claimed;
    }
  }

  /// `wc->ex.invalidate_rkey != req->mr->rkey`: the claim holds on one
  /// branch and is false on the other.
  /// Does taking this branch of \p Cond mean the completion failed
  /// (`wc->status != IB_WC_SUCCESS`, `if (wc->status)`)? Null when the
  /// condition does not test a completion's status.
  std::optional<bool> completionFailed(const Expr *Cond, bool Then) {
    bool Negated = false;
    Cond = stripNegation(Cond, Negated);
    if (!Cond)
      return std::nullopt;
    auto IsStatus = [&](const Expr *E) {
      const auto *ME = dyn_cast<MemberExpr>(stripExpr(E));
      std::optional<FieldStore> F = ME ? A.classifyMember(ME) : std::nullopt;
      return F && F->Role == FieldRole::WcStatus;
    };
    std::optional<bool> FailedOnTrue;
    if (IsStatus(Cond))
      FailedOnTrue = true;
    else if (const auto *BO = dyn_cast<BinaryOperator>(stripExpr(Cond));
             BO && BO->isEqualityOp() && (IsStatus(BO->getLHS()) || IsStatus(BO->getRHS())))
      FailedOnTrue = BO->getOpcode() == BO_NE;
    if (!FailedOnTrue)
      return std::nullopt;
    return (*FailedOnTrue != Negated) == Then;
  }

  /// A unit that invalidates a slot after each I/O ends its requests from
  /// completions once the invalidation is done (nvme-rdma's send and
  /// response completions, xprtrdma's LOCAL_INV completion). A release on
  /// a completion's success path is trusted to come after the
  /// invalidation; on its failure path it is the skipped invalidation.
  /// Only the function that sees the completion can tell its outcome: a
  /// helper it calls is judged at the call.
  bool trustsCompletion(const Walk &W, const PathState &S) {
    // The invalidated rkey turned out to be another key, or the post that
    // would have invalidated it failed on this path (`ret = inv_rkey(..);
    // if (ret < 0) end_request(req)`): nothing came after an invalidation.
    return AfterUse.count(W.Slot) && !S.WcFailed && !S.Mismatch && !S.PostFailed &&
           !S.InvUnconfirmed &&
           handlesCompletion(W.Fn);
  }

  /// Does \p Fn receive a completion (a work completion parameter, or a
  /// wr_cqe done callback)?
  bool handlesCompletion(const FunctionDecl *Fn) {
    return takesCompletion(A, Fn) || DoneCallbacks.count(Fn) != 0;
  }

  void compareKeys(Walk &W, const Expr *Cond, const Stmt *Term, bool Then,
                   PathState &S) {
    bool Negated = false;
    Cond = stripNegation(Cond, Negated);
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond); BO && BO->isLogicalOp()) {
      compareKeysIn(W, BO, Term, Then != Negated, S);
      return;
    }
    auto It = LC.KeyCompares.find(Cond);
    if (It == LC.KeyCompares.end() || It->second.Slot != W.Slot)
      return;
    bool Match = (It->second.EqualWhenTrue != Negated) == Then;
    if (Match && (S.L == Life::Claimed || S.L == Life::Exposed))
      S.L = Life::Invalidated;
    else if (!Match && S.L == Life::Claimed) {
      S.L = Life::Exposed;
      S.Mismatch = Term;
    }
  }

  /// `unlikely(!req->mr || wc->ex.invalidate_rkey != req->mr->rkey)`,
  /// branched on as a whole: when \p Value is false every operand is; when
  /// an `||` holds and its other operands test the handle for NULL (false
  /// while it is held), the key compare holds.
  void compareKeysIn(Walk &W, const BinaryOperator *BO, const Stmt *Term, bool Value,
                     PathState &S) {
    llvm::SmallVector<const Expr *, 4> Ops;
    std::function<void(const Expr *)> Flatten = [&](const Expr *E) {
      const auto *Sub = dyn_cast<BinaryOperator>(stripExpr(E));
      if (Sub && Sub->getOpcode() == BO->getOpcode())
        return Flatten(Sub->getLHS()), Flatten(Sub->getRHS());
      Ops.push_back(E);
    };
    Flatten(BO);
    bool Or = BO->getOpcode() == BO_LOr;
    if (Or != Value) { // every operand has the value of the whole
      for (const Expr *Op : Ops)
        compareKeys(W, Op, Term, Value, S);
      return;
    }
    if (!Or || !holds(S.L))
      return;
    const Expr *Rest = nullptr;
    for (const Expr *Op : Ops) {
      if (nullTest(W, Op) == std::optional<bool>(true))
        continue; // `!req->mr`: false while the handle is held
      if (Rest)
        return; // two operands that may hold
      Rest = Op;
    }
    if (Rest)
      compareKeys(W, Rest, Term, true, S);
  }

  const Expr *stripNegation(const Expr *Cond, bool &Negated) {
    for (;;) {
      Cond = stripExpr(Cond);
      if (const auto *UO = dyn_cast<UnaryOperator>(Cond);
          UO && UO->getOpcode() == UO_LNot) {
        Negated = !Negated;
        Cond = UO->getSubExpr();
        continue;
      }
      if (const auto *CE = dyn_cast<CallExpr>(Cond))
        if (const FunctionDecl *F = CE->getDirectCallee();
            F && F->getBuiltinID() && CE->getNumArgs() >= 1) {
          Cond = CE->getArg(0); // __builtin_expect(!!(x), 0)
          continue;
        }
      return Cond;
    }
  }

  /// For a null test of the walk's handle: true when the then-branch is the
  /// null side, false when the else-branch is.
  std::optional<bool> nullTest(Walk &W, const Expr *Cond, unsigned Depth = 0) {
    if (!Cond || Depth > budget::NullTestDepth)
      return std::nullopt;
    bool Negated = false;
    Cond = stripNegation(Cond, Negated);
    auto Flip = [&](std::optional<bool> R) {
      return R ? std::optional<bool>(*R != Negated) : std::nullopt;
    };
    if (const auto *SE = dyn_cast<StmtExpr>(Cond)) {
      const CompoundStmt *CS = SE->getSubStmt();
      if (!CS->body_empty())
        if (const auto *Last = dyn_cast<Expr>(CS->body_back()))
          return Flip(nullTest(W, Last, Depth + 1));
      return std::nullopt;
    }
    if (const auto *CE = dyn_cast<CallExpr>(Cond)) {
      const FunctionModel *M = A.modelOf(CE);
      if (M && M->E == Effect::ErrorPointerTest)
        if (std::optional<unsigned> P = M->arg(ArgRole::Ptr))
          if (*P < CE->getNumArgs() && names(W, CE->getArg(*P)))
            return Flip(true);
      return std::nullopt;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      // `if (!(mr = ibv_reg_mr(...)))` tests what it stores.
      if (BO->getOpcode() == BO_Assign)
        return Flip(names(W, BO->getLHS()) ? std::optional<bool>(false)
                                           : std::nullopt);
      if (BO->getOpcode() == BO_Comma)
        return Flip(nullTest(W, BO->getRHS(), Depth + 1));
      if (!BO->isEqualityOp())
        return std::nullopt;
      auto Tested = [&](const Expr *E) { return names(W, E) || holdsArray(W, E); };
      const Expr *Other = Tested(BO->getLHS())   ? BO->getRHS()
                          : Tested(BO->getRHS()) ? BO->getLHS()
                                                 : nullptr;
      if (!Other || !Other->isNullPointerConstant(
                        const_cast<ASTContext &>(A.context()),
                        Expr::NPC_ValueDependentIsNotNull))
        return std::nullopt;
      return Flip(BO->getOpcode() == BO_EQ);
    }
    if (names(W, Cond) || holdsArray(W, Cond) || gateFlag(W, Cond))
      return Flip(false); // `if (mr)`: null on the else side
    // `bool __ret = !!(!mr); if (unlikely(__ret))`
    if (auto L = locationOf(Cond); L && L->Steps.empty() &&
                                    !isHandleType(A, Cond->getType())) {
      auto Defs = A.flow(W.Fn).reaching(*L, Cond);
      if (Defs.size() == 1 && Defs[0] && Defs[0]->K == Def::Assign)
        return Flip(nullTest(W, Defs[0]->Value, Depth + 1));
    }
    return std::nullopt;
  }

  /// `if (!conn->ff_res_alloc) return;` in a release helper: a flag that
  /// says the struct holds the walk's handle.
  bool gateFlag(Walk &W, const Expr *E) {
    auto L = locationOf(E);
    if (!L || L->Steps.empty() || !stripExpr(E)->getType()->isIntegralOrEnumerationType())
      return false;
    return gatesOf(W.Slot).count(SlotKey::of(A.flow(W.Fn).resolve(*L), W.Fn)) != 0;
  }

  /// Integer fields next to a handle field that are set to a nonzero
  /// constant only after the handle was produced (`conn->pdu_data_mr =
  /// ibv_reg_mr(..); ...; conn->ff_res_alloc = 1;`): while they are zero,
  /// the struct holds no handle.
  const std::set<SlotKey> &gatesOf(const SlotKey &Slot) {
    auto [It, New] = Gates.try_emplace(Slot);
    if (!New || Slot.scope() != SlotKey::Scope::Field || Slot.isElement())
      return It->second;
    std::map<SlotKey, bool> AfterProduce;
    for (const FunctionDecl *Fn : A.functions())
      for (const Def &D : A.flow(Fn).defs()) {
        if (D.K != Def::Assign || !D.Value || D.Target.Steps.empty() ||
            !D.Target.Steps.back().Field ||
            !D.Target.Steps.back().Field->getType()->isIntegralOrEnumerationType())
          continue;
        SlotKey Flag = SlotKey::of(A.flow(Fn).resolve(D.Target), Fn);
        if (!sibling(Flag, Slot))
          continue;
        std::optional<int64_t> V = A.values(Fn).constant(D.Value);
        if (!V || *V == 0)
          continue;
        bool After = producedBefore(Fn, Slot, D.S);
        auto [F, Inserted] = AfterProduce.try_emplace(Flag, After);
        F->second = F->second && After;
      }
    for (const auto &[Flag, Ok] : AfterProduce)
      if (Ok)
        It->second.insert(Flag);
    return It->second;
  }

  /// A field of the struct object that holds the handle, or of one it is
  /// embedded in: `conn.ff_res_alloc` for `conn.pdu_data_mr`,
  /// `desc.pi_ctx` for `desc.rsc.sig_mr`.
  static bool sibling(const SlotKey &A, const SlotKey &B) {
    if (A.scope() != SlotKey::Scope::Field || A.record() != B.record() ||
        A.path().size() > B.path().size() || A == B)
      return false;
    return std::equal(A.path().begin(), A.path().end() - 1, B.path().begin());
  }

  /// Does \p Fn produce \p Slot before \p S (in source order)?
  bool producedBefore(const FunctionDecl *Fn, const SlotKey &Slot, const Stmt *S) {
    return llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return E.K == LifeEventKind::Produce && E.Fn == Fn && E.Slot == Slot && E.S &&
             A.sources().isBeforeInTranslationUnit(E.S->getBeginLoc(), S->getBeginLoc());
    });
  }

  /// `b->pmr` for the slot `b->pmr[j]`: a NULL array holds no handle.
  bool holdsArray(Walk &W, const Expr *E) {
    auto L = locationOf(E);
    if (!L || !stripExpr(E)->getType()->isPointerType() || !W.Slot.isElement())
      return false;
    SlotKey Array = slotOf(A, *L, W.Fn);
    return Array.valid() && Array != W.Slot && W.Slot.isWithin(Array);
  }

  bool names(Walk &W, const Expr *E) {
    auto L = locationOf(E);
    return L && isHandleType(A, stripExpr(E)->getType()) &&
           slotOf(A, *L, W.Fn) == W.Slot;
  }

  /// True when \p Cond holds when \p Call failed (`if (ret)` after `ret =
  /// ib_post_send(...)`, `if (!p)` after `p = helper()`), false for the
  /// opposite test, nullopt when unrelated.
  std::optional<bool> failedCall(Walk &W, const Expr *Cond, const Stmt *Call) {
    bool Negated = false;
    Cond = stripNegation(Cond, Negated);
    bool Pointer = false;
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (BO->getOpcode() == BO_NE || BO->getOpcode() == BO_LT)
        Cond = stripExpr(BO->getLHS()); // ret != 0, ret < 0
      else if (BO->getOpcode() == BO_EQ &&
               BO->getRHS()->isNullPointerConstant(
                   const_cast<ASTContext &>(A.context()),
                   Expr::NPC_ValueDependentIsNotNull)) {
        Cond = stripExpr(BO->getLHS()); // p == NULL
        Negated = !Negated;
      } else
        return std::nullopt;
    }
    if (Cond->getType()->isPointerType() || Cond->getType()->isBooleanType() ||
        waitsWithTimeout(Call))
      Pointer = true; // a pointer, a bool or a time left: true on success
    auto Result = [&](bool TrueMeansFailure) {
      return std::optional<bool>(TrueMeansFailure != Negated);
    };
    // `err = read ? read_req(r) : write_req(r)`: the arm this path took is
    // the tagged call.
    auto IsCall = [&](const Expr *V) {
      V = stripExpr(V);
      if (const auto *CO = dyn_cast<ConditionalOperator>(V))
        return stripExpr(CO->getTrueExpr()) == Call ||
               stripExpr(CO->getFalseExpr()) == Call;
      return V == Call;
    };
    if (IsCall(Cond))
      return Result(!Pointer);
    if (auto L = locationOf(Cond))
      for (const Def *D : A.flow(W.Fn).reaching(*L, Cond))
        if (D && D->K == Def::Assign && IsCall(D->Value))
          return Result(!Pointer);
    return std::nullopt;
  }

  /// Does \p Fn (or a helper it calls) wait for completions?
  bool waitsFor(const FunctionDecl *Fn, unsigned Depth = 0) {
    auto [It, New] = Waits.try_emplace(Fn, false);
    if (!New || Depth > budget::CallDepth)
      return It->second;
    bool Found = llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return E.Fn == Fn && (E.K == LifeEventKind::Wait ||
                            (E.K == LifeEventKind::Call && E.Callee != Fn &&
                             waitsFor(E.Callee, Depth + 1)));
    });
    return Waits[Fn] = Found;
  }

  bool waitsWithTimeout(const Stmt *Call) {
    const auto *CE = dyn_cast<CallExpr>(Call);
    const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
    return M && M->E == Effect::WaitCompletionTimeout;
  }

  /// `{ pr_err(..); return ret == -ENOMEM ? BUSY : IOERR; }`: a branch
  /// written to end in a return or goto, however many blocks its last
  /// expression takes.
  static bool endsInExit(const Stmt *S) {
    const Stmt *Last = lastStatement(S);
    return isa_and_nonnull<ReturnStmt>(Last) || isa_and_nonnull<GotoStmt>(Last);
  }

  /// A block that leaves the function early: a goto, or a return of a
  /// value within a couple of blocks.
  static bool exitsEarly(const CFGBlock &B) {
    const CFGBlock *Cur = &B;
    for (unsigned Hops = 0; Cur && Hops < budget::ErrorExitHops; ++Hops) {
      if (isa_and_nonnull<GotoStmt>(Cur->getTerminatorStmt()))
        return true;
      for (const CFGElement &El : *Cur)
        if (auto CS = El.getAs<CFGStmt>())
          if (isa<ReturnStmt>(CS->getStmt()))
            return true;
      Cur = Cur->succ_size() == 1 ? Cur->succ_begin()->getReachableBlock() : nullptr;
    }
    return false;
  }

  //===-- Exits -------------------------------------------------------------===//

  /// A return of an error: a negative constant, `-err`, NULL, false, the
  /// failed result of the tagged call, or any value on a path through an
  /// early-exit branch.
  bool errorReturn(Walk &W, const ReturnStmt *RS, const PathState &S) {
    if (!RS || !RS->getRetValue())
      return S.ErrorBranch != nullptr;
    const Expr *V = stripExpr(RS->getRetValue());
    // `return false;` of a bool function: C's `false` is an int 0.
    if (auto C = A.values(W.Fn).constant(V)) {
      if (V->getType()->isBooleanType() || W.Fn->getReturnType()->isBooleanType())
        return *C == 0;
      // perftest's `return FAILURE;` (1) after `goto err`, in a function
      // that returns SUCCESS (0) when it gets through.
      // Only a plain int: a status type (blk_status_t) says more itself.
      if (*C > 0 && S.ErrorBranch && isa<BuiltinType>(W.Fn->getReturnType()) &&
          returnsZero(W.Fn))
        return true;
      return *C < 0;
    }
    if (const auto *UO = dyn_cast<UnaryOperator>(V))
      if (UO->getOpcode() == UO_Minus)
        return true;
    if (V->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                 Expr::NPC_ValueDependentIsNotNull))
      return true;
    if (S.Tag && S.Outcome != 0)
      if (failedCall(W, V, S.Tag))
        return S.Outcome == 1;
    const auto *CO = dyn_cast<ConditionalOperator>(V);
    // `return post(..) ? OSD_ERR_IO : OSD_OK;`: the arm this path took,
    // by what it learned of the post when it branched on it.
    if (CO && S.Tag && S.Outcome != 0)
      if (std::optional<bool> TrueFails = failedCall(W, CO->getCond(), S.Tag)) {
        const Expr *Arm = (S.Outcome == 1) == *TrueFails ? CO->getTrueExpr()
                                                         : CO->getFalseExpr();
        if (auto C = A.values(W.Fn).constant(stripExpr(Arm)))
          return W.Fn->getReturnType()->isBooleanType() ? *C == 0 : *C != 0;
      }
    // `return *out ? RC_OK : RC_ERR_NO_MEMORY;`: the handle's own test
    // picks the arm; the side where it is null (learnt on this path) fails.
    if (CO && S.L != Life::Escaped && nullTest(W, CO->getCond()))
      return S.L == Life::None;
    // `return wc.status == IBV_WC_SUCCESS ? 0 : -EIO;`: may succeed.
    if (CO)
      for (const Expr *Arm : {CO->getTrueExpr(), CO->getFalseExpr()})
        if (auto C = A.values(W.Fn).constant(stripExpr(Arm)); C && *C == 0)
          return false;
    return S.ErrorBranch != nullptr;
  }

  void exit(Walk &W, const ReturnStmt *RS, const PathState &S) {
    // `return ib_post_send(...)`: the helper's caller tells the outcomes
    // apart; on the failed one the post changed nothing.
    if (W.M == Mode::Summary && S.Tag && S.Outcome == 0 && RS &&
        RS->getRetValue() && !waitsWithTimeout(S.Tag))
      if (std::optional<bool> Failed = failedCall(W, RS->getRetValue(), S.Tag);
          Failed && *Failed) {
        PathState NotPosted = S, Posted = S;
        undoTag(NotPosted);
        NotPosted.Outcome = 1;
        NotPosted.PostFailed = true;
        Posted.Outcome = -1;
        summaryExit(W, RS, NotPosted, /*Error=*/true, /*NotPosted=*/true);
        summaryExit(W, RS, Posted, /*Error=*/false);
        return;
      }
    bool Error = errorReturn(W, RS, S);
    if (W.M == Mode::Summary) {
      summaryExit(W, RS, S, Error);
      return;
    }
    if (!holds(S.L) || W.Param)
      return;
    if (W.Own) {
      if (ownProduced(S)) {
        addIncident(W, leak(W, RS, S));
        keyOutlivesMemory(W, S);
      }
      return;
    }
    // A shared slot keeps its handle for later; only an error return
    // abandons it.
    if (Error && (S.Pending || (ownFresh(S) && unwinds(W, RS, S)))) {
      addIncident(W, S.Pending ? *S.Pending : leak(W, RS, S));
      keyOutlivesMemory(W, S);
    }
  }

  /// A leak on a path that freed the memory behind a registration with
  /// remote rights (`free(staging); return -1;`, the MR never
  /// deregistered): the peer's key outlives the memory it reaches.
  void keyOutlivesMemory(Walk &W, const PathState &S) {
    // A leak a helper left pending is the helper's, and so is its free.
    const FunctionDecl *Leaker = S.Pending ? S.Pending->Fn : W.Fn;
    if (std::optional<LifeIncident> I = outlivedMemory(W.Slot, Leaker, S)) {
      I->Local = W.Own;
      addIncident(W, *I);
    }
  }

  std::optional<LifeIncident>
  outlivedMemory(const SlotKey &Slot, const FunctionDecl *Fn, const PathState &S) {
    if (!S.FreedLive || S.Reported)
      return std::nullopt;
    LifeIncident I;
    I.K = LifeIncident::ReleaseWhileExposed;
    I.Slot = Slot;
    I.Fn = Fn;
    I.At = S.FreedLive;
    // The registration's key came from the caller when the handle did.
    I.Exposed = S.Produced == &EntryMarker ? &EntryMarker : nullptr;
    I.ErrorBranch = S.ErrorBranch;
    // Freed by a helper of the leaking function: that call is the place.
    if (S.FreedVia && S.FreedLive->Fn != Fn && within(Fn->getBody(), S.FreedVia)) {
      I.Anchor = S.FreedVia;
      I.AnchorFn = Fn;
    }
    return I;
  }

  /// One way out of a helper, as its callers will see it.
  void summaryExit(Walk &W, const ReturnStmt *RS, const PathState &S,
                   bool Error, bool NotPosted = false) {
    Exit X{S, Error, NotPosted};
    X.S.ErrorBranch = nullptr;
    // A handle this helper produced and still holds on an error return:
    // its caller may release it; if not, the helper leaked it.
    if (Error && W.Slot.isShared() && holds(S.L) && ownFresh(S) &&
        !S.Pending && unwinds(W, RS, S))
      X.S.Pending = latent(leak(W, RS, S));
    if (!llvm::any_of(W.R.Exits, [&](const Exit &O) {
          return O.Error == X.Error && O.NotPosted == X.NotPosted && O.S == X.S;
        }))
      W.R.Exits.push_back(X);
  }

  /// Whose job is it to release a handle stored in a struct when the
  /// function fails?
  /// - Nobody's here once the handle went out to the device and the error
  ///   branch hands the state to recovery of another unit (see recovers()).
  /// - The function's, for a per-I/O handle (taken from a pool) whose
  ///   request failed while being prepared: a request never issued never
  ///   completes (nvme-rdma's missing ib_mr_pool_put).
  /// - When the post itself failed, the caller's, if some abort or cleanup
  ///   function of the unit releases the handle, or if nothing here but the
  ///   function itself does (the release lives in another unit); if only a
  ///   completion would, nobody's.
  /// - When a setup failed half-way, the function's if it releases the
  ///   handle on another path itself, or if no cleanup of the unit can run
  ///   after a partial setup (see toleratesPartialSetup()).
  bool unwinds(Walk &W, const ReturnStmt *RS, const PathState &S) {
    if (S.Exposed && recovers(S.ErrorBranch))
      return false;
    bool PostFailed = postFailed(W, RS, S);
    bool Pooled = S.Produced && S.Produced->By == Effect::MrPoolGet;
    if (!PostFailed && Pooled)
      return true;
    // A registration that replaced the slot's previous one (`dereg(c->mr);
    // c->mr = reg(..)`: a buffer that grows) found the struct set up; the
    // teardown that releases the slot owns it as it did the old one, also
    // when a later post fails (the function's own dereg was the old one's).
    bool Replaced = S.Produced && replacesHeld(*S.Produced);
    const Releasers &R = releasersOf(W.Fn, W.Slot, PostFailed || Replaced);
    if (Replaced)
      return !R.Cleanup;
    // A function that deregisters the handle on another of its paths owns
    // it on this one too, whoever cleans up after a failed post.
    if (PostFailed)
      return (R.OwnDereg && !Pooled) || (R.Completion && !R.Cleanup);
    return R.Own || !R.Cleanup;
  }

  /// Who in the unit releases \p Slot: \p Fn itself (and whether by
  /// deregistering it), a function on the completion path, or a cleanup
  /// function; with \p AnyCleanup, every other releasing function is one,
  /// otherwise only those that can run after a partial setup.
  struct Releasers {
    bool Own = false, OwnDereg = false, Completion = false, Cleanup = false;
  };
  const Releasers &releasersOf(const FunctionDecl *Fn, const SlotKey &Slot,
                               bool AnyCleanup) {
    auto [It, New] = ReleasersOf.try_emplace({Fn, Slot, AnyCleanup});
    Releasers &R = It->second;
    if (!New)
      return R;
    for (const LifeEvent &E : LC.Events) {
      bool Releases = E.K == LifeEventKind::Deregister || E.K == LifeEventKind::Release ||
                      (E.K == LifeEventKind::ContainerRelease && !E.Recycle);
      if (!Releases || E.Slot != Slot)
        continue;
      if (E.Fn == Fn) {
        R.Own = true;
        R.OwnDereg |= E.K == LifeEventKind::Deregister;
      } else if (onCompletionPath(E.Fn)) {
        R.Completion = true;
      } else if (AnyCleanup || toleratesPartialSetup(E.Fn)) {
        R.Cleanup = true;
      }
    }
    return R;
  }

  /// Does the function that produced \p P release the same slot before it
  /// (in source order), replacing a handle the struct already held?
  bool replacesHeld(const LifeEvent &P) {
    if (P.K != LifeEventKind::Produce || !P.S || !P.Slot.isShared())
      return false;
    return llvm::any_of(LC.Events, [&](const LifeEvent &E) {
      return (E.K == LifeEventKind::Deregister || E.K == LifeEventKind::Release) &&
             E.Fn == P.Fn && E.Slot == P.Slot && E.S &&
             A.sources().isBeforeInTranslationUnit(E.S->getBeginLoc(),
                                                   P.S->getBeginLoc());
    });
  }

  /// Does the error branch hand a struct to a function of another unit
  /// (`fwm_reset_ctrl(ctrl)`)? Once the handle went out to the device, such
  /// a call is recovery (QP to error, pool destroyed) that takes the handle
  /// with it; the unit cannot see through it. Variadic calls are logging.
  bool recovers(const Stmt *Branch) {
    if (const auto *If = dyn_cast_or_null<IfStmt>(Branch))
      Branch = If->getThen();
    if (!Branch)
      return false;
    if (const auto *CE = dyn_cast<CallExpr>(Branch)) {
      const FunctionDecl *Callee = CE->getDirectCallee();
      const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
      if (Callee && !Callee->isVariadic() && !A.modelOf(CE) &&
          !(Def && llvm::is_contained(A.functions(), Def)) &&
          llvm::any_of(CE->arguments(), [](const Expr *Arg) {
            QualType T = Arg->IgnoreParenImpCasts()->getType();
            return T->isPointerType() && T->getPointeeType()->isRecordType();
          }))
        return true;
    }
    return llvm::any_of(Branch->children(),
                        [&](const Stmt *C) { return recovers(C); });
  }

  /// Can \p Cleanup run after a setup that failed half-way? Only if it
  /// tests some handle before releasing it (`if (d->mr) ib_dereg_mr(d->mr)`);
  /// one that releases everything unconditionally would crash on the
  /// handles never set, so the setup must unwind itself.
  bool toleratesPartialSetup(const FunctionDecl *Cleanup) {
    const ParentMap &PM = A.flow(Cleanup).parents();
    for (const LifeEvent &E : LC.Events) {
      if (E.Fn != Cleanup || !E.S || !E.Slot.isShared() ||
          (E.K != LifeEventKind::Deregister && E.K != LifeEventKind::Release))
        continue;
      // `if (x->mr)` for a field (`if (x->mr[i])`: any field test),
      // `if (g_mr)` for a global handle.
      bool Global = E.Slot.path().empty();
      if (Global && !E.Slot.variable())
        continue;
      const FieldDecl *Field = Global ? nullptr : E.Slot.path().back().Field;
      for (const Stmt *P = PM.getParent(E.S), *Child = E.S; P;
           Child = P, P = PM.getParent(P))
        if (const auto *If = dyn_cast<IfStmt>(P))
          if (If->getCond() != Child &&
              (Global ? mentionsVariable(If->getCond(), E.Slot.variable())
                      : mentionsField(If->getCond(), Field)))
            return true;
    }
    return false;
  }

  static bool mentionsVariable(const Stmt *S, const ValueDecl *V) {
    if (!S)
      return false;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(S); DRE && DRE->getDecl() == V)
      return true;
    return llvm::any_of(S->children(),
                        [&](const Stmt *C) { return mentionsVariable(C, V); });
  }

  static bool mentionsField(const Stmt *S, const FieldDecl *Field) {
    if (!S)
      return false;
    if (const auto *ME = dyn_cast<MemberExpr>(S))
      if (!Field || ME->getMemberDecl() == Field)
        return true;
    return llvm::any_of(S->children(),
                        [&](const Stmt *C) { return mentionsField(C, Field); });
  }

  /// Is this error return the failure of a post: the post's result
  /// returned, or the early exit taken because it failed?
  bool postFailed(Walk &W, const ReturnStmt *RS, const PathState &S) {
    if (S.PostFailed && S.Outcome == 1)
      return true;
    for (const PostSite &P : WorkRequests::of(A).posts()) {
      if (P.Fn != W.Fn)
        continue;
      const Stmt *Post = P.Call->Call;
      if (RS && RS->getRetValue() && failedCall(W, RS->getRetValue(), Post))
        return true;
      if (const auto *If = dyn_cast_or_null<IfStmt>(S.ErrorBranch))
        if (failedCall(W, If->getCond(), Post))
          return true;
    }
    return false;
  }

  /// Does \p From call \p To, directly or through helpers?
  bool reaches(const FunctionDecl *From, const FunctionDecl *To) {
    std::vector<const FunctionDecl *> Work = {From};
    std::set<const FunctionDecl *> Seen = {From};
    while (!Work.empty()) {
      const FunctionDecl *F = Work.back();
      Work.pop_back();
      for (const LifeEvent *C : Callees[F]) {
        if (C->Callee == To)
          return true;
        if (Seen.insert(C->Callee).second)
          Work.push_back(C->Callee);
      }
    }
    return false;
  }

  /// A function that runs when an I/O completes: it receives a completion,
  /// is a work request's done callback, or is called only from those.
  bool onCompletionPath(const FunctionDecl *Fn, unsigned Depth = 0) {
    if (handlesCompletion(Fn))
      return true;
    auto Callers = A.callersOf(Fn);
    if (Callers.empty() || Depth > 4)
      return false;
    return llvm::all_of(Callers, [&](const auto &C) {
      return C.second != Fn && onCompletionPath(C.second, Depth + 1);
    });
  }

  LifeIncident leak(Walk &W, const ReturnStmt *RS, const PathState &S) {
    LifeIncident I;
    I.K = LifeIncident::LeakAtReturn;
    I.Slot = W.Slot;
    I.Fn = W.Fn;
    I.Exit = RS ? static_cast<const Stmt *>(RS) : W.Fn->getBody();
    I.Produced = S.Produced;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = W.Own;
    return I;
  }

  const LifeIncident *latent(const LifeIncident &I) {
    Latent.push_back(I);
    return &Latent.back();
  }

  void incident(Walk &W, LifeIncident::Kind K, const LifeEvent *At,
                const PathState &S) {
    LifeIncident I;
    I.K = K;
    I.Slot = W.Slot;
    I.Fn = W.Fn;
    I.At = At;
    I.Produced = S.Produced;
    I.Exposed = S.Exposed;
    I.Invalidation = S.Inval;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = W.Own;
    I.Mismatch = S.Mismatch;
    I.HeldAt = S.HeldAt;
    I.OwnFailure = failedHere(W, S);
    I.Unconfirmed = unconfirmed(S);
    I.Window = holdsWindow(W.Slot);
    addIncident(W, I);
  }

  /// Is \p Slot a struct field of memory-window type?
  bool holdsWindow(const SlotKey &Slot) const {
    const FieldDecl *F = Slot.path().empty() ? nullptr : Slot.path().back().Field;
    bool Window = false;
    return F && isHandleType(A, F->getType(), &Window) && Window;
  }

  static LifeIncident::Confirmation unconfirmed(const PathState &S) {
    if (!S.InvUnconfirmed || S.L != Life::Exposed)
      return LifeIncident::Confirmed;
    return S.WcFailed ? LifeIncident::InvalidationFailed
                      : LifeIncident::StatusUnchecked;
  }

  /// Did this path see a post (or a helper that posts) of \p W's function
  /// fail?
  bool failedHere(const Walk &W, const PathState &S) const {
    return S.Outcome == 1 && S.Tag && W.Fn->getBody() && within(W.Fn->getBody(), S.Tag);
  }

  void addIncident(Walk &W, const LifeIncident &I) {
    for (const LifeIncident &O : W.R.Incidents)
      if (sameIncident(O, I))
        return;
    W.R.Incidents.push_back(I);
  }

  Lifecycle &LC;
  const TuAnalysis &A;
  CompletionFields Fields{A};
  std::set<SlotKey> SharedSlots, Invalidated;
  std::map<const FunctionDecl *, bool> KeepsStatus, ReturnsZero;
  std::map<const FunctionDecl *, Settings> SettingsOf;
  std::map<const Expr *, std::optional<SettingTest>> SettingOfCond;
  std::map<std::pair<const Stmt *, SlotKey>, bool> Guards;
  std::map<std::pair<const FunctionDecl *, SlotKey>, std::set<SettingTest>> GuardingSettings;
  /// Slots some LOCAL_INV of the unit names.
  std::set<SlotKey> LocallyInvalidated;
  std::map<std::pair<const FunctionDecl *, SlotKey>, bool> Drops;
  /// Slots the unit invalidates after an I/O, not only before reuse.
  std::set<SlotKey> AfterUse;
  std::set<int64_t> InvTags;
  std::set<const FunctionDecl *> Invalidators;
  std::map<std::tuple<const FunctionDecl *, SlotKey, bool>, Releasers> ReleasersOf;
  std::set<const FunctionDecl *> DoneCallbacks;
  std::map<const FunctionDecl *, std::set<SlotKey>> OwnSlots, ParamSlots, Touches,
      SharedTouched, Prepares, InvalidatesIn;
  std::map<const FunctionDecl *, std::vector<const LifeEvent *>> Callees;
  std::vector<const FunctionDecl *> Roots;
  std::set<const FunctionDecl *> InvalidationCallbacks;
  std::set<const FunctionDecl *> Active;
  std::map<std::tuple<const FunctionDecl *, SlotKey, EntryKey, ArgConstants>,
           Result>
      Memo;
  std::map<const FunctionDecl *, ArgConstants> RootConstants;
  std::map<std::pair<const Stmt *, SlotKey>, const LifeEvent *> LoopRelease;
  std::map<SlotKey, std::set<SlotKey>> Gates;
  std::map<SlotKey, bool> RemoteRegistered;
  std::map<const FunctionDecl *, bool> Waits; // waitsFor()
  std::map<std::pair<const Stmt *, const RecordDecl *>, bool> ObjectLoops;
  llvm::DenseMap<const Stmt *, std::optional<DispatchLoop>> DispatchLoops;
  /// Where the user wrote the macros the unit's waits expand from.
  std::optional<std::set<SourceLocation>> WaitMacros;
  std::map<std::pair<const Stmt *, SlotKey>, LoopInvalidationFact> LoopInvalidation;
  std::map<const Stmt *, const CFGBlock *> LoopExits;
  std::deque<LifeIncident> Latent;
};

//===-- Lifecycle ---------------------------------------------------------===//

Lifecycle::Lifecycle(const TuAnalysis &A) : A(A) {
  extractEvents(*this);
  LifeSolver(*this).run();
  if (DumpLifecycle)
    dump(llvm::errs());
  exportFacts();
  reportIncomplete();
}

void Lifecycle::dump(llvm::raw_ostream &OS) const {
  const SourceManager &SM = A.sources();
  auto Line = [&](SourceLocation L) { return SM.getExpansionLineNumber(L); };
  for (const LifeEvent &E : Events)
    OS << E.Fn->getName() << ":" << Line(E.Loc) << " event " << unsigned(E.K)
       << " " << E.Slot.str() << " " << E.What
       << (E.Callee ? " -> " + E.Callee->getName().str() : "")
       << (E.Stable ? "" : " unstable") << (E.Lazy ? " lazy" : "")
       << (E.Remote ? " remote" : "") << "\n";
  for (const LifeIncident &I : Incidents)
    OS << I.Fn->getName() << ":" << Line(I.loc()) << " incident " << unsigned(I.K)
       << " " << I.Slot.str() << "\n";
}

SourceLocation LifeIncident::loc() const {
  if (Anchor)
    return Anchor->getBeginLoc();
  if (At)
    return At->Loc;
  return Exit ? Exit->getBeginLoc() : SourceLocation();
}

std::string LifeIncident::releasedHere() const {
  return "released here, by '" + At->What + "' in '" + At->Fn->getNameAsString() + "'";
}

const char *LifeIncident::handleNoun() const {
  return ulplint::handleNoun(Window || (Produced && Produced->Window) ||
                             (At && At->Window));
}

std::string LifeIncident::what() const {
  // Reported at a helper call: the helper is what the reader sees there.
  if (const auto *CE = dyn_cast_or_null<CallExpr>(Anchor))
    if (const FunctionDecl *Callee = CE->getDirectCallee())
      return Callee->getNameAsString();
  return At ? At->What : std::string();
}

void Lifecycle::reportIncomplete() const {
  UnitFacts *Sink = currentFacts();
  if (!Sink)
    return;
  const SourceManager &SM = A.sources();
  for (const FunctionDecl *Fn : Incomplete) {
    SourceLocation Loc = SM.getExpansionLoc(Fn->getLocation());
    Sink->Incomplete.push_back(
        {SM.getFilename(Loc).str(), SM.getExpansionLineNumber(Loc),
         Fn->getNameAsString(),
         "the registration lifecycle analysis reached its path budget"});
  }
}

const Lifecycle &Lifecycle::of(const TuAnalysis &A) {
  return A.cached<Lifecycle>();
}

bool Lifecycle::has(const SlotKey &Slot, LifeEventKind K,
                    const FunctionDecl *Fn) const {
  if (!Fn)
    return first(Slot, K) != nullptr;
  return llvm::any_of(Events, [&](const LifeEvent &E) {
    return E.K == K && E.Slot == Slot && E.Fn == Fn;
  });
}

const LifeEvent *Lifecycle::first(const SlotKey &Slot, LifeEventKind K) const {
  for (const LifeEvent &E : Events)
    if (E.K == K && E.Slot == Slot)
      return &E;
  return nullptr;
}

void Lifecycle::exportFacts() const {
  const Program &P = Program::of(A);
  for (const LifeEvent &E : Events) {
    if (!E.Slot.isShared())
      continue;
    switch (E.K) {
    case LifeEventKind::Expose:
      P.exportFact(fact(FactKind::Exposes, E.Slot));
      break;
    case LifeEventKind::InvalidatePost:
    case LifeEventKind::InvalidateRemote:
      P.exportFact(fact(FactKind::Invalidates, E.Slot));
      break;
    case LifeEventKind::Deregister:
      P.exportFact(fact(FactKind::Deregisters, E.Slot));
      P.exportFact(fact(FactKind::Releases, E.Slot));
      break;
    case LifeEventKind::Release:
    case LifeEventKind::ContainerRelease:
    case LifeEventKind::Escape:
      P.exportFact(fact(FactKind::Releases, E.Slot));
      break;
    case LifeEventKind::Rotate:
      P.exportFact(fact(FactKind::Rotates, E.Slot));
      break;
    default:
      break;
    }
  }
  for (const RemoteInvalidation &R : RemoteInvs)
    for (const SlotKey &Slot : R.Slots)
      P.exportFact(fact(FactKind::Invalidates, Slot));
}

} // namespace ulplint
