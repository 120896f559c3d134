//===- Flow.cpp - Locations, reaching definitions, value evaluation -------===//

#include "Flow.h"
#include "Analysis.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/AST/StmtVisitor.h"
#include "llvm/ADT/STLExtras.h"
#include <deque>
#include <map>

using namespace clang;

namespace ulplint {

//===-- Location ----------------------------------------------------------===//

bool Location::isWithin(const Location &Other) const {
  if (Root != Other.Root || Steps.size() < Other.Steps.size())
    return false;
  return std::equal(Other.Steps.begin(), Other.Steps.end(), Steps.begin());
}

Location Location::prefix(size_t Len) const {
  Location L;
  L.Root = Root;
  L.Steps.append(Steps.begin(), Steps.begin() + std::min(Len, Steps.size()));
  return L;
}

const FieldDecl *Location::lastField() const {
  for (const Step &S : llvm::reverse(Steps))
    if (S.Field)
      return S.Field;
  return nullptr;
}

std::string Location::fieldPath(size_t From) const {
  std::string S;
  for (size_t I = From; I < Steps.size(); ++I) {
    if (!Steps[I].Field) {
      S += "[]";
      continue;
    }
    if (!S.empty())
      S += '.';
    S += Steps[I].Field->getName().str();
  }
  return S;
}

std::string Location::str() const {
  std::string S = Root ? Root->getName().str() : std::string("?");
  std::string Fields = fieldPath();
  if (!Fields.empty() && Fields[0] != '[')
    S += '.';
  return S + Fields;
}

/// `({ T _res = f(x); ...; _res; })`, the shape of the kernel's
/// alloc_hooks() around every allocator since 6.10: its value is f(x).
static const Expr *statementExprValue(const StmtExpr *SE) {
  const CompoundStmt *CS = SE->getSubStmt();
  if (!CS || CS->body_empty())
    return nullptr;
  const auto *Last = dyn_cast<Expr>(CS->body_back());
  if (!Last)
    return nullptr;
  Last = Last->IgnoreParenCasts();
  if (isa<StmtExpr>(Last))
    return Last;
  const auto *DRE = dyn_cast<DeclRefExpr>(Last);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  if (!VD || !VD->getInit())
    return nullptr;
  for (const Stmt *S : CS->body())
    if (const auto *DS = dyn_cast<DeclStmt>(S))
      if (DS->isSingleDecl() && DS->getSingleDecl() == VD)
        return VD->getInit();
  return nullptr;
}

const Expr *stripExpr(const Expr *E) {
  while (E) {
    const Expr *Next = E->IgnoreParenCasts();
    if (const auto *EWC = dyn_cast<ExprWithCleanups>(Next))
      Next = EWC->getSubExpr();
    if (const auto *SE = dyn_cast<StmtExpr>(Next))
      if (const Expr *Value = statementExprValue(SE))
        Next = Value;
    if (Next == E)
      break;
    E = Next;
  }
  return E;
}

const Expr *conditionOf(const Stmt *S) {
  if (const auto *I = dyn_cast<IfStmt>(S))
    return I->getCond();
  if (const auto *F = dyn_cast<ForStmt>(S))
    return F->getCond();
  if (const auto *W = dyn_cast<WhileStmt>(S))
    return W->getCond();
  if (const auto *D = dyn_cast<DoStmt>(S))
    return D->getCond();
  return nullptr;
}

bool isInside(const ParentMap &PM, const Stmt *S, const Stmt *Outer) {
  for (const Stmt *P = PM.getParent(S); P; P = PM.getParent(P))
    if (P == Outer)
      return true;
  return false;
}

const Stmt *enclosingLoop(const ParentMap &PM, const Stmt *S) {
  for (const Stmt *P = PM.getParent(S); P; P = PM.getParent(P))
    if (isa<ForStmt>(P) || isa<WhileStmt>(P) || isa<DoStmt>(P))
      return P;
  return nullptr;
}

std::optional<Location> locationOf(const Expr *E) {
  E = stripExpr(E);
  if (!E)
    return std::nullopt;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    const auto *VD = dyn_cast<VarDecl>(DRE->getDecl());
    if (!VD)
      return std::nullopt;
    Location L;
    L.Root = VD;
    return L;
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    const auto *FD = dyn_cast<FieldDecl>(ME->getMemberDecl());
    std::optional<Location> Base = locationOf(ME->getBase());
    if (!FD || !Base)
      return std::nullopt;
    Base->Steps.push_back({FD});
    return Base;
  }
  if (const auto *ASE = dyn_cast<ArraySubscriptExpr>(E)) {
    std::optional<Location> Base = locationOf(ASE->getBase());
    if (!Base)
      return std::nullopt;
    Base->Steps.push_back({nullptr});
    return Base;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(E)) {
    if (UO->getOpcode() == UO_Deref || UO->getOpcode() == UO_AddrOf)
      return locationOf(UO->getSubExpr());
  }
  return std::nullopt;
}

