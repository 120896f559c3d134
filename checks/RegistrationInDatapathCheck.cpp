//===- RegistrationInDatapathCheck.cpp - rdma-registration-in-datapath ----===//

#include "RegistrationInDatapathCheck.h"
#include "engine/Inventory.h"
#include "engine/Lifecycle.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

static bool isPerIoCall(Effect E) {
  return E == Effect::MrRegister || E == Effect::MrReregister ||
         E == Effect::MrDeregister || E == Effect::MrAlloc;
}

namespace {
/// Does an expression name the storage \p L (both seen through the
/// function's local aliases, `b = &rdma->blocks[i]`)?
class NamesLocation : public RecursiveASTVisitor<NamesLocation> {
public:
  NamesLocation(const FunctionFlow &Flow, const Location &L)
      : Flow(Flow), L(Flow.resolve(L)) {}
  bool VisitExpr(Expr *E) {
    if (isa<DeclRefExpr>(E) || isa<MemberExpr>(E) || isa<ArraySubscriptExpr>(E))
      if (std::optional<Location> Named = locationOf(E);
          Named && Flow.resolve(*Named) == L)
        Found = true;
    return !Found;
  }
  const FunctionFlow &Flow;
  Location L;
  bool Found = false;
};
} // namespace

/// Where the function keeps what \p Result holds: \p Result itself, and
/// for a local the places it is copied to (`mr = ib_alloc_mr(..); ...;
/// xprt->bounce_mr = mr;`).
static std::vector<Location> keptIn(const FunctionFlow &Flow, const Location &Result) {
  std::vector<Location> Out{Flow.resolve(Result)};
  if (!Out[0].Steps.empty())
    return Out;
  for (const Def &D : Flow.defs())
    if (D.K == Def::Assign && D.Value)
      if (auto V = locationOf(D.Value); V && Flow.resolve(*V) == Out[0])
        Out.push_back(Flow.resolve(D.Target));
  return Out;
}

static bool names(const FunctionFlow &Flow, const Expr *E, const Location &L) {
  NamesLocation Finder(Flow, L);
  Finder.TraverseStmt(const_cast<Expr *>(E));
  return Finder.Found;
}

/// Does \p Value (`want` in `s->len = want`) appear among the arguments of
/// the registration: the size kept is the size registered?
static bool sizedBy(const FunctionFlow &Flow, const ApiCall &C, const Expr *Value) {
  std::optional<Location> V = locationOf(Value);
  if (!V)
    return false;
  return llvm::any_of(C.Call->arguments(),
                      [&](const Expr *Arg) { return names(Flow, Arg, *V); });
}

/// The top-level `if (cond) return;` statements of \p C's function (with
/// \p OrGoto also `if (cond) goto out;`) from which the call is reachable:
/// tests that may leave before it.
static std::vector<const IfStmt *> guardsBefore(const FunctionFlow &Flow,
                                                const ApiCall &C, bool OrGoto) {
  std::vector<const IfStmt *> Out;
  const auto *Body = dyn_cast_or_null<CompoundStmt>(C.Caller->getBody());
  if (!Body)
    return Out;
  for (const Stmt *St : Body->body()) {
    const auto *Guard = dyn_cast<IfStmt>(St);
    const Stmt *Last = Guard ? lastStatement(Guard->getThen()) : nullptr;
    bool Leaves = isa_and_nonnull<ReturnStmt>(Last) ||
                  (OrGoto && isa_and_nonnull<GotoStmt>(Last));
    if (Leaves && !Guard->getElse() && Flow.reachableFrom(Guard->getCond(), C.Call))
      Out.push_back(Guard);
  }
  return Out;
}

/// `if (!buf->mr) buf->mr = ibv_reg_mr(...)`: registered once, on first
/// use, then cached; not per I/O. Also `if (want <= s->len) return 0;`
/// ahead of a registration after which the function records the new
/// `s->len`: it registers only when what it keeps no longer suffices.
static bool registersLazily(const TuAnalysis &A, const ApiCall &C) {
  std::optional<Location> Result = A.resultOf(C.Call);
  if (!Result)
    return false;
  const FunctionFlow &Flow = A.flow(C.Caller);
  std::vector<Location> Kept = keptIn(Flow, *Result);
  const ParentMap &PM = Flow.parents();
  for (const Stmt *S = PM.getParent(C.Call); S; S = PM.getParent(S))
    if (const auto *If = dyn_cast<IfStmt>(S))
      for (const Location &L : Kept)
        if (names(Flow, If->getCond(), L))
          return true;
  for (const IfStmt *Guard : guardsBefore(Flow, C, /*OrGoto=*/false)) {
    for (const Def &D : Flow.defs()) {
      Location T = Flow.resolve(D.Target);
      const auto *VD = dyn_cast_or_null<VarDecl>(T.Root);
      bool Shared = !T.Steps.empty() || (VD && VD->hasGlobalStorage());
      if (Shared && D.S && D.K == Def::Assign && D.Value &&
          Flow.reachableFrom(C.Call, D.S) && names(Flow, Guard->getCond(), T) &&
          sizedBy(Flow, C, D.Value))
        return true;
    }
  }
  return false;
}

