//===- Sites.cpp - Places where the analyses' questions are asked ---------===//

#include "Sites.h"
#include "clang/AST/Expr.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"

using namespace clang;

namespace ulplint {

static constexpr Flag AccessFlags[] = {
    Flag::LocalWrite, Flag::RemoteWrite, Flag::RemoteRead, Flag::RemoteAtomic,
    Flag::MwBind,     Flag::ZeroBased,   Flag::OnDemand};

std::string accessNames(const TuAnalysis &A, Domain D, uint64_t Bits) {
  std::string Out;
  for (Flag F : AccessFlags) {
    uint64_t Bit = A.flagBit(F);
    if (!Bit || !(Bits & Bit))
      continue;
    if (!Out.empty())
      Out += " | ";
    Out += A.rules().flagName(D, F).str();
  }
  return Out;
}

/// The member of the same object that has \p Role, stored in \p Fn.
static const FieldStore *sibling(const TuAnalysis &A, const FieldStore &S,
                                 FieldRole Role) {
  const FieldStore *Found = nullptr;
  for (const FieldStore &O : A.stores())
    if (O.Role == Role && A.sameStorage(O.Object, O.Fn, S.Object, S.Fn) &&
        (!Found || O.Fn == S.Fn))
      Found = &O;
  return Found;
}

/// Only the last store to a field on a path matters: `access = A` followed
/// by `access |= B` is one request for A|B.
static bool isFinalStore(const TuAnalysis &A, const FieldStore &S,
                         llvm::ArrayRef<FieldStore> All) {
  const FunctionFlow &Flow = A.flow(S.Fn);
  for (const FieldStore &O : All)
    if (&O != &S && O.Fn == S.Fn && O.At != S.At &&
        Flow.resolve(O.Target) == Flow.resolve(S.Target) &&
        Flow.reachableFrom(S.At, O.At))
      return false;
  return true;
}

/// The value a field store leaves in its field. The flow records a
/// definition per statement; a declaration of several variables
/// (`struct ibv_send_wr wr = {...}, *bad;`) is split into statements of
/// its own there, so its stores are evaluated from the stored value.
static FlagSet storedValue(const TuAnalysis &A, const FieldStore &S) {
  const FunctionFlow &Flow = A.flow(S.Fn);
  if (Flow.definesAt(S.At) || !S.Value)
    return A.values(S.Fn).flagsAfter(Flow.resolve(S.Target), S.At);
  return A.values(S.Fn).flags(S.Value);
}

/// The MR named by a `reg_wr.mr = X` / `bind_info.mr = X` store.
static void setRegion(AccessSite &S, const FieldStore *MrStore) {
  if (!MrStore || !MrStore->Value)
    return;
  S.Region = locationOf(MrStore->Value);
  S.RegionFn = MrStore->Fn;
}

/// `ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, ...)` keeps the
/// MR's rights: its access argument means nothing unless the flags may
/// include IBV_REREG_MR_CHANGE_ACCESS.
static bool changesAccess(const TuAnalysis &A, const ApiCall &C) {
  const Expr *Flags = C.arg(ArgRole::Flags);
  std::optional<int64_t> Bit = A.enumValue("IBV_REREG_MR_CHANGE_ACCESS");
  if (!Flags || !Bit)
    return true;
  FlagSet V = A.values(C.Caller).flags(Flags);
  return V.empty() || llvm::any_of(V.Alts, [&](const FlagAlt &Alt) {
           return !Alt.exact() || (Alt.Known & static_cast<uint64_t>(*Bit));
         });
}

const AccessSites &AccessSites::of(const TuAnalysis &A) {
  return A.cached<AccessSites>();
}

AccessSites::AccessSites(const TuAnalysis &A) {
  std::vector<AccessSite> &Sites = All;
  for (const ApiCall &C : A.calls()) {
    Effect E = C.Model->E;
    bool IsReg = E == Effect::MrRegister || E == Effect::MrReregister;
    bool IsKey = E == Effect::WrxOp && C.Model->Op == Opcode::RegMr;
    if (!IsReg && !IsKey)
      continue;
    AccessSite S;
    S.K = IsReg ? AccessSite::Registration : AccessSite::DeviceKey;
    S.Fn = C.Caller;
    S.Call = &C;
    S.D = A.domain();
    S.What = C.Model->Name;
    S.Loc = C.Call->getBeginLoc();
    S.Flags = C.arg(ArgRole::Access);
    ValueEval VE = A.values(C.Caller);
    if (S.Flags) {
      S.Value = VE.flags(S.Flags);
    } else {
      if (C.Model->ImplicitAccess.empty())
        continue;
      uint64_t Bits = 0;
      for (Flag F : C.Model->ImplicitAccess)
        Bits |= A.flagBit(F);
      S.Value = FlagSet::constant(Bits, C.Call);
    }
    if (E == Effect::MrReregister && !changesAccess(A, C))
      continue; // the access argument is ignored
    if (E == Effect::MrReregister) {
      if (const Expr *Mr = C.arg(ArgRole::Mr))
        S.Region = locationOf(Mr);
    } else if (IsReg)
      S.Region = A.resultOf(C.Call);
    else if (const Expr *Key = C.arg(ArgRole::Mkey))
      S.Region = locationOf(Key);
    S.RegionFn = C.Caller;
    Sites.push_back(std::move(S));
  }
  for (const FieldStore &FS : A.stores()) {
    bool Fast = FS.Role == FieldRole::Access;
    bool Bind = FS.Role == FieldRole::BindAccess;
    if ((!Fast && !Bind) || !isFinalStore(A, FS, A.stores()))
      continue;
    AccessSite S;
    S.K = Fast ? AccessSite::FastReg : AccessSite::WindowBind;
    S.Fn = FS.Fn;
    S.Store = &FS;
    S.D = FS.Struct->D;
    S.What = Fast ? A.rules().opcodeEnumerator(S.D, Opcode::RegMr).str()
                  : "memory window bind";
    S.Loc = FS.Spelling->getBeginLoc();
    S.Flags = FS.Value;
    S.Value = storedValue(A, FS);
    setRegion(S, sibling(A, FS, Fast ? FieldRole::RegMr : FieldRole::BindMr));
    Sites.push_back(std::move(S));
  }
}

std::vector<const AccessSite *> rightsOf(const TuAnalysis &A,
                                         llvm::ArrayRef<AccessSite> Sites,
                                         const Location &Region,
                                         const FunctionDecl *Fn) {
  std::vector<const ApiCall *> Producers =
      A.producersOf(Region, Fn, {Effect::MrRegister});
  std::vector<const AccessSite *> Found;
  for (const AccessSite &S : Sites) {
    bool Produces = S.K == AccessSite::Registration &&
                    llvm::is_contained(Producers, S.Call);
    bool FastRegisters = S.K == AccessSite::FastReg && S.Region &&
                         A.sameStorage(*S.Region, S.RegionFn, Region, Fn);
    if (Produces || FastRegisters)
      Found.push_back(&S);
  }
  if (llvm::any_of(Found, [&](const AccessSite *S) { return S->RegionFn == Fn; }))
    llvm::erase_if(Found, [&](const AccessSite *S) { return S->RegionFn != Fn; });
  return Found;
}

std::vector<const AccessSite *> sinkRights(const TuAnalysis &A,
                                           llvm::ArrayRef<AccessSite> Sites,
                                           const ReadSink &Sink) {
  if (!Sink.Region)
    return {};
  std::vector<const AccessSite *> Found =
      rightsOf(A, Sites, *Sink.Region, Sink.RegionFn);
  if (llvm::any_of(Found, [&](const AccessSite *S) { return S->Fn == Sink.Fn; }))
    llvm::erase_if(Found, [&](const AccessSite *S) { return S->Fn != Sink.Fn; });
  return Found;
}

/// The opcodes among the values of \p V, for a field of type \p FieldType.
static llvm::SmallVector<Opcode, 2> opcodesIn(const TuAnalysis &A,
                                              QualType FieldType,
                                              const FlagSet &V) {
  llvm::SmallVector<Opcode, 2> Ops;
  for (const FlagAlt &Alt : V.Alts) {
    if (!Alt.exact())
      continue;
    StringRef Name = A.enumeratorName(FieldType, static_cast<int64_t>(Alt.Known));
    if (std::optional<Opcode> Op = A.rules().opcodeOf(Name))
      if (!llvm::is_contained(Ops, *Op))
        Ops.push_back(*Op);
  }
  return Ops;
}

static QualType storedFieldType(const FieldStore &S) {
  if (S.Target.Steps.empty() || !S.Target.Steps.back().Field)
    return QualType();
  return S.Target.Steps.back().Field->getType();
}

llvm::SmallVector<Opcode, 2> opcodesOf(const TuAnalysis &A,
                                       const FieldStore &S) {
  QualType FieldType = storedFieldType(S);
  if (FieldType.isNull())
    return {};
  return opcodesIn(A, FieldType, storedValue(A, S));
}

/// The parameter of \p Fn that \p E is, read as is (`wr->opcode = op`).
static const ParmVarDecl *parameterRead(const Expr *E, const FunctionDecl *Fn) {
  const auto *DRE = dyn_cast_or_null<DeclRefExpr>(stripExpr(E));
  const auto *P = DRE ? dyn_cast<ParmVarDecl>(DRE->getDecl()) : nullptr;
  return P && P->getDeclContext() == Fn ? P : nullptr;
}

/// A work request built in one function for the operation a caller picks:
/// where it is decided (the call, or the store itself) and what it is.
struct OpcodeContext {
  const FunctionDecl *Fn;
  SourceLocation At;
  llvm::SmallVector<Opcode, 2> Ops;
};

/// `lmig_build_rdma(x, IB_WR_RDMA_READ, ...)`: a builder that takes the
/// opcode as a parameter builds a READ for some callers and a WRITE for
/// others; each call is its own work request.
static std::vector<OpcodeContext> opcodeContexts(const TuAnalysis &A,
                                                 const FieldStore &S) {
  QualType FieldType = storedFieldType(S);
  if (FieldType.isNull())
    return {};
  std::vector<OpcodeContext> Out;
  if (const ParmVarDecl *P = parameterRead(S.Value, S.Fn)) {
    unsigned Index = P->getFunctionScopeIndex();
    for (const auto &[Call, Caller] : A.callersOf(S.Fn))
      if (Index < Call->getNumArgs() && Caller != S.Fn)
        Out.push_back({Caller, Call->getBeginLoc(),
                       opcodesIn(A, FieldType,
                                 A.values(Caller).flags(Call->getArg(Index)))});
    if (!Out.empty() && !S.Fn->isExternallyVisible())
      return Out;
  }
  Out.push_back({S.Fn, S.Spelling->getBeginLoc(), opcodesOf(A, S)});
  return Out;
}

/// Stores in \p Fn itself describe what \p Fn builds; stores elsewhere that
/// reach the same struct field only matter when \p Fn has none.
static void preferLocal(std::vector<const FieldStore *> &Stores,
                        const FunctionDecl *Fn) {
  if (llvm::any_of(Stores, [&](const FieldStore *S) { return S->Fn == Fn; }))
    llvm::erase_if(Stores, [&](const FieldStore *S) { return S->Fn != Fn; });
}

/// What an lkey value names: `mr->lkey` -> mr; `pd->local_dma_lkey` -> DMA.
/// An lkey the function takes as a parameter (`imgsrv_read(s, dst, lkey,
/// ...)`) names, at each call, what the caller passes: that call is then
/// where the READ happens.
static void addressSink(const TuAnalysis &A, const FunctionDecl *Fn,
                        const Expr *Lkey, const ReadSink &Proto,
                        std::vector<ReadSink> &Out, unsigned Depth = 0) {
  if (const ParmVarDecl *P = parameterRead(Lkey, Fn); P && Depth < 3) {
    unsigned Index = P->getFunctionScopeIndex();
    for (const auto &[Call, Caller] : A.callersOf(Fn)) {
      if (Index >= Call->getNumArgs() || Caller == Fn)
        continue;
      ReadSink AtCall = Proto;
      AtCall.Fn = Caller;
      AtCall.ReadLoc = Call->getBeginLoc();
      addressSink(A, Caller, Call->getArg(Index), AtCall, Out, Depth + 1);
    }
    return;
  }
  // A lookup helper of the unit (`tgt_lookup_lkey(dev, addr, len)` returns
  // `dev->regions[i].mr->lkey`): the lkeys it returns.
  if (const auto *CE = dyn_cast<CallExpr>(Lkey->IgnoreParenImpCasts());
      CE && Depth < 3 && !A.modelOf(CE)) {
    const FunctionDecl *Callee = CE->getDirectCallee();
    Callee = Callee ? Callee->getDefinition() : nullptr;
    if (Callee && Callee != Fn && llvm::is_contained(A.functions(), Callee))
      for (const Expr *Ret : returnValues(Callee))
        addressSink(A, Callee, Ret, Proto, Out, Depth + 1);
    return;
  }
  std::optional<Location> L = locationOf(Lkey);
  if (!L || L->Steps.empty())
    return;
  std::optional<FieldStore> Member = A.classify(*L);
  if (!Member)
    return;
  ReadSink Sink = Proto;
  if (Member->Role == FieldRole::LocalDmaLkey) {
    Sink.LocalDmaLkey = true;
    Out.push_back(Sink);
  } else if (Member->Role == FieldRole::Lkey &&
             Member->Struct->Role == StructRole::Mr) {
    Sink.Region = Member->Object;
    Sink.RegionFn = Fn;
    Out.push_back(Sink);
  }
}

/// SGE lkeys stored into the scatter list a work request points at.
static void sinksOfSgList(const TuAnalysis &A, const FunctionDecl *Fn,
                          const Expr *SgList, ReadSink Proto,
                          std::vector<ReadSink> &Out) {
  std::optional<Location> Sg = locationOf(SgList);
  if (!Sg)
    return;
  std::vector<const FieldStore *> Lkeys;
  for (const FieldStore &L : A.stores())
    if (L.Role == FieldRole::Lkey && L.Value && A.withinStorage(L.Object, L.Fn, *Sg, Fn))
      Lkeys.push_back(&L);
  preferLocal(Lkeys, Fn);
  for (const FieldStore *L : Lkeys)
    addressSink(A, L->Fn, L->Value, Proto, Out);
}

static bool sameSink(const ReadSink &L, const ReadSink &R) {
  return L.Fn == R.Fn && L.ReadLoc == R.ReadLoc && L.Region == R.Region &&
         L.RegionFn == R.RegionFn && L.LocalDmaLkey == R.LocalDmaLkey;
}

/// Local memory of the RDMA work requests with one of \p Ops.
static std::vector<ReadSink> rdmaBuffers(const TuAnalysis &A,
                                         llvm::ArrayRef<Opcode> Ops) {
  auto Wanted = [&](Opcode Op) { return llvm::is_contained(Ops, Op); };
  std::vector<ReadSink> Out;
  // Work requests built field by field. Elements of one array of WRs share
  // their storage, so every opcode store sees every sg_list store: what a
  // list addresses is worked out once, and each READ keeps one sink per
  // region (otherwise opcodes x lists x lkeys).
  std::map<std::pair<const FunctionDecl *, Location>, std::vector<ReadSink>>
      ListSinks;
  llvm::DenseMap<const FieldStore *, const std::vector<ReadSink> *> SinksOfStore;
  auto SinksOf = [&](const FieldStore *List) -> const std::vector<ReadSink> & {
    const std::vector<ReadSink> *&Known = SinksOfStore[List];
    if (Known)
      return *Known;
    std::optional<Location> Sg = locationOf(List->Value);
    Location Key = Sg ? A.flow(List->Fn).resolve(*Sg) : Location();
    auto [It, New] = ListSinks.try_emplace({List->Fn, Key});
    if (New) {
      std::vector<ReadSink> All;
      sinksOfSgList(A, List->Fn, List->Value, {}, All);
      for (const ReadSink &Sink : All) // one per lkey store of the list
        if (llvm::none_of(It->second,
                          [&](const ReadSink &O) { return sameSink(O, Sink); }))
          It->second.push_back(Sink);
    }
    Known = &It->second;
    return It->second;
  };
  // Stores in the same storage have the same slot key (see sameStorage()):
  // each opcode store looks only at the sg_list stores of its key.
  std::map<SlotKey, std::vector<std::pair<const FieldStore *, Location>>>
      ListsByKey;
  for (const FieldStore &List : A.stores())
    if (List.Role == FieldRole::SgList && List.Value) {
      Location R = A.flow(List.Fn).resolve(List.Object);
      ListsByKey[SlotKey::of(R, List.Fn)].push_back({&List, R});
    }
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::Opcode)
      continue;
    std::vector<OpcodeContext> Contexts;
    for (const OpcodeContext &Ctx : opcodeContexts(A, S))
      if (llvm::any_of(Ctx.Ops, Wanted))
        Contexts.push_back(Ctx);
    if (Contexts.empty())
      continue;
    Location R = A.flow(S.Fn).resolve(S.Object);
    SlotKey Key = SlotKey::of(R, S.Fn);
    std::vector<const FieldStore *> Lists;
    for (const auto &[List, ListR] : ListsByKey[Key])
      if (A.sameResolvedStorage(R, S.Fn, Key, ListR, List->Fn, Key))
        Lists.push_back(List);
    preferLocal(Lists, S.Fn);
    for (const OpcodeContext &Ctx : Contexts) {
      size_t First = Out.size();
      for (const FieldStore *List : Lists)
        for (ReadSink Sink : SinksOf(List)) {
          if (!Sink.Fn) { // addressed where the READ is built
            Sink.Fn = Ctx.Fn;
            Sink.ReadLoc = Ctx.At;
          }
          if (std::none_of(Out.begin() + First, Out.end(),
                           [&](const ReadSink &O) { return sameSink(O, Sink); }))
            Out.push_back(Sink);
        }
    }
  }
  // librdmacm helpers and the extended post API.
  const ApiCall *PendingRead = nullptr;
  for (const ApiCall &C : A.calls()) {
    ReadSink Proto{C.Caller, C.Call->getBeginLoc(), std::nullopt, nullptr, false};
    if (C.Model->E == Effect::PostCm && Wanted(C.Model->Op)) {
      if (const Expr *Mr = C.arg(ArgRole::Mr)) {
        Proto.Region = locationOf(Mr);
        Proto.RegionFn = C.Caller;
        if (Proto.Region)
          Out.push_back(Proto);
      } else if (const Expr *Sgl = C.arg(ArgRole::Sgl)) {
        sinksOfSgList(A, C.Caller, Sgl, Proto, Out);
      }
      continue;
    }
    if (C.Model->E == Effect::WrxOp) {
      PendingRead = Wanted(C.Model->Op) ? &C : nullptr;
      continue;
    }
    if (C.Model->E == Effect::WrxSge && PendingRead &&
        PendingRead->Caller == C.Caller) {
      Proto.ReadLoc = PendingRead->Call->getBeginLoc();
      if (const Expr *Lkey = C.arg(ArgRole::Lkey))
        addressSink(A, C.Caller, Lkey, Proto, Out);
      else if (const Expr *List = C.arg(ArgRole::SgList)) {
        sinksOfSgList(A, C.Caller, List, Proto, Out);
      }
      PendingRead = nullptr;
    }
  }
  return Out;
}