//===-- FunctionFlow ------------------------------------------------------===//

FunctionFlow::FunctionFlow(const FunctionDecl *FD, ASTContext &Ctx)
    : FD(FD), Ctx(Ctx) {
  Stmt *Body = FD->getBody();
  if (!Body)
    return;
  CFG::BuildOptions Options;
  Options.setAllAlwaysAdd();
  Options.AddImplicitDtors = false;
  Options.AddLifetime = false;
  Graph = CFG::buildCFG(FD, Body, &Ctx, Options);
  PM = std::make_unique<ParentMap>(Body);
  if (!Graph)
    return;
  for (const CFGBlock *B : *Graph)
    for (unsigned I = 0; I < B->size(); ++I)
      if (auto CS = (*B)[I].getAs<CFGStmt>())
        Positions.try_emplace(CS->getStmt(), B, I);
  collectDefs();
}

/// A memo key: the statement, the location's root and fields, and (for
/// values) the evaluation depth the result was computed at.
using MemoKey = llvm::SmallVector<const void *, 8>;
static MemoKey memoKey(const Stmt *At, const Location &L, unsigned Depth) {
  MemoKey K{At, L.Root, reinterpret_cast<const void *>(uintptr_t(Depth))};
  for (const Location::Step &S : L.Steps)
    K.push_back(S.Field);
  return K;
}

struct FunctionFlow::Memo {
  std::map<MemoKey, llvm::SmallVector<const Def *, 4>> Reaching;
  std::map<MemoKey, FlagSet> Values;
};

FunctionFlow::Memo &FunctionFlow::memo() const {
  if (!Memos)
    Memos = std::make_unique<Memo>();
  return *Memos;
}

FunctionFlow::~FunctionFlow() = default;

void FunctionFlow::addDef(Def D) {
  unsigned Index = Defs.size();
  DefsAt[D.S].push_back(Index);
  Defs.push_back(std::move(D));
}