static bool attachedToConnection(const TuAnalysis &A, const FunctionDecl *Fn,
                                 const Location &Handle);

/// The MR handle lives as long as a connection: in a global, or in a struct
/// that also holds the connection's QP, CQ or PD (`conn->login_mr`,
/// `dev->mr`), or in one the function hangs on such a struct. Registering
/// it happens once per connection even when the code that does it is
/// reached from the completion path.
static bool heldPerConnection(const TuAnalysis &A, const ApiCall &C) {
  std::optional<Location> L = registeredHandle(A, C);
  if (!L)
    return false;
  Location R = A.flow(C.Caller).resolve(*L);
  if (R.Steps.empty()) {
    const auto *VD = dyn_cast_or_null<VarDecl>(R.Root);
    return VD && VD->hasGlobalStorage();
  }
  // An array element counts by the struct holding the array: a
  // connection's table of MRs (`conn->cmd_mrs[i]`) is filled once.
  const FieldDecl *Last = R.lastField();
  return Last && (A.holdsConnection(Last->getParent()) ||
                  attachedToConnection(A, C.Caller, R));
}

/// A pointer to a struct that links to its own kind (`t->next`): one entry
/// of a list (a temporary registration pushed per put), not a part.
static bool isListNode(QualType T) {
  const auto *P = T->getAs<PointerType>();
  const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
  RD = RD ? RD->getDefinition() : nullptr;
  return RD && llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
           const auto *FP = F->getType()->getAs<PointerType>();
           const RecordDecl *To = FP ? FP->getPointeeType()->getAsRecordDecl() : nullptr;
           return To && To->getCanonicalDecl() == RD->getCanonicalDecl();
         });
}

/// `cmb = kzalloc(..); cmb->mr = ib_alloc_mr(..); ...; q->cmb = cmb;`: the
/// struct holding the handle is made here and hung on the connection.
static bool attachedToConnection(const TuAnalysis &A, const FunctionDecl *Fn,
                                 const Location &Handle) {
  const auto *Holder = dyn_cast_or_null<VarDecl>(Handle.Root);
  if (!Holder || !Holder->hasLocalStorage() || isa<ParmVarDecl>(Holder) ||
      isListNode(Holder->getType()))
    return false;
  const FunctionFlow &Flow = A.flow(Fn);
  return llvm::any_of(Flow.defs(), [&](const Def &D) {
    std::optional<Location> V =
        D.K == Def::Assign && D.Value ? locationOf(D.Value) : std::nullopt;
    const FieldDecl *Into = Flow.resolve(D.Target).lastField();
    return V && V->Root == Holder && V->Steps.empty() && Into &&
           A.holdsConnection(Into->getParent());
  });
}

/// The variable \p E names, through casts.
static const VarDecl *varOf(const Expr *E) {
  const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? stripExpr(E) : nullptr);
  return DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
}

/// `call->niov = n` on the data path: the field counts one I/O's elements,
/// it is not the size of a table set up once (`s->nslots = SINK_SLOTS`).
static bool countsOneIo(const TuAnalysis &A, const ValueDecl *Field) {
  const Inventory &Inv = Inventory::of(A);
  std::function<bool(const FunctionDecl *, const Stmt *)> SetsVariably =
      [&](const FunctionDecl *Fn, const Stmt *S) {
        if (const auto *BO = dyn_cast<BinaryOperator>(S); BO && BO->isAssignmentOp())
          if (const auto *ME = dyn_cast<MemberExpr>(BO->getLHS()->IgnoreParenImpCasts());
              ME && ME->getMemberDecl() == Field &&
              !A.values(Fn).constant(BO->getRHS()).has_value())
            return true;
        return llvm::any_of(S->children(), [&](const Stmt *C) {
          return C && SetsVariably(Fn, C);
        });
      };
  return llvm::any_of(A.functions(), [&](const FunctionDecl *Fn) {
    return Inv.datapath(Fn) && Fn->getBody() && SetsVariably(Fn, Fn->getBody());
  });
}

