//===- Lifecycle.cpp - Typestate of registration handles ------------------===//

#include "Lifecycle.h"
#include "Sites.h"
#include "WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "llvm/ADT/DenseSet.h"

using namespace clang;

namespace ulplint {

//===-- Handles and slots -------------------------------------------------===//

bool isHandleType(const TuAnalysis &A, QualType T, bool *Window) {
  if (T.isNull() || !T->isPointerType())
    return false;
  const StructModel *S = A.structOf(T);
  if (!S || (S->Role != StructRole::Mr && S->Role != StructRole::Mw))
    return false;
  if (Window)
    *Window = S->Role == StructRole::Mw;
  return true;
}

std::string slotOf(const TuAnalysis &A, const Location &L,
                   const FunctionDecl *Fn) {
  Location R = A.flow(Fn).resolve(L);
  std::string Key = R.typeKey();
  if (!Key.empty())
    return Key;
  return Fn->getName().str() + "::" + R.str();
}

std::string Lifecycle::fact(StringRef Verb, StringRef Slot) {
  return (Verb + ":" + Slot).str();
}

namespace {

bool isLocalSlot(StringRef Slot) { return Slot.contains("::"); }

/// The handle whose key an rkey/lkey expression reads: `mr->rkey` -> mr.
std::optional<Location> keyOwner(const TuAnalysis &A, const Expr *E) {
  std::optional<Location> L = locationOf(E);
  if (!L || L->Steps.empty())
    return std::nullopt;
  std::optional<FieldStore> F = A.classify(*L);
  if (!F || (F->Role != FieldRole::Rkey && F->Role != FieldRole::Lkey) ||
      (F->Struct->Role != StructRole::Mr && F->Struct->Role != StructRole::Mw))
    return std::nullopt;
  return F->Object;
}

} // namespace

//===-- Extraction --------------------------------------------------------===//

/// Reads of a completion's flags or invalidated rkey, through copies such as
/// xprtrdma's `rep->rr_wc_flags = wc->wc_flags`.
class CompletionFields {
public:
  CompletionFields(const TuAnalysis &A) : A(A) {
    for (const FunctionDecl *Fn : A.functions())
      for (const Def &D : A.flow(Fn).defs()) {
        if (D.K != Def::Assign || !D.Value)
          continue;
        std::optional<FieldRole> Role = role(Fn, D.Value);
        if (!Role)
          continue;
        std::string Key = D.Target.Steps.empty()
                              ? Fn->getName().str() + "::" + D.Target.str()
                              : D.Target.typeKey();
        if (!Key.empty())
          Copies.try_emplace(Key, *Role);
      }
  }

  /// "wc_flags" / "invalidated_rkey" for an expression that reads one.
  std::optional<FieldRole> role(const FunctionDecl *Fn, const Expr *E) const {
    std::optional<Location> L = locationOf(E);
    if (!L)
      return std::nullopt;
    if (!L->Steps.empty())
      if (auto F = A.classify(*L))
        if (F->Struct->Role == StructRole::Wc &&
            (F->Role == FieldRole::WcFlags || F->Role == FieldRole::InvalidatedRkey))
          return F->Role;
    Location R = A.flow(Fn).resolve(*L);
    std::string Key = R.Steps.empty() ? Fn->getName().str() + "::" + R.str()
                                      : R.typeKey();
    auto It = Copies.find(Key);
    if (It != Copies.end())
      return It->second;
    return std::nullopt;
  }

private:
  const TuAnalysis &A;
  std::map<std::string, FieldRole> Copies;
};



/// Builds the events of one unit.
class LifecycleBuilder {
public:
  explicit LifecycleBuilder(Lifecycle &L)
      : L(L), A(L.A), W(WorkRequests::of(L.A)), Fields(L.A) {
    for (const ApiCall &C : A.calls())
      CallModel[C.Call] = &C;
    for (const PostSite &P : W.posts())
      if (P.Call)
        Posts[P.Call->Call] = &P;
    findKeyHolders();
  }

  /// First pass: the memory behind each handle (ibv_reg_mr's addr, the sg
  /// list of ib_map_mr_sg), so that any unmap or free is recognised.
  void findBuffers(const FunctionDecl *Fn) {
    for (const ApiCall &C : A.calls()) {
      if (C.Caller != Fn)
        continue;
      if (C.Model->E == Effect::MrRegister) {
        if (auto Result = A.resultOf(C.Call))
          if (const Expr *Buf = C.arg(ArgRole::Addr))
            bufferOf(Fn, Buf, slotOf(A, *Result, Fn));
      } else if (C.Model->E == Effect::MrMap) {
        if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mr)))
          if (const Expr *Sg = C.arg(ArgRole::Sg))
            bufferOf(Fn, Sg, *Slot);
      }
    }
  }

  void extract(const FunctionDecl *Fn) {
    const CFG *G = A.flow(Fn).cfg();
    if (!G)
      return;
    findRemoteInvalidation(Fn);
    // Entry first: events of a block come in source order.
    for (const CFGBlock *B : llvm::reverse(*G))
      for (const CFGElement &El : *B)
        if (auto CS = El.getAs<CFGStmt>())
          visit(Fn, CS->getStmt());
  }

  /// Which slot the rkey value \p E belongs to, directly or through a copy.
  std::optional<std::string> keySlot(const FunctionDecl *Fn, const Expr *E,
                                     unsigned Depth = 0) {
    if (!E || Depth > 4)
      return std::nullopt;
    if (auto Owner = keyOwner(A, E))
      return slotOf(A, *Owner, Fn);
    std::optional<Location> Loc = locationOf(E);
    if (!Loc)
      return std::nullopt;
    // A local holding a key: `u32 rkey = mr->rkey;`
    Location R = A.flow(Fn).resolve(*Loc);
    if (R.Steps.empty()) {
      for (const Def *D : A.flow(Fn).reaching(R, E))
        if (D && D->K == Def::Assign && D->Value)
          if (auto S = keySlot(Fn, stripExpr(D->Value), Depth + 1))
            return S;
      return std::nullopt;
    }
    // A field holding a key: `mr->mr_handle = ibmr->rkey;` elsewhere.
    auto It = KeyHolders.find(R.typeKey());
    if (It != KeyHolders.end())
      return It->second;
    return std::nullopt;
  }

