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

/// A registration cache: the function first searches for a registration it
/// can reuse (`for (...) if (e->buf == buf) return e->mr;`) and registers,
/// or evicts, only on a miss. Its registrations are not per I/O.
static bool fillsCache(const TuAnalysis &A, const ApiCall &C) {
  const ParentMap &PM = A.flow(C.Caller).parents();
  const SourceManager &SM = A.sources();
  bool Hit = false;
  std::function<void(const Stmt *)> Scan = [&](const Stmt *S) {
    if (!S || Hit)
      return;
    if (const auto *RS = dyn_cast<ReturnStmt>(S))
      if (const Expr *V = RS->getRetValue())
        if (isHandleType(A, V->getType()) && enclosingLoop(PM, RS) &&
            SM.isBeforeInTranslationUnit(RS->getBeginLoc(), C.Call->getBeginLoc()))
          Hit = true;
    for (const Stmt *Child : S->children())
      Scan(Child);
  };
  Scan(C.Caller->getBody());
  return Hit;
}

/// A session function (`echo_serve_one`, a benchmark's run loop): it
/// registers once, outside the loop in which it posts or polls.
static bool registersOutsideItsLoop(const TuAnalysis &A, const ApiCall &C,
                                    const DatapathReason &Why) {
  if (Why.Seed != C.Caller)
    return false;
  const ParentMap &PM = A.flow(C.Caller).parents();
  if (enclosingLoop(PM, C.Call))
    return false;
  bool Any = false;
  for (const ApiCall &D : A.calls()) {
    if (D.Caller != C.Caller)
      continue;
    if (!isDatapathCall(D))
      continue;
    if (!enclosingLoop(PM, D.Call))
      return false;
    Any = true;
  }
  return Any;
}

/// `if (!buf->mr) buf->mr = ibv_reg_mr(...)`: registered once, on first
/// use, then cached; not per I/O.
static bool registersLazily(const TuAnalysis &A, const ApiCall &C) {
  std::optional<Location> Result = A.resultOf(C.Call);
  if (!Result)
    return false;
  const ParentMap &PM = A.flow(C.Caller).parents();
  for (const Stmt *S = PM.getParent(C.Call); S; S = PM.getParent(S))
    if (const auto *If = dyn_cast<IfStmt>(S)) {
      NamesLocation Finder(A.flow(C.Caller), *Result);
      Finder.TraverseStmt(const_cast<Expr *>(If->getCond()));
      if (Finder.Found)
        return true;
    }
  return false;
}

/// Is \p T a pointer to a connection-lifetime object (QP, CQ, PD, ...)?
static bool isConnectionType(const TuAnalysis &A, QualType T) {
  const auto *P = T->getAs<PointerType>();
  const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
  if (!RD)
    return false;
  const auto &Names = A.rules().domain(A.domain()).ConnectionTypes;
  return llvm::is_contained(Names, RD->getName());
}

/// The MR handle lives as long as a connection: in a global, or in a struct
/// that also holds the connection's QP, CQ or PD (`conn->login_mr`,
/// `dev->mr`). Registering it happens once per connection even when the
/// code that does it is reached from the completion path.
static bool heldPerConnection(const TuAnalysis &A, const ApiCall &C) {
  const Expr *Handle = C.Model->E == Effect::MrDeregister ? C.arg(ArgRole::Mr) : nullptr;
  std::optional<Location> L =
      Handle ? locationOf(Handle) : A.resultOf(C.Call);
  if (!L)
    return false;
  Location R = A.flow(C.Caller).resolve(*L);
  if (R.Steps.empty()) {
    const auto *VD = dyn_cast_or_null<VarDecl>(R.Root);
    return VD && VD->hasGlobalStorage();
  }
  // An array element counts by the struct holding the array: a
  // connection's table of MRs (`conn->cmd_mrs[i]`) is filled once.
  const FieldDecl *Last = nullptr;
  for (const Location::Step &Step : llvm::reverse(R.Steps))
    if ((Last = Step.Field))
      break;
  if (!Last)
    return false;
  return llvm::any_of(Last->getParent()->fields(), [&](const FieldDecl *F) {
    return isConnectionType(A, F->getType());
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

void RegistrationInDatapathCheck::checkUnit(const TuAnalysis &A) {
  const Inventory &Inv = Inventory::of(A);
  for (const RegistrationSite &S : Inv.sites()) {
    if (!S.Call || !S.Datapath || !isPerIoCall(S.Call->Model->E) ||
        registersLazily(A, *S.Call) || heldPerConnection(A, *S.Call))
      continue;
    const DatapathReason *Why = Inv.datapath(S.Fn);
    if (fillsCache(A, *S.Call) || registersOutsideItsLoop(A, *S.Call, *Why))
      continue;
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