/// The field a location ends in, after its aliases (`r->mr` -> mr).
static const FieldDecl *lastField(const TuAnalysis &A, const Location &L,
                                  const FunctionDecl *Fn) {
  Location R = A.flow(Fn).resolve(L);
  return R.Steps.empty() ? nullptr : R.Steps.back().Field;
}

/// Is \p RegFn the function of the READ \p Sink, or one it calls?
static bool registersFor(const TuAnalysis &A, const FunctionDecl *RegFn,
                         const ReadSink &Sink) {
  if (RegFn == Sink.Fn || RegFn == Sink.RegionFn)
    return true;
  return llvm::any_of(A.callersOf(RegFn), [&](const auto &CallAndCaller) {
    return CallAndCaller.second == Sink.Fn ||
           CallAndCaller.second == Sink.RegionFn;
  });
}

bool isReadSink(const TuAnalysis &A, const Location &Region,
                const FunctionDecl *Fn, const FunctionDecl *RegFn) {
  const FieldDecl *Field = lastField(A, Region, Fn);
  for (const ReadSink &Sink : readSinks(A)) {
    if (!Sink.Region)
      continue;
    bool Same = A.sameStorage(*Sink.Region, Sink.RegionFn, Region, Fn);
    if (Same && Sink.RegionFn == Fn)
      return true;
    if (!Same && (!Field || lastField(A, *Sink.Region, Sink.RegionFn) != Field))
      continue;
    // The same MR field (of some object) is the sink. When the READ's own
    // path registers that field (`fsx_pull()` calls `fsx_reg_sink()`),
    // other registrations of the field (`fsx_reg_reply_source()`) are for
    // other traffic.
    if (!RegFn || registersFor(A, RegFn, Sink))
      return true;
    bool Bound = false;
    for (const AccessSite &Other : AccessSites::of(A).All)
      if (Other.Fn != RegFn && Other.Region &&
          (Other.K == AccessSite::Registration ||
           Other.K == AccessSite::FastReg) &&
          lastField(A, *Other.Region, Other.RegionFn) == Field &&
          registersFor(A, Other.Fn, Sink))
        Bound = true;
    if (!Bound)
      return true;
  }
  return false;
}