private:
  /// `x->f = mr->rkey` anywhere in the unit makes x->f a holder of mr's key.
  void findKeyHolders() {
    for (const FunctionDecl *Fn : A.functions())
      for (const Def &D : A.flow(Fn).defs()) {
        if (D.K != Def::Assign || !D.Value || D.Target.Steps.empty())
          continue;
        std::string Key = D.Target.typeKey();
        if (Key.empty())
          continue;
        if (auto Owner = keyOwner(A, stripExpr(D.Value)))
          KeyHolders.try_emplace(Key, slotOf(A, *Owner, Fn));
      }
  }

  void add(LifeEvent E) {
    L.AtStmt[E.S].push_back(L.Events.size());
    L.Events.push_back(std::move(E));
  }

  LifeEvent event(LifeEventKind K, const std::string &Slot, const FunctionDecl *Fn,
                  const Stmt *S, SourceLocation Loc, StringRef What) {
    LifeEvent E;
    E.K = K;
    E.Slot = Slot;
    E.Fn = Fn;
    E.S = S;
    E.Loc = Loc;
    E.What = What.str();
    return E;
  }

  /// Handle slot named by an argument expression, if it is a handle.
  std::optional<std::string> handleSlot(const FunctionDecl *Fn, const Expr *E,
                                        bool *Window = nullptr) {
    if (!E || !isHandleType(A, stripExpr(E)->getType(), Window))
      return std::nullopt;
    std::optional<Location> Loc = locationOf(E);
    if (!Loc)
      return std::nullopt;
    return slotOf(A, *Loc, Fn);
  }

  void visit(const FunctionDecl *Fn, const Stmt *S) {
    if (const auto *CE = dyn_cast<CallExpr>(S)) {
      auto Model = CallModel.find(CE);
      if (Model != CallModel.end())
        modelled(Fn, *Model->second);
      else
        helperOrUnknown(Fn, CE);
      auto Post = Posts.find(CE);
      if (Post != Posts.end())
        posted(Fn, *Post->second);
      return;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(S)) {
      if (BO->getOpcode() == BO_Assign)
        assigned(Fn, BO);
      return;
    }
    if (const auto *RS = dyn_cast<ReturnStmt>(S)) {
      // A handle returned to the caller is the caller's to release.
      if (auto Slot = handleSlot(Fn, RS->getRetValue()))
        add(event(LifeEventKind::Escape, *Slot, Fn, S, RS->getBeginLoc(), "return"));
    }
  }

  void modelled(const FunctionDecl *Fn, const ApiCall &C) {
    const CallExpr *CE = C.Call;
    SourceLocation Loc = CE->getBeginLoc();
    StringRef Name = C.Model->Name;
    auto On = [&](LifeEventKind K, ArgRole Role) {
      bool Window = false;
      if (auto Slot = handleSlot(Fn, C.arg(Role), &Window)) {
        LifeEvent E = event(K, *Slot, Fn, CE, Loc, Name);
        E.Window = Window;
        add(E);
      }
    };
    switch (C.Model->E) {
    case Effect::MrRegister:
    case Effect::MrAlloc:
    case Effect::MrPoolGet:
    case Effect::MwAlloc: {
      std::optional<Location> Result = A.resultOf(CE);
      if (!Result)
        break;
      std::string Slot = slotOf(A, *Result, Fn);
      LifeEvent E = event(LifeEventKind::Produce, Slot, Fn, CE, Loc, Name);
      E.Stable = stable(Fn, *Result);
      E.Reusable = C.Model->E != Effect::MrRegister;
      E.By = C.Model->E;
      E.Window = C.Model->E == Effect::MwAlloc;
      add(E);
      if (C.Model->E == Effect::MrRegister && remote(Fn, C))
        add(event(LifeEventKind::Expose, Slot, Fn, CE, Loc, Name));
      break;
    }
    case Effect::MrDeregister:
    case Effect::MwDealloc:
      On(LifeEventKind::Deregister, C.Model->E == Effect::MwDealloc ? ArgRole::Mw : ArgRole::Mr);
      break;
    case Effect::MrPoolPut:
      On(LifeEventKind::Release, ArgRole::Mr);
      break;
    case Effect::RkeyRotate:
      On(LifeEventKind::Rotate, ArgRole::Mr);
      break;
    case Effect::MwBind:
      On(LifeEventKind::Expose, ArgRole::Mw);
      break;
    case Effect::WrxOp:
      if (C.Model->Op == Opcode::BindMw)
        On(LifeEventKind::Expose, ArgRole::Mw);
      if (C.Model->Op == Opcode::LocalInv)
        if (auto Slot = keySlot(Fn, C.arg(ArgRole::InvalidateRkey)))
          add(event(LifeEventKind::InvalidatePost, *Slot, Fn, CE, Loc, Name));
      break;
    case Effect::DmaUnmap:
    case Effect::BufferFree:
      released(Fn, CE, C.arg(C.Model->E == Effect::DmaUnmap ? ArgRole::Sg : ArgRole::Buffer),
               Name);
      break;
    case Effect::ContainerRecycle:
      released(Fn, CE, C.arg(ArgRole::Entry), Name, /*EntryOfContainer=*/true);
      break;
    case Effect::WaitCompletion:
    case Effect::CqPoll:
      add(event(LifeEventKind::Wait, "", Fn, CE, Loc, Name));
      break;
    default:
      break;
    }
  }

  /// Does \p L name the same object every time the function reaches it? Not
  /// for array elements (`io_us[i]->mr` in a loop) or through a local
  /// pointer that is assigned more than once.
  bool stable(const FunctionDecl *Fn, const Location &L) {
    Location R = A.flow(Fn).resolve(L);
    if (llvm::any_of(R.Steps, [](const Location::Step &S) { return !S.Field; }))
      return false;
    if (R.Steps.empty())
      return true;
    const auto *VD = dyn_cast_or_null<VarDecl>(R.Root);
    if (!VD || isa<ParmVarDecl>(VD) || VD->hasGlobalStorage() ||
        !VD->getType()->isPointerType())
      return true;
    // A local pointer: one assignment, outside any loop.
    const Def *Only = nullptr;
    for (const Def &D : A.flow(Fn).defs())
      if (D.Target.Root == VD && D.Target.Steps.empty()) {
        if (Only)
          return false;
        Only = &D;
      }
    if (!Only)
      return true;
    const ParentMap &PM = A.flow(Fn).parents();
    for (const Stmt *P = PM.getParent(Only->S); P; P = PM.getParent(P))
      if (isa<ForStmt>(P) || isa<WhileStmt>(P) || isa<DoStmt>(P))
        return false;
    return true;
  }

  bool remote(const FunctionDecl *Fn, const ApiCall &C) {
    uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
                      A.flagBit(Flag::RemoteAtomic);
    const Expr *Access = C.arg(ArgRole::Access);
    if (!Access)
      return false;
    for (const FlagAlt &Alt : A.values(Fn).flags(Access).Alts)
      if (Alt.Known & Remote)
        return true;
    return false;
  }

  /// Remembers the memory behind a handle (ibv_reg_mr's addr, the sg list
  /// given to ib_map_mr_sg) to recognise its unmap or free later.
  void bufferOf(const FunctionDecl *Fn, const Expr *Buf, const std::string &Slot) {
    if (auto Loc = locationOf(Buf))
      Buffers.push_back({*Loc, Fn, Slot});
  }

  /// A DMA unmap or free: of a buffer behind a handle, or of the struct that
  /// holds handles.
  void released(const FunctionDecl *Fn, const CallExpr *CE, const Expr *Arg,
                StringRef Name, bool EntryOfContainer = false) {
    if (!Arg)
      return;
    std::optional<Location> Freed = locationOf(Arg);
    if (!Freed)
      return;
    if (EntryOfContainer && !Freed->Steps.empty())
      Freed->Steps.pop_back(); // &req->node: the request
    for (const auto &[Buf, BufFn, Slot] : Buffers)
      if (A.sameStorage(*Freed, Fn, Buf, BufFn))
        add(event(LifeEventKind::BufferRelease, Slot, Fn, CE, CE->getBeginLoc(),
                  Name));
    // Handles stored inside the freed struct go with it.
    Location Container = A.flow(Fn).resolve(*Freed);
    for (const std::string &Slot : handleSlotsWithin(Fn, Container))
      add(event(LifeEventKind::ContainerRelease, Slot, Fn, CE, CE->getBeginLoc(),
                Name));
  }

  /// Slots of handles the unit stores inside \p Container.
  std::vector<std::string> handleSlotsWithin(const FunctionDecl *Fn,
                                             const Location &Container) {
    std::vector<std::string> Found;
    std::string Prefix = Container.Steps.empty() ? std::string()
                                                 : Container.typeKey();
    const ValueDecl *Root = Container.Root;
    QualType T = Root ? Root->getType() : QualType();
    if (Container.Steps.empty() && T->isPointerType()) {
      if (const auto *RT = T->getPointeeType()->getAs<RecordType>())
        Prefix = RT->getDecl()->getName().str();
    }
    if (Prefix.empty())
      return Found;
    for (const LifeEvent &E : L.Events)
      if (E.K == LifeEventKind::Produce && StringRef(E.Slot).starts_with(Prefix + ".") &&
          !llvm::is_contained(Found, E.Slot))
        Found.push_back(E.Slot);
    return Found;
  }

  /// A call to a helper of this unit carries its effects; anything else that
  /// receives a handle may keep or release it.
  void helperOrUnknown(const FunctionDecl *Fn, const CallExpr *CE) {
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    bool Helper = Def && llvm::is_contained(A.functions(), Def);
    if (Helper) {
      Calls.push_back({Fn, CE, Def});
      return;
    }
    for (const Expr *Arg : CE->arguments())
      if (auto Slot = handleSlot(Fn, Arg))
        add(event(LifeEventKind::Escape, *Slot, Fn, CE, CE->getBeginLoc(),
                  Callee ? Callee->getName() : StringRef("call")));
  }