/// Is \p Bound the size of a table rather than a count an I/O brings: a
/// constant, or a field the data path does not set (`c->nslots`), not a
/// parameter, a local (`iovcnt`) or a per-I/O count (`call->niov`)?
static bool tableBound(const TuAnalysis &A, const FunctionDecl *Fn, const Expr *Bound) {
  Bound = stripExpr(Bound);
  if (!Bound)
    return false;
  if (const auto *ME = dyn_cast<MemberExpr>(Bound))
    return !countsOneIo(A, ME->getMemberDecl());
  // Written as a constant here (`NSEGS`, `ARRAY_SIZE(x)`), not a variable
  // whose callers happen to pass one.
  std::function<bool(const Stmt *)> NamesVariable = [&](const Stmt *S) {
    if (const auto *DRE = dyn_cast<DeclRefExpr>(S); DRE && isa<VarDecl>(DRE->getDecl()))
      return true;
    return llvm::any_of(S->children(), [&](const Stmt *C) { return C && NamesVariable(C); });
  };
  return !NamesVariable(Bound) && A.values(Fn).constant(Bound).has_value();
}

/// The array field a handle location indexes (`slots` in `c->slots[i].mr`).
static const FieldDecl *tableOf(const Location &L) {
  for (size_t I = 1; I < L.Steps.size(); ++I)
    if (!L.Steps[I].Field)
      return L.Steps[I - 1].Field;
  return nullptr;
}

/// The condition of the loop around \p C, or null.
static const Expr *loopCondition(const TuAnalysis &A, const ApiCall &C) {
  const Stmt *Loop = enclosingLoop(A.flow(C.Caller).parents(), C.Call);
  const Expr *Cond = nullptr;
  if (const auto *For = dyn_cast_or_null<ForStmt>(Loop))
    Cond = For->getCond();
  else if (const auto *While = dyn_cast_or_null<WhileStmt>(Loop))
    Cond = While->getCond();
  return Cond ? stripExpr(Cond) : nullptr;
}

/// `while (i--)`, `while (--i >= 0)`: unwinding a loop's work.
static bool countsDown(const Expr *Cond) {
  if (const auto *UO = dyn_cast_or_null<UnaryOperator>(Cond))
    return UO->isDecrementOp();
  const auto *BO = dyn_cast_or_null<BinaryOperator>(Cond);
  const auto *UO = BO ? dyn_cast<UnaryOperator>(stripExpr(BO->getLHS())) : nullptr;
  return UO && UO->isDecrementOp();
}

/// `for (i = 0; i < NSEGS; i++) s->mr[i] = ib_alloc_mr(..)`,
/// `for (i = 0; i < c->nslots; i++) ibv_dereg_mr(c->slots[i].mr)`: every
/// element of a table of handles, in a loop bounded by the table's size.
static bool loopsOverTable(const TuAnalysis &A, const ApiCall &C) {
  const auto *BO = dyn_cast_or_null<BinaryOperator>(loopCondition(A, C));
  return BO && BO->isComparisonOp() && varOf(BO->getLHS()) &&
         tableBound(A, C.Caller, BO->getRHS());
}

/// A table of handles set up or torn down at once, not one I/O's handle:
/// a loop over the whole table, or the unwinding of such a loop in the
/// same function (`while (i--) ibv_dereg_mr(s->mr[i])` after the fill).
static bool wholeTable(const TuAnalysis &A, const ApiCall &C) {
  // Through a local alias of the element (`b = &r->blocks[i]; b->mr = ..`).
  auto TableOf = [&](const ApiCall &Call) -> const FieldDecl * {
    std::optional<Location> L = registeredHandle(A, Call);
    return L ? tableOf(A.flow(Call.Caller).resolve(*L)) : nullptr;
  };
  const FieldDecl *Table = TableOf(C);
  if (!Table)
    return false;
  if (!countsDown(loopCondition(A, C)))
    return loopsOverTable(A, C);
  return llvm::any_of(A.calls(), [&](const ApiCall &Fill) {
    if (Fill.Caller != C.Caller || Fill.Call == C.Call ||
        Fill.Model->E == Effect::MrDeregister || !isPerIoCall(Fill.Model->E))
      return false;
    return TableOf(Fill) == Table && loopsOverTable(A, Fill);
  });
}