std::vector<AccessSite> siteAtCalls(const TuAnalysis &A, const AccessSite &S) {
  const ParmVarDecl *FlagsParam = parameterRead(S.Flags, S.Fn);
  const ParmVarDecl *MrParam = nullptr;
  if (S.Region && S.Region->Steps.empty() && S.RegionFn == S.Fn)
    if (const auto *P = dyn_cast_or_null<ParmVarDecl>(S.Region->Root);
        P && P->getDeclContext() == S.Fn)
      MrParam = P;
  std::vector<AccessSite> Out;
  if (!FlagsParam && !MrParam)
    return Out;
  for (const auto &[Call, Caller] : A.callersOf(S.Fn)) {
    if (Caller == S.Fn)
      continue;
    AccessSite At = S;
    At.Fn = Caller;
    At.Loc = Call->getBeginLoc();
    if (FlagsParam && FlagsParam->getFunctionScopeIndex() < Call->getNumArgs()) {
      At.Flags = Call->getArg(FlagsParam->getFunctionScopeIndex());
      At.Value = A.values(Caller).flags(At.Flags);
    }
    if (MrParam && MrParam->getFunctionScopeIndex() < Call->getNumArgs()) {
      At.Region = locationOf(Call->getArg(MrParam->getFunctionScopeIndex()));
      At.RegionFn = Caller;
    }
    Out.push_back(std::move(At));
  }
  return Out;
}

