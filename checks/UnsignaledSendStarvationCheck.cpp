//===- UnsignaledSendStarvationCheck.cpp - rdma-unsignaled-send-starvation ===//

#include "UnsignaledSendStarvationCheck.h"
#include "engine/Program.h"
#include "engine/Slots.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

void UnsignaledSendStarvationCheck::checkUnit(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  checkNeverSignaled(A, W);
  checkStuckCounters(A, W);
}

/// A post of the ULP's own messages or RDMA, not only REG_MR / LOCAL_INV.
static bool postsData(const PostSite &P) {
  return llvm::any_of(P.Chain,
                      [](const WrSlot &S) { return !S.isRegistration(); });
}

/// The field a slot ends in (`qp` of struct tlm_qp_base, wherever that
/// struct is embedded), or null.
static const FieldDecl *lastField(const SlotKey &K) {
  if (!K.valid() || K.path().empty())
    return nullptr;
  return K.path().back().Field;
}

/// The posts of this unit that may be on \p Q: those on storage that holds
/// it (or the same field of an embedded struct), and those on a QP this unit
/// cannot name (a parameter).
static std::vector<const PostSite *> postsMaybeOn(const WorkRequests &W,
                                                  const QpCreation &Q) {
  bool AllNamed = llvm::all_of(W.creations(), [](const QpCreation &C) {
    return C.QpKey.isShared();
  });
  std::vector<const PostSite *> On;
  for (const PostSite &P : W.posts()) {
    const QpCreation *Tied = W.creationFor(P);
    if (!Tied)
      for (const QpCreation &C : W.creations()) {
        const FieldDecl *F = lastField(P.QpKey);
        if (F && llvm::any_of(C.QpNames, [&](const SlotKey &N) { return lastField(N) == F; }))
          Tied = &C;
      }
    if (Tied ? Tied == &Q : !P.QpKey.isShared() || !AllNamed)
      On.push_back(&P);
  }
  return On;
}

void UnsignaledSendStarvationCheck::checkNeverSignaled(const TuAnalysis &A,
                                                       const WorkRequests &W) {
  StringRef FlagText = A.flagName(Flag::Signaled);
  std::string Ulp = Program::of(A).key();
  for (const QpCreation &Q : W.creations()) {
    if (Q.CoreManaged || !Q.SignalAll || *Q.SignalAll)
      continue;
    std::vector<const PostSite *> On = postsMaybeOn(W, Q);
    if (llvm::any_of(On, [](const PostSite *P) { return P->asksForCompletion(); }))
      continue;
    SourceLocation Loc = Q.SignalStore ? Q.SignalStore->Spelling->getBeginLoc() : Q.Call->Call->getBeginLoc();
    // Another file of the ULP may post on this QP, under any name it is
    // kept in (`b->qpx`), and signal there.
    std::vector<std::string> Unless = {WorkRequests::signalsFact("*")};
    for (const SlotKey &Name : Q.QpNames)
      if (Name.isShared())
        Unless.push_back(WorkRequests::signalsFact(Name.str()));
    if (Q.QpKey.isShared())
      Unless.push_back(WorkRequests::signalsFact(Q.QpKey.str()));
    if (On.empty()) {
      reportIfProgram(A, Loc,
                      "only work requests that ask for it are signaled on this "
                      "QP, but no post of this ULP sets " + FlagText.str() +
                          "; completed send-queue entries are never reclaimed "
                          "and posts fail once the queue fills",
                      {factKey(FactKind::Posts, Ulp)}, Unless);
      continue;
    }
    // Only registrations and invalidations here: the requests' own sends
    // are posted in code this unit does not show.
    if (llvm::none_of(On, [](const PostSite *P) { return postsData(*P); }))
      continue;
    if (!reportIfProgram(
            A, Loc,
            "only work requests that ask for it are signaled on this QP, but "
            "no post on it sets " + FlagText.str() +
                "; completed send-queue entries are never reclaimed and posts "
                "fail once the queue fills",
            {}, Unless))
      continue;
    for (const PostSite *P : On)
      note(A, P->Call->Call->getBeginLoc(), "posted unsignaled here");
  }
}

//===-- Counters signaling waits on ---------------------------------------===//

