//===- LifeSolver.cpp - Walking each function's paths per handle ----------===//
//
// The third part of the lifecycle model: a path-sensitive walk of each
// function for each slot it touches, over Clang's CFG, recording the
// incidents the lifecycle checks report.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "Program.h"
#include "clang/AST/ASTContext.h"

using namespace clang;

namespace ulplint {

namespace budget {
/// Blocks one function's walk may visit per slot.
constexpr unsigned SolverSteps = 20000;
/// Distinct path states kept at a block's entry.
constexpr unsigned StatesPerBlock = 24;
} // namespace budget

namespace {

enum class Life : uint8_t {
  Unknown,     // from outside the function
  None,        // holds nothing (NULL, or before production)
  Live,        // holds a handle with no remote rights
  Exposed,     // key valid for a peer
  InvalPosted, // LOCAL_INV posted
  Invalidated, // invalidated (remote invalidation accepted)
  Released,
  Escaped,
};

struct PathState {
  Life L = Life::Unknown;
  const LifeEvent *Produced = nullptr;
  const LifeEvent *Exposed = nullptr;
  const LifeEvent *Inval = nullptr;
  const Stmt *ExposedBy = nullptr; // the post call that exposed
  const Stmt *ErrorBranch = nullptr;
  bool Waited = false;

  bool operator<(const PathState &O) const {
    return std::tie(L, Produced, Exposed, Inval, ExposedBy, ErrorBranch, Waited) <
           std::tie(O.L, O.Produced, O.Exposed, O.Inval, O.ExposedBy,
                    O.ErrorBranch, O.Waited);
  }
};

bool holds(Life L) {
  return L == Life::Live || L == Life::Exposed || L == Life::InvalPosted ||
         L == Life::Invalidated;
}

} // namespace

/// Walks one function for one slot and records incidents.
class SlotSolver {
public:
  SlotSolver(Lifecycle &LC, const TuAnalysis &A, const FunctionDecl *Fn,
             const SlotKey &Slot)
      : LC(LC), A(A), Fn(Fn), Slot(Slot), Local(Slot.isLocal()) {}

  void run() {
    const CFG *G = A.flow(Fn).cfg();
    if (!G)
      return;
    std::map<unsigned, std::set<PathState>> In;
    PathState Start;
    Start.L = Local ? Life::None : Life::Unknown;
    In[G->getEntry().getBlockID()].insert(Start);
    std::vector<const CFGBlock *> Work = {&G->getEntry()};
    unsigned Steps = 0;
    while (!Work.empty() && ++Steps < budget::SolverSteps) {
      const CFGBlock *B = Work.back();
      Work.pop_back();
      std::set<PathState> States = In[B->getBlockID()];
      std::set<PathState> Out;
      for (PathState S : States)
        if (block(*B, S))
          Out.insert(S);
      unsigned SuccIndex = 0;
      for (const auto &Succ : B->succs()) {
        const CFGBlock *SB = Succ.getReachableBlock();
        unsigned Index = SuccIndex++;
        if (!SB)
          continue;
        std::set<PathState> &Target = In[SB->getBlockID()];
        size_t Before = Target.size();
        for (PathState S : Out) {
          edge(*B, Index, *SB, S);
          if (Target.size() < budget::StatesPerBlock)
            Target.insert(S);
          else if (!Target.count(S))
            Truncated = true; // a path state dropped: findings may be missing
        }
        if (Target.size() != Before)
          Work.push_back(SB);
      }
      if (B == &G->getExit())
        for (const PathState &S : States)
          exit(nullptr, S);
    }
    if (!Work.empty())
      Truncated = true; // out of steps before the walk converged
    if (Truncated)
      LC.Incomplete.insert(Fn);
    flushReleases();
  }

private:
  /// Applies a block's events; false when the path ends in it.
  bool block(const CFGBlock &B, PathState &S) {
    for (const CFGElement &El : B) {
      auto CS = El.getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *St = CS->getStmt();
      auto It = LC.AtStmt.find(St);
      if (It != LC.AtStmt.end())
        for (size_t I : It->second)
          apply(LC.Events[I], S);
      if (const auto *RS = dyn_cast<ReturnStmt>(St)) {
        exit(RS, S);
        return false;
      }
    }
    return true;
  }