std::vector<ReadSink> readSinks(const TuAnalysis &A) {
  return rdmaBuffers(A, {Opcode::RdmaRead});
}

std::vector<ReadSink> rdmaLocalBuffers(const TuAnalysis &A) {
  return rdmaBuffers(A, {Opcode::RdmaRead, Opcode::RdmaWrite});
}

/// The first enclosing statement that is not a paren or cast.
static const Stmt *useContext(const ParentMap &PM, const Stmt *&Child) {
  const Stmt *P = PM.getParent(Child);
  while (P && (isa<ParenExpr>(P) || isa<CastExpr>(P))) {
    Child = P;
    P = PM.getParent(P);
  }
  return P;
}

namespace {
constexpr unsigned KeyFollowDepth = 3;

/// A value is the key itself, a byte-swapped or cast copy of it.
bool transparent(const Stmt *P) {
  if (const auto *CE = dyn_cast_or_null<CallExpr>(P))
    if (const FunctionDecl *F = CE->getDirectCallee())
      return F->getBuiltinID() != 0; // __builtin_bswap32 (htonl, cpu_to_be32)
  return isa_and_nonnull<ParenExpr>(P) || isa_and_nonnull<CastExpr>(P);
}

KeyUse readsUse(const TuAnalysis &A, const FunctionDecl *Fn, const ValueDecl *Var,
                unsigned Depth);

KeyUse widest(KeyUse X, KeyUse Y) { return std::max(X, Y); }

/// Where the key value \p Read (an rkey, or a copy of one) goes: nowhere
/// (comparisons, invalidations, rotations, REG_MR's key field), into memory
/// a post sends (a message, a descriptor), or to code of another unit.
/// Copies into locals and helpers' parameters are followed.
KeyUse keyUse(const TuAnalysis &A, const FunctionDecl *Fn, const Expr *Read,
              unsigned Depth) {
  if (Depth > KeyFollowDepth)
    return KeyUse::Leaves;
  const ParentMap &PM = A.flow(Fn).parents();
  const Stmt *Child = Read;
  const Stmt *P = PM.getParent(Child);
  while (transparent(P)) {
    Child = P;
    P = PM.getParent(P);
  }
  if (!P)
    return KeyUse::Local;
  if (const auto *BO = dyn_cast<BinaryOperator>(P)) {
    if (BO->isComparisonOp() || BO->isLogicalOp())
      return KeyUse::Local;
    if (!BO->isAssignmentOp())
      return keyUse(A, Fn, BO, Depth + 1);
    if (BO->getRHS() != Child)
      return KeyUse::Local; // the key field written
    if (auto Target = A.classifyMember(BO->getLHS()))
      if (Target->Role == FieldRole::InvalidateRkey ||
          Target->Role == FieldRole::RegKey)
        return KeyUse::Local;
    if (auto L = locationOf(BO->getLHS()); L && L->Steps.empty() &&
                                           !L->Root->getType()->isPointerType() &&
                                           !cast<VarDecl>(L->Root)->hasGlobalStorage())
      return readsUse(A, Fn, L->Root, Depth + 1);
    return KeyUse::Staged; // into a struct: a message, a descriptor, a holder
  }
  if (const auto *DS = dyn_cast<DeclStmt>(P)) {
    for (const Decl *D : DS->decls())
      if (const auto *VD = dyn_cast<VarDecl>(D); VD && VD->getInit() &&
                                                 VD->isLocalVarDecl())
        return readsUse(A, Fn, VD, Depth + 1);
    return KeyUse::Staged;
  }
  if (const auto *CE = dyn_cast<CallExpr>(P)) {
    unsigned Index = 0;
    while (Index < CE->getNumArgs() && CE->getArg(Index) != Child)
      ++Index;
    if (const FunctionModel *M = A.modelOf(CE)) {
      if (M->E == Effect::RkeyIncrement || M->E == Effect::RkeyRotate ||
          M->arg(ArgRole::InvalidateRkey) == Index)
        return KeyUse::Local;
      return KeyUse::Leaves;
    }
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    if (Def && llvm::is_contained(A.functions(), Def) &&
        Index < Def->getNumParams())
      return readsUse(A, Def, Def->getParamDecl(Index), Depth + 1);
    // printf(), pr_warn(): a key in a log line reaches nobody.
    if (Callee && Callee->isVariadic() && Index >= Callee->getNumParams())
      return KeyUse::Local;
    // put_unaligned_le32(mr->rkey, msg->key), memcpy(msg, &key, 4): into
    // memory a post sends, through a function of another unit.
    return KeyUse::Staged;
  }
  if (isa<IfStmt>(P) || isa<WhileStmt>(P) || isa<SwitchStmt>(P) ||
      isa<ParenListExpr>(P))
    return KeyUse::Local;
  if (const auto *UO = dyn_cast<UnaryOperator>(P))
    return UO->getOpcode() == UO_AddrOf ? keyUse(A, Fn, UO, Depth + 1)
                                        : KeyUse::Local;
  if (isa<ConditionalOperator>(P))
    return keyUse(A, Fn, cast<Expr>(P), Depth + 1);
  // Designated initializers of a work request field fall here too.
  for (const FieldStore &S : A.stores())
    if (S.Value == Child)
      return S.Role == FieldRole::InvalidateRkey || S.Role == FieldRole::RegKey
                 ? KeyUse::Local
                 : KeyUse::Staged;
  if (isa<InitListExpr>(P))
    return KeyUse::Staged;
  return KeyUse::Leaves; // returned to the caller
}

/// Where the reads of local \p Var in \p Fn take the key.
KeyUse readsUse(const TuAnalysis &A, const FunctionDecl *Fn, const ValueDecl *Var,
                unsigned Depth) {
  Location L;
  L.Root = Var;
  KeyUse Use = KeyUse::Local;
  for (const TuAnalysis::Use &U : A.usesOf(L, Fn)) {
    const Stmt *P = A.flow(U.Fn).parents().getParent(U.E);
    if (const auto *BO = dyn_cast_or_null<BinaryOperator>(P);
        BO && BO->isAssignmentOp() && BO->getLHS() == U.E)
      continue; // written, not read
    if (const auto *UO = dyn_cast_or_null<UnaryOperator>(P);
        UO && UO->getOpcode() == UO_AddrOf)
      Use = widest(Use, keyUse(A, U.Fn, UO, Depth));
    if (const auto *ICE = dyn_cast_or_null<ImplicitCastExpr>(P);
        ICE && ICE->getCastKind() == CK_LValueToRValue)
      Use = widest(Use, keyUse(A, U.Fn, ICE, Depth));
  }
  return Use;
}
} // namespace