/// Which ways writes move an integer (bits), or which way a test needs it
/// to move before it can hold.
enum CounterMotion : unsigned {
  MovesNot = 0,
  MovesUp = 1,
  MovesDown = 2,
  MovesEither = 3,
  MovesCopied = 4, // set to a copy of other storage (a limit, a message field)
  MovesSet = 8,    // with MovesEither: set to a computed value (`n = atoi(..)`)
};

struct CounterWrite {
  Location Target;
  const FunctionDecl *Fn;
  unsigned Moves;
  const Expr *At = nullptr; // the storage as written
  bool Constant = false;    // set to a constant: a reset or a reload
};

/// One read of an integer a signaling test depends on, with the way the
/// test needs it to move.
struct CounterRead {
  const Expr *E;
  Location L;
  unsigned Needs;
};

namespace {

/// Every write to an integer in the unit, with the way it moves it.
class CounterWrites : public RecursiveASTVisitor<CounterWrites> {
public:
  explicit CounterWrites(const TuAnalysis &A) : A(A) {
    for (const FunctionDecl *Fn : A.functions()) {
      Current = Fn;
      TraverseStmt(Fn->getBody());
    }
  }
  std::vector<CounterWrite> Writes;

  bool VisitUnaryOperator(UnaryOperator *UO) {
    if (UO->isIncrementDecrementOp())
      add(UO->getSubExpr(), UO->isIncrementOp() ? MovesUp : MovesDown);
    return true;
  }
  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (!BO->isAssignmentOp())
      return true;
    const Expr *Rhs = BO->getRHS();
    switch (BO->getOpcode()) {
    case BO_AddAssign:
    case BO_SubAssign: {
      bool Negative = false;
      if (auto V = A.values(Current).constant(Rhs))
        Negative = *V < 0;
      add(BO->getLHS(), (BO->getOpcode() == BO_AddAssign) != Negative ? MovesUp : MovesDown);
      return true;
    }
    case BO_Assign:
      add(BO->getLHS(), assigned(Rhs, BO->getLHS()),
          A.values(Current).constant(Rhs).has_value());
      return true;
    default:
      add(BO->getLHS(), MovesEither);
      return true;
    }
  }
  bool VisitCallExpr(CallExpr *CE) {
    const FunctionModel *M = A.modelOf(CE);
    ApiCall Call{CE, M, Current};
    if (const Expr *Counter = M ? Call.arg(ArgRole::Counter) : nullptr) {
      const Expr *Value = Call.arg(ArgRole::Value);
      switch (M->E) {
      case Effect::CounterAdd: add(Counter, MovesUp); break;
      case Effect::CounterSub: add(Counter, MovesDown); break;
      case Effect::CounterSet:
        add(Counter, Value ? assigned(Value, nullptr) : MovesEither,
            Value && A.values(Current).constant(Value).has_value());
        break;
      default: break;
      }
      return true;
    }
    // Any other function handed an integer's address may move it.
    for (const Expr *E : CE->arguments())
      if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(E)))
        if (UO->getOpcode() == UO_AddrOf)
          add(UO->getSubExpr(), MovesEither);
    return true;
  }

private:
  /// `x = 0` sets it, `x = c->depth` copies a limit or a message field;
  /// anything computed (`x = x + 1`, `x = n`, a call) may move it either way.
  unsigned assigned(const Expr *Value, const Expr *Target) {
    if (auto V = A.values(Current).constant(Value))
      return *V == 0 ? MovesNot : MovesEither | MovesSet;
    const Expr *Plain = stripExpr(Value);
    // `x = x + 1` counts; `x = opts->depth * 2` sets a limit.
    if (const auto *BO = dyn_cast<BinaryOperator>(Plain);
        BO && Target && (BO->getOpcode() == BO_Add || BO->getOpcode() == BO_Sub)) {
      auto L = locationOf(Target), Operand = locationOf(BO->getLHS());
      if (L && Operand && A.sameStorage(*L, Current, *Operand, Current))
        return BO->getOpcode() == BO_Add ? MovesUp : MovesDown;
    }
    if (isa<MemberExpr>(Plain))
      return MovesCopied;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(Plain))
      if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
        if (VD->hasGlobalStorage())
          return MovesCopied;
    return MovesEither | MovesSet;
  }
  void add(const Expr *Target, unsigned Moves, bool Constant = false) {
    if (auto L = locationOf(Target))
      Writes.push_back({*L, Current, Moves, Target, Constant});
  }
  const TuAnalysis &A;
  const FunctionDecl *Current = nullptr;
};