void FunctionFlow::collectDefs() {
  llvm::SmallVector<const BinaryOperator *, 4> ThroughPointer;
  for (const CFGBlock *B : *Graph) {
    for (const CFGElement &El : *B) {
      auto CS = El.getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *S = CS->getStmt();
      if (const auto *BO = dyn_cast<BinaryOperator>(S)) {
        if (!BO->isAssignmentOp())
          continue;
        if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(BO->getLHS()));
            UO && UO->getOpcode() == UO_Deref && !BO->isCompoundAssignmentOp())
          ThroughPointer.push_back(BO);
        if (auto L = locationOf(BO->getLHS()))
          addDef({BO->isCompoundAssignmentOp() ? Def::Compound : Def::Assign,
                  *L, S, BO->getRHS(), BO->getOpcode()});
      } else if (const auto *UO = dyn_cast<UnaryOperator>(S)) {
        if (UO->isIncrementDecrementOp())
          if (auto L = locationOf(UO->getSubExpr()))
            addDef({Def::Increment, *L, S, nullptr, BO_Assign});
      } else if (const auto *DS = dyn_cast<DeclStmt>(S)) {
        for (const Decl *D : DS->decls()) {
          const auto *VD = dyn_cast<VarDecl>(D);
          if (!VD || !VD->isLocalVarDecl())
            continue;
          Location L;
          L.Root = VD;
          addDef({VD->getInit() ? Def::Assign : Def::Unknown, L, S,
                  VD->getInit(), BO_Assign});
        }
      } else if (const auto *CE = dyn_cast<CallExpr>(S)) {
        // Storage whose address escapes into a call may be rewritten by it.
        // memset(&x, 0, n) zeroes it; modelled verbs only read their
        // arguments, except device queries that fill in the attributes.
        const FunctionModel *M = nullptr;
        if (const FunctionDecl *Callee = CE->getDirectCallee())
          M = Rules::embedded().function(Callee->getName());
        bool Writes = !M || M->E == Effect::DeviceQuery;
        std::optional<unsigned> Zeroed;
        if (M && M->E == Effect::MemoryZero)
          Zeroed = M->arg(ArgRole::Buffer);
        for (unsigned I = 0; I < CE->getNumArgs(); ++I) {
          const Expr *Arg = stripExpr(CE->getArg(I));
          const auto *UO = dyn_cast<UnaryOperator>(Arg);
          if (!UO || UO->getOpcode() != UO_AddrOf)
            continue;
          auto L = locationOf(UO->getSubExpr());
          if (!L)
            continue;
          if (Zeroed == I)
            addDef({Def::Zero, *L, S, nullptr, BO_Assign});
          else if (Writes)
            addDef({Def::Unknown, *L, S, nullptr, BO_Assign});
        }
      }
    }
  }
  // `*prev = wr` with `prev = &first` (or `prev = &last->next`) writes
  // what prev points to: a tail pointer building a chain.
  for (const BinaryOperator *BO : ThroughPointer) {
    const auto *UO = cast<UnaryOperator>(stripExpr(BO->getLHS()));
    std::optional<Location> P = locationOf(UO->getSubExpr());
    if (!P || !P->Steps.empty())
      continue;
    llvm::SmallVector<Location, 4> Targets;
    for (const Def &D : Defs)
      if (D.Target == *P && D.K == Def::Assign && D.Value)
        if (const auto *Addr = dyn_cast<UnaryOperator>(stripExpr(D.Value));
            Addr && Addr->getOpcode() == UO_AddrOf)
          if (auto T = locationOf(Addr->getSubExpr()))
            Targets.push_back(*T);
    for (const Location &T : Targets)
      addDef({Def::Assign, T, BO, BO->getRHS(), BO_Assign});
  }
  // Local pointers assigned once from another location are aliases of it.
  // A declaration without initializer gives no value; it does not count.
  llvm::DenseMap<const ValueDecl *, unsigned> Count;
  for (const Def &D : Defs)
    if (D.Target.Steps.empty() && !(D.K == Def::Unknown && isa<DeclStmt>(D.S)))
      ++Count[D.Target.Root];
  for (const Def &D : Defs) {
    // Parameters carry the caller's value besides any assignment.
    const auto *VD = dyn_cast_or_null<VarDecl>(D.Target.Root);
    if (!VD || isa<ParmVarDecl>(VD) || !D.Target.Steps.empty() ||
        Count[VD] != 1 || D.K != Def::Assign || !VD->getType()->isPointerType())
      continue;
    if (auto Target = locationOf(D.Value))
      if (Target->Root != VD)
        SingleDef[VD] = &D;
  }
  // Writes through an alias are writes to the storage it names.
  for (Def &D : Defs)
    if (!D.Target.Steps.empty())
      D.Target = resolve(D.Target);
}

Location FunctionFlow::resolve(Location L) const {
  for (int Depth = 0; Depth < 4; ++Depth) {
    auto It = SingleDef.find(L.Root);
    if (It == SingleDef.end())
      return L;
    // `mr = req->mr` makes mr an alias only when read as a pointer: a field
    // of *mr is a field of *req->mr.
    std::optional<Location> Target = locationOf(It->second->Value);
    if (!Target)
      return L;
    Target->Steps.append(L.Steps.begin(), L.Steps.end());
    L = std::move(*Target);
  }
  return L;
}

std::pair<const CFGBlock *, unsigned>
FunctionFlow::position(const Stmt *S) const {
  while (S) {
    auto It = Positions.find(S);
    if (It != Positions.end())
      return It->second;
    S = PM ? PM->getParent(S) : nullptr;
  }
  return {nullptr, 0};
}

llvm::SmallVector<const Def *, 4>
FunctionFlow::reaching(const Location &L, const Stmt *At) const {
  MemoKey Key = memoKey(At, L, 0);
  auto &Cache = memo().Reaching;
  if (auto It = Cache.find(Key); It != Cache.end())
    return It->second;
  llvm::SmallVector<const Def *, 4> Result = solveReaching(L, At);
  Cache.emplace(std::move(Key), Result);
  return Result;
}