  void apply(const LifeEvent &E, PathState &S) {
    if (E.K == LifeEventKind::Wait) {
      S.Waited = true;
      return;
    }
    if (E.Slot != Slot)
      return;
    switch (E.K) {
    case LifeEventKind::Produce:
      if (holds(S.L) && S.Produced && E.Stable && S.Produced->Stable)
        incident(LifeIncident::LeakOverwrite, &E, S);
      S = PathState{Life::Live, &E, nullptr, nullptr, nullptr, S.ErrorBranch, false};
      break;
    case LifeEventKind::Expose:
      S.L = Life::Exposed;
      S.Exposed = &E;
      S.ExposedBy = E.S;
      break;
    case LifeEventKind::Rotate:
      break;
    case LifeEventKind::InvalidatePost:
      S.L = Life::InvalPosted;
      S.Inval = &E;
      S.Waited = false;
      break;
    case LifeEventKind::InvalidateRemote:
      S.L = Life::Invalidated;
      break;
    case LifeEventKind::Deregister:
      S.L = Life::Released;
      break;
    case LifeEventKind::Release:
    case LifeEventKind::BufferRelease:
    case LifeEventKind::ContainerRelease:
      release(E, S);
      break;
    case LifeEventKind::Clear:
    case LifeEventKind::Overwrite:
      if (holds(S.L) && S.Produced && S.Produced->Stable &&
          (E.K == LifeEventKind::Clear || E.Stable))
        incident(LifeIncident::LeakOverwrite, &E, S);
      S.L = E.K == LifeEventKind::Clear ? Life::None : Life::Unknown;
      S.Produced = nullptr;
      break;
    case LifeEventKind::Escape:
      S.L = Life::Escaped;
      break;
    case LifeEventKind::Wait:
      break;
    }
  }

  void release(const LifeEvent &E, PathState &S) {
    ReleaseSeen &Seen = Releases[&E];
    if (S.L != Life::None && S.L != Life::Released && S.L != Life::Escaped)
      LC.Holding.insert(&E);
    switch (S.L) {
    case Life::Exposed:
      incident(LifeIncident::ReleaseWhileExposed, &E, S);
      break;
    case Life::InvalPosted:
      if (!S.Waited)
        incident(LifeIncident::ReleaseBeforeInvalidated, &E, S);
      Seen.Invalidated = true;
      break;
    case Life::Invalidated:
      Seen.Invalidated = true;
      break;
    case Life::Unknown:
      if (!Seen.Bare)
        Seen.Bare = S;
      break;
    case Life::Live:
      // The holder of a live handle freed: the handle leaks with it.
      if (E.K == LifeEventKind::ContainerRelease && S.Produced)
        incident(LifeIncident::LeakOverwrite, &E, S);
      break;
    default:
      break;
    }
    // Unmapping the memory does not end the handle; the rest do.
    if (E.K != LifeEventKind::BufferRelease)
      S.L = Life::Released;
  }

  /// A release reached both with and without an invalidation on the way.
  void flushReleases() {
    for (const auto &[E, Seen] : Releases)
      if (Seen.Invalidated && Seen.Bare)
        incident(LifeIncident::ReleaseSkipsInvalidation, E, *Seen.Bare);
  }

  void edge(const CFGBlock &From, unsigned Index, const CFGBlock &To,
            PathState &S) {
    const Stmt *Term = From.getTerminatorStmt();
    const auto *If = dyn_cast_or_null<IfStmt>(Term);
    const Expr *Cond = If ? If->getCond() : nullptr;
    if (const auto *CO = dyn_cast_or_null<ConditionalOperator>(Term))
      Cond = CO->getCond();
    if (!Cond || From.succ_size() != 2)
      return;
    bool Then = Index == 0;
    if (auto Null = nullTest(Cond))
      if (*Null == Then && S.L != Life::Escaped) {
        S.L = Life::None;
        S.Produced = nullptr;
      }
    if (S.ExposedBy && failedCall(Cond, S.ExposedBy) == Then &&
        S.L == Life::Exposed) {
      // The post that would have exposed the key failed.
      S.L = Life::Live;
      S.Exposed = nullptr;
      S.ExposedBy = nullptr;
    }
    if (If) {
      // The branch that takes the peer's invalidation as done: the key is
      // dead from here on, as far as this code is concerned.
      for (const Lifecycle::RemoteInvalidation &R : LC.RemoteInvs)
        if (R.If == If && R.AcceptThen == Then &&
            (R.Slots.empty() || llvm::is_contained(R.Slots, Slot)) &&
            S.L != Life::Escaped && S.L != Life::None && S.L != Life::Released)
          S.L = Life::Invalidated;
      if (Then && exitsEarly(To))
        S.ErrorBranch = If;
    }
  }

