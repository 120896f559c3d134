//===- Inventory.cpp - Where a unit manages registration by hand ----------===//

#include "Inventory.h"
#include "Lifecycle.h"
#include "Sites.h"
#include "WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/AST/TypeLoc.h"
#include "clang/Basic/FileManager.h"
#include "clang/Lex/Lexer.h"
#include "llvm/Support/Path.h"

using namespace clang;

namespace ulplint {

StringRef siteKindName(SiteKind K) {
  switch (K) {
  case SiteKind::Allocation: return "allocation";
  case SiteKind::Mapping: return "mapping";
  case SiteKind::RegistrationPost: return "registration";
  case SiteKind::Invalidation: return "invalidation";
  case SiteKind::QueueSizing: return "queue-sizing";
  case SiteKind::RemoteInvalidation: return "remote-invalidation";
  case SiteKind::CoreManaged: return "core-managed";
  }
  llvm_unreachable("site kind");
}

MigrationKey migrationKeyOf(SiteRole R) {
  switch (R) {
  case SiteRole::Expose: return MigrationKey::Expose;
  case SiteRole::DataTransfer: return MigrationKey::DataTransfer;
  case SiteRole::Local: return MigrationKey::Local;
  }
  llvm_unreachable("site role");
}

StringRef siteRoleName(SiteRole R) {
  switch (R) {
  case SiteRole::Expose: return "expose";
  case SiteRole::DataTransfer: return "data_transfer";
  case SiteRole::Local: return "local";
  }
  llvm_unreachable("site role");
}

const Inventory &Inventory::of(const TuAnalysis &A) {
  return A.cached<Inventory>();
}

Inventory::Inventory(const TuAnalysis &A) : A(A) {
  findDatapath();
  RdmaBuffers = rdmaLocalBuffers(A);
  // First: what the unit does as a whole decides the roles of its sites.
  scanWorkRequests();
  UnitRole = unitRole();
  UsesRdmaRw = llvm::any_of(A.calls(), [](const ApiCall &C) {
    return C.Model->E == Effect::RwInit;
  });
  collectWorkRequests();
  collectCalls();
  collectQueues();
  collectRemoteInvalidations();
  llvm::sort(Sites, [&](const RegistrationSite &L, const RegistrationSite &R) {
    return A.sources().isBeforeInTranslationUnit(L.Loc, R.Loc);
  });
  exportSites();
}

static std::optional<SiteKind> kindOfEffect(Effect E);

/// `nbuf = malloc(len); mr = ibv_reg_mr(pd, nbuf, ...)`: memory the
/// function allocates and registers itself (a pool or a space that grows),
/// not memory an I/O brings.
static bool registersItsOwnAllocation(const TuAnalysis &A, const ApiCall &C) {
  const Expr *Addr = C.arg(ArgRole::Addr);
  std::optional<Location> Buf = Addr ? locationOf(Addr) : std::nullopt;
  if (!Buf)
    return false;
  const FunctionFlow &Flow = A.flow(C.Caller);
  Location Registered = Flow.resolve(*Buf);
  return llvm::any_of(A.calls(), [&](const ApiCall &M) {
    if (M.Caller != C.Caller || M.Model->E != Effect::BufferAlloc)
      return false;
    std::optional<Location> Allocated = A.resultOf(M.Call);
    return Allocated && Flow.resolve(*Allocated) == Registered;
  });
}

std::optional<Location> registeredHandle(const TuAnalysis &A, const ApiCall &C) {
  const Expr *Handle = C.Model->E == Effect::MrDeregister ? C.arg(ArgRole::Mr) : nullptr;
  return Handle ? locationOf(Handle) : A.resultOf(C.Call);
}

/// A handle, or a pointer to an entry that holds one (`struct cache_ent *`).
static bool holdsHandle(const TuAnalysis &A, QualType T) {
  if (isHandleType(A, T))
    return true;
  const auto *P = T->getAs<PointerType>();
  const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
  RD = RD ? RD->getDefinition() : nullptr;
  return RD && llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
           return isHandleType(A, F->getType());
         });
}

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
        if (holdsHandle(A, V->getType()) && enclosingLoop(PM, RS) &&
            SM.isBeforeInTranslationUnit(RS->getBeginLoc(), C.Call->getBeginLoc()))
          Hit = true;
    for (const Stmt *Child : S->children())
      Scan(Child);
  };
  Scan(C.Caller->getBody());
  return Hit;
}