llvm::SmallVector<const Def *, 4>
FunctionFlow::solveReaching(const Location &L, const Stmt *At) const {
  llvm::SmallVector<const Def *, 4> Result;
  auto [Block, Index] = position(At);
  // Definitions that write all of L: of L itself or of storage containing it.
  std::vector<unsigned> Relevant;
  for (unsigned I = 0; I < Defs.size(); ++I)
    if (L.isWithin(Defs[I].Target))
      Relevant.push_back(I);
  if (!Graph || !Block || Relevant.empty()) {
    Result.push_back(nullptr); // the value comes from outside the function
    return Result;
  }

  // Scan back inside the block first: the nearest definition wins.
  for (unsigned I = Index; I-- > 0;) {
    auto CS = (*Block)[I].getAs<CFGStmt>();
    if (!CS)
      continue;
    auto It = DefsAt.find(CS->getStmt());
    if (It == DefsAt.end())
      continue;
    for (unsigned D : llvm::reverse(It->second))
      if (llvm::is_contained(Relevant, D)) {
        Result.push_back(&Defs[D]);
        return Result;
      }
  }

  // Forward data flow over blocks; bit Relevant.size() is "value at entry".
  unsigned NumBits = Relevant.size() + 1;
  unsigned NumBlocks = Graph->getNumBlockIDs();
  std::vector<llvm::BitVector> Out(NumBlocks, llvm::BitVector(NumBits));
  std::vector<int> LastDef(NumBlocks, -1);
  for (const CFGBlock *B : *Graph)
    for (const CFGElement &El : *B)
      if (auto CS = El.getAs<CFGStmt>()) {
        auto It = DefsAt.find(CS->getStmt());
        if (It == DefsAt.end())
          continue;
        for (unsigned D : It->second) {
          auto Pos = llvm::find(Relevant, D);
          if (Pos != Relevant.end())
            LastDef[B->getBlockID()] = Pos - Relevant.begin();
        }
      }
  auto InOf = [&](const CFGBlock *B) {
    llvm::BitVector In(NumBits);
    if (B == &Graph->getEntry())
      In.set(Relevant.size());
    for (const auto &P : B->preds())
      if (const CFGBlock *PB = P.getReachableBlock())
        In |= Out[PB->getBlockID()];
    return In;
  };
  bool Changed = true;
  while (Changed) {
    Changed = false;
    for (const CFGBlock *B : llvm::reverse(*Graph)) {
      llvm::BitVector New(NumBits);
      int Last = LastDef[B->getBlockID()];
      if (Last >= 0)
        New.set(Last);
      else
        New = InOf(B);
      if (New != Out[B->getBlockID()]) {
        Out[B->getBlockID()] = std::move(New);
        Changed = true;
      }
    }
  }
  llvm::BitVector In = InOf(Block);
  for (unsigned Bit : In.set_bits()) {
    if (Bit == Relevant.size())
      Result.push_back(nullptr); // from outside the function
    else
      Result.push_back(&Defs[Relevant[Bit]]);
  }
  return Result;
}

bool FunctionFlow::reachableFrom(const Stmt *From, const Stmt *To) const {
  auto [FB, FI] = position(From);
  auto [TB, TI] = position(To);
  if (!FB || !TB)
    return false;
  if (FB == TB && FI < TI)
    return true;
  llvm::BitVector Seen(Graph->getNumBlockIDs());
  std::deque<const CFGBlock *> Work;
  for (const auto &S : FB->succs())
    if (const CFGBlock *SB = S.getReachableBlock())
      Work.push_back(SB);
  while (!Work.empty()) {
    const CFGBlock *B = Work.front();
    Work.pop_front();
    if (Seen.test(B->getBlockID()))
      continue;
    Seen.set(B->getBlockID());
    if (B == TB)
      return true;
    for (const auto &S : B->succs())
      if (const CFGBlock *SB = S.getReachableBlock())
        Work.push_back(SB);
  }
  return false;
}

//===-- FlagSet and ValueEval ---------------------------------------------===//

static constexpr size_t MaxAlternatives = 16;

FlagSet FlagSet::unknown(const Stmt *Origin) {
  FlagSet S;
  FlagAlt A;
  A.Maybe = ~uint64_t(0);
  A.Origin = Origin;
  S.Alts.push_back(A);
  return S;
}

FlagSet FlagSet::constant(uint64_t V, const Stmt *Origin) {
  FlagSet S;
  FlagAlt A;
  A.Known = V;
  A.Origin = Origin;
  S.Alts.push_back(A);
  return S;
}

void FlagSet::add(const FlagSet &O) {
  Alts.append(O.Alts.begin(), O.Alts.end());
  if (Alts.size() <= MaxAlternatives)
    return;
  // Too many paths: keep one alternative that is sound for both checks, the
  // bits every path sets and the bits some path may set.
  FlagAlt Merged = Alts.front();
  for (const FlagAlt &A : Alts) {
    uint64_t Any = (Merged.Known | Merged.Maybe) | (A.Known | A.Maybe);
    Merged.Known &= A.Known;
    Merged.Maybe = Any & ~Merged.Known;
    if (!Merged.TransportTest)
      Merged.TransportTest = A.TransportTest;
    Merged.FromCoreHelper |= A.FromCoreHelper;
  }
  Alts.assign(1, Merged);
}

