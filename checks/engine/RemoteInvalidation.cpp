//===- RemoteInvalidation.cpp - Completions that report a peer's LOCAL_INV -===//
//
// The second part of the lifecycle model: branches that take a completion
// with WITH_INVALIDATE as the end of an MR's key, and whether they compare
// the invalidated rkey with the request's before believing it.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

namespace {

/// `flags & WITH_INV`: +1 when the condition holds on remote invalidation,
/// -1 when it holds without it, 0 when it does not test it.
int invalidationTest(const TuAnalysis &A, const CompletionFields &CF,
                     const FunctionDecl *Fn, const Expr *Cond) {
  Cond = stripExpr(Cond);
  if (const auto *UO = dyn_cast<UnaryOperator>(Cond))
    if (UO->getOpcode() == UO_LNot)
      return -invalidationTest(A, CF, Fn, UO->getSubExpr());
  if (const auto *CE = dyn_cast<CallExpr>(Cond)) // likely()/unlikely()
    if (CE->getNumArgs() == 1 && !A.modelOf(CE))
      if (const FunctionDecl *F = CE->getDirectCallee())
        if (F->getBuiltinID())
          return invalidationTest(A, CF, Fn, CE->getArg(0));
  const auto *BO = dyn_cast<BinaryOperator>(Cond);
  if (!BO)
    return 0;
  if (BO->getOpcode() == BO_And) {
    StringRef FlagText = A.flagName(Flag::WithInvalidate);
    auto IsFlag = [&](const Expr *E) {
      const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(E));
      return DRE && DRE->getDecl()->getName() == FlagText;
    };
    auto IsFlags = [&](const Expr *E) { return CF.role(Fn, E) == FieldRole::WcFlags; };
    if ((IsFlag(BO->getRHS()) && IsFlags(BO->getLHS())) ||
        (IsFlag(BO->getLHS()) && IsFlags(BO->getRHS())))
      return 1;
    return 0;
  }
  if (BO->getOpcode() == BO_NE || BO->getOpcode() == BO_EQ) {
    // (flags & WITH_INV) != 0
    int Inner = invalidationTest(A, CF, Fn, BO->getLHS());
    return BO->getOpcode() == BO_NE ? Inner : -Inner;
  }
  return 0;
}

/// Inside an accepting branch: comparisons of the invalidated rkey, and
/// calls that receive it (they may compare it).
class InvalidatedKeyUses : public RecursiveASTVisitor<InvalidatedKeyUses> {
public:
  InvalidatedKeyUses(const TuAnalysis &A, const CompletionFields &CF,
                     const KeyTracker &Keys, const FunctionDecl *Fn,
                     unsigned Depth = 0)
      : A(A), CF(CF), Keys(Keys), Fn(Fn), Depth(Depth) {}

  std::vector<SlotKey> Slots;
  bool Checked = false;
  /// Parameters of a helper that receive the invalidated key.
  std::set<const ValueDecl *> KeyParams;

  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (!BO->isEqualityOp())
      return true;
    for (auto [Key, Other] : {std::pair{BO->getLHS(), BO->getRHS()},
                              std::pair{BO->getRHS(), BO->getLHS()}})
      if (readsInvalidatedKey(Key)) {
        Checked = true;
        if (auto Slot = Keys.keySlot(Fn, Other))
          Slots.push_back(*Slot);
      }
    return true;
  }
  bool VisitCallExpr(CallExpr *CE) {
    if (A.modelOf(CE))
      return true;
    // The key (or the completion holding it) goes to code that may compare
    // it: frwr_reminv(rep, ...), iser_inv_desc(desc, rkey). A helper of this
    // unit is looked into; code elsewhere gets the benefit of the doubt.
    bool Passes = llvm::any_of(CE->arguments(), [&](const Expr *Arg) {
      return readsInvalidatedKey(Arg) || carriesCompletion(Arg);
    });
    if (!Passes)
      return true;
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    if (!Def || !llvm::is_contained(A.functions(), Def) ||
        Depth > budget::InvalidatedKeyHelperDepth) {
      Checked = true;
      return true;
    }
    InvalidatedKeyUses Inner(A, CF, Keys, Def, Depth + 1);
    for (unsigned I = 0; I < CE->getNumArgs() && I < Def->getNumParams(); ++I)
      if (readsInvalidatedKey(CE->getArg(I)))
        Inner.KeyParams.insert(Def->getParamDecl(I));
    Inner.TraverseStmt(Def->getBody());
    Checked |= Inner.Checked;
    Slots.insert(Slots.end(), Inner.Slots.begin(), Inner.Slots.end());
    return true;
  }

  bool readsInvalidatedKey(const Expr *E) {
    if (CF.role(Fn, E) == FieldRole::InvalidatedRkey)
      return true;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(E)))
      if (KeyParams.count(DRE->getDecl()))
        return true;
    // `u32 rkey = wc->ex.invalidate_rkey;` then `rkey != ...`
    if (auto L = locationOf(E))
      if (L->Steps.empty())
        for (const Def *D : A.flow(Fn).reaching(*L, E))
          if (D && D->K == Def::Assign && D->Value &&
              CF.role(Fn, D->Value) == FieldRole::InvalidatedRkey)
            return true;
    return false;
  }

  bool carriesCompletion(const Expr *E) {
    const StructModel *S = A.structOf(stripExpr(E)->getType());
    return S && S->Role == StructRole::Wc;
  }

  const TuAnalysis &A;
  const CompletionFields &CF;
  const KeyTracker &Keys;
  const FunctionDecl *Fn;
  unsigned Depth;
};

} // namespace

std::vector<Lifecycle::RemoteInvalidation>
findRemoteInvalidations(const TuAnalysis &A, const CompletionFields &CF,
                        const KeyTracker &Keys, const FunctionDecl *Fn) {
  std::vector<Lifecycle::RemoteInvalidation> Found;
  struct Finder : RecursiveASTVisitor<Finder> {
    std::vector<const IfStmt *> Ifs;
    bool VisitIfStmt(IfStmt *If) {
      Ifs.push_back(If);
      return true;
    }
  } F;
  F.TraverseStmt(Fn->getBody());
  for (const IfStmt *If : F.Ifs) {
    int Polarity = invalidationTest(A, CF, Fn, If->getCond());
    const Stmt *Branch = Polarity > 0 ? If->getThen()
                         : Polarity < 0 ? If->getElse()
                                        : nullptr;
    if (!Branch)
      continue;
    InvalidatedKeyUses Uses(A, CF, Keys, Fn);
    Uses.TraverseStmt(const_cast<Stmt *>(Branch));
    Found.push_back({If, Polarity > 0, Uses.Slots, Uses.Checked, Fn});
  }
  return Found;
}
} // namespace ulplint