public:
  /// Applies helpers' effects at their call sites, after every function's
  /// own events exist.
  void applySummaries() {
    for (const auto &[Fn, CE, Callee] : Calls) {
      std::set<std::pair<LifeEventKind, std::string>> Effects;
      summarize(Callee, Effects, 0);
      std::map<std::string, std::set<LifeEventKind>> BySlot;
      for (const auto &[K, Slot] : Effects)
        if (!isLocalSlot(Slot)) // the helper's own locals stay there
          BySlot[Slot].insert(K);
      for (const auto &[Slot, Kinds] : BySlot)
        for (LifeEventKind K : callEffect(Kinds)) {
          LifeEvent E = event(K, Slot, Fn, CE, CE->getBeginLoc(),
                              Callee->getName());
          E.Via = CE;
          add(E);
        }
    }
  }

private:
  /// What a helper call does to a slot, without knowing the helper's paths:
  /// only unambiguous effects may create incidents at the call.
  static std::vector<LifeEventKind> callEffect(const std::set<LifeEventKind> &K) {
    auto Has = [&](LifeEventKind X) { return K.count(X) != 0; };
    std::vector<LifeEventKind> Out;
    if (Has(LifeEventKind::Rotate))
      Out.push_back(LifeEventKind::Rotate);
    bool Invalidates = Has(LifeEventKind::InvalidatePost) ||
                       Has(LifeEventKind::InvalidateRemote);
    LifeEventKind Release = Has(LifeEventKind::Release) ? LifeEventKind::Release
                            : Has(LifeEventKind::ContainerRelease)
                                ? LifeEventKind::ContainerRelease
                                : LifeEventKind::BufferRelease;
    bool Releases = Has(LifeEventKind::Release) ||
                    Has(LifeEventKind::ContainerRelease) ||
                    Has(LifeEventKind::BufferRelease);
    if (Has(LifeEventKind::Deregister) || (Releases && Invalidates)) {
      Out.push_back(LifeEventKind::Deregister); // handled completely inside
    } else if (Releases) {
      Out.push_back(Release);
    } else if (Invalidates) {
      Out.push_back(LifeEventKind::InvalidateRemote); // done, as far as we know
    } else if (Has(LifeEventKind::Expose)) {
      Out.push_back(LifeEventKind::Expose);
    } else if (Has(LifeEventKind::Escape)) {
      Out.push_back(LifeEventKind::Escape);
    }
    return Out;
  }