const FlagAlt *FlagSet::transportDependent() const {
  for (const FlagAlt &A : Alts)
    if (A.TransportTest)
      return &A;
  return nullptr;
}

static FlagAlt mergeOrigin(FlagAlt R, const FlagAlt &X, const FlagAlt &Y) {
  R.Origin = X.Origin ? X.Origin : Y.Origin;
  R.TransportTest = X.TransportTest ? X.TransportTest : Y.TransportTest;
  R.FromCoreHelper = X.FromCoreHelper || Y.FromCoreHelper;
  return R;
}

static FlagSet combine(const FlagSet &L, const FlagSet &R,
                       BinaryOperatorKind Op) {
  FlagSet Out;
  for (const FlagAlt &X : L.Alts)
    for (const FlagAlt &Y : R.Alts) {
      FlagAlt Z;
      if (Op == BO_Or || Op == BO_OrAssign) {
        Z.Known = X.Known | Y.Known;
        Z.Maybe = (X.Maybe | Y.Maybe) & ~Z.Known;
      } else { // BO_And
        Z.Known = X.Known & Y.Known;
        Z.Maybe = ((X.Known | X.Maybe) & (Y.Known | Y.Maybe)) & ~Z.Known;
      }
      FlagSet One;
      One.Alts.push_back(mergeOrigin(Z, X, Y));
      Out.add(One);
    }
  return Out;
}

std::optional<int64_t> ValueEval::constant(const Expr *E) const {
  if (!E || E->isValueDependent() || E->isTypeDependent() ||
      !E->getType()->isIntegralOrEnumerationType())
    return std::nullopt;
  Expr::EvalResult R;
  if (!E->EvaluateAsInt(R, A.context()))
    return std::nullopt;
  return R.Val.getInt().trySExtValue();
}

FlagSet ValueEval::flags(const Expr *E) const { return eval(E, BaseDepth); }

namespace {
struct ReturnValues : RecursiveASTVisitor<ReturnValues> {
  llvm::SmallVector<const Expr *, 4> Values;
  bool VisitReturnStmt(ReturnStmt *RS) {
    if (RS->getRetValue())
      Values.push_back(RS->getRetValue());
    return true;
  }
};
} // namespace

const Stmt *lastStatement(const Stmt *S) {
  while (const auto *CS = dyn_cast_or_null<CompoundStmt>(S))
    S = CS->body_empty() ? nullptr : CS->body_back();
  return S;
}

llvm::SmallVector<const Expr *, 4> returnValues(const FunctionDecl *Fn) {
  ReturnValues RV;
  RV.TraverseStmt(Fn->getBody());
  return std::move(RV.Values);
}

/// Statements that end a case of a switch: control does not fall through.
static bool endsCase(const Stmt *S) {
  while (const auto *SC = dyn_cast_or_null<SwitchCase>(S))
    S = SC->getSubStmt();
  return isa_and_nonnull<ReturnStmt>(S) || isa_and_nonnull<BreakStmt>(S);
}

