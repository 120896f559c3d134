//===- Analysis.cpp - The shared per-translation-unit engine --------------===//

#include "Analysis.h"
#include "Facts.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Basic/IdentifierTable.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Lex/Lexer.h"
#include "llvm/Support/Path.h"
#include <map>
#include <mutex>

using namespace clang;

namespace ulplint {

//===-- The per-ASTContext cache ------------------------------------------===//

namespace {
std::mutex CacheMutex;
std::map<const ASTContext *, std::unique_ptr<TuAnalysis>> &cache() {
  static std::map<const ASTContext *, std::unique_ptr<TuAnalysis>> Cache;
  return Cache;
}
void dropFromCache(void *Ctx) {
  std::lock_guard<std::mutex> Lock(CacheMutex);
  cache().erase(static_cast<const ASTContext *>(Ctx));
}
} // namespace

TuAnalysis &TuAnalysis::get(ASTContext &Ctx, StringRef Wrappers) {
  {
    std::lock_guard<std::mutex> Lock(CacheMutex);
    auto It = cache().find(&Ctx);
    if (It != cache().end())
      return *It->second;
  }
  // Built outside the lock: one ASTContext belongs to one thread.
  auto A = std::make_unique<TuAnalysis>(Ctx, Wrappers);
  TuAnalysis &Ref = *A;
  {
    std::lock_guard<std::mutex> Lock(CacheMutex);
    cache()[&Ctx] = std::move(A);
  }
  Ctx.AddDeallocation(dropFromCache, &Ctx);
  return Ref;
}

//===-- Construction ------------------------------------------------------===//

llvm::Expected<llvm::StringMap<const FunctionModel *>>
parseApiWrappers(StringRef Spec, const Rules &R) {
  llvm::StringMap<const FunctionModel *> Out;
  SmallVector<StringRef, 8> Entries;
  Spec.split(Entries, ';', -1, /*KeepEmpty=*/false);
  for (StringRef Entry : Entries) {
    auto [Wrapper, Modelled] = Entry.split('=');
    Wrapper = Wrapper.trim();
    Modelled = Modelled.trim();
    if (Wrapper.empty() || Modelled.empty())
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "ApiWrappers: expected 'wrapper=function' "
                                     "entries separated by ';', got '" +
                                         Entry.trim() + "'");
    const FunctionModel *M = R.function(Modelled);
    if (!M)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "ApiWrappers: '" + Modelled +
                                         "' is not a modelled API function "
                                         "(rules/api/*.yaml)");
    Out[Wrapper] = M;
  }
  return Out;
}

TuAnalysis::TuAnalysis(ASTContext &Ctx, StringRef WrapperSpec)
    : Ctx(Ctx), R(Rules::embedded()) {
  if (auto Parsed = parseApiWrappers(WrapperSpec, R))
    Wrappers = std::move(*Parsed);
  else
    llvm::consumeError(Parsed.takeError()); // reported by the checks
  // get(), not find(): with a precompiled preamble (clangd) identifiers of
  // the headers are loaded on demand.
  if (Ctx.Idents.get("__KERNEL__").hasMacroDefinition())
    TuDomain = Domain::Kernel;
  collect();
}

TuAnalysis::~TuAnalysis() = default;

const SourceManager &TuAnalysis::sources() const {
  return Ctx.getSourceManager();
}

namespace {
/// Visits one function body and records modelled calls and field stores.
class BodyCollector : public RecursiveASTVisitor<BodyCollector> {
public:
  BodyCollector(TuAnalysis &A, const FunctionDecl *FD,
                std::vector<ApiCall> &Calls,
                std::vector<std::pair<const CallExpr *, const FunctionDecl *>>
                    &DirectCalls,
                std::function<void(const Stmt *, const Location &, QualType,
                                   const Expr *)>
                    OnInit,
                std::function<void(const BinaryOperator *)> OnAssign,
                std::function<void(const CallExpr *, const Location &)> OnResult)
      : A(A), FD(FD), Calls(Calls), DirectCalls(DirectCalls),
        OnInit(std::move(OnInit)), OnAssign(std::move(OnAssign)),
        OnResult(std::move(OnResult)) {}