bool Inventory::onDatapath(const ApiCall &C) const {
  const DatapathReason *Why = datapath(C.Caller);
  if (!Why || fillsCache(A, C))
    return false;
  if (!Why->Indirect)
    return true;
  // Reached only through a helper that posts: the function may be setup
  // that sends a message. What it registers must come with the I/O, and
  // what it deregisters must have been registered per I/O.
  if (registersItsOwnAllocation(A, C))
    return false;
  if (C.Model->E != Effect::MrDeregister)
    return true;
  std::optional<Location> L = registeredHandle(A, C);
  const FieldDecl *Field = L ? L->lastField() : nullptr;
  return Field && llvm::any_of(A.calls(), [&](const ApiCall &R) {
           std::optional<Location> RL;
           return R.Model->E != Effect::MrDeregister && kindOfEffect(R.Model->E) &&
                  (RL = registeredHandle(A, R)) && RL->lastField() == Field &&
                  onDatapath(R);
         });
}

void Inventory::add(RegistrationSite S) {
  S.Datapath = S.Call ? onDatapath(*S.Call) : S.Fn && datapath(S.Fn);
  Sites.push_back(std::move(S));
}

static std::optional<SiteKind> kindOfEffect(Effect E) {
  switch (E) {
  case Effect::MrRegister:
  case Effect::MrReregister:
  case Effect::MrAlloc:
  case Effect::MwAlloc:
  case Effect::MrPoolInit:
  case Effect::MrPoolGet:
    return SiteKind::Allocation;
  case Effect::MrMap:
    return SiteKind::Mapping;
  case Effect::MwBind:
    return SiteKind::RegistrationPost;
  case Effect::MrDeregister:
  case Effect::MwDealloc:
  case Effect::MrPoolPut:
  case Effect::MrPoolDestroy:
    return SiteKind::Invalidation;
  default:
    return std::nullopt;
  }
}

/// Core-managed calls that stand for one migrated site each.
static bool isCoreSite(Effect E) {
  return E == Effect::RwInit || E == Effect::CoreRegInit ||
         E == Effect::CoreMrGet || E == Effect::QpCreate ||
         E == Effect::RwMaxSendWr || E == Effect::RwMrFactor;
}

/// `ib_mr_pool_init(qp, &qp->rdma_mrs, ...)` (in a unit that uses rdma_rw):
/// the MRs rdma_rw itself takes on iWARP (ksmbd sets the pool up by hand).
static bool isRdmaRwPool(const TuAnalysis &A, const ApiCall &C) {
  if (C.Model->E != Effect::MrPoolInit && C.Model->E != Effect::MrPoolDestroy)
    return false;
  const auto *Pool = dyn_cast_or_null<UnaryOperator>(
      C.arg(ArgRole::Pool) ? C.arg(ArgRole::Pool)->IgnoreParenImpCasts() : nullptr);
  const auto *ME = Pool ? dyn_cast<MemberExpr>(Pool->getSubExpr()->IgnoreParens())
                        : nullptr;
  StringRef RwPool = A.rules().domain(A.domain()).RwMrPool;
  return ME && !RwPool.empty() && ME->getMemberDecl()->getName() == RwPool;
}

void Inventory::collectCalls() {
  for (const ApiCall &C : A.calls()) {
    RegistrationSite S;
    S.Loc = C.Call->getBeginLoc();
    S.Fn = C.Caller;
    S.Api = C.Model->Name;
    S.Call = &C;
    bool FeedsRdmaRw = UsesRdmaRw && isRdmaRwPool(A, C);
    if (C.Model->CoreManaged || FeedsRdmaRw) {
      if (!isCoreSite(C.Model->E) && !FeedsRdmaRw)
        continue;
      S.Kind = SiteKind::CoreManaged;
      add(std::move(S));
      continue;
    }
    std::optional<SiteKind> K = kindOfEffect(C.Model->E);
    if (C.Model->E == Effect::WrxOp) {
      if (C.Model->Op == Opcode::RegMr || C.Model->Op == Opcode::BindMw)
        K = SiteKind::RegistrationPost;
      else if (C.Model->Op == Opcode::LocalInv)
        K = SiteKind::Invalidation;
    }
    if (!K)
      continue;
    S.Kind = *K;
    S.Role = roleOf(C);
    // A key for the peer must die with its I/O: no cache for those.
    if (C.Model->E == Effect::MrRegister && S.Role != SiteRole::Expose)
      S.Fixes = regcoreCacheRewrite(A, C, S.FixInPlace);
    add(std::move(S));
  }
}

