//===- LifeEvents.cpp - What each function does to registration handles ---===//
//
// The first part of the lifecycle model: every function's events, in CFG
// order, with the effects of the unit's helpers applied at their calls.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"

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

SlotKey slotOf(const TuAnalysis &A, const Location &L, const FunctionDecl *Fn) {
  return SlotKey::of(A.flow(Fn).resolve(L), Fn);
}

std::string Lifecycle::fact(FactKind K, const SlotKey &Slot) {
  return factKey(K, Slot.str());
}

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

//===-- Completion fields and keys ----------------------------------------===//

CompletionFields::CompletionFields(const TuAnalysis &A) : A(A) {
  for (const FunctionDecl *Fn : A.functions())
    for (const Def &D : A.flow(Fn).defs()) {
      if (D.K != Def::Assign || !D.Value)
        continue;
      std::optional<FieldRole> Role = role(Fn, D.Value);
      if (!Role)
        continue;
      SlotKey Key = SlotKey::of(D.Target, Fn);
      // Fields of a struct on this function's stack are not followed.
      if (!D.Target.Steps.empty() && Key.isLocal())
        continue;
      Copies.try_emplace(Key, *Role);
    }
}

std::optional<FieldRole> CompletionFields::role(const FunctionDecl *Fn,
                                                const Expr *E) const {
  // The extended CQ API reads the current completion through calls.
  if (const auto *CE = dyn_cast_or_null<CallExpr>(stripExpr(E)))
    if (const FunctionModel *M = A.modelOf(CE)) {
      if (M->E == Effect::WcReadFlags)
        return FieldRole::WcFlags;
      if (M->E == Effect::WcReadInvalidatedRkey)
        return FieldRole::InvalidatedRkey;
      if (M->E == Effect::WcReadOpcode)
        return FieldRole::WcOpcode;
    }
  std::optional<Location> L = locationOf(E);
  if (!L)
    return std::nullopt;
  if (!L->Steps.empty())
    if (auto F = A.classify(*L))
      if (F->Struct->Role == StructRole::Wc &&
          (F->Role == FieldRole::WcFlags || F->Role == FieldRole::InvalidatedRkey ||
           F->Role == FieldRole::WcOpcode))
        return F->Role;
  auto It = Copies.find(SlotKey::of(A.flow(Fn).resolve(*L), Fn));
  if (It != Copies.end())
    return It->second;
  return std::nullopt;
}

KeyTracker::KeyTracker(const TuAnalysis &A) : A(A) {
  for (const FunctionDecl *Fn : A.functions())
    for (const Def &D : A.flow(Fn).defs()) {
      if (D.K != Def::Assign || !D.Value || D.Target.Steps.empty())
        continue;
      SlotKey Key = SlotKey::of(D.Target, Fn);
      if (!Key.isShared())
        continue;
      if (auto Owner = keyOwner(A, stripExpr(D.Value)))
        Holders.try_emplace(Key, slotOf(A, *Owner, Fn));
    }
}

std::optional<SlotKey> KeyTracker::keySlot(const FunctionDecl *Fn, const Expr *E,
                                           unsigned Depth) const {
  if (!E || Depth > budget::KeyCopyDepth)
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
  auto It = Holders.find(SlotKey::of(R, Fn));
  if (It != Holders.end())
    return It->second;
  return std::nullopt;
}

//===-- Extraction --------------------------------------------------------===//

/// Builds the events of one unit.
class LifecycleBuilder {
public:
  explicit LifecycleBuilder(Lifecycle &L)
      : L(L), A(L.A), W(WorkRequests::of(L.A)), Fields(L.A), Keys(L.A) {
    for (const ApiCall &C : A.calls())
      CallModel[C.Call] = &C;
    for (const PostSite &P : W.posts())
      if (P.Call)
        Posts[P.Call->Call] = &P;
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
    for (Lifecycle::RemoteInvalidation &R :
         findRemoteInvalidations(A, Fields, Keys, Fn, L.KeyCompares))
      L.RemoteInvs.push_back(std::move(R));
    // Entry first: events of a block come in source order.
    for (const CFGBlock *B : llvm::reverse(*G))
      for (const CFGElement &El : *B)
        if (auto CS = El.getAs<CFGStmt>())
          visit(Fn, CS->getStmt());
  }

private:
  void add(LifeEvent E) {
    L.AtStmt[E.S].push_back(L.Events.size());
    L.Events.push_back(std::move(E));
  }

