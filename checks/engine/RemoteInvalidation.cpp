//===- RemoteInvalidation.cpp - Completions that report a peer's LOCAL_INV -===//
//
// The second part of the lifecycle model: branches that take a completion
// with WITH_INVALIDATE as the end of an MR's key, and the equality tests of
// the invalidated rkey against an MR's key that decide whether the peer
// invalidated the right one. Only such a test checks the claim; passing the
// key to a logger does not.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

namespace {

/// Strips `!!`, likely()/unlikely() and parens; counts the negations.
const Expr *stripTest(const TuAnalysis &A, const Expr *Cond, bool &Negated) {
  for (;;) {
    Cond = stripExpr(Cond);
    if (const auto *UO = dyn_cast<UnaryOperator>(Cond);
        UO && UO->getOpcode() == UO_LNot) {
      Negated = !Negated;
      Cond = UO->getSubExpr();
      continue;
    }
    if (const auto *CE = dyn_cast<CallExpr>(Cond))
      if (CE->getNumArgs() >= 1 && !A.modelOf(CE))
        if (const FunctionDecl *F = CE->getDirectCallee(); F && F->getBuiltinID()) {
          Cond = CE->getArg(0); // __builtin_expect(!!(x), 0)
          continue;
        }
    return Cond;
  }
}

/// `flags & WITH_INV`: +1 when the condition holds on remote invalidation,
/// -1 when it holds without it, 0 when it does not test it. Follows a local
/// boolean computed from such a test (`bool inv = flags & WITH_INV`).
int invalidationTest(const TuAnalysis &A, const CompletionFields &CF,
                     const FunctionDecl *Fn, const Expr *Cond,
                     unsigned Depth = 0) {
  if (!Cond || Depth > budget::KeyCopyDepth)
    return 0;
  bool Negated = false;
  Cond = stripTest(A, Cond, Negated);
  int Sign = Negated ? -1 : 1;
  if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
    switch (BO->getOpcode()) {
    case BO_And: {
      // The WITH_INVALIDATE bit only means something in completion flags:
      // `x & IBV_WC_WITH_INV` tests them, wherever x was copied from.
      StringRef FlagText = A.flagName(Flag::WithInvalidate);
      auto IsFlag = [&](const Expr *E) {
        const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(E));
        return DRE && DRE->getDecl()->getName() == FlagText;
      };
      bool Tests = IsFlag(BO->getRHS()) || IsFlag(BO->getLHS());
      return Tests ? Sign : 0;
    }
    case BO_NE:
    case BO_EQ: {
      // (flags & WITH_INV) != 0
      int Inner = invalidationTest(A, CF, Fn, BO->getLHS(), Depth + 1);
      return Sign * (BO->getOpcode() == BO_NE ? Inner : -Inner);
    }
    case BO_LAnd:
    case BO_LOr: {
      // `a && b` holds only if both do: one positive test makes the whole
      // positive; `a || b` fails only if both fail: one negative test makes
      // its else-branch a remote invalidation.
      int L = invalidationTest(A, CF, Fn, BO->getLHS(), Depth + 1);
      int R = invalidationTest(A, CF, Fn, BO->getRHS(), Depth + 1);
      int Wanted = BO->getOpcode() == BO_LAnd ? 1 : -1;
      return (L == Wanted || R == Wanted) ? Sign * Wanted : 0;
    }
    default:
      return 0;
    }
  }
  // `(flags & WITH_INV) ? false : true`
  if (const auto *CO = dyn_cast<ConditionalOperator>(Cond)) {
    auto T = A.values(Fn).constant(CO->getTrueExpr());
    auto F = A.values(Fn).constant(CO->getFalseExpr());
    if (T && F && (*T != 0) != (*F != 0))
      return Sign * (*T ? 1 : -1) *
             invalidationTest(A, CF, Fn, CO->getCond(), Depth + 1);
    return 0;
  }
  // `bool inv = wc->wc_flags & IB_WC_WITH_INVALIDATE; ... if (inv)`, and a
  // field the unit sets from such a test (`ev->remote_inv = ...`).
  if (auto L = locationOf(Cond)) {
    if (L->Steps.empty()) {
      auto Defs = A.flow(Fn).reaching(*L, Cond);
      if (Defs.size() == 1 && Defs[0] && Defs[0]->K == Def::Assign &&
          Defs[0]->Value)
        return Sign * invalidationTest(A, CF, Fn, Defs[0]->Value, Depth + 1);
      return 0;
    }
    SlotKey Field = slotOf(A, *L, Fn);
    if (Field.isShared() && Depth == 0)
      for (const FunctionDecl *Other : A.functions())
        for (const Def &D : A.flow(Other).defs())
          if (D.K == Def::Assign && D.Value && !D.Target.Steps.empty() &&
              SlotKey::of(D.Target, Other) == Field)
            if (int P = invalidationTest(A, CF, Other, D.Value, Depth + 1))
              return Sign * P;
  }
  return 0;
}