/// Is the return \p RS of \p Callee, inside a switch on one of its
/// parameters (`switch (role) { case BM_ROLE_SEND: return 0; ... }`), in a
/// case the call \p CE does not select with its constant argument? Cases
/// reached by falling through are kept.
static bool skippedCase(const ParentMap &PM, const FunctionDecl *Callee,
                        const Stmt *RS,
                        llvm::function_ref<std::optional<int64_t>(unsigned)> Arg) {
  const Stmt *Child = RS;
  for (const Stmt *P = PM.getParent(Child); P; Child = P, P = PM.getParent(P)) {
    const auto *SW = dyn_cast<SwitchStmt>(P);
    if (!SW)
      continue;
    const auto *Ref = dyn_cast<DeclRefExpr>(SW->getCond()->IgnoreParenImpCasts());
    const auto *Param = Ref ? dyn_cast<ParmVarDecl>(Ref->getDecl()) : nullptr;
    const auto *Body = dyn_cast<CompoundStmt>(SW->getBody());
    if (!Param || Param->getDeclContext() != Callee || !Body)
      return false;
    std::optional<int64_t> K = Arg(Param->getFunctionScopeIndex());
    if (!K)
      return false;
    // The top-level statement of the body holding the return.
    const Stmt *Top = RS;
    while (Top && PM.getParent(Top) != Body)
      Top = PM.getParent(Top);
    if (!Top)
      return false;
    llvm::SmallVector<const Stmt *, 16> Stmts(Body->body());
    auto It = llvm::find(Stmts, Top);
    if (It == Stmts.end())
      return false;
    bool Matches = false;
    auto CaseMatches = [&](const CaseStmt *C) {
      if (C->getRHS())
        return true; // a range: keep it
      auto V = C->getLHS()->getIntegerConstantExpr(Callee->getASTContext());
      return !V || V->getExtValue() == *K;
    };
    for (auto I = It;; --I) {
      if (I != It && endsCase(*I))
        return false; // dead code after a return: keep it
      if (isa<SwitchCase>(*I)) {
        for (const Stmt *L = *I; const auto *SC = dyn_cast<SwitchCase>(L);
             L = SC->getSubStmt()) {
          if (const auto *C = dyn_cast<CaseStmt>(SC)) {
            Matches |= CaseMatches(C);
            continue;
          }
          // default: selected when no case matches
          bool AnyCase = false;
          for (const SwitchCase *O = SW->getSwitchCaseList(); O;
               O = O->getNextSwitchCase())
            if (const auto *C = dyn_cast<CaseStmt>(O); C && CaseMatches(C))
              AnyCase = true;
          Matches |= !AnyCase;
        }
        if (I == Stmts.begin() || !endsCase(*std::prev(I)))
          return false; // reached by falling through
        return !Matches;
      }
      if (I == Stmts.begin())
        return false;
    }
  }
  return false;
}

FlagSet ValueEval::evalCall(const CallExpr *CE, unsigned Depth) const {
  FlagSet Unknown = FlagSet::unknown(CE);
  const FunctionModel *M = A.modelOf(CE);
  if (M) {
    if (M->E == Effect::CoreAccessFlags)
      Unknown.Alts.front().FromCoreHelper = true;
    return Unknown;
  }
  const FunctionDecl *Callee = CE->getDirectCallee();
  if (Callee)
    Callee = Callee->getDefinition();
  if (!Callee || Depth > 8 || !llvm::is_contained(A.functions(), Callee))
    return Unknown;
  llvm::SmallVector<const Expr *, 4> Returned = returnValues(Callee);
  if (Returned.empty())
    return Unknown;
  ValueEval Inner(A, A.flow(Callee), Depth + 4);
  const ParentMap &PM = A.flow(Callee).parents();
  auto Arg = [&](unsigned I) -> std::optional<int64_t> {
    if (I >= CE->getNumArgs())
      return std::nullopt;
    return constant(CE->getArg(I));
  };
  FlagSet Result;
  for (const Expr *V : Returned)
    if (!skippedCase(PM, Callee, PM.getParent(V), Arg))
      Result.add(Inner.eval(V, Depth + 4));
  if (Result.empty())
    for (const Expr *V : Returned)
      Result.add(Inner.eval(V, Depth + 4));
  return Result;
}

FlagSet ValueEval::eval(const Expr *E, unsigned Depth) const {
  E = stripExpr(E);
  if (!E || Depth > 16)
    return FlagSet::unknown(E);
  if (auto C = constant(E))
    return FlagSet::constant(static_cast<uint64_t>(*C), E);
  if (const auto *CO = dyn_cast<ConditionalOperator>(E)) {
    FlagSet T = eval(CO->getTrueExpr(), Depth + 1);
    T.add(eval(CO->getFalseExpr(), Depth + 1));
    if (const Expr *Test = transportTest(CO->getCond()))
      for (FlagAlt &Alt : T.Alts)
        Alt.TransportTest = Alt.TransportTest ? Alt.TransportTest : Test;
    return T;
  }
  if (const auto *BO = dyn_cast<BinaryOperator>(E)) {
    switch (BO->getOpcode()) {
    case BO_Or:
    case BO_Add: // flags are sometimes summed; same as | for distinct bits
      return combine(eval(BO->getLHS(), Depth + 1),
                     eval(BO->getRHS(), Depth + 1), BO_Or);
    case BO_And:
      return combine(eval(BO->getLHS(), Depth + 1),
                     eval(BO->getRHS(), Depth + 1), BO_And);
    case BO_Comma:
      return eval(BO->getRHS(), Depth + 1);
    default:
      return FlagSet::unknown(E);
    }
  }
  if (const auto *CE = dyn_cast<CallExpr>(E))
    return evalCall(CE, Depth);
  if (auto L = locationOf(E))
    return evalLocation(E, Flow.resolve(*L), Depth + 1);
  return FlagSet::unknown(E);
}