private:
  void summarize(const FunctionDecl *F,
                 std::set<std::pair<LifeEventKind, std::string>> &Out,
                 unsigned Depth) {
    if (Depth > 3)
      return;
    for (const LifeEvent &E : L.Events) {
      if (E.Fn != F || E.Via)
        continue;
      switch (E.K) {
      case LifeEventKind::Expose:
      case LifeEventKind::InvalidatePost:
      case LifeEventKind::Deregister:
      case LifeEventKind::Release:
      case LifeEventKind::BufferRelease:
      case LifeEventKind::ContainerRelease:
      case LifeEventKind::Rotate:
      case LifeEventKind::Escape:
        Out.insert({E.K, E.Slot});
        break;
      default:
        break;
      }
    }
    for (const auto &[Fn, CE, Callee] : Calls)
      if (Fn == F)
        summarize(Callee, Out, Depth + 1);
  }

  void assigned(const FunctionDecl *Fn, const BinaryOperator *BO) {
    const Expr *Lhs = BO->getLHS();
    const Expr *Rhs = stripExpr(BO->getRHS());
    std::optional<Location> Target = locationOf(Lhs);
    // A handle copied anywhere else (`mr.verb_obj = ibv_mr`, a void * in a
    // cache entry) lives on there.
    if (auto From = handleSlot(Fn, Rhs)) {
      bool Alias = Target && Target->Steps.empty() &&
                   A.flow(Fn).resolve(*Target) != *Target;
      if (!Alias && (!Target || slotOf(A, *Target, Fn) != *From))
        add(event(LifeEventKind::Escape, *From, Fn, BO, BO->getBeginLoc(),
                  "store"));
    }
    if (!isHandleType(A, Lhs->getType()) || !Target)
      return;
    std::string Slot = slotOf(A, *Target, Fn);
    if (Rhs->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                   Expr::NPC_ValueDependentIsNotNull)) {
      add(event(LifeEventKind::Clear, Slot, Fn, BO, BO->getBeginLoc(), "NULL"));
      return;
    }
    if (isa<CallExpr>(Rhs))
      return; // the call's Produce, or a helper that returns a handle
    LifeEvent E = event(LifeEventKind::Overwrite, Slot, Fn, BO, BO->getBeginLoc(),
                        "store");
    E.Stable = stable(Fn, *Target);
    add(E);
  }

  /// The handles a post registers for remote access or invalidates.
  void posted(const FunctionDecl *Fn, const PostSite &P) {
    const Stmt *S = P.Call->Call;
    SourceLocation Loc = S->getBeginLoc();
    uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
                      A.flagBit(Flag::RemoteAtomic);
    for (const WrSlot &W : P.Chain) {
      if (W.mayBe(Opcode::RegMr)) {
        bool Grants = false;
        for (const FieldStore *Acc : slotStores(A, W, FieldRole::Access))
          for (const FlagAlt &Alt :
               A.values(Acc->Fn)
                   .flagsAfter(A.flow(Acc->Fn).resolve(Acc->Target), Acc->At)
                   .Alts)
            Grants |= (Alt.Known & Remote) != 0;
        if (Grants)
          for (const FieldStore *Mr : slotStores(A, W, FieldRole::RegMr))
            if (auto Slot = handleSlot(Mr->Fn, Mr->Value))
              add(event(LifeEventKind::Expose, *Slot, Fn, S, Loc, "IB_WR_REG_MR"));
      }
      if (W.mayBe(Opcode::BindMw))
        for (const FieldStore *Mw : slotStores(A, W, FieldRole::BindMw))
          if (auto Slot = handleSlot(Mw->Fn, Mw->Value))
            add(event(LifeEventKind::Expose, *Slot, Fn, S, Loc, "IBV_WR_BIND_MW"));
      if (W.mayBe(Opcode::LocalInv))
        for (const FieldStore *Key : slotStores(A, W, FieldRole::InvalidateRkey))
          if (auto Slot = keySlot(Key->Fn, Key->Value)) {
            LifeEvent E = event(LifeEventKind::InvalidatePost, *Slot, Fn, S, Loc,
                                "LOCAL_INV");
            E.Signaled = W.Signal != WrSlot::Never;
            add(E);
          }
    }
  }

  /// Branches that accept a remote invalidation (`wc->wc_flags &
  /// IB_WC_WITH_INVALIDATE`) and whether they compare the invalidated rkey.
  void findRemoteInvalidation(const FunctionDecl *Fn);

  Lifecycle &L;
  const TuAnalysis &A;
  const WorkRequests &W;
  llvm::DenseMap<const CallExpr *, const ApiCall *> CallModel;
  llvm::DenseMap<const CallExpr *, const PostSite *> Posts;
  std::map<std::string, std::string> KeyHolders;
  std::vector<std::tuple<Location, const FunctionDecl *, std::string>> Buffers;
  std::vector<std::tuple<const FunctionDecl *, const CallExpr *, const FunctionDecl *>>
      Calls;
  CompletionFields Fields;
};