  /// For a null test of this slot's handle: true when the then-branch is
  /// the null side, false when the else-branch is. Looks through !, !!,
  /// likely()/unlikely(), WARN_ON_ONCE's statement expression and the
  /// boolean locals such macros compute.
  std::optional<bool> nullTest(const Expr *Cond, unsigned Depth = 0) {
    Cond = stripExpr(Cond);
    if (!Cond || Depth > budget::NullTestDepth)
      return std::nullopt;
    if (const auto *UO = dyn_cast<UnaryOperator>(Cond); UO && UO->getOpcode() == UO_LNot) {
      auto Inner = nullTest(UO->getSubExpr(), Depth + 1);
      return Inner ? std::optional<bool>(!*Inner) : std::nullopt;
    }
    if (const auto *SE = dyn_cast<StmtExpr>(Cond)) {
      const CompoundStmt *CS = SE->getSubStmt();
      if (!CS->body_empty())
        if (const auto *Last = dyn_cast<Expr>(CS->body_back()))
          return nullTest(Last, Depth + 1);
      return std::nullopt;
    }
    if (const auto *CE = dyn_cast<CallExpr>(Cond)) {
      const FunctionDecl *F = CE->getDirectCallee();
      if (!F || CE->getNumArgs() < 1)
        return std::nullopt;
      if (F->getBuiltinID()) // __builtin_expect(x, 0)
        return nullTest(CE->getArg(0), Depth + 1);
      const FunctionModel *M = A.modelOf(CE);
      if (M && M->E == Effect::ErrorPointerTest) {
        const Expr *Ptr = CE->getArg(M->arg(ArgRole::Ptr).value_or(0));
        if (names(Ptr))
          return true;
      }
      return std::nullopt;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (!BO->isEqualityOp())
        return std::nullopt;
      const Expr *Other = names(BO->getLHS()) ? BO->getRHS()
                          : names(BO->getRHS()) ? BO->getLHS()
                                                : nullptr;
      if (!Other || !Other->isNullPointerConstant(
                        const_cast<ASTContext &>(A.context()),
                        Expr::NPC_ValueDependentIsNotNull))
        return std::nullopt;
      return BO->getOpcode() == BO_EQ;
    }
    if (names(Cond))
      return false; // `if (mr)`: null on the else side
    // `bool __ret = !!(!mr); if (unlikely(__ret))`
    if (auto L = locationOf(Cond); L && L->Steps.empty() &&
                                    !isHandleType(A, Cond->getType())) {
      auto Defs = A.flow(Fn).reaching(*L, Cond);
      if (Defs.size() == 1 && Defs[0] && Defs[0]->K == Def::Assign)
        return nullTest(Defs[0]->Value, Depth + 1);
    }
    return std::nullopt;
  }

  bool names(const Expr *E) {
    auto L = locationOf(E);
    return L && isHandleType(A, stripExpr(E)->getType()) &&
           slotOf(A, *L, Fn) == Slot;
  }

  /// True when \p Cond holds when \p Call failed (`if (ret)` after
  /// `ret = ib_post_send(...)`), false for the opposite test, nullopt when
  /// unrelated.
  std::optional<bool> failedCall(const Expr *Cond, const Stmt *Call) {
    Cond = stripExpr(Cond);
    bool Negated = false;
    while (true) {
      if (const auto *UO = dyn_cast<UnaryOperator>(Cond);
          UO && UO->getOpcode() == UO_LNot) {
        Negated = !Negated;
        Cond = stripExpr(UO->getSubExpr());
        continue;
      }
      if (const auto *CE = dyn_cast<CallExpr>(Cond);
          CE && CE != Call && CE->getNumArgs() >= 1 && CE->getDirectCallee() &&
          CE->getDirectCallee()->getBuiltinID()) {
        Cond = stripExpr(CE->getArg(0)); // __builtin_expect(!!(ret), 0)
        continue;
      }
      break;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (BO->getOpcode() == BO_NE || BO->getOpcode() == BO_LT)
        Cond = stripExpr(BO->getLHS()); // ret != 0, ret < 0
      else
        return std::nullopt;
    }
    if (Cond == Call)
      return !Negated;
    if (auto L = locationOf(Cond))
      for (const Def *D : A.flow(Fn).reaching(*L, Cond))
        if (D && D->K == Def::Assign && stripExpr(D->Value) == Call)
          return !Negated;
    return std::nullopt;
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

  /// A return of an error: a negative constant, `-err`, or any value on a
  /// path through an early-exit branch.
  bool errorReturn(const ReturnStmt *RS, const PathState &S) {
    if (!RS || !RS->getRetValue())
      return S.ErrorBranch != nullptr;
    const Expr *V = stripExpr(RS->getRetValue());
    if (auto C = A.values(Fn).constant(V))
      return *C < 0;
    if (const auto *UO = dyn_cast<UnaryOperator>(V))
      if (UO->getOpcode() == UO_Minus)
        return true;
    if (V->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                 Expr::NPC_ValueDependentIsNotNull))
      return true;
    return S.ErrorBranch != nullptr;
  }