/// Splits a signaling condition into tests (`&&`, `||`, `!`) and collects
/// the integers each test reads.
class TestSplitter {
public:
  TestSplitter(const TuAnalysis &A) : A(A) {}
  struct Test {
    const Expr *E;
    std::vector<CounterRead> Reads;
    bool Compares = false; // a comparison or a remainder, not a bare flag
    bool Counts = false;   // orders or takes a remainder: a counter, not a
                           // dispatch on a value (`cmd->opcode == READ`)
  };
  std::vector<Test> Tests;

  void split(const Expr *E) {
    E = stripExpr(E);
    if (const auto *BO = dyn_cast<BinaryOperator>(E); BO && BO->isLogicalOp()) {
      split(BO->getLHS());
      split(BO->getRHS());
      return;
    }
    if (const auto *UO = dyn_cast<UnaryOperator>(E); UO && UO->getOpcode() == UO_LNot) {
      split(UO->getSubExpr());
      return;
    }
    Tests.push_back({E, {}, false});
    collect(E, MovesEither);
  }

private:
  void collect(const Expr *E, unsigned Needs) {
    E = stripExpr(E);
    if (!E)
      return;
    if (const auto *BO = dyn_cast<BinaryOperator>(E)) {
      unsigned L = MovesEither, R = MovesEither;
      switch (BO->getOpcode()) {
      case BO_GT: case BO_GE: L = MovesUp; R = MovesDown; break;
      case BO_LT: case BO_LE: L = MovesDown; R = MovesUp; break;
      case BO_Add: L = R = Needs; break;
      case BO_Sub: L = Needs; R = flip(Needs); break;
      default: break;
      }
      if (BO->isComparisonOp() || BO->getOpcode() == BO_Rem)
        Tests.back().Compares = true;
      if (BO->isRelationalOp() || BO->getOpcode() == BO_Rem)
        Tests.back().Counts = true;
      collect(BO->getLHS(), L);
      collect(BO->getRHS(), R);
      return;
    }
    if (const auto *UO = dyn_cast<UnaryOperator>(E)) {
      collect(UO->getSubExpr(), MovesEither);
      return;
    }
    if (const auto *CE = dyn_cast<CallExpr>(E)) {
      // atomic_read(&c->unsignaled) reads the counter.
      const FunctionModel *M = A.modelOf(CE);
      if (M && M->E == Effect::CounterRead)
        if (auto L = locationOf(ApiCall{CE, M, nullptr}.arg(ArgRole::Counter)))
          Tests.back().Reads.push_back({CE, *L, Needs});
      return;
    }
    if (!isa<MemberExpr>(E) && !isa<DeclRefExpr>(E))
      return;
    if (!E->getType()->isIntegerType() || E->getType().isConstQualified())
      return;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(E))
      if (!isa<VarDecl>(DRE->getDecl()))
        return; // an enumerator
    if (auto L = locationOf(E))
      Tests.back().Reads.push_back({E, *L, Needs});
  }
  static unsigned flip(unsigned N) {
    return N == MovesUp ? MovesDown : N == MovesDown ? MovesUp : N;
  }
  const TuAnalysis &A;
};
} // namespace

/// Does the test change storage other than \p Restarting itself
/// (`atomic_inc_return(&cnt) % n`: the test advances a counter)?
static bool hasSideEffects(const TuAnalysis &A, const Expr *Cond,
                           const ValueDecl *Restarting) {
  struct Finder : RecursiveASTVisitor<Finder> {
    const TuAnalysis &A;
    const ValueDecl *Restarting;
    bool Found = false;
    Finder(const TuAnalysis &A, const ValueDecl *R) : A(A), Restarting(R) {}
    bool VisitCallExpr(CallExpr *CE) {
      const FunctionModel *M = A.modelOf(CE);
      Found |= !M || M->E != Effect::CounterRead;
      return !Found;
    }
    bool VisitUnaryOperator(UnaryOperator *UO) {
      if (UO->isIncrementDecrementOp())
        Found |= !writes(UO->getSubExpr());
      return !Found;
    }
    bool VisitBinaryOperator(BinaryOperator *BO) {
      if (BO->isAssignmentOp())
        Found |= !writes(BO->getLHS());
      return !Found;
    }
    bool writes(const Expr *E) {
      auto L = locationOf(E);
      return Restarting && L && L->Root == Restarting && L->Steps.empty();
    }
  } F(A, Restarting);
  F.TraverseStmt(const_cast<Expr *>(Cond));
  return F.Found;
}