  bool VisitCallExpr(CallExpr *CE) {
    if (const FunctionModel *M = A.modelOf(CE)) {
      Calls.push_back({CE, M, FD});
      // regcore_mr_get(core, buf, len, flags, &mr): the handle comes back
      // through an out-parameter.
      if (std::optional<unsigned> Out = M->arg(ArgRole::Out))
        if (*Out < CE->getNumArgs())
          if (auto L = locationOf(CE->getArg(*Out)))
            OnResult(CE, *L);
    }
    else if (CE->getDirectCallee())
      DirectCalls.push_back({CE, FD});
    return true;
  }
  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (BO->isAssignmentOp())
      OnAssign(BO);
    return true;
  }
  bool VisitDeclStmt(DeclStmt *DS) {
    for (Decl *D : DS->decls())
      if (auto *VD = dyn_cast<VarDecl>(D))
        if (VD->getInit()) {
          Location L;
          L.Root = VD;
          OnInit(DS, L, VD->getType(), VD->getInit());
        }
    return true;
  }

private:
  TuAnalysis &A;
  const FunctionDecl *FD;
  std::vector<ApiCall> &Calls;
  std::vector<std::pair<const CallExpr *, const FunctionDecl *>> &DirectCalls;
  std::function<void(const Stmt *, const Location &, QualType, const Expr *)>
      OnInit;
  std::function<void(const BinaryOperator *)> OnAssign;
  std::function<void(const CallExpr *, const Location &)> OnResult;
};
} // namespace

void TuAnalysis::collect() {
  const SourceManager &SM = Ctx.getSourceManager();
  // Only the main file's functions are analysed: headers are shared by many
  // units, and system headers are not the user's code.
  for (Decl *D : Ctx.getTranslationUnitDecl()->decls()) {
    auto *FD = dyn_cast<FunctionDecl>(D);
    if (!FD || !FD->doesThisDeclarationHaveABody())
      continue;
    if (!SM.isInMainFile(SM.getExpansionLoc(FD->getLocation())))
      continue;
    Functions.push_back(FD);
    collectFunction(FD);
  }
}

std::optional<int64_t> TuAnalysis::enumValue(StringRef Name) const {
  if (Name.empty())
    return std::nullopt;
  IdentifierInfo &II = Ctx.Idents.get(Name); // loads it from a preamble
  for (const NamedDecl *ND : Ctx.getTranslationUnitDecl()->lookup(&II))
    if (const auto *ECD = dyn_cast<EnumConstantDecl>(ND))
      return ECD->getInitVal().getExtValue();
  // C units with a precompiled preamble (clangd) have no lookup table for
  // the headers' enumerators: index the top-level enums once.
  if (!EnumsIndexed) {
    EnumsIndexed = true;
    auto Index = [&](const EnumDecl *ED) {
      if (ED)
        for (const EnumConstantDecl *ECD : ED->enumerators())
          Enumerators.try_emplace(ECD->getName(), ECD->getInitVal().getExtValue());
    };
    for (const Decl *D : Ctx.getTranslationUnitDecl()->decls())
      if (const auto *ED = dyn_cast<EnumDecl>(D))
        Index(ED);
      else if (const auto *TD = dyn_cast<TypedefNameDecl>(D))
        if (const auto *ET = TD->getUnderlyingType()->getAs<EnumType>())
          Index(ET->getDecl()->getDefinition());
  }
  auto It = Enumerators.find(Name);
  if (It != Enumerators.end())
    return It->second;
  return std::nullopt;
}

StringRef TuAnalysis::enumeratorName(QualType T, int64_t V) const {
  const auto *ET = T.getCanonicalType()->getAs<EnumType>();
  if (!ET || !ET->getDecl()->getDefinition())
    return {};
  for (const EnumConstantDecl *ECD : ET->getDecl()->getDefinition()->enumerators())
    if (ECD->getInitVal().getExtValue() == V)
      return ECD->getName();
  return {};
}