KeyUse rkeyUse(const TuAnalysis &A, const FunctionDecl *Fn, const Expr *Read) {
  return keyUse(A, Fn, Read, 0);
}

bool rkeyReadLeaves(const TuAnalysis &A, const FunctionDecl *Fn,
                    const Expr *Read) {
  return rkeyUse(A, Fn, Read) != KeyUse::Local;
}

namespace {
/// Every expression in one function that names the field \p F.
class FieldUseFinder : public RecursiveASTVisitor<FieldUseFinder> {
public:
  FieldUseFinder(const FieldDecl *F, const FunctionDecl *Fn,
                 std::vector<TuAnalysis::Use> &Out)
      : F(F), Fn(Fn), Out(Out) {}
  bool VisitMemberExpr(MemberExpr *ME) {
    if (ME->getMemberDecl() == F)
      Out.push_back({ME, Fn});
    return true;
  }

private:
  const FieldDecl *F;
  const FunctionDecl *Fn;
  std::vector<TuAnalysis::Use> &Out;
};
} // namespace

/// The uses of the MR stored in \p Region: those of that very storage and,
/// when it is a struct field, of the same field reached through any other
/// object (`r = find_region(c, buf); key = r->mr->rkey;`): the analysis
/// cannot always tell which object a pointer names, and a key that leaves
/// through any of them may be this MR's.
static std::vector<TuAnalysis::Use> mrUses(const TuAnalysis &A,
                                           const Location &Region,
                                           const FunctionDecl *Fn) {
  std::vector<TuAnalysis::Use> Uses = A.usesOf(Region, Fn);
  Location R = A.flow(Fn).resolve(Region);
  if (R.Steps.empty() || !R.Steps.back().Field)
    return Uses;
  std::vector<TuAnalysis::Use> Same;
  for (const FunctionDecl *F : A.functions())
    FieldUseFinder(R.Steps.back().Field, F, Same).TraverseStmt(F->getBody());
  for (const TuAnalysis::Use &U : Same)
    if (llvm::none_of(Uses, [&](const TuAnalysis::Use &O) { return O.E == U.E; }))
      Uses.push_back(U);
  return Uses;
}