/// Does this registration give a peer a key (remote rights on an rkey that
/// leaves the code we see)?
static bool registrationExposes(const TuAnalysis &A, const ApiCall &C) {
  bool Remote = llvm::any_of(Lifecycle::of(A).events(), [&](const LifeEvent &E) {
    return E.K == LifeEventKind::Produce && E.S == C.Call && E.Remote;
  });
  if (!Remote)
    return false;
  std::optional<Location> Result = A.resultOf(C.Call);
  return !Result || rkeyMayLeave(A, *Result, C.Caller);
}

/// The registration or allocation whose handle \p C works on (the MR a
/// dereg, pool put or map takes), if this unit makes it.
const ApiCall *Inventory::producerOf(const ApiCall &C) const {
  const Expr *Handle = C.arg(ArgRole::Mr);
  std::optional<Location> L = Handle ? locationOf(Handle) : std::nullopt;
  if (!L)
    return nullptr;
  SlotKey Slot = slotOf(A, *L, C.Caller);
  for (const ApiCall &P : A.calls()) {
    Effect E = P.Model->E;
    if (E != Effect::MrRegister && E != Effect::MrAlloc &&
        E != Effect::MrPoolGet && E != Effect::MwAlloc)
      continue;
    if (std::optional<Location> R = A.resultOf(P.Call))
      if (slotOf(A, *R, P.Caller) == Slot)
        return &P;
  }
  return nullptr;
}

SiteRole Inventory::roleOf(const ApiCall &C) const {
  Effect E = C.Model->E;
  if (E == Effect::MrDeregister || E == Effect::MrPoolPut ||
      E == Effect::MrMap || E == Effect::MrReregister)
    if (const ApiCall *P = producerOf(C); P && P != &C)
      return roleOf(*P);
  if (C.Model->E == Effect::MwAlloc || C.Model->E == Effect::MwBind ||
      C.Model->E == Effect::MwDealloc)
    return SiteRole::Expose;
  if (C.Model->E == Effect::MrRegister) {
    if (registrationExposes(A, C))
      return SiteRole::Expose;
    return addressesRdma(C) ? SiteRole::DataTransfer : SiteRole::Local;
  }
  return UnitRole;
}

/// Is the registration's MR the local side of an RDMA READ or WRITE here?
bool Inventory::addressesRdma(const ApiCall &C) const {
  std::optional<Location> Result = A.resultOf(C.Call);
  if (!Result)
    return false;
  return llvm::any_of(RdmaBuffers, [&](const ReadSink &B) {
    if (!B.Region)
      return false;
    if (A.sameStorage(*B.Region, B.RegionFn, *Result, C.Caller))
      return true;
    // The MR a helper returns (`mr = rcache_get(ep, buf, len)`).
    return llvm::is_contained(A.producersOf(*B.Region, B.RegionFn, {Effect::MrRegister}),
                              &C);
  });
}

/// Fast-registration MRs, pools, REG_MR and LOCAL_INV: exposed when the
/// unit registers keys with remote rights (REG_MR, window binds), else the
/// local side of its own RDMA READ/WRITE.
SiteRole Inventory::unitRole() const {
  bool Exposes = llvm::any_of(Lifecycle::of(A).events(), [&](const LifeEvent &E) {
    // REG_MR and window binds, not the rkey of a registration leaving.
    return E.K == LifeEventKind::Expose && E.What != "rkey";
  });
  if (Exposes)
    return SiteRole::Expose;
  return PostsRdma ? SiteRole::DataTransfer : SiteRole::Local;
}