/// The function whose body holds \p S.
static const FunctionDecl *functionHolding(const TuAnalysis &A, const Stmt *S) {
  for (const FunctionDecl *Fn : A.functions())
    if (A.flow(Fn).parents().hasParent(S))
      return Fn;
  return nullptr;
}

/// The condition that decides between signaling and not for \p Origin,
/// in the function that holds it (a helper returning the flags, too).
static std::pair<const Expr *, const FunctionDecl *>
signalCondition(const TuAnalysis &A, const Stmt *Origin) {
  const FunctionDecl *Fn = Origin ? functionHolding(A, Origin) : nullptr;
  if (!Fn)
    return {nullptr, nullptr};
  const ParentMap &PM = A.flow(Fn).parents();
  const Stmt *Child = Origin;
  for (const Stmt *P = PM.getParent(Origin); P; Child = P, P = PM.getParent(P)) {
    if (const auto *If = dyn_cast<IfStmt>(P))
      if (Child != If->getCond())
        return {If->getCond(), Fn};
    if (const auto *CO = dyn_cast<ConditionalOperator>(P))
      if (Child != CO->getCond())
        return {CO->getCond(), Fn};
  }
  return {nullptr, nullptr};
}

/// A local counter that starts from a constant on every call and is only
/// stepped in the function itself, with no loop around the test: it
/// reaches the same value every time.
static const VarDecl *restartingLocal(const TuAnalysis &A, const FunctionDecl *Fn,
                                      const CounterRead &R, const Expr *Test,
                                      llvm::ArrayRef<CounterWrite> Writes) {
  const auto *VD = dyn_cast_or_null<VarDecl>(R.L.Root);
  if (!VD || !R.L.Steps.empty() || !VD->isLocalVarDecl() ||
      VD->isStaticLocal() || VD->getType()->isPointerType())
    return nullptr;
  if (VD->getInit() && !A.values(Fn).constant(VD->getInit()))
    return nullptr;
  if (enclosingLoop(A.flow(Fn).parents(), Test))
    return nullptr;
  for (const CounterWrite &W : Writes)
    if (W.Fn == Fn && W.Target.Root == VD &&
        ((W.Moves & MovesEither) == MovesEither || W.Moves == MovesCopied))
      return nullptr; // fed from something computed
  return VD;
}

void UnsignaledSendStarvationCheck::checkStuckCounters(const TuAnalysis &A,
                                                       const WorkRequests &W) {
  CounterWrites Writes(A);
  exportMoves(A, Writes.Writes);
  uint64_t Bit = A.flagBit(Flag::Signaled);
  llvm::DenseSet<const Expr *> Judged;
  for (const PostSite &P : W.posts())
    for (const WrSlot &S : P.Chain) {
      // Unknown: flags set in a helper that fills the WR (`wr =
      // &req->wr[SEND]; wr->send_flags |= ..` in rpc_prep_send()).
      if (S.Signal != WrSlot::Sometimes && S.Signal != WrSlot::Unknown)
        continue;
      // Each function that posts a shared WR (`conn->ctrl_wr` from the
      // notify and the keepalive paths) decides its signaling itself.
      auto Stored = [&](const FieldStore *F) {
        return A.values(F->Fn).flagsAfter(A.flow(F->Fn).resolve(F->Target), F->At);
      };
      std::vector<FlagSet> Decisions;
      for (const FieldStore *F : slotStores(A, S, FieldRole::SendFlags))
        if (F->Fn == P.Fn && F != S.Flags)
          Decisions.push_back(Stored(F));
      if (S.Flags)
        Decisions.push_back(Stored(S.Flags));
      else if (S.FlagsArg)
        Decisions.push_back(A.values(P.Fn).flags(S.FlagsArg));
      // Only `|=` and `&= ~` decide: the flags as the post finds them.
      for (const auto &[Name, Fn] : S.Names)
        if (Fn == P.Fn)
          if (std::optional<Location> L = A.member(Name, FieldRole::SendFlags))
            Decisions.push_back(A.values(P.Fn).flagsAt(
                A.flow(P.Fn).resolve(*L), P.Call->Call));
      for (const FlagSet &V : Decisions)
        for (const FlagAlt &Alt : V.Alts) {
          if (!(Alt.Known & Bit))
            continue;
          auto [Cond, Fn] = signalCondition(A, Alt.Origin);
          if (Cond && Judged.insert(Cond).second)
            judgeCondition(A, Fn, Cond, Writes.Writes);
        }
    }
}