//===-- Remote invalidation -----------------------------------------------===//

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
                     LifecycleBuilder &B, const FunctionDecl *Fn,
                     unsigned Depth = 0)
      : A(A), CF(CF), B(B), Fn(Fn), Depth(Depth) {}

  std::vector<std::string> Slots;
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
        if (auto Slot = B.keySlot(Fn, Other))
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
    if (!Def || !llvm::is_contained(A.functions(), Def) || Depth > 2) {
      Checked = true;
      return true;
    }
    InvalidatedKeyUses Inner(A, CF, B, Def, Depth + 1);
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
  LifecycleBuilder &B;
  const FunctionDecl *Fn;
  unsigned Depth;
};

} // namespace

void LifecycleBuilder::findRemoteInvalidation(const FunctionDecl *Fn) {
  struct Finder : RecursiveASTVisitor<Finder> {
    std::vector<const IfStmt *> Ifs;
    bool VisitIfStmt(IfStmt *If) {
      Ifs.push_back(If);
      return true;
    }
  } F;
  F.TraverseStmt(Fn->getBody());
  for (const IfStmt *If : F.Ifs) {
    int Polarity = invalidationTest(A, Fields, Fn, If->getCond());
    const Stmt *Branch = Polarity > 0 ? If->getThen()
                         : Polarity < 0 ? If->getElse()
                                        : nullptr;
    if (!Branch)
      continue;
    InvalidatedKeyUses Uses(A, Fields, *this, Fn);
    Uses.TraverseStmt(const_cast<Stmt *>(Branch));
    L.RemoteInvs.push_back({If, Polarity > 0, Uses.Slots, Uses.Checked, Fn});
  }
}

//===-- The path-sensitive solver -----------------------------------------===//

namespace {

enum class Life : uint8_t {
  Unknown,     // from outside the function
  None,        // holds nothing (NULL, or before production)
  Live,        // holds a handle with no remote rights
  Exposed,     // key valid for a peer
  InvalPosted, // LOCAL_INV posted
  Invalidated, // invalidated (remote invalidation accepted)
  Released,
  Escaped,
};

struct PathState {
  Life L = Life::Unknown;
  const LifeEvent *Produced = nullptr;
  const LifeEvent *Exposed = nullptr;
  const LifeEvent *Inval = nullptr;
  const Stmt *ExposedBy = nullptr; // the post call that exposed
  const Stmt *ErrorBranch = nullptr;
  bool Waited = false;

  bool operator<(const PathState &O) const {
    return std::tie(L, Produced, Exposed, Inval, ExposedBy, ErrorBranch, Waited) <
           std::tie(O.L, O.Produced, O.Exposed, O.Inval, O.ExposedBy,
                    O.ErrorBranch, O.Waited);
  }
};

bool holds(Life L) {
  return L == Life::Live || L == Life::Exposed || L == Life::InvalPosted ||
         L == Life::Invalidated;
}

} // namespace

/// Walks one function for one slot and records incidents.
class SlotSolver {
public:
  SlotSolver(Lifecycle &LC, const TuAnalysis &A, const FunctionDecl *Fn,
             const std::string &Slot)
      : LC(LC), A(A), Fn(Fn), Slot(Slot), Local(isLocalSlot(Slot)) {}