/// Does the unit move data with RDMA READ/WRITE itself?
void Inventory::scanWorkRequests() {
  auto IsRdma = [](Opcode Op) {
    return Op == Opcode::RdmaRead || Op == Opcode::RdmaWrite;
  };
  for (const FieldStore &S : A.stores())
    if (S.Role == FieldRole::Opcode && S.Value && llvm::any_of(opcodesOf(A, S), IsRdma))
      PostsRdma = true;
  for (const ApiCall &C : A.calls())
    if (!C.Model->CoreManaged && IsRdma(C.Model->Op))
      PostsRdma = true;
}

/// REG_MR, BIND_MW and LOCAL_INV work requests built by the unit.
void Inventory::collectWorkRequests() {
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::Opcode || !S.Value)
      continue;
    for (Opcode Op : opcodesOf(A, S)) {
      if (Op != Opcode::RegMr && Op != Opcode::BindMw && Op != Opcode::LocalInv)
        continue;
      RegistrationSite R;
      R.Kind = Op == Opcode::LocalInv ? SiteKind::Invalidation
                                      : SiteKind::RegistrationPost;
      R.Role = UnitRole;
      R.Loc = S.Spelling ? S.Spelling->getBeginLoc() : S.At->getBeginLoc();
      R.Fn = S.Fn;
      R.Api = sourceText(A.context(), S.Value);
      if (R.Api.empty() || R.Api.size() > 40)
        R.Api = opcodeName(Op).upper();
      add(std::move(R));
    }
  }
}

void Inventory::collectQueues() {
  for (const QpCreation &Q : WorkRequests::of(A).creations()) {
    if (Q.CoreManaged)
      continue;
    auto It = Q.Caps.find(FieldRole::MaxSendWr);
    if (It == Q.Caps.end() || !It->second)
      continue;
    RegistrationSite S;
    // With cap.max_rdma_ctxs the core adds the room its contexts need.
    S.Kind = Q.Caps.count(FieldRole::MaxRdmaCtxs) ? SiteKind::CoreManaged
                                           : SiteKind::QueueSizing;
    S.Loc = It->second->Spelling ? It->second->Spelling->getBeginLoc()
                                 : Q.Call->Call->getBeginLoc();
    S.Fn = It->second->Fn;
    S.Api = S.Kind == SiteKind::CoreManaged ? "cap.max_rdma_ctxs" : "max_send_wr";
    add(std::move(S));
  }
}

void Inventory::collectRemoteInvalidations() {
  StringRef FlagText =
      A.flagName(Flag::WithInvalidate);
  for (const Lifecycle::RemoteInvalidation &R :
       Lifecycle::of(A).remoteInvalidations()) {
    RegistrationSite S;
    S.Kind = SiteKind::RemoteInvalidation;
    S.Role = SiteRole::Expose;
    S.Loc = R.If->getCond()->getBeginLoc();
    S.Fn = R.Fn;
    S.Api = FlagText.str();
    add(std::move(S));
  }
}

// ---------------------------------------------------------------- data path

static bool handlesCompletions(const TuAnalysis &A, const FunctionDecl *Fn) {
  return llvm::any_of(Fn->parameters(), [&](const ParmVarDecl *P) {
    const StructModel *S = A.structOf(P->getType());
    return S && S->Role == StructRole::Wc && P->getType()->isPointerType();
  });
}

static std::optional<std::string> datapathCall(const ApiCall &C) {
  switch (C.Model->E) {
  case Effect::PostSend:
  case Effect::PostCm:
  case Effect::WrxComplete:
  case Effect::RwPost:
    return "posts work requests (" + C.Model->Name + ")";
  case Effect::CqPoll:
    return "reaps completions (" + C.Model->Name + ")";
  default:
    return std::nullopt;
  }
}

bool isDatapathCall(const ApiCall &C) { return datapathCall(C).has_value(); }

/// Does \p Fn post work requests that move data, not only REG_MR, BIND_MW
/// or LOCAL_INV (an MR's own upkeep, also done at setup and teardown)?
static bool postsData(const TuAnalysis &A, const FunctionDecl *Fn) {
  return llvm::any_of(WorkRequests::of(A).posts(), [&](const PostSite &P) {
    return P.Fn == Fn && (P.Chain.empty() || llvm::any_of(P.Chain, [](const WrSlot &W) {
                            return W.Ops.empty() || !W.isRegistration();
                          }));
  });
}