/// `if (!ep->send_count) { signal; ep->send_count = ep->send_batch; }`: the
/// branch the test guards reloads what it tests from a limit, so the test
/// is a countdown, not a dispatch on a value copied from elsewhere.
static bool reloadedCountdown(const TuAnalysis &A, const FunctionDecl *Fn,
                              const Expr *Cond, const TestSplitter::Test &T,
                              llvm::ArrayRef<CounterWrite> Writes) {
  const ParentMap &PM = A.flow(Fn).parents();
  const auto *If = dyn_cast_or_null<IfStmt>(PM.getParent(Cond));
  if (!If || If->getCond() != Cond || T.Reads.size() != 1)
    return false;
  auto Inside = [&](const Stmt *Branch, const Expr *E) {
    return Branch && isInside(PM, E, Branch);
  };
  return llvm::any_of(Writes, [&](const CounterWrite &W) {
    return W.Fn == Fn && (W.Moves & (MovesCopied | MovesSet)) && W.At &&
           (Inside(If->getThen(), W.At) || Inside(If->getElse(), W.At)) &&
           A.sameStorage(W.Target, W.Fn, T.Reads.front().L, Fn);
  });
}

void UnsignaledSendStarvationCheck::judgeCondition(
    const TuAnalysis &A, const FunctionDecl *Fn, const Expr *Cond,
    llvm::ArrayRef<CounterWrite> Writes) {
  TestSplitter Split(A);
  Split.split(Cond);
  // The read of \p T that can never let the test hold, and the restarting
  // local it is, if any; null when the test may hold.
  auto StuckIn = [&](const TestSplitter::Test &T)
      -> std::pair<const CounterRead *, const VarDecl *> {
    bool Reloaded = reloadedCountdown(A, Fn, Cond, T, Writes);
    if (T.Reads.empty() || (!T.Compares && !Reloaded))
      return {nullptr, nullptr};
    // One read that moves the way the test needs (`wr_cnt++ % interval`)
    // is a working counter; the others are limits.
    const CounterRead *Stuck = nullptr;
    const VarDecl *Restarting = nullptr;
    bool Moves = false, CountedMoves = false;
    for (const CounterRead &R : T.Reads) {
      if (const VarDecl *VD = restartingLocal(A, Fn, R, T.E, Writes)) {
        Restarting = VD;
        Stuck = &R;
        continue;
      }
      if (isa<ParmVarDecl>(R.L.Root) && R.L.Steps.empty()) {
        Moves = true; // the caller decides
        continue;
      }
      bool Found = false, Counted = false;
      for (const CounterWrite &W : Writes)
        if ((W.Moves & R.Needs) && A.sameStorage(W.Target, W.Fn, R.L, Fn)) {
          Found = true;
          Counted |= !(W.Moves & MovesSet);
        }
      Moves |= Found;
      CountedMoves |= Counted;
      if (!Found && !Stuck)
        Stuck = &R;
    }
    // A countdown reloaded where it signals, and otherwise only ever set
    // to constants (loaded at setup, reloaded here): nothing counts it
    // towards the value that signals.
    auto OnlyConstants = [&](const CounterRead &R) {
      return Reloaded && llvm::all_of(Writes, [&](const CounterWrite &W) {
               return W.Constant || !A.sameStorage(W.Target, W.Fn, R.L, Fn);
             });
    };
    if (!Stuck && T.Reads.size() == 1 && OnlyConstants(T.Reads.front()))
      Stuck = &T.Reads.front();
    if (!Stuck || hasSideEffects(A, T.E, Restarting))
      return {nullptr, nullptr};
    // `since == p->cq_mod - 1`: a limit set from the configuration does not
    // move a counter that is only ever reset.
    auto Same = [&](const CounterWrite &W) {
      return A.sameStorage(W.Target, W.Fn, Stuck->L, Fn);
    };
    bool OnlyReset = llvm::any_of(Writes, Same) &&
                     llvm::all_of(Writes, [&](const CounterWrite &W) {
                       return !Same(W) || W.Moves == MovesNot;
                     });
    if (Moves && !Restarting && !OnlyConstants(*Stuck) && (CountedMoves || !OnlyReset))
      return {nullptr, nullptr};
    // `cmd->opcode == READ` on a value nothing here writes is a dispatch;
    // `since == 8` on a field the code resets is a counter.
    bool Written = llvm::any_of(Writes, [&](const CounterWrite &W) {
      return W.Moves != MovesCopied && Same(W);
    });
    if (!T.Counts && !Restarting && !Written && !Reloaded)
      return {nullptr, nullptr};
    return {Stuck, Restarting};
  };
  // `!count || refs > 1`: one test that may hold lets the branch run.
  bool Disjunctive = hasDisjunction(Cond, false);
  std::pair<const CounterRead *, const VarDecl *> First = {nullptr, nullptr};
  for (const TestSplitter::Test &T : Split.Tests) {
    auto Verdict = StuckIn(T);
    if (!Verdict.first && Disjunctive)
      return;
    if (Verdict.first && !First.first) {
      First = Verdict;
      if (!Disjunctive)
        break;
    }
  }
  if (First.first)
    reportStuck(A, Fn, *First.first, First.second);
}