/// The initializer of the part of an aggregate named by \p Steps, walking
/// the semantic form of nested initializer lists. Null when it cannot tell.
const Expr *subInitializer(const Expr *Init,
                           llvm::ArrayRef<Location::Step> Steps) {
  for (const Location::Step &Step : Steps) {
    const auto *ILE = dyn_cast_or_null<InitListExpr>(stripExpr(Init));
    if (const auto *CLE = dyn_cast_or_null<CompoundLiteralExpr>(stripExpr(Init)))
      ILE = dyn_cast<InitListExpr>(CLE->getInitializer());
    if (!ILE || !Step.Field)
      return nullptr;
    if (ILE->isSyntacticForm() && ILE->getSemanticForm())
      ILE = ILE->getSemanticForm();
    const RecordDecl *RD = Step.Field->getParent();
    if (RD->isUnion()) {
      if (ILE->getInitializedFieldInUnion() != Step.Field)
        return nullptr;
      Init = ILE->getNumInits() ? ILE->getInit(0) : nullptr;
      continue;
    }
    unsigned Index = Step.Field->getFieldIndex();
    Init = Index < ILE->getNumInits() ? ILE->getInit(Index) : nullptr;
    if (!Init)
      return nullptr;
  }
  return Init;
}

FlagSet ValueEval::evalDef(const Def &D, unsigned Depth) const {
  // Only whole-location definitions reach here; evalLocation narrows
  // aggregate definitions first.
  switch (D.K) {
  case Def::Assign:
    return eval(D.Value, Depth + 1);
  case Def::Compound: {
    if (D.Op != BO_OrAssign && D.Op != BO_AndAssign)
      return FlagSet::unknown(D.S);
    FlagSet Before = evalLocation(D.S, D.Target, Depth + 1);
    FlagSet After = combine(Before, eval(D.Value, Depth + 1),
                            D.Op == BO_OrAssign ? BO_Or : BO_And);
    // The compound assignment is where this value was completed.
    for (FlagAlt &Alt : After.Alts)
      Alt.Origin = D.S;
    return After;
  }
  case Def::Zero:
    return FlagSet::constant(0, D.S);
  case Def::Increment:
  case Def::Unknown:
    return FlagSet::unknown(D.S);
  }
  return FlagSet::unknown(D.S);
}

FlagSet ValueEval::evalReaching(const Def &D, const Location &L,
                                unsigned Depth) const {
  FlagSet V;
  if (D.Target == L) {
    V = evalDef(D, Depth);
  } else if (D.K == Def::Zero) {
    V = FlagSet::constant(0, D.S);
  } else if (D.K == Def::Assign) {
    // A whole-aggregate initializer: pick the member's initializer; a member
    // left out of a braced initializer is zero.
    const Expr *Init = stripExpr(D.Value);
    bool Braced = isa_and_nonnull<InitListExpr>(Init) ||
                  isa_and_nonnull<CompoundLiteralExpr>(Init);
    const Expr *Sub = subInitializer(
        D.Value, llvm::ArrayRef(L.Steps).drop_front(D.Target.Steps.size()));
    if (Sub && !isa<ImplicitValueInitExpr>(stripExpr(Sub)))
      V = eval(Sub, Depth + 1);
    else if (Braced)
      V = FlagSet::constant(0, D.S);
    else
      V = FlagSet::unknown(D.S);
  } else {
    V = FlagSet::unknown(D.S);
  }
  const Expr *Test = controllingTransportTest(D.S);
  for (FlagAlt &Alt : V.Alts) {
    if (!Alt.Origin)
      Alt.Origin = D.S;
    if (!Alt.TransportTest)
      Alt.TransportTest = Test;
  }
  return V;
}

FlagSet ValueEval::evalLocation(const Stmt *Use, const Location &L,
                                unsigned Depth) const {
  if (Depth > 16)
    return FlagSet::unknown(Use);
  // Without the memo, `x |= ...` reached by n definitions of x (a loop
  // reaching itself, branches) re-evaluates n^16 paths.
  MemoKey Key = memoKey(Use, L, Depth);
  auto &Cache = Flow.memo().Values;
  if (auto It = Cache.find(Key); It != Cache.end())
    return It->second;
  FlagSet Result = evalLocationUncached(Use, L, Depth);
  Cache.emplace(std::move(Key), Result);
  return Result;
}

FlagSet ValueEval::evalLocationUncached(const Stmt *Use, const Location &L,
                                        unsigned Depth) const {
  FlagSet Result;
  for (const Def *D : Flow.reaching(L, Use)) {
    if (!D)
      Result.add(fromCallers(L, Depth));
    else
      Result.add(evalReaching(*D, L, Depth));
  }
  if (Result.empty())
    return FlagSet::unknown(Use);
  return Result;
}