void Inventory::findDatapath() {
  for (const FunctionDecl *Fn : A.functions())
    if (handlesCompletions(A, Fn))
      Datapath[Fn] = {Fn, Fn->getLocation(), "handles completions"};
  for (const ApiCall &C : A.calls())
    if (std::optional<std::string> What = datapathCall(C))
      Datapath.try_emplace(C.Caller, DatapathReason{C.Caller,
                                                    C.Call->getBeginLoc(), *What});
  // A submit function that posts through a helper (`iorpc_post(c, ...)`)
  // is a submit function too, one level up: further up are the callers
  // that run the I/O loop, judged by where they register.
  std::vector<std::pair<const FunctionDecl *, DatapathReason>> Submitters;
  for (const auto &[Fn, Why] : Datapath) {
    if (Why.Seed != Fn || !postsData(A, Fn))
      continue;
    for (const auto &[Call, Caller] : A.callersOf(Fn))
      Submitters.push_back({Caller, {Caller, Call->getBeginLoc(),
                                     "posts work requests through '" +
                                         Fn->getNameAsString() + "'",
                                     /*Indirect=*/true}});
  }
  for (auto &[Fn, Why] : Submitters)
    Datapath.try_emplace(Fn, std::move(Why));
  // Everything the submit and completion functions call runs per I/O too.
  for (bool Grew = true; Grew;) {
    Grew = false;
    for (const FunctionDecl *Fn : A.functions()) {
      if (Datapath.count(Fn))
        continue;
      for (const auto &[Call, Caller] : A.callersOf(Fn)) {
        auto It = Datapath.find(Caller);
        if (It == Datapath.end() ||
            (It->second.Seed == Caller && outsideIoLoop(Caller, Call)))
          continue;
        Datapath[Fn] = It->second;
        Grew = true;
        break;
      }
    }
  }
}

bool Inventory::outsideIoLoop(const FunctionDecl *Fn, const Stmt *S) const {
  const ParentMap &PM = A.flow(Fn).parents();
  if (enclosingLoop(PM, S))
    return false;
  std::vector<const CallExpr *> Io;
  for (const ApiCall &D : A.calls())
    if (D.Caller == Fn && isDatapathCall(D))
      Io.push_back(D.Call);
  // Posts through a helper (`iorpc_post(c, ...)`) count where they are called.
  for (const FunctionDecl *Helper : A.functions())
    if (const DatapathReason *R = datapath(Helper);
        R && R->Seed == Helper && Helper != Fn)
      llvm::append_range(Io, A.callsTo(Fn, Helper));
  if (Io.empty())
    return false;
  if (llvm::all_of(Io, [&](const CallExpr *P) { return enclosingLoop(PM, P); }))
    return true;
  // Or it has an I/O loop that both posts and reaps completions; what it
  // does once outside it (reading a header first) is part of the session.
  for (const ApiCall &Poll : A.calls()) {
    const Stmt *Loop = Poll.Caller == Fn && Poll.Model->E == Effect::CqPoll
                           ? enclosingLoop(PM, Poll.Call)
                           : nullptr;
    if (Loop && llvm::any_of(Io, [&](const CallExpr *Post) {
          return Post != Poll.Call && isInside(PM, Post, Loop);
        }))
      return true;
  }
  return false;
}

const DatapathReason *Inventory::datapath(const FunctionDecl *Fn) const {
  auto It = Datapath.find(Fn);
  return It == Datapath.end() ? nullptr : &It->second;
}

std::string Inventory::replacement(MigrationKey Key) const {
  const auto &M = A.rules().domain(A.domain()).Migration;
  auto It = M.find(Key);
  return It == M.end() ? std::string() : It->second;
}

std::string Inventory::replacement(const RegistrationSite &S) const {
  switch (S.Kind) {
  case SiteKind::QueueSizing:
    return replacement(MigrationKey::QueueSizing);
  case SiteKind::RemoteInvalidation:
    return replacement(MigrationKey::RemoteInvalidation);
  case SiteKind::CoreManaged:
    return "";
  default:
    return replacement(migrationKeyOf(S.Role));
  }
}