  void exit(const ReturnStmt *RS, const PathState &S) {
    if (!holds(S.L) || !S.Produced)
      return;
    // A field keeps its handle for later; only an error return abandons it.
    if (!Local && !errorReturn(RS, S))
      return;
    LifeIncident I;
    I.K = LifeIncident::LeakAtReturn;
    I.Slot = Slot;
    I.Fn = Fn;
    I.Exit = RS;
    I.Produced = S.Produced;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = Local;
    add(I);
  }

  void incident(LifeIncident::Kind K, const LifeEvent *At, const PathState &S) {
    LifeIncident I;
    I.K = K;
    I.Slot = Slot;
    I.Fn = Fn;
    I.At = At;
    I.Produced = S.Produced;
    I.Exposed = S.Exposed;
    I.Invalidation = S.Inval;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = Local;
    add(I);
  }

  void add(const LifeIncident &I) {
    for (const LifeIncident &O : LC.Incidents)
      if (O.K == I.K && O.Slot == I.Slot && O.At == I.At && O.Exit == I.Exit)
        return;
    LC.Incidents.push_back(I);
  }

  struct ReleaseSeen {
    bool Invalidated = false;
    std::optional<PathState> Bare;
  };

  Lifecycle &LC;
  const TuAnalysis &A;
  const FunctionDecl *Fn;
  SlotKey Slot;
  bool Local;
  bool Truncated = false;
  std::map<const LifeEvent *, ReleaseSeen> Releases;
};

//===-- Lifecycle ---------------------------------------------------------===//

Lifecycle::Lifecycle(const TuAnalysis &A) : A(A) {
  extractEvents(*this);
  // Solve each function for the slots it touches.
  std::map<const FunctionDecl *, std::set<SlotKey>> Touched;
  for (const LifeEvent &E : Events)
    if (E.Slot.valid())
      Touched[E.Fn].insert(E.Slot);
  for (const auto &[Fn, Slots] : Touched)
    for (const SlotKey &Slot : Slots)
      SlotSolver(*this, A, Fn, Slot).run();
  exportFacts();
  reportIncomplete();
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

bool Lifecycle::has(const SlotKey &Slot, LifeEventKind K) const {
  return first(Slot, K) != nullptr;
}

const LifeEvent *Lifecycle::first(const SlotKey &Slot, LifeEventKind K) const {
  for (const LifeEvent &E : Events)
    if (E.K == K && E.Slot == Slot)
      return &E;
  return nullptr;
}

void Lifecycle::exportFacts() const {
  for (const LifeEvent &E : Events) {
    if (!E.Slot.isShared())
      continue;
    switch (E.K) {
    case LifeEventKind::Expose:
      Program::of(A).exportFact(fact(FactKind::Exposes, E.Slot));
      break;
    case LifeEventKind::InvalidatePost:
    case LifeEventKind::InvalidateRemote:
      Program::of(A).exportFact(fact(FactKind::Invalidates, E.Slot));
      break;
    case LifeEventKind::Deregister:
      Program::of(A).exportFact(fact(FactKind::Deregisters, E.Slot));
      Program::of(A).exportFact(fact(FactKind::Releases, E.Slot));
      break;
    case LifeEventKind::Release:
    case LifeEventKind::ContainerRelease:
    case LifeEventKind::Escape:
      Program::of(A).exportFact(fact(FactKind::Releases, E.Slot));
      break;
    case LifeEventKind::Rotate:
      Program::of(A).exportFact(fact(FactKind::Rotates, E.Slot));
      break;
    default:
      break;
    }
  }
  for (const RemoteInvalidation &R : RemoteInvs)
    for (const SlotKey &Slot : R.Slots)
      Program::of(A).exportFact(fact(FactKind::Invalidates, Slot));
}

} // namespace ulplint