/// The struct whose field holds the flags \p Cond tests, when it is not the
/// completion itself (xprtrdma's `rep->rr_wc_flags`): a copy of the
/// completion, whose other fields another unit may have filled from it.
const RecordDecl *flagsRecord(const TuAnalysis &A, const Expr *Cond) {
  const RecordDecl *Found = nullptr;
  std::function<void(const Stmt *)> Visit = [&](const Stmt *S) {
    if (!S || Found)
      return;
    if (const auto *BO = dyn_cast<BinaryOperator>(S); BO && BO->getOpcode() == BO_And)
      for (const Expr *Side : {BO->getLHS(), BO->getRHS()})
        if (const auto *ME = dyn_cast<MemberExpr>(stripExpr(Side))) {
          QualType Base = ME->getBase()->getType();
          if (Base->isPointerType())
            Base = Base->getPointeeType();
          const StructModel *M = A.structOf(Base);
          if (!(M && M->Role == StructRole::Wc))
            Found = Base->getAsRecordDecl();
        }
    for (const Stmt *C : S->children())
      Visit(C);
  };
  Visit(Cond);
  return Found;
}

/// `rep->rr_inv_rkey = wc->ex.invalidate_rkey;`, `inv_rkey =
/// ibv_wc_read_invalidated_rkey(cq);`: a branch that only copies the key
/// into a struct or a local records the invalidation for whoever reads it
/// (a handler it is passed to); it accepts nothing itself.
bool onlyRecords(const CompletionFields &CF, const FunctionDecl *Fn,
                 const Stmt *Branch) {
  auto IntoLocal = [](const Expr *E) {
    const auto *DRE = dyn_cast<DeclRefExpr>(E->IgnoreParenImpCasts());
    const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
    return VD && VD->hasLocalStorage() && !isa<ParmVarDecl>(VD);
  };
  auto Records = [&](const Stmt *S) {
    const auto *BO = dyn_cast<BinaryOperator>(S);
    return BO && BO->getOpcode() == BO_Assign &&
           (isa<MemberExpr>(BO->getLHS()->IgnoreParenImpCasts()) ||
            IntoLocal(BO->getLHS())) &&
           CF.role(Fn, BO->getRHS()) == FieldRole::InvalidatedRkey;
  };
  if (const auto *CS = dyn_cast<CompoundStmt>(Branch))
    return !CS->body_empty() && llvm::all_of(CS->body(), Records);
  return Records(Branch);
}

/// Reads of the invalidated rkey inside \p Fn: the completion's field, a
/// copy of it, or a helper's parameter that receives one.
class InvalidatedKeyReads {
public:
  InvalidatedKeyReads(const TuAnalysis &A, const CompletionFields &CF,
                      const FunctionDecl *Fn, unsigned Depth = 0)
      : A(A), CF(CF), Fn(Fn), Depth(Depth) {}
  std::set<const ValueDecl *> KeyParams;