// ------------------------------------------------------------- report sink

/// Lines [Line - 2, Line + 2] of the file \p Loc is in.
static std::pair<std::string, unsigned> excerpt(const SourceManager &SM,
                                                SourceLocation Loc) {
  FileID FID = SM.getFileID(Loc);
  unsigned Line = SM.getSpellingLineNumber(Loc);
  unsigned First = Line > 2 ? Line - 2 : 1;
  StringRef Buffer = SM.getBufferData(FID);
  std::string Text;
  unsigned N = 1;
  for (StringRef Rest = Buffer; !Rest.empty() && N <= Line + 2; ++N) {
    auto [L, Tail] = Rest.split('\n');
    if (N >= First)
      Text += L.rtrim().str() + "\n";
    Rest = Tail;
  }
  return {Text, First};
}

void Inventory::exportSites() const {
  SiteSink *Sink = currentSiteSink();
  if (!Sink)
    return;
  const SourceManager &SM = A.sources();
  for (const RegistrationSite &S : Sites) {
    SourceLocation At = SM.getExpansionLoc(userLoc(SM, S.Loc));
    if (At.isInvalid() || SM.isInSystemHeader(At))
      continue;
    SiteRecord R;
    R.Kind = siteKindName(S.Kind).str();
    R.Role = S.Kind == SiteKind::CoreManaged ? "" : siteRoleName(S.Role).str();
    R.Api = S.Api;
    R.Target = replacement(S);
    R.Function = S.Fn ? S.Fn->getNameAsString() : "";
    SmallString<256> Path(SM.getFilename(At));
    SM.getFileManager().makeAbsolutePath(Path);
    llvm::sys::path::remove_dots(Path, true);
    R.File = std::string(Path);
    R.Line = SM.getExpansionLineNumber(At);
    R.Column = SM.getExpansionColumnNumber(At);
    R.Datapath = S.Datapath;
    R.Fixable = S.fixable();
    std::tie(R.Excerpt, R.ExcerptLine) = excerpt(SM, At);
    Sink->Sites.push_back(std::move(R));
  }
}

// -------------------------------------------------- rewrite into the cache

namespace {

/// Every reference to one declaration in the unit's functions.
class RefFinder : public RecursiveASTVisitor<RefFinder> {
public:
  explicit RefFinder(const ValueDecl *D) : D(D) {}
  bool VisitDeclRefExpr(DeclRefExpr *E) {
    if (E->getDecl() == D)
      Refs.push_back(E);
    return true;
  }
  bool VisitMemberExpr(MemberExpr *E) {
    if (E->getMemberDecl() == D)
      Refs.push_back(E);
    return true;
  }
  const ValueDecl *D;
  std::vector<const Expr *> Refs;
};

/// Spelling of a pointer to the cache (`struct regcore *`) usable at \p At
/// inside \p Fn: a parameter or local of that type, or such a field one
/// pointer hop away (`conn->core`).
std::string coreInScope(const TuAnalysis &A, const CacheRewrite &Rule,
                        const FunctionDecl *Fn, SourceLocation At) {
  auto IsCore = [&](QualType T) {
    const auto *P = T->getAs<PointerType>();
    const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
    return RD && RD->getName() == Rule.CacheType;
  };
  std::vector<const VarDecl *> Vars(Fn->param_begin(), Fn->param_end());
  for (const Decl *D : Fn->decls())
    if (const auto *VD = dyn_cast<VarDecl>(D); VD && !isa<ParmVarDecl>(VD) &&
        A.sources().isBeforeInTranslationUnit(VD->getLocation(), At))
      Vars.push_back(VD);
  for (const VarDecl *VD : Vars)
    if (IsCore(VD->getType()))
      return VD->getName().str();
  for (const VarDecl *VD : Vars) {
    QualType T = VD->getType();
    bool Ptr = T->isPointerType();
    const RecordDecl *RD =
        Ptr ? T->getPointeeType()->getAsRecordDecl() : T->getAsRecordDecl();
    if (!RD || !RD->getDefinition())
      continue;
    for (const FieldDecl *F : RD->getDefinition()->fields())
      if (IsCore(F->getType()))
        return (VD->getName() + (Ptr ? "->" : ".") + F->getName()).str();
  }
  return "";
}

/// The `struct ibv_mr` part of a handle declaration's type, if the type is
/// written as a plain `struct ibv_mr *` in the user's code.
std::optional<CharSourceRange> mrTypeRange(const DeclaratorDecl *D,
                                           const CacheRewrite &Rule,
                                           const SourceManager &SM) {
  TypeSourceInfo *TSI = D->getTypeSourceInfo();
  if (!TSI)
    return std::nullopt;
  TypeLoc TL = TSI->getTypeLoc();
  auto PTL = TL.getAs<PointerTypeLoc>();
  if (!PTL)
    return std::nullopt;
  TypeLoc Pointee = PTL.getPointeeLoc();
  const RecordDecl *RD = Pointee.getType()->getAsRecordDecl();
  if (!RD || RD->getName() != Rule.HandleType || Pointee.getType().hasQualifiers())
    return std::nullopt;
  SourceRange R = Pointee.getSourceRange();
  if (R.getBegin().isMacroID() || R.getEnd().isMacroID() ||
      !SM.isWrittenInMainFile(R.getBegin()))
    return std::nullopt;
  return CharSourceRange::getTokenRange(R);
}

const Stmt *parentSkippingParens(const ParentMap &PM, const Stmt *S) {
  const Stmt *P = PM.getParent(S);
  while (P && (isa<ParenExpr>(P) || isa<ImplicitCastExpr>(P)))
    P = PM.getParent(P);
  return P;
}

} // namespace