  void run() {
    const CFG *G = A.flow(Fn).cfg();
    if (!G)
      return;
    std::map<unsigned, std::set<PathState>> In;
    PathState Start;
    Start.L = Local ? Life::None : Life::Unknown;
    In[G->getEntry().getBlockID()].insert(Start);
    std::vector<const CFGBlock *> Work = {&G->getEntry()};
    unsigned Steps = 0;
    while (!Work.empty() && ++Steps < 20000) {
      const CFGBlock *B = Work.back();
      Work.pop_back();
      std::set<PathState> States = In[B->getBlockID()];
      std::set<PathState> Out;
      for (PathState S : States)
        if (block(*B, S))
          Out.insert(S);
      unsigned SuccIndex = 0;
      for (const auto &Succ : B->succs()) {
        const CFGBlock *SB = Succ.getReachableBlock();
        unsigned Index = SuccIndex++;
        if (!SB)
          continue;
        std::set<PathState> &Target = In[SB->getBlockID()];
        size_t Before = Target.size();
        for (PathState S : Out) {
          edge(*B, Index, *SB, S);
          if (Target.size() < 24)
            Target.insert(S);
        }
        if (Target.size() != Before)
          Work.push_back(SB);
      }
      if (B == &G->getExit())
        for (const PathState &S : States)
          exit(nullptr, S);
    }
    flushReleases();
  }

private:
  /// Applies a block's events; false when the path ends in it.
  bool block(const CFGBlock &B, PathState &S) {
    for (const CFGElement &El : B) {
      auto CS = El.getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *St = CS->getStmt();
      auto It = LC.AtStmt.find(St);
      if (It != LC.AtStmt.end())
        for (size_t I : It->second)
          apply(LC.Events[I], S);
      if (const auto *RS = dyn_cast<ReturnStmt>(St)) {
        exit(RS, S);
        return false;
      }
    }
    return true;
  }

  void apply(const LifeEvent &E, PathState &S) {
    if (E.K == LifeEventKind::Wait) {
      S.Waited = true;
      return;
    }
    if (E.Slot != Slot)
      return;
    switch (E.K) {
    case LifeEventKind::Produce:
      if (holds(S.L) && S.Produced && E.Stable && S.Produced->Stable)
        incident(LifeIncident::LeakOverwrite, &E, S);
      S = PathState{Life::Live, &E, nullptr, nullptr, nullptr, S.ErrorBranch, false};
      break;
    case LifeEventKind::Expose:
      S.L = Life::Exposed;
      S.Exposed = &E;
      S.ExposedBy = E.S;
      break;
    case LifeEventKind::Rotate:
      break;
    case LifeEventKind::InvalidatePost:
      S.L = Life::InvalPosted;
      S.Inval = &E;
      S.Waited = false;
      break;
    case LifeEventKind::InvalidateRemote:
      S.L = Life::Invalidated;
      break;
    case LifeEventKind::Deregister:
      S.L = Life::Released;
      break;
    case LifeEventKind::Release:
    case LifeEventKind::BufferRelease:
    case LifeEventKind::ContainerRelease:
      release(E, S);
      break;
    case LifeEventKind::Clear:
    case LifeEventKind::Overwrite:
      if (holds(S.L) && S.Produced && S.Produced->Stable &&
          (E.K == LifeEventKind::Clear || E.Stable))
        incident(LifeIncident::LeakOverwrite, &E, S);
      S.L = E.K == LifeEventKind::Clear ? Life::None : Life::Unknown;
      S.Produced = nullptr;
      break;
    case LifeEventKind::Escape:
      S.L = Life::Escaped;
      break;
    case LifeEventKind::Wait:
      break;
    }
  }

  void release(const LifeEvent &E, PathState &S) {
    ReleaseSeen &Seen = Releases[&E];
    if (S.L != Life::None && S.L != Life::Released && S.L != Life::Escaped)
      LC.Holding.insert(&E);
    switch (S.L) {
    case Life::Exposed:
      incident(LifeIncident::ReleaseWhileExposed, &E, S);
      break;
    case Life::InvalPosted:
      if (!S.Waited)
        incident(LifeIncident::ReleaseBeforeInvalidated, &E, S);
      Seen.Invalidated = true;
      break;
    case Life::Invalidated:
      Seen.Invalidated = true;
      break;
    case Life::Unknown:
      if (!Seen.Bare)
        Seen.Bare = S;
      break;
    case Life::Live:
      // The holder of a live handle freed: the handle leaks with it.
      if (E.K == LifeEventKind::ContainerRelease && S.Produced)
        incident(LifeIncident::LeakOverwrite, &E, S);
      break;
    default:
      break;
    }
    // Unmapping the memory does not end the handle; the rest do.
    if (E.K != LifeEventKind::BufferRelease)
      S.L = Life::Released;
  }

  /// A release reached both with and without an invalidation on the way.
  void flushReleases() {
    for (const auto &[E, Seen] : Releases)
      if (Seen.Invalidated && Seen.Bare)
        incident(LifeIncident::ReleaseSkipsInvalidation, E, *Seen.Bare);
  }