  bool reads(const Expr *E) const {
    if (CF.role(Fn, E) == FieldRole::InvalidatedRkey)
      return true;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(E))) {
      if (KeyParams.count(DRE->getDecl()))
        return true;
      if (const auto *P = dyn_cast<ParmVarDecl>(DRE->getDecl()))
        return passedKey(P);
    }
    // `u32 rkey = wc->ex.invalidate_rkey;` then `rkey != ...`
    if (auto L = locationOf(E); L && L->Steps.empty())
      for (const Def *D : A.flow(Fn).reaching(*L, E))
        if (D && D->K == Def::Assign && D->Value &&
            (CF.role(Fn, D->Value) == FieldRole::InvalidatedRkey ||
             reads(D->Value)))
          return true;
    return false;
  }

private:
  /// `handle_ats(iface, req, flags, inv_rkey)` where the poller passed what
  /// ibv_wc_read_invalidated_rkey() returned: the parameter is the key.
  bool passedKey(const ParmVarDecl *P) const {
    if (Depth >= 2 || P->getDeclContext() != Fn)
      return false;
    unsigned Index = P->getFunctionScopeIndex();
    for (const auto &[Call, Caller] : A.callersOf(Fn)) {
      if (Index >= Call->getNumArgs() || Caller == Fn)
        continue;
      InvalidatedKeyReads InCaller(A, CF, Caller, Depth + 1);
      if (InCaller.reads(Call->getArg(Index)))
        return true;
    }
    return false;
  }

  const TuAnalysis &A;
  const CompletionFields &CF;
  const FunctionDecl *Fn;
  unsigned Depth;
};

/// Inside an accepting branch: equality tests of the invalidated rkey
/// against a key, directly or in helpers of this unit that receive it, and
/// functions of other units that receive it (they may test it there).
class InvalidatedKeyUses : public RecursiveASTVisitor<InvalidatedKeyUses> {
public:
  InvalidatedKeyUses(const TuAnalysis &A, const CompletionFields &CF,
                     const KeyTracker &Keys, const FunctionDecl *Fn,
                     std::map<const Expr *, Lifecycle::KeyCompare> &Compares,
                     unsigned Depth = 0)
      : A(A), CF(CF), Keys(Keys), Fn(Fn), Reads(A, CF, Fn), Compares(Compares),
        Depth(Depth) {}

  std::vector<SlotKey> Slots;
  bool Checked = false;
  std::string External;

  void keyParam(const ValueDecl *P) { Reads.KeyParams.insert(P); }

  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (!BO->isEqualityOp())
      return true;
    for (auto [Key, Other] : {std::pair{BO->getLHS(), BO->getRHS()},
                              std::pair{BO->getRHS(), BO->getLHS()}}) {
      if (!Reads.reads(Key) || A.values(Fn).constant(Other))
        continue; // `rkey != 0` tests nothing about whose key it is
      Checked = true;
      if (auto Slot = Keys.keySlot(Fn, Other)) {
        Slots.push_back(*Slot);
        Compares[BO] = {*Slot, BO->getOpcode() == BO_EQ};
      }
    }
    return true;
  }

  bool VisitCallExpr(CallExpr *CE) {
    if (A.modelOf(CE))
      return true;
    bool Passes = llvm::any_of(CE->arguments(), [&](const Expr *Arg) {
      return Reads.reads(Arg) || carriesCompletion(Arg) || carriesKeyCopy(Arg) ||
             recordField(Arg);
    });
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    bool Helper = Def && llvm::is_contained(A.functions(), Def);
    if (!Passes && !Helper)
      return true;
    if (!Helper) {
      // `req = ulp_req_by_rkey(q, rkey)`: a lookup by the invalidated key
      // finds the request whose key it is.
      if (Callee && Callee->getReturnType()->isPointerType() &&
          llvm::any_of(CE->arguments(), [&](const Expr *Arg) { return Reads.reads(Arg); })) {
        Checked = true;
        return true;
      }
      // Another unit may test it (xprtrdma's frwr_reminv): the finding then
      // depends on that unit (compares-invalidated-key:<name>).
      if (Callee && External.empty() && Callee->isExternallyVisible())
        External = Callee->getName().str();
      return true;
    }
    if (Depth > budget::InvalidatedKeyHelperDepth)
      return true;
    InvalidatedKeyUses Inner(A, CF, Keys, Def, Compares, Depth + 1);
    for (unsigned I = 0; I < CE->getNumArgs() && I < Def->getNumParams(); ++I)
      if (Reads.reads(CE->getArg(I)))
        Inner.keyParam(Def->getParamDecl(I));
    Inner.TraverseStmt(Def->getBody());
    Checked |= Inner.Checked;
    Slots.insert(Slots.end(), Inner.Slots.begin(), Inner.Slots.end());
    if (External.empty())
      External = Inner.External;
    return true;
  }

  /// The struct the tested flags were copied into (see flagsRecord()).
  const RecordDecl *FlagsRecord = nullptr;