std::vector<FixItHint> regcoreCacheRewrite(const TuAnalysis &A,
                                           const ApiCall &Reg, bool &InPlace) {
  std::vector<FixItHint> Fixes;
  ASTContext &Ctx = A.context();
  const SourceManager &SM = A.sources();
  const std::optional<CacheRewrite> &Rule = A.rules().domain(A.domain()).Cache;
  if (!Rule || Reg.Model->Name != Rule->Register)
    return {};
  const Expr *Addr = Reg.arg(ArgRole::Addr), *Length = Reg.arg(ArgRole::Length),
             *Access = Reg.arg(ArgRole::Access);
  if (!Addr || !Length || !Access)
    return {};
  // `H = ibv_reg_mr(...);` as a statement of its own.
  const ParentMap &PM = A.flow(Reg.Caller).parents();
  const auto *Assign =
      dyn_cast_or_null<BinaryOperator>(parentSkippingParens(PM, Reg.Call));
  if (!Assign || Assign->getOpcode() != BO_Assign ||
      !isa_and_nonnull<CompoundStmt>(PM.getParent(Assign)))
    return {};
  const Expr *LHS = Assign->getLHS()->IgnoreParenImpCasts();
  const ValueDecl *Handle = nullptr;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(LHS))
    Handle = DRE->getDecl();
  else if (const auto *ME = dyn_cast<MemberExpr>(LHS))
    Handle = ME->getMemberDecl();
  const auto *DD = dyn_cast_or_null<DeclaratorDecl>(Handle);
  if (!DD || (!isa<FieldDecl>(DD) && !(isa<VarDecl>(DD) &&
                                        cast<VarDecl>(DD)->isLocalVarDecl())))
    return {};
  std::optional<CharSourceRange> TypeRange = mrTypeRange(DD, *Rule, SM);
  if (!TypeRange)
    return {};
  std::string Core = coreInScope(A, *Rule, Reg.Caller, Reg.Call->getBeginLoc());
  if (Core.empty())
    return {};
  // `struct ibv_mr *a, *b;` shares one type specifier: leave it alone.
  if (const auto *VD = dyn_cast<VarDecl>(DD))
    for (const Decl *Other : VD->getDeclContext()->decls())
      if (Other != VD && isa<DeclaratorDecl>(Other) &&
          Other->getBeginLoc() == VD->getBeginLoc())
        return {};
  if (const auto *FD = dyn_cast<FieldDecl>(DD))
    for (const FieldDecl *Other : FD->getParent()->fields())
      if (Other != FD && Other->getBeginLoc() == FD->getBeginLoc())
        return {};

  std::string AddrText = sourceText(Ctx, Addr), LengthText = sourceText(Ctx, Length),
              AccessText = sourceText(Ctx, Access);
  if (AddrText.empty() || LengthText.empty() || AccessText.empty())
    return {};
  std::string Lhs = sourceText(Ctx, Assign->getLHS());
  CharSourceRange AssignRange = CharSourceRange::getTokenRange(
      SM.getExpansionRange(Assign->getBeginLoc()).getBegin(),
      SM.getExpansionRange(Assign->getEndLoc()).getEnd());
  if (Lhs.empty() || AssignRange.isInvalid())
    return {};
  Fixes.push_back(FixItHint::CreateReplacement(
      *TypeRange, "struct " + Rule->NewHandleType));
  Fixes.push_back(FixItHint::CreateReplacement(
      AssignRange, expandTemplate(Rule->Get, {{"core", Core},
                                              {"addr", AddrText},
                                              {"length", LengthText},
                                              {"access", AccessText},
                                              {"handle", Lhs}})));

  // Every other use: keys, null tests, clearing, or the deregistration.
  RefFinder Finder(Handle);
  Finder.TraverseDecl(Ctx.getTranslationUnitDecl());
  for (const Expr *Ref : Finder.Refs) {
    const FunctionDecl *Fn = nullptr;
    for (const FunctionDecl *F : A.functions())
      if (F->getBody() && SM.isPointWithin(Ref->getBeginLoc(),
                                           F->getBody()->getBeginLoc(),
                                           F->getBody()->getEndLoc()))
        Fn = F;
    if (!Fn)
      return {};
    // The reference as a whole operand: `req->mr` for the field `mr`.
    const Stmt *Whole = Ref;
    const ParentMap &RefPM = A.flow(Fn).parents();
    const Stmt *P = parentSkippingParens(RefPM, Whole);
    if (Whole == LHS && P == Assign)
      continue; // the registration itself
    if (const auto *ME = dyn_cast_or_null<MemberExpr>(P)) {
      // The cache entry has the MR's keys, address and length.
      std::optional<FieldStore> Member = A.classifyMember(ME);
      if (Member && Member->Struct->Role == StructRole::Mr &&
          (Member->Role == FieldRole::Lkey || Member->Role == FieldRole::Rkey ||
           Member->Role == FieldRole::Addr || Member->Role == FieldRole::Length))
        continue;
      return {};
    }
    if (const auto *UO = dyn_cast_or_null<UnaryOperator>(P))
      if (UO->getOpcode() == UO_LNot)
        continue;
    if (const auto *BO = dyn_cast_or_null<BinaryOperator>(P)) {
      if (BO->isEqualityOp())
        continue;
      if (BO->getOpcode() == BO_Assign && BO->getLHS()->IgnoreParenImpCasts() == Ref &&
          BO->getRHS()->IgnoreParenImpCasts()->isNullPointerConstant(
              Ctx, Expr::NPC_ValueDependentIsNotNull))
        continue;
      return {};
    }
    if (isa_and_nonnull<IfStmt>(P) || isa_and_nonnull<WhileStmt>(P))
      continue;
    const auto *CE = dyn_cast_or_null<CallExpr>(P);
    const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
    if (!M || M->Name != Rule->Deregister)
      return {};
    std::string PutCore = coreInScope(A, *Rule, Fn, CE->getBeginLoc());
    CharSourceRange CallRange = CharSourceRange::getTokenRange(
        SM.getExpansionRange(CE->getBeginLoc()).getBegin(),
        SM.getExpansionRange(CE->getEndLoc()).getEnd());
    std::string Arg = sourceText(Ctx, CE->getArg(0));
    if (PutCore.empty() || Arg.empty())
      return {};
    Fixes.push_back(FixItHint::CreateReplacement(
        CallRange, expandTemplate(Rule->Put, {{"core", PutCore}, {"handle", Arg}})));
  }
  InPlace = isa<VarDecl>(DD);
  return Fixes;
}

} // namespace ulplint