void TuAnalysis::collectFunction(const FunctionDecl *FD) {
  auto OnInit = [&](const Stmt *At, const Location &L, QualType T,
                    const Expr *Init) {
    addInitStores(FD, At, L, T, Init);
  };
  auto OnAssign = [&](const BinaryOperator *BO) {
    if (const auto *CE = dyn_cast<CallExpr>(stripExpr(BO->getRHS())))
      if (auto L = locationOf(BO->getLHS())) {
        Results[CE] = *L;
        CallerOf[CE] = FD;
      }
    std::optional<FieldStore> FS = classifyMember(BO->getLHS());
    if (FS) {
      FS->Value = BO->getRHS();
      FS->At = BO;
      FS->Spelling = BO->getLHS();
      FS->Compound = BO->isCompoundAssignmentOp();
      FS->Fn = FD;
      Stores.push_back(std::move(*FS));
      return;
    }
    // `wr = (struct ibv_send_wr){ .opcode = ... }` or a whole-struct copy.
    if (auto L = locationOf(BO->getLHS()))
      addInitStores(FD, BO, *L, BO->getLHS()->getType(), BO->getRHS());
  };
  auto OnResult = [&](const CallExpr *CE, const Location &L) {
    Results[CE] = L;
    CallerOf[CE] = FD;
  };
  BodyCollector(*this, FD, Calls, DirectCalls, OnInit, OnAssign, OnResult)
      .TraverseStmt(FD->getBody());
}

/// Records one FieldStore per modelled member a braced initializer sets.
void TuAnalysis::addInitStores(const FunctionDecl *FD, const Stmt *At,
                               const Location &Object, QualType T,
                               const Expr *Init) {
  const Expr *Stripped = stripExpr(Init);
  // `d = kzalloc(..)` is recorded before the `_res` inside the kernel's
  // alloc_hooks() statement expression: the outer target wins.
  if (const auto *CE = dyn_cast_or_null<CallExpr>(Stripped))
    if (Results.try_emplace(CE, Object).second)
      CallerOf[CE] = FD;
  if (const auto *CLE = dyn_cast_or_null<CompoundLiteralExpr>(Stripped))
    Stripped = CLE->getInitializer();
  const auto *ILE = dyn_cast_or_null<InitListExpr>(Stripped);
  const auto *RT = T->getAsStructureType();
  if (!RT)
    RT = T->getAsUnionType() ? T->getAs<RecordType>() : nullptr;
  if (!ILE || !RT)
    return;
  if (ILE->isSyntacticForm() && ILE->getSemanticForm())
    ILE = ILE->getSemanticForm();
  const RecordDecl *RD = RT->getDecl()->getDefinition();
  if (!RD)
    return;
  auto Visit = [&](const FieldDecl *F, const Expr *Sub) {
    if (!Sub || isa<ImplicitValueInitExpr>(Sub))
      return;
    Location Member = Object;
    Member.Steps.push_back({F});
    if (isa<InitListExpr>(stripExpr(Sub))) {
      addInitStores(FD, At, Member, F->getType(), Sub);
      return;
    }
    if (std::optional<FieldStore> FS = classify(Member)) {
      FS->Value = Sub;
      FS->At = At;
      FS->Spelling = Sub;
      FS->Fn = FD;
      Stores.push_back(std::move(*FS));
    }
  };
  for (const FieldDecl *F : RD->fields()) {
    if (RD->isUnion()) {
      if (ILE->getInitializedFieldInUnion() == F && ILE->getNumInits())
        Visit(F, ILE->getInit(0));
      continue;
    }
    unsigned I = F->getFieldIndex();
    if (I < ILE->getNumInits())
      Visit(F, ILE->getInit(I));
  }
}

//===-- Queries -----------------------------------------------------------===//

const FunctionModel *TuAnalysis::modelOf(const CallExpr *CE) const {
  const FunctionDecl *Callee = CE->getDirectCallee();
  if (!Callee || !Callee->getIdentifier())
    return nullptr;
  if (!Wrappers.empty())
    if (auto It = Wrappers.find(Callee->getName()); It != Wrappers.end())
      return It->second;
  return R.function(Callee->getName());
}