static bool mayLeave(const TuAnalysis &A, const Location &Region,
                     const FunctionDecl *Fn, unsigned Depth);

/// A local initialised with the handle (`struct ibv_mr *mr = r->mr;`):
/// where its own uses take the key.
static bool aliasMayLeave(const TuAnalysis &A, const VarDecl *VD,
                          const FunctionDecl *Fn, unsigned Depth) {
  Location Alias;
  Alias.Root = VD;
  return Depth >= 2 || mayLeave(A, Alias, Fn, Depth + 1);
}

/// `lab_reg(d, d->bounce_mr, ...)`: a helper of the unit that takes the
/// MR as a parameter keeps its key if its own uses of the parameter do.
static bool helperKeepsKey(const TuAnalysis &A, const CallExpr *CE,
                           const Stmt *Arg, unsigned Depth) {
  const FunctionDecl *Callee = CE->getDirectCallee();
  const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
  if (!Def || Depth >= 3 || !llvm::is_contained(A.functions(), Def))
    return false;
  for (unsigned I = 0; I < CE->getNumArgs() && I < Def->getNumParams(); ++I)
    if (CE->getArg(I)->IgnoreParenImpCasts() == Arg ||
        CE->getArg(I) == Arg) {
      Location Param;
      Param.Root = Def->getParamDecl(I);
      return !mayLeave(A, Param, Def, Depth + 1);
    }
  return false;
}