/// A parameter's value when the function starts: what the unit's callers
/// pass (`fwm_map(cmd, IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE)`),
/// and anything when callers elsewhere may pass something else.
FlagSet ValueEval::fromCallers(const Location &L, unsigned Depth) const {
  const auto *P = dyn_cast_or_null<ParmVarDecl>(L.Root);
  const FunctionDecl *Fn = Flow.function();
  if (!P || !L.Steps.empty() || Depth > 12)
    return FlagSet::unknown(nullptr);
  FlagSet Result;
  unsigned Index = P->getFunctionScopeIndex();
  for (const auto &[Call, Caller] : A.callersOf(Fn))
    if (Index < Call->getNumArgs() && Caller != Fn) {
      ValueEval Outer(A, A.flow(Caller), Depth + 2);
      Result.add(Outer.eval(Call->getArg(Index), Depth + 2));
    }
  if (Result.empty() || Fn->isExternallyVisible())
    Result.add(FlagSet::unknown(nullptr));
  return Result;
}

const Def *FunctionFlow::lastDefAt(const Stmt *S, const Location &L) const {
  auto It = DefsAt.find(S);
  if (It == DefsAt.end())
    return nullptr;
  const Def *Last = nullptr;
  for (unsigned I : It->second)
    if (L.isWithin(Defs[I].Target))
      Last = &Defs[I];
  return Last;
}

FlagSet ValueEval::flagsAt(const Location &L, const Stmt *At) const {
  return evalLocation(At, Flow.resolve(L), BaseDepth);
}

FlagSet ValueEval::flagsAfter(const Location &L, const Stmt *At) const {
  const Def *Last = Flow.lastDefAt(At, L);
  if (!Last)
    return FlagSet::unknown(At);
  return evalReaching(*Last, L, 0);
}

namespace {
/// Finds a transport test inside a condition.
class TransportFinder : public ConstStmtVisitor<TransportFinder, const Expr *> {
public:
  explicit TransportFinder(const TuAnalysis &A) : A(A) {}

  const Expr *VisitCallExpr(const CallExpr *CE) {
    const FunctionModel *M = A.modelOf(CE);
    if (M && M->E == Effect::TransportQuery)
      return CE;
    return VisitStmt(CE);
  }
  const Expr *VisitDeclRefExpr(const DeclRefExpr *DRE) {
    if (const auto *ECD = dyn_cast<EnumConstantDecl>(DRE->getDecl()))
      return A.rules().isTransportConstant(ECD->getName()) ? DRE : nullptr;
    return nullptr;
  }
  const Expr *VisitStmt(const Stmt *S) {
    for (const Stmt *Child : S->children())
      if (Child)
        if (const Expr *Found = Visit(Child))
          return Found;
    return nullptr;
  }

private:
  const TuAnalysis &A;
};
} // namespace

const Expr *ValueEval::transportTest(const Expr *Cond) const {
  if (!Cond)
    return nullptr;
  TransportFinder Finder(A);
  if (const Expr *Found = Finder.Visit(Cond))
    return Found;
  // `bool iwarp = rdma_protocol_iwarp(...); ... if (iwarp)`
  if (auto L = locationOf(Cond)) {
    if (!L->Steps.empty())
      return nullptr;
    for (const Def *D : Flow.reaching(*L, Cond))
      if (D && D->K == Def::Assign && D->Value)
        if (const Expr *Found = Finder.Visit(D->Value))
          return Found;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(Cond)))
    if (UO->getOpcode() == UO_LNot)
      return transportTest(UO->getSubExpr());
  return nullptr;
}

const Expr *ValueEval::controllingTransportTest(const Stmt *S) const {
  if (!S)
    return nullptr;
  const ParentMap &PM = Flow.parents();
  const Stmt *Child = S;
  for (const Stmt *P = PM.getParent(S); P; Child = P, P = PM.getParent(P)) {
    const Expr *Cond = nullptr;
    if (const auto *If = dyn_cast<IfStmt>(P))
      Cond = Child != If->getCond() ? If->getCond() : nullptr;
    else if (const auto *CO = dyn_cast<ConditionalOperator>(P))
      Cond = Child != CO->getCond() ? CO->getCond() : nullptr;
    if (const Expr *Test = transportTest(Cond))
      return Test;
  }
  return nullptr;
}

} // namespace ulplint