  void edge(const CFGBlock &From, unsigned Index, const CFGBlock &To,
            PathState &S) {
    const Stmt *Term = From.getTerminatorStmt();
    const auto *If = dyn_cast_or_null<IfStmt>(Term);
    const Expr *Cond = If ? If->getCond() : nullptr;
    if (const auto *CO = dyn_cast_or_null<ConditionalOperator>(Term))
      Cond = CO->getCond();
    if (!Cond || From.succ_size() != 2)
      return;
    bool Then = Index == 0;
    if (auto Null = nullTest(Cond))
      if (*Null == Then && S.L != Life::Escaped) {
        S.L = Life::None;
        S.Produced = nullptr;
      }
    if (S.ExposedBy && failedCall(Cond, S.ExposedBy) == Then &&
        S.L == Life::Exposed) {
      // The post that would have exposed the key failed.
      S.L = Life::Live;
      S.Exposed = nullptr;
      S.ExposedBy = nullptr;
    }
    if (If) {
      // The branch that takes the peer's invalidation as done: the key is
      // dead from here on, as far as this code is concerned.
      for (const Lifecycle::RemoteInvalidation &R : LC.RemoteInvs)
        if (R.If == If && R.AcceptThen == Then &&
            (R.Slots.empty() || llvm::is_contained(R.Slots, Slot)) &&
            S.L != Life::Escaped && S.L != Life::None && S.L != Life::Released)
          S.L = Life::Invalidated;
      if (Then && exitsEarly(To))
        S.ErrorBranch = If;
    }
  }

  /// For a null test of this slot's handle: true when the then-branch is
  /// the null side, false when the else-branch is. Looks through !, !!,
  /// likely()/unlikely(), WARN_ON_ONCE's statement expression and the
  /// boolean locals such macros compute.
  std::optional<bool> nullTest(const Expr *Cond, unsigned Depth = 0) {
    Cond = stripExpr(Cond);
    if (!Cond || Depth > 16)
      return std::nullopt;
    if (const auto *UO = dyn_cast<UnaryOperator>(Cond); UO && UO->getOpcode() == UO_LNot) {
      auto Inner = nullTest(UO->getSubExpr(), Depth + 1);
      return Inner ? std::optional<bool>(!*Inner) : std::nullopt;
    }
    if (const auto *SE = dyn_cast<StmtExpr>(Cond)) {
      const CompoundStmt *CS = SE->getSubStmt();
      if (!CS->body_empty())
        if (const auto *Last = dyn_cast<Expr>(CS->body_back()))
          return nullTest(Last, Depth + 1);
      return std::nullopt;
    }
    if (const auto *CE = dyn_cast<CallExpr>(Cond)) {
      const FunctionDecl *F = CE->getDirectCallee();
      if (!F || CE->getNumArgs() < 1)
        return std::nullopt;
      if (F->getBuiltinID()) // __builtin_expect(x, 0)
        return nullTest(CE->getArg(0), Depth + 1);
      if (F->getName().starts_with("IS_ERR") && names(CE->getArg(0)))
        return true;
      return std::nullopt;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (!BO->isEqualityOp())
        return std::nullopt;
      const Expr *Other = names(BO->getLHS()) ? BO->getRHS()
                          : names(BO->getRHS()) ? BO->getLHS()
                                                : nullptr;
      if (!Other || !Other->isNullPointerConstant(
                        const_cast<ASTContext &>(A.context()),
                        Expr::NPC_ValueDependentIsNotNull))
        return std::nullopt;
      return BO->getOpcode() == BO_EQ;
    }
    if (names(Cond))
      return false; // `if (mr)`: null on the else side
    // `bool __ret = !!(!mr); if (unlikely(__ret))`
    if (auto L = locationOf(Cond); L && L->Steps.empty() &&
                                    !isHandleType(A, Cond->getType())) {
      auto Defs = A.flow(Fn).reaching(*L, Cond);
      if (Defs.size() == 1 && Defs[0] && Defs[0]->K == Def::Assign)
        return nullTest(Defs[0]->Value, Depth + 1);
    }
    return std::nullopt;
  }

  bool names(const Expr *E) {
    auto L = locationOf(E);
    return L && isHandleType(A, stripExpr(E)->getType()) &&
           slotOf(A, *L, Fn) == Slot;
  }

  /// True when \p Cond holds when \p Call failed (`if (ret)` after
  /// `ret = ib_post_send(...)`), false for the opposite test, nullopt when
  /// unrelated.
  std::optional<bool> failedCall(const Expr *Cond, const Stmt *Call) {
    Cond = stripExpr(Cond);
    bool Negated = false;
    while (true) {
      if (const auto *UO = dyn_cast<UnaryOperator>(Cond);
          UO && UO->getOpcode() == UO_LNot) {
        Negated = !Negated;
        Cond = stripExpr(UO->getSubExpr());
        continue;
      }
      if (const auto *CE = dyn_cast<CallExpr>(Cond);
          CE && CE != Call && CE->getNumArgs() >= 1 && CE->getDirectCallee() &&
          CE->getDirectCallee()->getBuiltinID()) {
        Cond = stripExpr(CE->getArg(0)); // __builtin_expect(!!(ret), 0)
        continue;
      }
      break;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (BO->getOpcode() == BO_NE || BO->getOpcode() == BO_LT)
        Cond = stripExpr(BO->getLHS()); // ret != 0, ret < 0
      else
        return std::nullopt;
    }
    if (Cond == Call)
      return !Negated;
    if (auto L = locationOf(Cond))
      for (const Def *D : A.flow(Fn).reaching(*L, Cond))
        if (D && D->K == Def::Assign && stripExpr(D->Value) == Call)
          return !Negated;
    return std::nullopt;
  }

