//===- UnsignaledSendStarvationCheck.cpp - rdma-unsignaled-send-starvation ===//

#include "UnsignaledSendStarvationCheck.h"
#include "engine/Program.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

void UnsignaledSendStarvationCheck::run(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  checkNeverSignaled(A, W);
  checkStuckCounters(A, W);
}

void UnsignaledSendStarvationCheck::checkNeverSignaled(const TuAnalysis &A,
                                                       const WorkRequests &W) {
  if (!W.posts().empty() && W.mayRequestCompletion())
    return;
  StringRef FlagText = A.flagName(Flag::Signaled);
  std::string Ulp = Program::of(A).key();
  for (const QpCreation &Q : W.creations()) {
    if (Q.CoreManaged || !Q.SignalAll || *Q.SignalAll)
      continue;
    SourceLocation Loc = Q.SignalStore ? Q.SignalStore->Spelling->getBeginLoc() : Q.Call->Call->getBeginLoc();
    if (W.posts().empty()) {
      // The posts live in other files of the ULP.
      reportIfProgram(A, Loc,
                      "only work requests that ask for it are signaled on this "
                      "QP, but no post of this ULP sets " + FlagText.str() +
                          "; completed send-queue entries are never reclaimed "
                          "and posts fail once the queue fills",
                      {factKey(FactKind::Posts, Ulp)}, {factKey(FactKind::Signals, Ulp)});
      continue;
    }
    report(A, Loc,
           "only work requests that ask for it are signaled on this QP, but "
           "no post in this file sets " + FlagText.str() +
               "; completed send-queue entries are never reclaimed and posts "
               "fail once the queue fills");
    for (const PostSite &P : W.posts())
      note(A, P.Call->Call->getBeginLoc(), "posted unsignaled here");
  }
}

namespace {
/// Storage read in a condition (the counters signaling depends on).
class ReadCollector : public RecursiveASTVisitor<ReadCollector> {
public:
  std::vector<const Expr *> Reads;
  bool VisitMemberExpr(MemberExpr *ME) {
    if (ME->getType()->isIntegerType())
      Reads.push_back(ME);
    return true;
  }
  bool VisitDeclRefExpr(DeclRefExpr *DRE) {
    const auto *VD = dyn_cast<VarDecl>(DRE->getDecl());
    if (VD && !VD->getType().isConstQualified() &&
        VD->getType()->isIntegerType() && VD->hasGlobalStorage())
      Reads.push_back(DRE);
    return true;
  }
};

/// Is \p Counter ever moved away from its initial value in this unit?
class AdvanceFinder : public RecursiveASTVisitor<AdvanceFinder> {
public:
  AdvanceFinder(const TuAnalysis &A, const Location &Counter,
                const FunctionDecl *Where)
      : A(A), Counter(Counter), Where(Where) {}
  const FunctionDecl *Current = nullptr;
  bool Found = false;

  bool VisitUnaryOperator(UnaryOperator *UO) {
    if (UO->isIncrementDecrementOp())
      check(UO->getSubExpr(), nullptr);
    return !Found;
  }
  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (BO->isAssignmentOp())
      check(BO->getLHS(), BO->isCompoundAssignmentOp() ? nullptr : BO->getRHS());
    return !Found;
  }
  bool VisitCallExpr(CallExpr *CE) {
    // atomic_inc(&x), atomic_add(n, &x), ...: the address escapes.
    for (const Expr *Arg : CE->arguments())
      if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(Arg)))
        if (UO->getOpcode() == UO_AddrOf)
          check(UO->getSubExpr(), nullptr);
    return !Found;
  }

private:
  void check(const Expr *Target, const Expr *Value) {
    auto L = locationOf(Target);
    if (!L || !A.sameStorage(*L, Current, Counter, Where))
      return;
    // Resetting to zero does not advance it.
    if (Value)
      if (auto V = A.values(Current).constant(Value))
        if (*V == 0)
          return;
    Found = true;
  }
  const TuAnalysis &A;
  const Location &Counter;
  const FunctionDecl *Where;
};
} // namespace

/// `atomic_inc_return(&cnt) % n`: the condition advances a counter itself.
static bool hasSideEffects(const Expr *Cond) {
  struct Finder : RecursiveASTVisitor<Finder> {
    bool Found = false;
    bool VisitCallExpr(CallExpr *) { return !(Found = true); }
    bool VisitUnaryOperator(UnaryOperator *UO) {
      Found |= UO->isIncrementDecrementOp();
      return !Found;
    }
    bool VisitBinaryOperator(BinaryOperator *BO) {
      Found |= BO->isAssignmentOp();
      return !Found;
    }
  } F;
  F.TraverseStmt(const_cast<Expr *>(Cond));
  return F.Found;
}

/// The condition that decides between signaling and not for \p Origin.
static const Expr *signalCondition(const TuAnalysis &A, const FunctionDecl *Fn,
                                   const Stmt *Origin) {
  if (!Origin)
    return nullptr;
  const ParentMap &PM = A.flow(Fn).parents();
  const Stmt *Child = Origin;
  for (const Stmt *P = PM.getParent(Origin); P; Child = P, P = PM.getParent(P)) {
    if (const auto *If = dyn_cast<IfStmt>(P))
      if (Child != If->getCond())
        return If->getCond();
    if (const auto *CO = dyn_cast<ConditionalOperator>(P))
      if (Child != CO->getCond())
        return CO->getCond();
  }
  return nullptr;
}

void UnsignaledSendStarvationCheck::checkStuckCounters(const TuAnalysis &A,
                                                       const WorkRequests &W) {
  uint64_t Bit = A.flagBit(Flag::Signaled);
  llvm::DenseSet<const Expr *> Reported;
  for (const PostSite &P : W.posts())
    for (const WrSlot &S : P.Chain) {
      if (S.Signal != WrSlot::Sometimes || !S.Flags)
        continue;
      const FieldStore &F = *S.Flags;
      FlagSet V = A.values(F.Fn).flagsAfter(A.flow(F.Fn).resolve(F.Target), F.At);
      for (const FlagAlt &Alt : V.Alts) {
        if (!(Alt.Known & Bit))
          continue;
        const Expr *Cond = signalCondition(A, F.Fn, Alt.Origin);
        if (!Cond || !Reported.insert(Cond).second)
          continue;
        // One advancing read (`wr_cnt++ % interval`) is a working counter;
        // the others are limits.
        ReadCollector Reads;
        Reads.TraverseStmt(const_cast<Expr *>(Cond));
        const Expr *Stuck = nullptr;
        bool Advances = false;
        for (const Expr *R : Reads.Reads) {
          auto L = locationOf(R);
          if (!L)
            continue;
          AdvanceFinder Finder(A, *L, F.Fn);
          for (const FunctionDecl *Fn : A.functions()) {
            Finder.Current = Fn;
            Finder.TraverseStmt(Fn->getBody());
          }
          if (Finder.Found)
            Advances = true;
          else if (!Stuck)
            Stuck = R;
        }
        if (Stuck && !Advances && !hasSideEffects(Cond))
          report(A, Stuck->getBeginLoc(),
                 "signaling depends on '" + sourceText(A.context(), Stuck) +
                     "', which nothing in this file advances; the signaled "
                     "branch never runs and the send queue is never reclaimed");
      }
    }
}

} // namespace ulplint