std::vector<std::pair<const CallExpr *, const FunctionDecl *>>
TuAnalysis::callersOf(const FunctionDecl *Callee) const {
  // Indexed by callee once: a scan of every call per query made the value
  // evaluator (which asks for a parameter's callers at each step) quadratic.
  if (CallersIndexed != DirectCalls.size()) {
    for (size_t I = CallersIndexed; I < DirectCalls.size(); ++I) {
      const auto &[CE, Caller] = DirectCalls[I];
      CallersByCallee[CE->getDirectCallee()->getCanonicalDecl()].push_back(
          {CE, Caller});
    }
    CallersIndexed = DirectCalls.size();
  }
  auto It = CallersByCallee.find(Callee->getCanonicalDecl());
  if (It == CallersByCallee.end())
    return {};
  return It->second;
}

std::vector<const CallExpr *>
TuAnalysis::callsTo(const FunctionDecl *Caller, const FunctionDecl *Callee) const {
  std::vector<const CallExpr *> Found;
  for (const auto &[CE, From] : callersOf(Callee))
    if (From == Caller)
      Found.push_back(CE);
  return Found;
}

FunctionFlow &TuAnalysis::flow(const FunctionDecl *FD) const {
  std::unique_ptr<FunctionFlow> &Slot = Flows[FD];
  if (!Slot)
    Slot = std::make_unique<FunctionFlow>(FD, Ctx);
  return *Slot;
}

ValueEval TuAnalysis::values(const FunctionDecl *FD) const {
  return ValueEval(*this, flow(FD));
}

/// The record a value of type \p T is or points to.
static QualType objectType(QualType T) {
  while (!T.isNull()) {
    T = T.getCanonicalType();
    if (const auto *PT = T->getAs<PointerType>())
      T = PT->getPointeeType();
    else if (const auto *AT = T->getAsArrayTypeUnsafe())
      T = AT->getElementType();
    else
      break;
  }
  return T;
}

/// Type of the object named by the first \p K steps of \p L.
static QualType typeAt(const Location &L, size_t K) {
  QualType T = L.Root->getType();
  for (size_t I = 0; I < K; ++I) {
    T = objectType(T);
    if (L.Steps[I].Field)
      T = L.Steps[I].Field->getType();
  }
  return objectType(T);
}

const StructModel *TuAnalysis::structOf(QualType T) const {
  const RecordType *RT = objectType(T)->getAs<RecordType>();
  if (!RT || !RT->getDecl()->getIdentifier())
    return nullptr;
  return R.structure(RT->getDecl()->getName());
}

bool TuAnalysis::isConnectionPointer(QualType T) const {
  const auto *P = T->getAs<PointerType>();
  const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
  return RD && RD->getIdentifier() &&
         llvm::is_contained(R.domain(TuDomain).ConnectionTypes, RD->getName());
}

bool TuAnalysis::holdsConnection(const RecordDecl *RD) const {
  RD = RD ? RD->getDefinition() : nullptr;
  return RD && llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
           return isConnectionPointer(F->getType());
         });
}

bool TuAnalysis::ownedByConnection(const Expr *E) const {
  E = stripExpr(E);
  if (const auto *UO = dyn_cast<UnaryOperator>(E))
    return ownedByConnection(UO->getSubExpr());
  if (const auto *AS = dyn_cast<ArraySubscriptExpr>(E))
    return ownedByConnection(AS->getBase());
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    const auto *FD = dyn_cast<FieldDecl>(ME->getMemberDecl());
    return (FD && holdsConnection(FD->getParent())) ||
           ownedByConnection(ME->getBase());
  }
  const auto *DRE = dyn_cast<DeclRefExpr>(E);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  return VD && VD->hasGlobalStorage();
}

static const FieldDecl *fieldNamed(QualType T, StringRef Name) {
  const RecordType *RT = objectType(T)->getAs<RecordType>();
  if (!RT || !RT->getDecl()->getDefinition())
    return nullptr;
  for (const FieldDecl *F : RT->getDecl()->getDefinition()->fields())
    if (F->getName() == Name)
      return F;
  return nullptr;
}