static std::string cost(const TuAnalysis &A, Effect E) {
  if (A.domain() == Domain::Kernel)
    return E == Effect::MrDeregister
               ? "deregistering is a command to the device on every I/O"
               : "allocating a memory region is a command to the device on "
                 "every I/O";
  return E == Effect::MrDeregister
             ? "deregistration enters the kernel and unpins the pages on "
               "every I/O"
             : "registration enters the kernel and pins the pages on every "
               "I/O";
}

/// `e = cache_lookup(dom, buf, len); if (e) goto hit; ... e = victim(dom);
/// e->mr = ibv_reg_mr(...)`: a hit on the lookup skips the registration,
/// which fills an entry of the struct the lookup returns (a registration
/// cache). So does the deregistration of the entry it evicts.
static bool skipsOnCacheHit(const TuAnalysis &A, const ApiCall &C) {
  std::optional<Location> Handle = registeredHandle(A, C);
  if (!Handle)
    return false;
  const FunctionFlow &Flow = A.flow(C.Caller);
  llvm::SmallPtrSet<const TagDecl *, 2> Entries;
  for (const Location &L : keptIn(Flow, *Handle))
    if (const FieldDecl *F = L.lastField())
      Entries.insert(F->getParent()->getCanonicalDecl());
  if (Entries.empty())
    return false;
  for (const IfStmt *Guard : guardsBefore(Flow, C, /*OrGoto=*/true)) {
    const VarDecl *Hit = varOf(Guard->getCond());
    const RecordDecl *RD = Hit && Hit->getType()->isPointerType()
                               ? Hit->getType()->getPointeeType()->getAsRecordDecl()
                               : nullptr;
    if (!RD || !Entries.count(RD->getCanonicalDecl()))
      continue;
    Location HitLoc{Hit, {}};
    for (const Def *D : Flow.reaching(HitLoc, Guard->getCond())) {
      const auto *Lookup = D && D->K == Def::Assign && D->Value
                               ? dyn_cast<CallExpr>(D->Value->IgnoreParenImpCasts())
                               : nullptr;
      if (Lookup && !A.modelOf(Lookup))
        return true;
    }
  }
  return false;
}

/// A registration or deregistration that runs once per I/O.
static bool perIo(const TuAnalysis &A, const Inventory &Inv,
                  const RegistrationSite &S) {
  if (!S.Call || !S.Datapath || !isPerIoCall(S.Call->Model->E) ||
      registersLazily(A, *S.Call) || skipsOnCacheHit(A, *S.Call) ||
      heldPerConnection(A, *S.Call) ||
      wholeTable(A, *S.Call))
    return false;
  // A session function's own setup, outside the loop it posts or polls in.
  const DatapathReason *Why = Inv.datapath(S.Fn);
  return !(Why->Seed == S.Fn && Inv.outsideIoLoop(S.Fn, S.Call->Call));
}

void RegistrationInDatapathCheck::checkUnit(const TuAnalysis &A) {
  const Inventory &Inv = Inventory::of(A);
  for (const RegistrationSite &S : Inv.sites()) {
    if (!perIo(A, Inv, S))
      continue;
    const DatapathReason *Why = Inv.datapath(S.Fn);
    // Exposed memory gets no cache rewrite (the inventory offers none): its
    // key must die with its I/O.
    bool Exposed = S.Role == SiteRole::Expose;
    std::string Target = Exposed && A.domain() != Domain::Kernel
                             ? Inv.replacement(S)
                             : Inv.replacement(MigrationKey::DatapathRegistration);
    std::string Seed = Why->Seed->getNameAsString();
    {
      auto D = report(A, S.Loc,
                      "'" + S.Api + "' runs once per I/O: " +
                          (Why->Seed == S.Fn ? "'" + Seed + "'"
                                             : "it is called from '" + Seed + "', which") +
                          " " + Why->What + "; " + cost(A, S.Call->Model->E) +
                          "; use " + Target);
      if (S.FixInPlace)
        for (const FixItHint &F : S.Fixes)
          D << F;
    }
    note(A, Why->At, "'" + Seed + "' " + Why->What + " here");
    if (!S.FixInPlace && S.fixable()) {
      auto N = note(A, S.Loc,
                    "the handle is a struct field: this rewrite changes its "
                    "type and every use in this file");
      for (const FixItHint &F : S.Fixes)
        N << F;
    }
  }
}

} // namespace ulplint