static bool mayLeave(const TuAnalysis &A, const Location &Region,
                     const FunctionDecl *Fn, unsigned Depth) {
  for (const TuAnalysis::Use &U : mrUses(A, Region, Fn)) {
    const FunctionFlow &Flow = A.flow(U.Fn);
    const Stmt *Child = U.E;
    const Stmt *P = useContext(Flow.parents(), Child);
    if (!P)
      return true;
    if (const auto *ME = dyn_cast<MemberExpr>(P)) {
      auto Member = A.classifyMember(ME);
      if (Member && Member->Role == FieldRole::Rkey && rkeyReadLeaves(A, U.Fn, ME))
        return true;
      continue; // lkey, addr, length, or a member of a member
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(P)) {
      if (BO->isAssignmentOp() && BO->getLHS() == Child)
        continue; // the registration storing the handle
      if (BO->isComparisonOp() || BO->isLogicalOp())
        continue;
      if (auto Member = A.classifyMember(BO->getLHS()))
        if (Member->Role == FieldRole::RegMr || Member->Role == FieldRole::BindMr)
          continue; // the fast registration or bind of this very MR
      if (BO->isAssignmentOp())
        if (auto Target = locationOf(BO->getLHS()))
          if (Target->Steps.empty() &&
              Flow.resolve(*Target).Root != Target->Root)
            continue; // copied into a local alias, whose uses we see
      return true;
    }
    if (const auto *CE = dyn_cast<CallExpr>(P)) {
      if (A.modelOf(CE))
        continue; // verbs that only use the MR locally
      if (!helperKeepsKey(A, CE, Child, Depth))
        return true;
      continue;
    }
    if (isa<InitListExpr>(P)) {
      // `(struct ib_reg_wr){ .mr = mr, ... }` registers it; any other
      // aggregate takes the handle somewhere we do not follow.
      bool Registers = llvm::any_of(A.stores(), [&](const FieldStore &S) {
        return S.Value == Child && (S.Role == FieldRole::RegMr || S.Role == FieldRole::BindMr);
      });
      if (Registers)
        continue;
      return true;
    }
    if (isa<UnaryOperator>(P) || isa<IfStmt>(P) || isa<WhileStmt>(P) ||
        isa<ConditionalOperator>(P))
      continue;
    if (const auto *DS = dyn_cast<DeclStmt>(P)) {
      if (DS->isSingleDecl())
        if (const auto *VD = dyn_cast<VarDecl>(DS->getSingleDecl())) {
          Location Alias;
          Alias.Root = VD;
          if (!(Flow.resolve(Alias) == Alias))
            continue; // an alias the flow resolves to the region
          if (VD->isLocalVarDecl() && !aliasMayLeave(A, VD, U.Fn, Depth))
            continue;
        }
      return true;
    }
    return true; // returned, stored elsewhere, ...
  }
  return false;
}

/// Can the rkey of the MR stored in \p Region reach a peer, or code the
/// analysis cannot see?
bool rkeyMayLeave(const TuAnalysis &A, const Location &Region,
                  const FunctionDecl *Fn) {
  return mayLeave(A, Region, Fn, 0);
}

} // namespace ulplint