  LifeEvent event(LifeEventKind K, const SlotKey &Slot, const FunctionDecl *Fn,
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

  /// An event of a post: it does not happen when the post fails.
  LifeEvent postEvent(LifeEventKind K, const SlotKey &Slot, const FunctionDecl *Fn,
                      const Stmt *S, SourceLocation Loc, StringRef What) {
    LifeEvent E = event(K, Slot, Fn, S, Loc, What);
    E.Post = S;
    return E;
  }

  /// Handle slot named by an argument expression, if it is a handle.
  std::optional<SlotKey> handleSlot(const FunctionDecl *Fn, const Expr *E,
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
      SlotKey Slot = slotOf(A, *Result, Fn);
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
        if (auto Slot = Keys.keySlot(Fn, C.arg(ArgRole::InvalidateRkey)))
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
      add(event(LifeEventKind::Wait, SlotKey(), Fn, CE, Loc, Name));
      break;
    case Effect::ErrorPointerTest:
    case Effect::MemoryZero:
      // Outside the lifecycle; a handle passed here is treated like one
      // passed to any function of another unit.
      helperOrUnknown(Fn, CE);
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
  void bufferOf(const FunctionDecl *Fn, const Expr *Buf, const SlotKey &Slot) {
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
    for (const SlotKey &Slot : handleSlotsWithin(Fn, Container))
      add(event(LifeEventKind::ContainerRelease, Slot, Fn, CE, CE->getBeginLoc(),
                Name));
  }

  /// `mr = ulp_get_mr(conn)`: a helper that returns a handle it produced
  /// produces it here.
  void freshFromHelper(const FunctionDecl *Fn, const CallExpr *CE,
                       const FunctionDecl *Callee) {
    std::optional<Location> Result = A.resultOf(CE);
    if (!Result || !isHandleType(A, Callee->getReturnType()))
      return;
    std::vector<const ApiCall *> Producers = A.returnedProducers(
        Callee, {Effect::MrRegister, Effect::MrAlloc, Effect::MrPoolGet,
                 Effect::MwAlloc});
    if (Producers.empty())
      return;
    const ApiCall &P = *Producers.front();
    LifeEvent E = event(LifeEventKind::Produce, slotOf(A, *Result, Fn), Fn, CE,
                        CE->getBeginLoc(), Callee->getName());
    E.Stable = stable(Fn, *Result);
    E.Reusable = P.Model->E != Effect::MrRegister;
    E.By = P.Model->E;
    E.Window = P.Model->E == Effect::MwAlloc;
    add(E);
  }

  /// Slots of handles the unit stores inside \p Container.
  std::vector<SlotKey> handleSlotsWithin(const FunctionDecl *Fn,
                                         const Location &Container) {
    std::vector<SlotKey> Found;
    auto Inside = [&](const SlotKey &Slot) {
      if (!Container.Steps.empty()) {
        SlotKey Outer = SlotKey::of(Container, Fn);
        return !Outer.isLocal() && Slot != Outer && Slot.isWithin(Outer);
      }
      QualType T = Container.Root ? Container.Root->getType() : QualType();
      const RecordDecl *RD =
          !T.isNull() && T->isPointerType() ? T->getPointeeType()->getAsRecordDecl()
                                            : nullptr;
      return Slot.isFieldOf(RD);
    };
    for (const LifeEvent &E : L.Events)
      if (E.K == LifeEventKind::Produce && Inside(E.Slot) &&
          !llvm::is_contained(Found, E.Slot))
        Found.push_back(E.Slot);
    return Found;
  }

  /// A call to a helper of this unit carries its effects (the solver
  /// applies its summary); anything else that receives a handle may keep or
  /// release it.
  void helperOrUnknown(const FunctionDecl *Fn, const CallExpr *CE) {
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    bool Helper = Def && llvm::is_contained(A.functions(), Def);
    if (Helper) {
      LifeEvent E = event(LifeEventKind::Call, SlotKey(), Fn, CE,
                          CE->getBeginLoc(), Def->getName());
      E.Callee = Def;
      add(E);
      freshFromHelper(Fn, CE, Def);
      return;
    }
    for (const Expr *Arg : CE->arguments())
      if (auto Slot = handleSlot(Fn, Arg))
        add(event(LifeEventKind::Escape, *Slot, Fn, CE, CE->getBeginLoc(),
                  Callee ? Callee->getName() : StringRef("call")));
  }

public:
  /// ib_mr_pool_destroy() deregisters every MR of the pool: each slot that
  /// holds MRs taken from a pool.
  void destroyPools() {
    std::vector<SlotKey> Pooled;
    for (const LifeEvent &E : L.Events)
      if (E.K == LifeEventKind::Produce && E.By == Effect::MrPoolGet &&
          !llvm::is_contained(Pooled, E.Slot))
        Pooled.push_back(E.Slot);
    for (const ApiCall &C : A.calls())
      if (C.Model->E == Effect::MrPoolDestroy)
        for (const SlotKey &Slot : Pooled)
          add(event(LifeEventKind::Deregister, Slot, C.Caller, C.Call,
                    C.Call->getBeginLoc(), C.Model->Name));
  }

private:
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
    SlotKey Slot = slotOf(A, *Target, Fn);
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
              add(postEvent(LifeEventKind::Expose, *Slot, Fn, S, Loc,
                            A.rules().opcodeEnumerator(A.domain(), Opcode::RegMr)));
      }
      if (W.mayBe(Opcode::BindMw))
        for (const FieldStore *Mw : slotStores(A, W, FieldRole::BindMw))
          if (auto Slot = handleSlot(Mw->Fn, Mw->Value))
            add(postEvent(LifeEventKind::Expose, *Slot, Fn, S, Loc,
                          A.rules().opcodeEnumerator(A.domain(), Opcode::BindMw)));
      if (W.mayBe(Opcode::LocalInv))
        for (const FieldStore *Key : slotStores(A, W, FieldRole::InvalidateRkey))
          if (auto Slot = Keys.keySlot(Key->Fn, Key->Value)) {
            LifeEvent E = postEvent(LifeEventKind::InvalidatePost, *Slot, Fn,
                                    S, Loc, "LOCAL_INV");
            E.Signaled = W.Signal != WrSlot::Never;
            add(E);
          }
    }
  }

  Lifecycle &L;
  const TuAnalysis &A;
  const WorkRequests &W;
  llvm::DenseMap<const CallExpr *, const ApiCall *> CallModel;
  llvm::DenseMap<const CallExpr *, const PostSite *> Posts;
  std::vector<std::tuple<Location, const FunctionDecl *, SlotKey>> Buffers;
  CompletionFields Fields;
  KeyTracker Keys;
};

void extractEvents(Lifecycle &L) {
  LifecycleBuilder B(L);
  for (const FunctionDecl *Fn : L.A.functions())
    B.findBuffers(Fn);
  for (const FunctionDecl *Fn : L.A.functions())
    B.extract(Fn);
  B.destroyPools();
}

} // namespace ulplint