std::optional<FieldStore> TuAnalysis::classify(const Location &Target) const {
  if (!Target.Root)
    return std::nullopt;
  // Innermost owner first: `req->reg_wr.wr.opcode` belongs to the ib_send_wr
  // `req->reg_wr.wr`, not to whatever struct `req` is.
  for (size_t K = Target.Steps.size(); K-- > 0;) {
    QualType Owner = typeAt(Target, K);
    const StructModel *S = structOf(Owner);
    if (!S)
      continue;
    auto It = S->Fields.find(Target.fieldPath(K));
    if (It == S->Fields.end())
      continue;
    FieldStore FS;
    FS.Struct = S;
    FS.Role = It->second;
    FS.Target = Target;
    FS.Object = Target.prefix(K);
    if (!S->Base.empty())
      if (const FieldDecl *Base = fieldNamed(Owner, S->Base))
        FS.Object.Steps.push_back({Base});
    return FS;
  }
  return std::nullopt;
}

std::optional<Location> TuAnalysis::member(const Location &Object,
                                           FieldRole Role) const {
  QualType T = typeAt(Object, Object.Steps.size());
  const StructModel *S = structOf(T);
  if (!S)
    return std::nullopt;
  for (const auto &[Path, FieldRole] : S->Fields) {
    if (FieldRole != Role)
      continue;
    Location L = Object;
    QualType Cur = T;
    llvm::SmallVector<StringRef, 4> Parts;
    StringRef(Path).split(Parts, '.');
    for (StringRef Part : Parts) {
      const FieldDecl *F = fieldNamed(Cur, Part);
      if (!F)
        return std::nullopt;
      L.Steps.push_back({F});
      Cur = F->getType();
    }
    return L;
  }
  return std::nullopt;
}

std::optional<FieldStore> TuAnalysis::classifyMember(const Expr *LValue) const {
  std::optional<Location> L = locationOf(LValue);
  if (!L || L->Steps.empty())
    return std::nullopt;
  return classify(*L);
}

std::optional<Location> TuAnalysis::resultOf(const CallExpr *CE) const {
  auto It = Results.find(CE);
  if (It == Results.end())
    return std::nullopt;
  return It->second;
}

bool TuAnalysis::sameStorage(const Location &L1, const FunctionDecl *F1,
                             const Location &L2, const FunctionDecl *F2) const {
  Location R1 = flow(F1).resolve(L1);
  Location R2 = flow(F2).resolve(L2);
  if (F1 == F2 && R1 == R2)
    return true; // spares the keys
  SlotKey K1 = SlotKey::of(R1, F1);
  return K1.isShared() && // spares the second key
         sameResolvedStorage(R1, F1, K1, R2, F2, SlotKey::of(R2, F2));
}

bool TuAnalysis::sameResolvedStorage(const Location &R1, const FunctionDecl *F1,
                                     const SlotKey &K1, const Location &R2,
                                     const FunctionDecl *F2, const SlotKey &K2) const {
  return (F1 == F2 && R1 == R2) || (K1.isShared() && K1 == K2);
}

bool TuAnalysis::withinStorage(const Location &L1, const FunctionDecl *F1,
                               const Location &L2, const FunctionDecl *F2) const {
  Location R1 = flow(F1).resolve(L1);
  Location R2 = flow(F2).resolve(L2);
  if (F1 == F2 && R1.isWithin(R2))
    return true;
  if (R1.Steps.size() < R2.Steps.size())
    return false;
  SlotKey K2 = SlotKey::of(R2, F2);
  return K2.isShared() && K2 == SlotKey::of(R1.prefix(R2.Steps.size()), F1);
}

std::vector<const ApiCall *>
TuAnalysis::producersOf(const Location &Handle, const FunctionDecl *Where,
                        llvm::ArrayRef<Effect> Effects, unsigned Depth) const {
  std::vector<const ApiCall *> Found;
  for (const ApiCall &C : Calls) {
    if (!llvm::is_contained(Effects, C.Model->E))
      continue;
    std::optional<Location> Result = resultOf(C.Call);
    if (Result && sameStorage(*Result, C.Caller, Handle, Where))
      Found.push_back(&C);
  }
  if (Depth >= 3)
    return Found;
  // `mr = ulp_alloc_mr(c)`: a helper of this unit that returns what a
  // modelled call produced.
  for (const auto &[Call, Result] : Results) {
    const FunctionDecl *Callee = Call->getDirectCallee();
    const FunctionDecl *Caller = CallerOf.lookup(Call);
    if (!Callee || !Caller || !Callee->hasBody() ||
        !sameStorage(Result, Caller, Handle, Where))
      continue;
    for (const ApiCall *P : returnedProducers(Callee->getDefinition(), Effects, Depth + 1))
      if (!llvm::is_contained(Found, P))
        Found.push_back(P);
  }
  return Found;
}