  /// A block that leaves the function early: a goto, or a return of a
  /// value within a couple of blocks.
  static bool exitsEarly(const CFGBlock &B) {
    const CFGBlock *Cur = &B;
    for (int Hops = 0; Cur && Hops < 3; ++Hops) {
      if (isa_and_nonnull<GotoStmt>(Cur->getTerminatorStmt()))
        return true;
      for (const CFGElement &El : *Cur)
        if (auto CS = El.getAs<CFGStmt>())
          if (isa<ReturnStmt>(CS->getStmt()))
            return true;
      Cur = Cur->succ_size() == 1 ? Cur->succ_begin()->getReachableBlock() : nullptr;
    }
    return false;
  }

  /// A return of an error: a negative constant, `-err`, or any value on a
  /// path through an early-exit branch.
  bool errorReturn(const ReturnStmt *RS, const PathState &S) {
    if (!RS || !RS->getRetValue())
      return S.ErrorBranch != nullptr;
    const Expr *V = stripExpr(RS->getRetValue());
    if (auto C = A.values(Fn).constant(V))
      return *C < 0;
    if (const auto *UO = dyn_cast<UnaryOperator>(V))
      if (UO->getOpcode() == UO_Minus)
        return true;
    if (V->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                 Expr::NPC_ValueDependentIsNotNull))
      return true;
    return S.ErrorBranch != nullptr;
  }

  void exit(const ReturnStmt *RS, const PathState &S) {
    if (!holds(S.L) || !S.Produced)
      return;
    // A field keeps its handle for later; only an error return abandons it.
    if (!Local && !errorReturn(RS, S))
      return;
    LifeIncident I;
    I.K = LifeIncident::LeakAtReturn;
    I.Slot = Slot;
    I.Fn = Fn;
    I.Exit = RS;
    I.Produced = S.Produced;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = Local;
    add(I);
  }

  void incident(LifeIncident::Kind K, const LifeEvent *At, const PathState &S) {
    LifeIncident I;
    I.K = K;
    I.Slot = Slot;
    I.Fn = Fn;
    I.At = At;
    I.Produced = S.Produced;
    I.Exposed = S.Exposed;
    I.Invalidation = S.Inval;
    I.ErrorBranch = S.ErrorBranch;
    I.Local = Local;
    add(I);
  }

  void add(const LifeIncident &I) {
    for (const LifeIncident &O : LC.Incidents)
      if (O.K == I.K && O.Slot == I.Slot && O.At == I.At && O.Exit == I.Exit)
        return;
    LC.Incidents.push_back(I);
  }

  struct ReleaseSeen {
    bool Invalidated = false;
    std::optional<PathState> Bare;
  };

  Lifecycle &LC;
  const TuAnalysis &A;
  const FunctionDecl *Fn;
  std::string Slot;
  bool Local;
  std::map<const LifeEvent *, ReleaseSeen> Releases;
};

//===-- Lifecycle ---------------------------------------------------------===//

Lifecycle::Lifecycle(const TuAnalysis &A) : A(A) {
  LifecycleBuilder B(*this);
  for (const FunctionDecl *Fn : A.functions())
    B.findBuffers(Fn);
  for (const FunctionDecl *Fn : A.functions())
    B.extract(Fn);
  B.applySummaries();
  // Solve each function for the slots it touches.
  std::map<const FunctionDecl *, std::set<std::string>> Touched;
  for (const LifeEvent &E : Events)
    if (!E.Slot.empty())
      Touched[E.Fn].insert(E.Slot);
  for (const auto &[Fn, Slots] : Touched)
    for (const std::string &Slot : Slots)
      SlotSolver(*this, A, Fn, Slot).run();
  exportFacts();
}

const Lifecycle &Lifecycle::of(const TuAnalysis &A) {
  return A.cached<Lifecycle>();
}

bool Lifecycle::has(StringRef Slot, LifeEventKind K) const {
  return first(Slot, K) != nullptr;
}

const LifeEvent *Lifecycle::first(StringRef Slot, LifeEventKind K) const {
  for (const LifeEvent &E : Events)
    if (E.K == K && E.Slot == Slot)
      return &E;
  return nullptr;
}

std::set<std::string> Lifecycle::slots() const {
  std::set<std::string> Out;
  for (const LifeEvent &E : Events)
    if (!E.Slot.empty())
      Out.insert(E.Slot);
  return Out;
}

void Lifecycle::exportFacts() const {
  for (const LifeEvent &E : Events) {
    if (E.Slot.empty() || isLocalSlot(E.Slot))
      continue;
    switch (E.K) {
    case LifeEventKind::Expose:
      A.exportFact(fact("exposes", E.Slot));
      break;
    case LifeEventKind::InvalidatePost:
    case LifeEventKind::InvalidateRemote:
      A.exportFact(fact("invalidates", E.Slot));
      break;
    case LifeEventKind::Deregister:
      A.exportFact(fact("deregisters", E.Slot));
      A.exportFact(fact("releases", E.Slot));
      break;
    case LifeEventKind::Release:
    case LifeEventKind::ContainerRelease:
    case LifeEventKind::Escape:
      A.exportFact(fact("releases", E.Slot));
      break;
    case LifeEventKind::Rotate:
      A.exportFact(fact("rotates", E.Slot));
      break;
    default:
      break;
    }
  }
  for (const RemoteInvalidation &R : RemoteInvs)
    for (const std::string &Slot : R.Slots)
      A.exportFact(fact("invalidates", Slot));
}

} // namespace ulplint