private:
  /// `rep->rr_inv_rkey` handed on: a 32-bit field of the struct that holds
  /// the tested flags may be the invalidated key another unit copied there.
  bool recordField(const Expr *E) {
    const auto *ME = dyn_cast<MemberExpr>(stripExpr(E));
    const auto *FD = ME ? dyn_cast<FieldDecl>(ME->getMemberDecl()) : nullptr;
    return FlagsRecord && FD && FD->getType()->isIntegerType() &&
           A.context().getTypeSize(FD->getType()) == 32 &&
           FD->getParent()->getCanonicalDecl() == FlagsRecord->getCanonicalDecl();
  }

  bool carriesCompletion(const Expr *E) {
    const StructModel *S = A.structOf(stripExpr(E)->getType());
    return S && S->Role == StructRole::Wc;
  }

  /// A struct holding a copy of the invalidated key (xprtrdma's
  /// rep->rr_inv_rkey).
  bool carriesKeyCopy(const Expr *E) {
    QualType T = stripExpr(E)->getType();
    const RecordDecl *RD =
        T->isPointerType() ? T->getPointeeType()->getAsRecordDecl() : nullptr;
    if (!RD || !(RD = RD->getDefinition()))
      return false;
    return llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
      return CF.isInvalidatedKeyCopy(F);
    });
  }

  const TuAnalysis &A;
  const CompletionFields &CF;
  const KeyTracker &Keys;
  const FunctionDecl *Fn;
  InvalidatedKeyReads Reads;
  std::map<const Expr *, Lifecycle::KeyCompare> &Compares;
  unsigned Depth;
};

/// Does \p Fn test an MR's key for equality with a value its caller passes
/// in (a parameter, or a field reached through one)? Such a function checks
/// a remote invalidation for callers in other units.
bool comparesParameterKey(const TuAnalysis &A, const KeyTracker &Keys,
                          const FunctionDecl *Fn) {
  struct Finder : RecursiveASTVisitor<Finder> {
    const TuAnalysis &A;
    const KeyTracker &Keys;
    const FunctionDecl *Fn;
    bool Found = false;
    Finder(const TuAnalysis &A, const KeyTracker &Keys, const FunctionDecl *Fn)
        : A(A), Keys(Keys), Fn(Fn) {}
    bool fromParameter(const Expr *E) {
      auto L = locationOf(E);
      return L && isa<ParmVarDecl>(A.flow(Fn).resolve(*L).Root) &&
             !Keys.keySlot(Fn, E);
    }
    bool VisitBinaryOperator(BinaryOperator *BO) {
      if (BO->isEqualityOp())
        for (auto [Key, Other] : {std::pair{BO->getLHS(), BO->getRHS()},
                                  std::pair{BO->getRHS(), BO->getLHS()}})
          if (Keys.keySlot(Fn, Key) && fromParameter(Other))
            Found = true;
      return !Found;
    }
  } F(A, Keys, Fn);
  F.TraverseStmt(Fn->getBody());
  return F.Found;
}

/// Nothing (a void function), a negative constant, false or NULL.
bool failureValue(const TuAnalysis &A, const FunctionDecl *Fn, const Expr *V) {
  if (!V)
    return Fn->getReturnType()->isVoidType();
  std::optional<int64_t> C = A.values(Fn).constant(V);
  if (Fn->getReturnType()->isBooleanType())
    return C && *C == 0;
  if (Fn->getReturnType()->isPointerType())
    return V->IgnoreParenImpCasts()->isNullPointerConstant(
        const_cast<ASTContext &>(A.context()), Expr::NPC_ValueDependentIsNotNull);
  return C && *C < 0;
}