std::vector<const ApiCall *>
TuAnalysis::returnedProducers(const FunctionDecl *FD,
                              llvm::ArrayRef<Effect> Effects,
                              unsigned Depth) const {
  std::vector<const ApiCall *> Found;
  if (!FD || !llvm::is_contained(Functions, FD))
    return Found;
  for (const Expr *V : returnValues(FD)) {
    const Expr *S = stripExpr(V);
    if (const auto *CE = dyn_cast<CallExpr>(S)) {
      for (const ApiCall &C : Calls)
        if (C.Call == CE && llvm::is_contained(Effects, C.Model->E))
          Found.push_back(&C);
      continue;
    }
    if (auto L = locationOf(S))
      for (const ApiCall *P : producersOf(*L, FD, Effects, Depth))
        if (!llvm::is_contained(Found, P))
          Found.push_back(P);
  }
  return Found;
}

namespace {
class UseFinder : public RecursiveASTVisitor<UseFinder> {
public:
  UseFinder(const TuAnalysis &A, const FunctionDecl *FD, const Location &Handle,
            const FunctionDecl *Where, std::vector<TuAnalysis::Use> &Out)
      : A(A), FD(FD), Handle(Handle), Where(Where), Out(Out) {}
  bool VisitExpr(Expr *E) {
    if (!isa<DeclRefExpr>(E) && !isa<MemberExpr>(E) &&
        !isa<ArraySubscriptExpr>(E))
      return true;
    if (auto L = locationOf(E))
      if (A.sameStorage(*L, FD, Handle, Where))
        Out.push_back({E, FD});
    return true;
  }

private:
  const TuAnalysis &A;
  const FunctionDecl *FD;
  const Location &Handle;
  const FunctionDecl *Where;
  std::vector<TuAnalysis::Use> &Out;
};
} // namespace

std::vector<TuAnalysis::Use> TuAnalysis::usesOf(const Location &Handle,
                                                const FunctionDecl *Where) const {
  std::vector<Use> Out;
  bool Shared = SlotKey::of(flow(Where).resolve(Handle), Where).isShared();
  for (const FunctionDecl *FD : Functions) {
    if (FD != Where && !Shared)
      continue;
    UseFinder(*this, FD, Handle, Where, Out).TraverseStmt(FD->getBody());
  }
  return Out;
}

uint64_t TuAnalysis::flagBit(Flag F) const {
  // Enumerator values come from the unit's own headers.
  auto [It, New] = FlagBits.try_emplace(F, 0);
  if (New)
    It->second = static_cast<uint64_t>(enumValue(flagName(F)).value_or(0));
  return It->second;
}

const Expr *ApiCall::arg(ArgRole Role) const {
  std::optional<unsigned> Index = Model->arg(Role);
  if (!Index || *Index >= Call->getNumArgs())
    return nullptr;
  return Call->getArg(*Index);
}

//===-- Source locations --------------------------------------------------===//

SourceLocation userLoc(const SourceManager &SM, SourceLocation Loc) {
  return Loc.isMacroID() ? SM.getFileLoc(Loc) : Loc;
}

CharSourceRange userRange(const ASTContext &Ctx, const Expr *E) {
  return Lexer::makeFileCharRange(
      CharSourceRange::getTokenRange(E->getSourceRange()),
      Ctx.getSourceManager(), Ctx.getLangOpts());
}

std::string sourceText(const ASTContext &Ctx, const Expr *E) {
  CharSourceRange Range = userRange(Ctx, E);
  if (Range.isInvalid())
    return {};
  return Lexer::getSourceText(Range, Ctx.getSourceManager(), Ctx.getLangOpts())
      .str();
}

} // namespace ulplint