/// Does \p E, read as a condition, hold when any one of several tests
/// holds (`a || b`, `!(a && b)`)?
bool UnsignaledSendStarvationCheck::hasDisjunction(const Expr *E, bool Negated) {
  E = stripExpr(E);
  if (const auto *UO = dyn_cast<UnaryOperator>(E); UO && UO->getOpcode() == UO_LNot)
    return hasDisjunction(UO->getSubExpr(), !Negated);
  const auto *BO = dyn_cast<BinaryOperator>(E);
  if (!BO || !BO->isLogicalOp())
    return false;
  if ((BO->getOpcode() == BO_LOr) != Negated)
    return true;
  return hasDisjunction(BO->getLHS(), Negated) || hasDisjunction(BO->getRHS(), Negated);
}

void UnsignaledSendStarvationCheck::reportStuck(const TuAnalysis &A,
                                                const FunctionDecl *Fn,
                                                const CounterRead &R,
                                                const VarDecl *Restarting) {
  std::string Name = sourceText(A.context(), R.E);
  if (Restarting) {
    report(A, R.E->getBeginLoc(),
           "signaling depends on '" + Restarting->getName().str() +
               "', a local that starts again from the same value on every "
               "call; the signaled branch never runs and the send queue is "
               "never reclaimed");
    return;
  }
  std::string Way = R.Needs == MovesUp     ? "goes up"
                    : R.Needs == MovesDown ? "goes down"
                                      : "changes";
  std::string Message = "signaling depends on '" + Name +
                        "', which nothing in the program " + Way +
                        "; the signaled branch never runs and the send "
                        "queue is never reclaimed";
  SlotKey Key = SlotKey::of(A.flow(Fn).resolve(R.L), Fn);
  if (!Key.isShared()) {
    report(A, R.E->getBeginLoc(), Message);
    return;
  }
  // Another file of the ULP may move it (`repl_account_post()`).
  std::vector<std::string> Unless;
  for (unsigned M : {unsigned(MovesUp), unsigned(MovesDown)})
    if (R.Needs & M)
      Unless.push_back(movesFact(Key.str(), M));
  reportIfProgram(A, R.E->getBeginLoc(), Message, {}, Unless);
}

std::string UnsignaledSendStarvationCheck::movesFact(StringRef Slot,
                                                     unsigned Moves) {
  return factKey(FactKind::Moves, (Slot + (Moves == MovesUp ? ":up" : ":down")).str());
}

/// Tell the other files which shared integers this one moves, and how.
void UnsignaledSendStarvationCheck::exportMoves(
    const TuAnalysis &A, llvm::ArrayRef<CounterWrite> Writes) {
  const Program &Prog = Program::of(A);
  std::set<std::string> Done;
  for (const CounterWrite &W : Writes) {
    // A constant loads or reloads a countdown; it counts nothing.
    if (!(W.Moves & MovesEither) || W.Constant)
      continue;
    SlotKey Key = SlotKey::of(A.flow(W.Fn).resolve(W.Target), W.Fn);
    if (!Key.isShared())
      continue;
    for (unsigned M : {unsigned(MovesUp), unsigned(MovesDown)})
      if ((W.Moves & M) && Done.insert(movesFact(Key.str(), M)).second)
        Prog.exportFact(movesFact(Key.str(), M));
  }
}

} // namespace ulplint