/// A handle, or a pointer to a struct that holds one (the request a
/// `call_put(c, call)` completes), directly or in an embedded struct.
bool carriesHandles(const TuAnalysis &A, QualType T, unsigned Depth = 0) {
  if (isHandleType(A, T))
    return true;
  if (const auto *P = T->getAs<PointerType>(); P && Depth == 0)
    T = P->getPointeeType();
  else if (const auto *AT = T->getAsArrayTypeUnsafe())
    T = AT->getElementType();
  const RecordDecl *RD = T->getAsRecordDecl();
  RD = RD ? RD->getDefinition() : nullptr;
  return RD && Depth < 2 && llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
           return carriesHandles(A, F->getType(), Depth + 1);
         });
}

/// `if (wc->wc_flags & IBV_WC_WITH_INV) return -EPROTO;`: the branch
/// taken for an invalidating completion drops the message: it logs, may
/// hand the connection to error recovery elsewhere (`queue_work(..,
/// &ch->err_work)`), and leaves with nothing or a failure (a negative
/// code, false, NULL). It refuses the invalidation rather than accepting
/// it: nothing is stored, and no helper of this file, modelled API or
/// call given a request (a struct holding a handle) runs, any of which
/// could complete or release the request.
bool rejects(const TuAnalysis &A, const FunctionDecl *Fn, const Stmt *Branch) {
  const auto *Ret = dyn_cast_or_null<ReturnStmt>(lastStatement(Branch));
  if (!Ret || !failureValue(A, Fn, Ret->getRetValue()))
    return false;
  // A bare `return;` may skip what follows (the LOCAL_INV it makes
  // unnecessary): a drop says so, in a log line or a recovery call.
  bool Void = !Ret->getRetValue();
  const auto *CS = dyn_cast<CompoundStmt>(Branch);
  if (!CS)
    return !Void;
  if (Void && CS->size() < 2)
    return false;
  return llvm::all_of(CS->body(), [&](const Stmt *S) {
    const auto *CE = dyn_cast<CallExpr>(S);
    const FunctionDecl *F = CE ? CE->getDirectCallee() : nullptr;
    if (S == Ret || (F && F->isVariadic())) // logging
      return true;
    // A function the unit analyses (its own file's) may complete the
    // request; one declared or inlined from a header (`queue_work`) not.
    return F && !A.modelOf(CE) &&
           !llvm::is_contained(A.functions(), F->getDefinition()) &&
           llvm::none_of(CE->arguments(), [&](const Expr *Arg) {
             return carriesHandles(A, Arg->getType());
           });
  });
}

} // namespace

std::vector<Lifecycle::RemoteInvalidation>
findRemoteInvalidations(const TuAnalysis &A, const CompletionFields &CF,
                        const KeyTracker &Keys, const FunctionDecl *Fn,
                        std::map<const Expr *, Lifecycle::KeyCompare> &Compares) {
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
    if (!Branch || rejects(A, Fn, Branch) || onlyRecords(CF, Fn, Branch))
      continue;
    // `(flags & WITH_INV) && wc->invalidated_rkey == req->key` compares in
    // the condition itself.
    InvalidatedKeyUses Uses(A, CF, Keys, Fn, Compares);
    Uses.FlagsRecord = flagsRecord(A, If->getCond());
    Uses.TraverseStmt(const_cast<Expr *>(If->getCond()));
    Uses.TraverseStmt(const_cast<Stmt *>(Branch));
    Lifecycle::RemoteInvalidation R;
    R.If = If;
    R.AcceptThen = Polarity > 0;
    R.Slots = Uses.Slots;
    R.Checked = Uses.Checked;
    R.External = Uses.Checked ? "" : Uses.External;
    R.Fn = Fn;
    Found.push_back(std::move(R));
  }
  if (Fn->isExternallyVisible() && comparesParameterKey(A, Keys, Fn))
    Program::of(A).exportFact(
        factKey(FactKind::ComparesInvalidatedKey, Fn->getName()));
  return Found;
}

} // namespace ulplint
