//===- LifeEvents.cpp - What each function does to registration handles ---===//
//
// The first part of the lifecycle model: every function's events, in CFG
// order, with the effects of the unit's helpers applied at their calls.
//
//===----------------------------------------------------------------------===//

#include "LifeEvents.h"
#include "Sites.h"
#include "WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Lex/Lexer.h"

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

bool takesCompletion(const TuAnalysis &A, const FunctionDecl *Fn) {
  return llvm::any_of(Fn->parameters(), [&](const ParmVarDecl *P) {
    const StructModel *S = A.structOf(P->getType());
    return S && S->Role == StructRole::Wc;
  });
}

SlotKey slotOf(const TuAnalysis &A, const Location &L, const FunctionDecl *Fn) {
  return SlotKey::of(A.flow(Fn).resolve(L), Fn);
}

std::string Lifecycle::fact(FactKind K, const SlotKey &Slot) {
  return factKey(K, Slot.str());
}

std::optional<Location> keyOwner(const TuAnalysis &A, const Expr *E) {
  // ibv_inc_rkey(mw->rkey), cpu_to_be32(mr->rkey): still that handle's key.
  if (const auto *CE = dyn_cast_or_null<CallExpr>(stripExpr(E))) {
    const FunctionModel *M = A.modelOf(CE);
    const FunctionDecl *F = CE->getDirectCallee();
    if (((M && M->E == Effect::RkeyIncrement) || (F && F->getBuiltinID())) &&
        CE->getNumArgs() >= 1)
      return keyOwner(A, CE->getArg(0));
  }
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
      std::optional<FieldRole> Role = copiedRole(Fn, D.Value);
      if (!Role)
        continue;
      SlotKey Key = SlotKey::of(D.Target, Fn);
      // A field of a struct on this function's stack is followed by field:
      // the handlers it is handed to name it through their parameter.
      if (!D.Target.Steps.empty() && Key.isLocal()) {
        if (const FieldDecl *F = D.Target.Steps.back().Field)
          StackCopies.try_emplace(F, *Role);
        continue;
      }
      Copies.try_emplace(Key, *Role);
    }
}

std::optional<FieldRole> CompletionFields::copiedRole(const FunctionDecl *Fn,
                                                      const Expr *Value) const {
  if (const auto *CO = dyn_cast<ConditionalOperator>(stripExpr(Value))) {
    std::optional<FieldRole> T = role(Fn, CO->getTrueExpr());
    std::optional<FieldRole> F = role(Fn, CO->getFalseExpr());
    if (T && !F && A.values(Fn).constant(CO->getFalseExpr()))
      return T;
    if (F && !T && A.values(Fn).constant(CO->getTrueExpr()))
      return F;
    return std::nullopt;
  }
  return role(Fn, Value);
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
  if (const auto *ME = dyn_cast<MemberExpr>(stripExpr(E)))
    if (const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl())) {
      auto S = StackCopies.find(F);
      if (S != StackCopies.end())
        return S->second;
    }
  return std::nullopt;
}

bool CompletionFields::isInvalidatedKeyCopy(const FieldDecl *F) const {
  for (const auto &[Slot, Role] : Copies)
    if (Role == FieldRole::InvalidatedRkey && !Slot.path().empty() &&
        Slot.path().back().Field == F)
      return true;
  auto S = StackCopies.find(F);
  return S != StackCopies.end() && S->second == FieldRole::InvalidatedRkey;
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
  // ibv_wr_bind_mw(qpx, b->mw, b->key, &info): b->key is b->mw's key.
  for (const ApiCall &C : A.calls())
    if (C.Model->E == Effect::WrxOp && C.Model->Op == Opcode::BindMw)
      if (const Expr *K = C.arg(ArgRole::Rkey))
        if (auto KL = locationOf(K); KL && !KL->Steps.empty())
          if (const Expr *Mw = C.arg(ArgRole::Mw))
            if (auto ML = locationOf(Mw)) {
              SlotKey Holder = slotOf(A, *KL, C.Caller);
              if (Holder.isShared())
                Holders.try_emplace(Holder, slotOf(A, *ML, C.Caller));
            }
  // `wr.bind_mw.rkey = f->key` with `wr.bind_mw.mw = f->mw`, and REG_MR's
  // `reg_wr.key = k` with `reg_wr.mr = mr`: the value is that handle's key.
  for (const FieldStore &Key : A.stores()) {
    if ((Key.Role != FieldRole::BindRkey && Key.Role != FieldRole::RegKey) ||
        !Key.Value)
      continue;
    FieldRole HandleRole =
        Key.Role == FieldRole::BindRkey ? FieldRole::BindMw : FieldRole::RegMr;
    std::vector<SlotKey> KeyHolders = holdersOf(Key.Fn, Key.Value, Key.At);
    if (KeyHolders.empty())
      continue;
    for (const FieldStore &H : A.stores())
      if (H.Role == HandleRole && H.Value &&
          A.sameStorage(H.Object, H.Fn, Key.Object, Key.Fn))
        if (auto L = locationOf(H.Value))
          for (const SlotKey &Holder : KeyHolders)
            Holders.try_emplace(Holder, slotOf(A, *L, H.Fn));
  }
}

/// The shared fields \p Value (read at \p At in \p Fn) takes a key from:
/// the field itself (`wr.bind_mw.rkey = f->key`), or, for a parameter no
/// assignment reaches, the fields its callers pass
/// (`post_bind(c, l, l->rkey, len)`).
std::vector<SlotKey> KeyTracker::holdersOf(const FunctionDecl *Fn, const Expr *Value,
                                           const Stmt *At) const {
  std::optional<Location> L = Value ? locationOf(Value) : std::nullopt;
  if (!L)
    return {};
  if (!L->Steps.empty()) {
    SlotKey Holder = slotOf(A, *L, Fn);
    return Holder.isShared() ? std::vector<SlotKey>{Holder} : std::vector<SlotKey>{};
  }
  const auto *P = dyn_cast_or_null<ParmVarDecl>(L->Root);
  if (!P || !A.flow(Fn).onlyEntryValue(*L, At))
    return {};
  std::vector<SlotKey> Out;
  for (const auto &[Call, Caller] : A.callersOf(Fn)) {
    if (P->getFunctionScopeIndex() >= Call->getNumArgs())
      continue;
    std::optional<Location> Arg = locationOf(Call->getArg(P->getFunctionScopeIndex()));
    if (!Arg || Arg->Steps.empty())
      continue;
    SlotKey Holder = slotOf(A, *Arg, Caller);
    if (Holder.isShared() && !llvm::is_contained(Out, Holder))
      Out.push_back(Holder);
  }
  return Out;
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

std::optional<SlotKey> KeyTracker::keyParameter(const FunctionDecl *Fn,
                                                const Expr *E) const {
  std::optional<Location> Loc = E ? locationOf(E) : std::nullopt;
  if (!Loc)
    return std::nullopt;
  Location R = A.flow(Fn).resolve(*Loc);
  const auto *P = dyn_cast_or_null<ParmVarDecl>(R.Root);
  if (!P || !R.Steps.empty() || !P->getType()->isIntegerType())
    return std::nullopt;
  // Only the value the caller passed: no assignment reaches the read.
  for (const Def *D : A.flow(Fn).reaching(R, E))
    if (D)
      return std::nullopt;
  return SlotKey::of(R, Fn);
}

std::optional<SlotKey> KeyTracker::soleHandleNextTo(const FunctionDecl *Fn,
                                                    const Expr *E) const {
  std::optional<Location> Loc = E ? locationOf(stripExpr(E)) : std::nullopt;
  if (!Loc)
    return std::nullopt;
  Location R = A.flow(Fn).resolve(*Loc);
  if (R.Steps.empty() || !R.Steps.back().Field ||
      !R.Steps.back().Field->getType()->isIntegerType())
    return std::nullopt;
  const FieldDecl *Handle = nullptr;
  for (const FieldDecl *F : R.Steps.back().Field->getParent()->fields())
    if (isHandleType(A, F->getType())) {
      if (Handle)
        return std::nullopt; // several: which one is unknown
      Handle = F;
    }
  if (!Handle)
    return std::nullopt;
  R.Steps.back().Field = Handle;
  return SlotKey::of(R, Fn);
}

//===-- Extraction --------------------------------------------------------===//

/// Builds the events of one unit.
class LifecycleBuilder {
public:
  explicit LifecycleBuilder(Lifecycle &L)
      : L(L), A(L.A), W(WorkRequests::of(L.A)), Fields(L.A), Keys(L.A) {
    for (const ApiCall &C : A.calls())
      CallModel[C.Call] = &C;
    for (const PostSite &P : W.posts()) {
      if (P.Call)
        Posts[P.Call->Call] = &P;
      for (const PostSite::Alternative &Alt : P.Alternatives)
        if (Alt.Via)
          HandedToPost[Alt.Via].push_back(&Alt);
    }
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
            bufferOf(Fn, Buf, slotOf(A, *Result, Fn), C.Call);
      } else if (C.Model->E == Effect::MrMap ||
                 C.Model->E == Effect::MrReregister) {
        if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mr)))
          if (const Expr *Mem = C.arg(C.Model->E == Effect::MrMap ? ArgRole::Sg
                                                                  : ArgRole::Addr))
            bufferOf(Fn, Mem, *Slot, C.Call);
      }
    }
    windowBuffers(Fn);
  }

  /// The memory a window is bound over (`bind_info.addr`), in a bind work
  /// request, an `ibv_bind_mw()` or an `ibv_wr_bind_mw()`.
  void windowBuffers(const FunctionDecl *Fn) {
    const FunctionFlow &Flow = A.flow(Fn);
    auto Inside = [&](const Location &Part, const Location &Whole) {
      return Flow.resolve(Part).isWithin(Flow.resolve(Whole));
    };
    for (const FieldStore &Addr : A.stores()) {
      if (Addr.Fn != Fn || Addr.Role != FieldRole::BindAddr || !Addr.Value)
        continue;
      for (const FieldStore &Mw : A.stores())
        if (Mw.Fn == Fn && Mw.Role == FieldRole::BindMw && Mw.Value &&
            Inside(Addr.Object, Mw.Object))
          if (auto Slot = handleSlot(Fn, Mw.Value))
            bufferOf(Fn, Addr.Value, *Slot, nullptr, /*Window=*/true);
      for (const ApiCall &C : A.calls()) {
        if (C.Caller != Fn)
          continue;
        const Expr *Bind = C.Model->E == Effect::MwBind ? C.arg(ArgRole::Bind)
                           : C.Model->Op == Opcode::BindMw ? C.arg(ArgRole::BindInfo)
                                                           : nullptr;
        std::optional<Location> Arg = Bind ? locationOf(addressee(Bind)) : std::nullopt;
        if (Arg && Inside(Addr.Object, *Arg))
          if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mw)))
            bufferOf(Fn, Addr.Value, *Slot, nullptr, /*Window=*/true);
      }
    }
  }

  /// `&bind`: the object a pointer argument names.
  static const Expr *addressee(const Expr *E) {
    E = stripExpr(E);
    if (const auto *UO = dyn_cast_or_null<UnaryOperator>(E);
        UO && UO->getOpcode() == UO_AddrOf)
      return UO->getSubExpr();
    return E;
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
      // A chain built here and posted by the helper called: its effects
      // happen at this call, before the helper's own (its wait).
      auto Handed = HandedToPost.find(CE);
      if (Handed != HandedToPost.end())
        for (const PostSite::Alternative *Alt : Handed->second)
          posted(Fn, CE, Alt->Chain);
      auto Model = CallModel.find(CE);
      if (Model != CallModel.end())
        modelled(Fn, *Model->second);
      else
        helperOrUnknown(Fn, CE);
      auto Post = Posts.find(CE);
      if (Post != Posts.end()) {
        add(event(LifeEventKind::Post, SlotKey(), Fn, CE, CE->getBeginLoc(),
                  Post->second->Call->Model->Name));
        posted(Fn, *Post->second);
      }
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
      return;
    }
    if (const auto *ME = dyn_cast<MemberExpr>(S))
      keyRead(Fn, ME);
  }

  /// `hello.rkey = htonl(mr->rkey)`: the MR's key goes into a message,
  /// and reaches the peer with the next post; `send_key(peer, mr->rkey)`
  /// hands it to code of another unit at once.
  void keyRead(const FunctionDecl *Fn, const MemberExpr *ME) {
    std::optional<FieldStore> Member = A.classifyMember(ME);
    if (!Member || Member->Role != FieldRole::Rkey ||
        Member->Struct->Role != StructRole::Mr)
      return;
    KeyUse Use = rkeyUse(A, Fn, ME);
    if (Use == KeyUse::Local)
      return;
    LifeEvent E = event(Use == KeyUse::Staged ? LifeEventKind::KeyStaged
                                              : LifeEventKind::Expose,
                        slotOf(A, Member->Object, Fn), Fn, ME, ME->getBeginLoc(), "rkey");
    E.Outward = Use == KeyUse::Staged &&
                (storedOutward(Fn, ME) || givenToOtherUnit(Fn, ME));
    KeyLeaves.push_back(E);
  }

  /// `exchange_keys(peers, base, mr->rkey)`: the key is handed to code of
  /// another unit (no model, no body in this one), which may keep or send
  /// it.
  bool givenToOtherUnit(const FunctionDecl *Fn, const Expr *Read) {
    const ParentMap &PM = A.flow(Fn).parents();
    for (const Stmt *P = PM.getParent(Read); P && isa<Expr>(P); P = PM.getParent(P))
      if (const auto *CE = dyn_cast<CallExpr>(P)) {
        const FunctionDecl *Callee = CE->getDirectCallee();
        // A body anywhere in the unit (htobe32's inline __bswap_32, a
        // helper) is not another unit's code.
        return Callee && !Callee->getDefinition() && !A.modelOf(CE) &&
               !Callee->isVariadic();
      }
    return false;
  }

  /// Is the key read \p Read assigned (through conversions) into memory
  /// the function's caller or other code sees: `d->rkey = htobe32(..)` with
  /// `d` a pointer parameter, or a global?
  bool storedOutward(const FunctionDecl *Fn, const Expr *Read) {
    const ParentMap &PM = A.flow(Fn).parents();
    const Stmt *Child = Read;
    for (const Stmt *P = PM.getParent(Read); P; Child = P, P = PM.getParent(P)) {
      if (const auto *BO = dyn_cast<BinaryOperator>(P)) {
        if (!BO->isAssignmentOp() || BO->getRHS() != Child)
          return false;
        std::optional<Location> To = locationOf(BO->getLHS());
        if (!To || To->Steps.empty())
          return false;
        const auto *VD = dyn_cast_or_null<VarDecl>(A.flow(Fn).resolve(*To).Root);
        return VD && (VD->hasGlobalStorage() ||
                      (isa<ParmVarDecl>(VD) && VD->getType()->isPointerType()));
      }
      if (!isa<Expr>(P) || isa<ConditionalOperator>(P))
        return false; // a statement: not stored here
    }
    return false;
  }

public:
  /// Fresh memory holds no handle yet, whatever the unit later stores in it.
  void freshAllocations() {
    for (const auto &[Fn, CE, Result, Name] : Allocations)
      for (const SlotKey &Slot : handleSlotsWithin(Fn, Result))
        add(event(LifeEventKind::Fresh, Slot, Fn, CE, CE->getBeginLoc(), Name));
  }

  /// `my_free(staging)`, `frame_put(exp, s->frame)`: a helper that frees,
  /// unmaps or pools the memory its caller passes releases it at the call,
  /// where the caller's windows and MRs over that memory are known. Struct
  /// parameters need none of this: the handles in them are shared slots
  /// whose events the helper's summary carries.
  void releaseThroughHelpers() {
    std::set<std::pair<const CallExpr *, unsigned>> Done;
    for (bool Changed = true; Changed;) {
      Changed = false;
      for (const auto &[Fn, CE, Callee] : HelperCalls)
        for (const auto &[Index, Unmap] : ParamReleased[Callee])
          if (Index < CE->getNumArgs() && Done.insert({CE, Index}).second) {
            size_t Before = ParamReleases;
            released(Fn, CE, CE->getArg(Index), Callee->getName(), false, Unmap);
            Changed |= ParamReleases != Before;
          }
    }
  }

  /// \p Fn releases the memory its parameter \p Freed points at.
  void noteParamReleased(const FunctionDecl *Fn, const Location &Freed, bool Unmap) {
    const auto *P = dyn_cast_or_null<ParmVarDecl>(Freed.Root);
    // Plain memory only (`void *`, `char *`, `float *`): not a struct, and
    // not a table of pointers to structs (`struct desc **`).
    QualType Pointee = P ? P->getType()->getPointeeType() : QualType();
    if (!P || !Freed.Steps.empty() || Pointee.isNull() ||
        Pointee->getAsRecordDecl() || Pointee->isPointerType() ||
        !A.flow(Fn).onlyEntryValue(Freed, Fn->getBody()))
      return;
    ParamReleases += ParamReleased[Fn].insert({P->getFunctionScopeIndex(), Unmap}).second;
  }

  /// `mr = ulp_get_mr(conn)`: a helper that returns a handle it produced
  /// and kept nowhere else produces it here. One that returns a handle it
  /// also stored (a cache entry) does not.
  void produceFromHelpers() {
    for (const auto &[Fn, CE, Callee, Result] : HelperResults) {
      std::optional<LifeEvent> Fresh = freshReturn(Callee, 0);
      if (!Fresh)
        continue;
      LifeEvent E = event(LifeEventKind::Produce, slotOf(A, Result, Fn), Fn, CE,
                          CE->getBeginLoc(), Callee->getName());
      E.Stable = stable(Fn, Result);
      E.Reusable = Fresh->Reusable;
      E.By = Fresh->By;
      E.Window = Fresh->Window;
      E.Remote = Fresh->Remote;
      E.Binding = CE;
      add(E);
    }
  }

  /// `mr = ib_mr_pool_get(..); ...; req->mr = mr;`: the struct receives
  /// the handle this function just produced, as if the call had stored it
  /// there; the store is that slot's Produce, not an overwrite with a
  /// handle of unknown origin.
  void produceThroughLocals() {
    std::map<SlotKey, std::set<SlotKey>> Into; // the local -> the structs
    for (LifeEvent &E : L.Events) {
      if (E.K != LifeEventKind::Overwrite || !E.Slot.isShared())
        continue;
      // Only into the caller's struct (`ioctx->mr = mr`): a struct this
      // function made and linked somewhere owns its handle with it.
      const auto *BO = dyn_cast_or_null<BinaryOperator>(E.S);
      if (!BO || !intoParameter(E.Fn, BO->getLHS(), BO))
        continue;
      const LifeEvent *P = producedInto(E.Fn, BO->getRHS(), BO);
      if (!P || namedAfter(P->Slot, E.Fn, BO))
        continue;
      E.K = LifeEventKind::Produce;
      E.Reusable = P->Reusable;
      E.By = P->By;
      E.Window = P->Window;
      E.Remote = P->Remote;
      E.Binding = P->Binding;
      E.What = P->What;
      // `if (!d->mr) { mr = ib_alloc_mr(..); d->mr = mr; }`: filled once.
      if (std::optional<Location> Target = locationOf(BO->getLHS()))
        E.Lazy = lazy(E.Fn, BO, *Target);
      Into[P->Slot].insert(E.Slot);
    }
    // Memory registered through the local (`mr = ibv_reg_mr(pd, s->locks,
    // ..); s->mr = mr;`) is the struct's handle's memory where other
    // functions release it (`free(s->locks)` in a grow or a teardown).
    for (LifeEvent &E : L.Events)
      if (E.K == LifeEventKind::BufferRelease && E.Slot.isLocal() &&
          E.Fn != E.Slot.function())
        if (auto It = Into.find(E.Slot); It != Into.end() && It->second.size() == 1)
          E.Slot = *It->second.begin();
  }

  /// Is \p Lhs storage reached through a parameter of \p Fn at \p At,
  /// directly or through a local pointing into it (`p = &sess->permits[i];
  /// p->mr = mr;`)?
  bool intoParameter(const FunctionDecl *Fn, const Expr *Lhs, const Stmt *At) {
    std::optional<Location> L = locationOf(Lhs);
    if (!L)
      return false;
    Location R = A.flow(Fn).resolve(*L);
    if (!R.Root || R.Steps.empty())
      return false;
    if (isa<ParmVarDecl>(R.Root))
      return true;
    const auto *Local = dyn_cast<VarDecl>(R.Root);
    if (!Local || !Local->isLocalVarDecl() || !Local->getType()->isPointerType())
      return false;
    auto Defs = A.flow(Fn).reaching(Location{Local, {}}, At);
    return !Defs.empty() && llvm::all_of(Defs, [&](const Def *D) {
      const Expr *V = D && D->K == Def::Assign && D->Value ? stripExpr(D->Value) : nullptr;
      if (const Expr *Target = addressed(V))
        V = Target;
      std::optional<Location> From = V ? locationOf(V) : std::nullopt;
      return From && From->Root && isa<ParmVarDecl>(From->Root) && !From->Steps.empty();
    });
  }

  /// Does \p Fn still act on the handle through the local \p Slot after
  /// \p Store (`io->mr = mr; ... ib_dereg_mr(mr)`)? Then the local stays its
  /// name there, and the struct's copy is not tracked as a second handle.
  bool namedAfter(const SlotKey &Slot, const FunctionDecl *Fn, const Stmt *Store) {
    auto ActsOnHandle = [](LifeEventKind K) {
      switch (K) {
      case LifeEventKind::Bind: // mapping pages: the struct's copy is the same
      case LifeEventKind::Produce:
      case LifeEventKind::Overwrite:
      case LifeEventKind::Post:
      case LifeEventKind::Call:
      case LifeEventKind::Wait:
      case LifeEventKind::Fresh:
      case LifeEventKind::Repoint:
        return false;
      default:
        return true;
      }
    };
    return llvm::any_of(L.Events, [&](const LifeEvent &O) {
      return O.Fn == Fn && O.Slot == Slot && O.S && O.S != Store &&
             ActsOnHandle(O.K) && A.flow(Fn).reachableFrom(Store, O.S);
    });
  }

  /// The Produce of \p Fn whose handle the local \p Value holds at \p At:
  /// every assignment reaching there stores a produced handle (the first
  /// in the source names them).
  const LifeEvent *producedInto(const FunctionDecl *Fn, const Expr *Value,
                                const Stmt *At) {
    const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Value));
    const auto *Var = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
    if (!Var || !Var->isLocalVarDecl())
      return nullptr;
    std::optional<Location> Local = locationOf(DRE);
    if (!Local)
      return nullptr;
    SlotKey Slot = slotOf(A, *Local, Fn);
    const LifeEvent *First = nullptr;
    auto Defs = A.flow(Fn).reaching(*Local, At);
    for (const Def *D : Defs) {
      const auto *Call = D && D->K == Def::Assign && D->Value
                             ? dyn_cast<CallExpr>(stripExpr(D->Value))
                             : nullptr;
      const LifeEvent *P = nullptr;
      for (const LifeEvent &O : L.Events)
        if (O.K == LifeEventKind::Produce && O.Fn == Fn && O.S == Call &&
            O.Slot == Slot)
          P = &O;
      if (!Call || !P)
        return nullptr;
      if (!First || A.sources().isBeforeInTranslationUnit(P->Loc, First->Loc))
        First = P;
    }
    return First;
  }

  /// The Produce whose handle \p Fn returns, if the handle is fresh: the
  /// result of a registration returned as is, or held in a local of \p Fn
  /// that nothing stores elsewhere.
  std::optional<LifeEvent> freshReturn(const FunctionDecl *Fn, unsigned Depth) {
    if (Depth > budget::SummaryDepth)
      return std::nullopt;
    for (const ApiCall &C : A.calls()) {
      if (C.Caller != Fn)
        continue;
      Effect E = C.Model->E;
      if (E != Effect::MrRegister && E != Effect::MrAlloc &&
          E != Effect::MrPoolGet && E != Effect::MwAlloc)
        continue;
      const auto *RS = dyn_cast_or_null<ReturnStmt>(
          A.flow(Fn).parents().getParentIgnoreParenCasts(C.Call));
      if (!RS)
        continue;
      LifeEvent P;
      P.By = E;
      P.Reusable = E != Effect::MrRegister;
      P.Window = E == Effect::MwAlloc;
      P.Remote = E == Effect::MrRegister && remote(Fn, C);
      return P;
    }
    for (const LifeEvent &E : L.Events) {
      if (E.Fn != Fn || E.K != LifeEventKind::Escape || E.What != "return")
        continue;
      if (!E.Slot.isLocal() || isa<ParmVarDecl>(E.Slot.variable()))
        continue;
      const LifeEvent *Produce = nullptr;
      bool Kept = false;
      for (const LifeEvent &O : L.Events) {
        if (O.Fn != Fn || O.Slot != E.Slot)
          continue;
        if (O.K == LifeEventKind::Produce)
          Produce = &O;
        else if (O.K == LifeEventKind::Escape && O.What != "return")
          Kept = true;
      }
      if (Produce && !Kept)
        return *Produce;
    }
    return std::nullopt;
  }

  /// An rkey that leaves exposes MRs registered with remote rights, and
  /// shared MRs registered in another unit.
  void exposeLeavingKeys() {
    for (LifeEvent &E : KeyLeaves) {
      bool Remote = false, Produced = false;
      for (const LifeEvent &P : L.Events)
        if (P.K == LifeEventKind::Produce && P.Slot == E.Slot) {
          Produced = true;
          Remote |= P.Remote; // fast-registration MRs get rights from REG_MR
        }
      if (Remote || (!Produced && E.Slot.isShared()))
        add(std::move(E));
    }
  }

private:

  void modelled(const FunctionDecl *Fn, const ApiCall &C) {
    const CallExpr *CE = C.Call;
    SourceLocation Loc = CE->getBeginLoc();
    StringRef Name = C.Model->Name;
    auto On = [&](LifeEventKind K, ArgRole Role) {
      bool Window = false;
      if (auto Slot = handleSlot(Fn, C.arg(Role), &Window)) {
        LifeEvent E = event(K, *Slot, Fn, CE, Loc, Name);
        E.Window = Window;
        E.Stable = stable(Fn, *locationOf(C.arg(Role)));
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
      // A registration with remote rights is exposed where its rkey leaves
      // (keyLeaves): a key nobody learns opens nothing.
      E.Remote = C.Model->E == Effect::MrRegister && remote(Fn, C);
      E.Lazy = lazy(Fn, CE, *Result);
      E.Binding = CE;
      add(E);
      break;
    }
    case Effect::MrMap:
    case Effect::MrReregister:
      if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mr))) {
        LifeEvent E = event(LifeEventKind::Bind, *Slot, Fn, CE, Loc, Name);
        E.Binding = CE;
        add(E);
      }
      break;
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
        if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mw))) {
          LifeEvent E = event(LifeEventKind::Expose, *Slot, Fn, CE, Loc, Name);
          E.Window = true;
          extendedPost(C, E);
          add(E);
        }
      // mlx5dv_wr_mr_list(mqp, mkey, access, ..): a UMR registers the
      // mkey like a REG_MR; with remote rights its key is out once posted.
      if (C.Model->Op == Opcode::RegMr && remote(Fn, C))
        if (auto Slot = handleSlot(Fn, C.arg(ArgRole::Mkey))) {
          LifeEvent E = event(LifeEventKind::Expose, *Slot, Fn, CE, Loc, Name);
          extendedPost(C, E);
          add(E);
        }
      if (C.Model->Op == Opcode::LocalInv)
        if (auto Slot = invalidatedKey(Fn, C.arg(ArgRole::InvalidateRkey))) {
          LifeEvent E = event(LifeEventKind::InvalidatePost, *Slot, Fn, CE, Loc, Name);
          extendedPost(C, E);
          add(E);
        }
      break;
    case Effect::DmaUnmap:
    case Effect::BufferFree:
      released(Fn, CE, C.arg(C.Model->E == Effect::DmaUnmap ? ArgRole::Sg : ArgRole::Buffer),
               Name, false, C.Model->E == Effect::DmaUnmap);
      break;
    case Effect::ContainerRecycle: {
      const Expr *List = C.arg(ArgRole::List);
      const auto *Param =
          dyn_cast_or_null<ParmVarDecl>(List ? refDecl(stripExpr(List)) : nullptr);
      released(Fn, CE, C.arg(ArgRole::Entry), Name, /*EntryOfContainer=*/true,
               /*Unmap=*/false, !Param && onlyWalkedField(List), Param);
      break;
    }
    case Effect::BufferAlloc:
      // Judged once every handle the unit produces is known: the array
      // allocated here may hold MRs produced further down.
      if (std::optional<Location> Result = A.resultOf(CE))
        Allocations.push_back({Fn, CE, *Result, Name.str()});
      break;
    case Effect::WaitCompletion:
      waitedOrDone(Fn, CE, Name);
      [[fallthrough]];
    case Effect::CqPoll:
    case Effect::QpDrain:   // every posted work request has completed
    case Effect::QpDrainSq: // ... every send work request
      add(event(LifeEventKind::Wait, SlotKey(), Fn, CE, Loc, Name));
      break;
    case Effect::WaitCompletionTimeout: {
      // On the branch where it returned 0, nothing completed.
      LifeEvent E = event(LifeEventKind::Wait, SlotKey(), Fn, CE, Loc, Name);
      E.Post = CE;
      add(E);
      break;
    }
    case Effect::ErrorPointerTest:
    case Effect::ErrorPointerValue:
      // Reading a pointer's error state neither keeps nor frees the handle.
      break;
    case Effect::MemoryZero:
      zeroed(Fn, CE, C.arg(ArgRole::Buffer));
      // A handle passed here is treated like one passed to any function
      // of another unit.
      helperOrUnknown(Fn, CE);
      break;
    default:
      break;
    }
  }

  /// `memset(s, 0, sizeof(*s))`: the handles the struct holds, in its
  /// arrays of structs too, are NULL now.
  void zeroed(const FunctionDecl *Fn, const CallExpr *CE, const Expr *Arg) {
    std::optional<Location> Object = Arg ? locationOf(stripExpr(Arg)) : std::nullopt;
    if (!Object || !Object->Steps.empty())
      return;
    for (const SlotKey &Slot : handleSlotsWithin(Fn, *Object, /*Arrays=*/true)) {
      LifeEvent E = event(LifeEventKind::Clear, Slot, Fn, CE, CE->getBeginLoc(), "memset");
      E.Stable = stable(Fn, *Object);
      add(E);
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

  /// A work request of the extended API happens at the ibv_wr_complete()
  /// that posts it, signaled as the QP's wr_flags say.
  void extendedPost(const ApiCall &Op, LifeEvent &E) {
    for (const PostSite &P : W.posts()) {
      if (P.Fn != Op.Caller || P.Call->Model->E != Effect::WrxComplete ||
          !A.sources().isBeforeInTranslationUnit(Op.Call->getBeginLoc(),
                                                 P.Call->Call->getBeginLoc()))
        continue;
      E.Post = P.Call->Call;
      for (const WrSlot &S : P.Chain)
        if (S.Key.Api == Op.Model)
          E.Signaled = S.Signal != WrSlot::Never;
      return;
    }
  }

  /// `if (!buf->mr) buf->mr = ibv_reg_mr(...)`: registered once, on first
  /// use, then kept: a cache.
  bool lazy(const FunctionDecl *Fn, const Stmt *Call, const Location &Result) {
    const ParentMap &PM = A.flow(Fn).parents();
    Location R = A.flow(Fn).resolve(Result);
    const Stmt *Child = Call;
    for (const Stmt *P = PM.getParent(Call); P; Child = P, P = PM.getParent(P)) {
      const auto *If = dyn_cast<IfStmt>(P);
      if (!If || If->getCond() == Child)
        continue;
      bool Found = false;
      std::function<void(const Stmt *)> Scan = [&](const Stmt *S) {
        if (const auto *E = dyn_cast_or_null<Expr>(S))
          if (auto L = locationOf(E); L && A.flow(Fn).resolve(*L) == R)
            Found = true;
        if (S)
          for (const Stmt *Sub : S->children())
            Scan(Sub);
      };
      Scan(If->getCond());
      if (Found)
        return true;
    }
    return false;
  }

  /// `if (!atomic_dec_and_test(&c->pending)) wait_event(c->wq,
  /// atomic_read(&c->pending) == 0);`: the wait is skipped only when the
  /// counter it waits on already says every completion arrived. The test
  /// of that counter is then a wait on both branches.
  void waitedOrDone(const FunctionDecl *Fn, const CallExpr *Wait, StringRef Name) {
    const ParentMap &PM = A.flow(Fn).parents();
    const Stmt *Child = Wait;
    for (const Stmt *P = PM.getParent(Wait); P; Child = P, P = PM.getParent(P)) {
      // The wait macro's own tests are not the caller's.
      const auto *If = dyn_cast<IfStmt>(P);
      if (!If || If->getBeginLoc().isMacroID())
        continue;
      if (If->getThen() != Child)
        return;
      const CallExpr *Test = counterTest(If->getCond(), If->getThen());
      if (Test)
        add(event(LifeEventKind::Wait, SlotKey(), Fn, Test, Test->getBeginLoc(), Name));
      return;
    }
  }

  /// The call in \p Cond that reads a counter \p Then also reads (the
  /// wait's condition), if any.
  static const CallExpr *counterTest(const Expr *Cond, const Stmt *Then) {
    const auto *CE = dyn_cast<CallExpr>(stripExpr(Cond));
    if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(Cond)))
      CE = dyn_cast<CallExpr>(stripExpr(UO->getSubExpr()));
    if (!CE)
      return nullptr;
    for (const Expr *Arg : CE->arguments()) {
      const Expr *Counter = addressed(Arg);
      std::optional<Location> L = locationOf(Counter ? Counter : stripExpr(Arg));
      if (L && !L->Steps.empty() && mentions(Then, *L))
        return CE;
    }
    return nullptr;
  }

  static bool mentions(const Stmt *S, const Location &L) {
    if (!S)
      return false;
    if (const auto *E = dyn_cast<Expr>(S))
      if (auto M = locationOf(E); M && *M == L)
        return true;
    return llvm::any_of(S->children(), [&](const Stmt *C) { return mentions(C, L); });
  }

  bool remote(const FunctionDecl *Fn, const ApiCall &C) {
    uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
                      A.flagBit(Flag::RemoteAtomic);
    for (Flag F : C.Model->ImplicitAccess) // rdma_reg_write()
      if (A.flagBit(F) & Remote)
        return true;
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
  void bufferOf(const FunctionDecl *Fn, const Expr *Buf, const SlotKey &Slot,
                const Stmt *Binding, bool Window = false, bool ViaLocal = false) {
    // `copy ? m->bounce : buf`: either buffer may be behind the handle.
    if (const auto *CO = dyn_cast_or_null<ConditionalOperator>(stripExpr(Buf))) {
      bufferOf(Fn, CO->getTrueExpr(), Slot, Binding, Window, ViaLocal);
      bufferOf(Fn, CO->getFalseExpr(), Slot, Binding, Window, ViaLocal);
      return;
    }
    // `reg_buf = buf; if (hmem) reg_buf = md->bounce;`: each value the
    // local may hold is the memory behind the handle.
    if (!ViaLocal)
      if (const VarDecl *Local = plainLocal(Buf)) {
        for (const Def &D : A.flow(Fn).defs())
          if (D.K == Def::Assign && D.Value && D.Target.Root == Local &&
              D.Target.Steps.empty())
            bufferOf(Fn, D.Value, Slot, Binding, Window, /*ViaLocal=*/true);
      }
    std::optional<Location> Loc = memoryOf(Buf);
    if (!Loc)
      return;
    Buffers.push_back({*Loc, Fn, Slot, Binding, Window});
    // `bind(.., frame); e->frame = frame;`: the struct keeps the memory,
    // and other functions free it under that name.
    if (Loc->Steps.empty())
      for (const Def &D : A.flow(Fn).defs())
        if (D.K == Def::Assign && D.Value && !D.Target.Steps.empty())
          if (auto V = locationOf(stripExpr(D.Value)); V && *V == *Loc)
            Buffers.push_back({A.flow(Fn).resolve(D.Target), Fn, Slot, Binding, Window});
  }

  /// The local pointer variable (not a parameter) \p E names, if any.
  static const VarDecl *plainLocal(const Expr *E) {
    const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? stripExpr(E) : nullptr);
    const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
    return VD && VD->isLocalVarDecl() && VD->getType()->isPointerType() ? VD : nullptr;
  }

  /// Does the unit name the memory behind \p Slot anywhere?
  bool hasBuffer(const SlotKey &Slot) const {
    return llvm::any_of(Buffers, [&](const Buffer &B) { return B.Slot == Slot; });
  }

  /// The storage a pointer into memory names: `buf`, `b->host + off`,
  /// `&ring[i]`, `(void *)(uintptr_t)p` all name their base.
  static std::optional<Location> memoryOf(const Expr *E) {
    E = stripExpr(E);
    if (const auto *BO = dyn_cast_or_null<BinaryOperator>(E))
      if (BO->isAdditiveOp())
        return memoryOf(BO->getLHS()->getType()->isPointerType() ||
                                BO->getLHS()->getType()->isIntegerType()
                            ? BO->getLHS()
                            : BO->getRHS());
    std::optional<Location> L = locationOf(E);
    while (L && !L->Steps.empty() && !L->Steps.back().Field)
      L->Steps.pop_back(); // an element of the buffer is the buffer
    return L;
  }

  /// Does \p Fn bind a memory window (ibv_bind_mw, ibv_wr_bind_mw, a
  /// BIND_MW work request it posts)?
  bool bindsWindowIn(const FunctionDecl *Fn) const {
    for (const ApiCall &C : A.calls())
      if (C.Caller == Fn && (C.Model->E == Effect::MwBind ||
                             (C.Model->E == Effect::WrxOp && C.Model->Op == Opcode::BindMw)))
        return true;
    for (const PostSite &P : W.posts())
      for (const PostSite::Alternative &Alt : P.Alternatives)
        if ((Alt.Via ? Alt.ViaFn : P.Fn) == Fn &&
            llvm::any_of(Alt.Chain, [](const WrSlot &S) { return S.mayBe(Opcode::BindMw); }))
          return true;
    return false;
  }

  /// `brk.stats = aligned_alloc(..); ... free(brk.stats);`: every value of
  /// \p Memory reaching \p At comes from an allocation in \p Fn.
  bool allocatedHere(const FunctionDecl *Fn, const Location &Memory, const Stmt *At) const {
    auto Defs = A.flow(Fn).reaching(A.flow(Fn).resolve(Memory), At);
    return !Defs.empty() && llvm::all_of(Defs, [&](const Def *D) {
      const auto *CE = D && D->K == Def::Assign && D->S &&
                               A.sources().isBeforeInTranslationUnit(D->S->getBeginLoc(),
                                                                     At->getBeginLoc())
                           ? dyn_cast_or_null<CallExpr>(stripExpr(D->Value))
                           : nullptr;
      const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
      return M && M->E == Effect::BufferAlloc;
    });
  }

  /// A DMA unmap or free: of a buffer behind a handle, or of the struct that
  /// holds handles.
  void released(const FunctionDecl *Fn, const Stmt *CE, const Expr *Arg,
                StringRef Name, bool EntryOfContainer = false, bool Unmap = false,
                bool Parked = false, const ParmVarDecl *ListParam = nullptr) {
    if (!Arg)
      return;
    // `list_add_tail(&mr->qp_entry, list)`: the handle itself goes onto the
    // list (ib_mr_pool_init); the list keeps it.
    if (EntryOfContainer)
      if (const auto *UO = dyn_cast<UnaryOperator>(stripExpr(Arg));
          UO && UO->getOpcode() == UO_AddrOf)
        if (const auto *ME = dyn_cast<MemberExpr>(stripExpr(UO->getSubExpr()))) {
          const Expr *Owner = ME->getBase();
          // Through anonymous unions (ib_mr's qp_entry).
          while (const auto *In = dyn_cast<MemberExpr>(stripExpr(Owner))) {
            const auto *FD = dyn_cast<FieldDecl>(In->getMemberDecl());
            if (!FD || !FD->isAnonymousStructOrUnion())
              break;
            Owner = In->getBase();
          }
          if (auto Slot = handleSlot(Fn, Owner)) {
            add(event(LifeEventKind::Escape, *Slot, Fn, CE, CE->getBeginLoc(), Name));
            return;
          }
        }
    std::optional<Location> Freed = EntryOfContainer ? locationOf(Arg) : memoryOf(Arg);
    if (!Freed)
      return;
    if (!EntryOfContainer)
      noteParamReleased(Fn, *Freed, Unmap);
    if (EntryOfContainer && !Freed->Steps.empty())
      Freed->Steps.pop_back(); // &req->node: the request
    bool Named = false; // the memory of some handle the unit knows
    for (const Buffer &B : Buffers)
      if (A.sameStorage(*Freed, Fn, B.Memory, B.Fn)) {
        LifeEvent E = event(LifeEventKind::BufferRelease, B.Slot, Fn, CE,
                            CE->getBeginLoc(), Name);
        E.Binding = B.Binding;
        E.Window = B.Window;
        E.Stable = stable(Fn, *Freed);
        // A window is put over memory by its bind, wherever its MR was
        // registered.
        E.FreshMemory = allocatedHere(Fn, *Freed, CE) &&
                        (B.Window ? !bindsWindowIn(Fn)
                                  : B.Binding && !A.flow(Fn).parents().hasParent(B.Binding));
        add(E);
        Named = true;
      }
    // `ib_dma_unmap_sg(dev, req->sgl, ...)` with the MR in req->mr: the
    // request's data, mapped into its MR somewhere this unit does not see.
    // `free(r->buf)` next to `r->mw` whose memory no code here names: only
    // perhaps the handle's memory (Guessed), which matters only right after
    // an unawaited LOCAL_INV of that handle.
    if (!EntryOfContainer && !Named && !Freed->Steps.empty() &&
        Freed->Steps.back().Field) {
      Location Request = A.flow(Fn).resolve(*Freed);
      Request.Steps.pop_back();
      for (const SlotKey &Slot : handleSlotsWithin(Fn, Request)) {
        if (!Unmap && hasBuffer(Slot))
          continue;
        LifeEvent E = event(LifeEventKind::BufferRelease, Slot, Fn, CE,
                            CE->getBeginLoc(), Name);
        E.Stable = stable(Fn, *Freed);
        E.Guessed = !Unmap;
        add(E);
      }
    }
    // Handles stored inside the freed struct go with it.
    Location Container = A.flow(Fn).resolve(*Freed);
    for (const SlotKey &Slot : handleSlotsWithin(Fn, Container)) {
      LifeEvent E = event(LifeEventKind::ContainerRelease, Slot, Fn, CE,
                          CE->getBeginLoc(), Name);
      E.Stable = stable(Fn, *Freed);
      E.Recycle = EntryOfContainer;
      E.Parked = Parked;
      E.ListParam = ListParam;
      add(E);
    }
  }

  /// `r->next = q->free; q->free = r;`: \p Rhs goes onto a free list, and
  /// the handles in it with it.
  void pushed(const FunctionDecl *Fn, const BinaryOperator *BO,
              const Location &Head, const Expr *Rhs) {
    std::optional<Location> Item = locationOf(Rhs);
    QualType T = Rhs->getType();
    if (!Item || !Item->Steps.empty() || !T->isPointerType() ||
        !T->getPointeeType()->getAsRecordDecl() || Head.Steps.empty())
      return;
    // Earlier in the function: the item's link field gets the old head.
    bool Linked = llvm::any_of(A.flow(Fn).defs(), [&](const Def &D) {
      if (D.K != Def::Assign || !D.Value || D.S == BO || D.Target.Steps.empty() ||
          D.Target.Root != Item->Root)
        return false;
      std::optional<Location> Old = locationOf(D.Value);
      return Old && A.sameStorage(*Old, Fn, Head, Fn);
    });
    if (!Linked || indexList(Fn, Item->Root, BO) || pendingList(Head))
      return;
    for (const SlotKey &Slot : handleSlotsWithin(Fn, *Item)) {
      // An item whose handle this function just produced is being handed
      // on (a pending list, a pool being filled), not recycled.
      if (L.has(Slot, LifeEventKind::Produce, Fn))
        continue;
      LifeEvent E = event(LifeEventKind::ContainerRelease, Slot, Fn, BO,
                          BO->getBeginLoc(), "free list");
      E.Stable = stable(Fn, *Item);
      E.Recycle = true;
      add(E);
    }
  }

  /// `c->free_slots[c->nfree++] = slot`: a buffer goes back onto an
  /// array-stack pool for reuse, as `free()` would give it away. Structs
  /// pushed that way keep their handles (request pools), so only memory
  /// (a pointer to no struct) counts.
  void pushedMemory(const FunctionDecl *Fn, const BinaryOperator *BO,
                    const Expr *Lhs, const Expr *Rhs) {
    const auto *AS = dyn_cast<ArraySubscriptExpr>(Lhs->IgnoreParenImpCasts());
    const auto *Push = AS ? dyn_cast<UnaryOperator>(stripExpr(AS->getIdx())) : nullptr;
    if (!Push || Push->getOpcode() != UO_PostInc)
      return;
    QualType T = Rhs->getType();
    if (!T->isPointerType() || isHandleType(A, T) ||
        T->getPointeeType()->getAsRecordDecl())
      return;
    released(Fn, BO, Rhs, "free pool");
  }

  /// `s->busy = false` where the unit hands out entries by that flag
  /// (`if (!c->slots[i].busy)` to find one, `busy = true` to take it): the
  /// entry, and the handles in it, go back for reuse.
  void flagCleared(const FunctionDecl *Fn, const BinaryOperator *BO,
                   const Location &Target, const Expr *Rhs) {
    if (Target.Steps.empty() || !Target.Steps.back().Field)
      return;
    const FieldDecl *Flag = Target.Steps.back().Field;
    std::optional<int64_t> Value = A.values(Fn).constant(Rhs);
    if (!Value || *Value != 0 || !inUseFlag(Flag))
      return;
    Location Entry = Target;
    Entry.Steps.pop_back();
    std::string Text = sourceText(A.context(), BO);
    for (const SlotKey &Slot : handleSlotsWithin(Fn, A.flow(Fn).resolve(Entry))) {
      // An entry whose handle this function produced is being set up.
      if (L.has(Slot, LifeEventKind::Produce, Fn))
        continue;
      LifeEvent E = event(LifeEventKind::ContainerRelease, Slot, Fn, BO,
                          BO->getBeginLoc(), Text.empty() ? "in-use flag" : Text);
      E.Stable = stable(Fn, Entry);
      E.Recycle = true;
      add(E);
    }
  }

  /// Is \p F an in-use flag: tested false on a table's entries in a loop
  /// (the scan for a free entry) and set to a constant other than 0
  /// somewhere in the unit?
  bool inUseFlag(const FieldDecl *F) {
    if (!F->getType()->isIntegerType())
      return false;
    auto [It, New] = InUseFlags.try_emplace(F, false);
    if (!New)
      return It->second;
    auto Names = [&](const Expr *E) {
      const auto *ME = dyn_cast_or_null<MemberExpr>(E ? stripExpr(E) : nullptr);
      return ME && ME->getMemberDecl() == F;
    };
    bool TestedFree = false, Taken = false;
    for (const FunctionDecl *Fn : A.functions()) {
      std::function<void(const Stmt *)> Scan = [&](const Stmt *S) {
        if (!S)
          return;
        // Tested on a table's entries in a loop written here: the scan for
        // a free entry, not a state check or a wait (`wait_event(wq,
        // !mr->reg_done)` is a loop too).
        auto InLoop = [&](const Expr *Operand) {
          if (S->getBeginLoc().isMacroID() ||
              !enclosingLoop(A.flow(Fn).parents(), S))
            return false;
          std::optional<Location> Tested = locationOf(stripExpr(Operand));
          if (!Tested)
            return false;
          Location R = A.flow(Fn).resolve(*Tested);
          return llvm::any_of(R.Steps, [](const Location::Step &St) { return !St.Field; });
        };
        if (const auto *UO = dyn_cast<UnaryOperator>(S);
            UO && UO->getOpcode() == UO_LNot && Names(UO->getSubExpr()) &&
            InLoop(UO->getSubExpr()))
          TestedFree = true;
        if (const auto *BO = dyn_cast<BinaryOperator>(S)) {
          std::optional<int64_t> V =
              BO->isAssignmentOp() || BO->isEqualityOp()
                  ? A.values(Fn).constant(BO->getRHS())
                  : std::nullopt;
          if (BO->getOpcode() == BO_Assign && Names(BO->getLHS()) && V && *V != 0)
            Taken = true;
          if (BO->getOpcode() == BO_EQ && Names(BO->getLHS()) && V && *V == 0 && InLoop(BO->getLHS()))
            TestedFree = true;
        }
        for (const Stmt *C : S->children())
          Scan(C);
      };
      Scan(Fn->getBody());
    }
    return It->second = TestedFree && Taken;
  }

  /// The list \p Push puts \p Item on keeps items in use (an LRU, a
  /// lookup index), not free ones: after the push the item is handed out,
  /// by this function or by a caller of this helper.
  bool indexList(const FunctionDecl *Fn, const ValueDecl *Item, const Stmt *Push) {
    if (handedOutAfter(Fn, Item, Push->getEndLoc()))
      return true;
    const auto *P = dyn_cast<ParmVarDecl>(Item);
    if (!P)
      return false;
    unsigned Index = P->getFunctionScopeIndex();
    for (const auto &[CE, Caller] : A.callersOf(Fn)) {
      if (Index >= CE->getNumArgs())
        continue;
      std::optional<Location> Arg = locationOf(CE->getArg(Index));
      if (Arg && Arg->Steps.empty() && handedOutAfter(Caller, Arg->Root, CE->getEndLoc()))
        return true;
    }
    return false;
  }

  /// A list a completion handler walks (`for (pp = &d->inv_pending; ...)`
  /// in the LOCAL_INV's completion): requests wait there for their
  /// completions; it recycles nothing.
  bool pendingList(const Location &Head) {
    const FieldDecl *F = Head.Steps.back().Field;
    if (!F)
      return false;
    auto [It, New] = PendingLists.try_emplace(F, false);
    if (!New)
      return It->second;
    std::function<bool(const Stmt *)> Reads = [&](const Stmt *S) {
      if (!S)
        return false;
      if (const auto *ME = dyn_cast<MemberExpr>(S); ME && ME->getMemberDecl() == F)
        return true;
      return llvm::any_of(S->children(), Reads);
    };
    for (const FunctionDecl *Fn : A.functions())
      if (takesCompletion(A, Fn) && Reads(Fn->getBody()))
        return It->second = true;
    return false;
  }

  static const ValueDecl *refDecl(const Expr *E) {
    const auto *DRE = dyn_cast<DeclRefExpr>(E);
    return DRE ? DRE->getDecl() : nullptr;
  }

  /// `x` of `&x` (casts and parentheses stripped), or null.
  static const Expr *addressed(const Expr *E) {
    const auto *UO = dyn_cast_or_null<UnaryOperator>(E ? stripExpr(E) : nullptr);
    return UO && UO->getOpcode() == UO_AddrOf ? stripExpr(UO->getSubExpr()) : nullptr;
  }

  /// The field `&p->list` names, or null.
  static const FieldDecl *addressedField(const Expr *E) {
    const auto *ME = dyn_cast_or_null<MemberExpr>(addressed(E));
    return ME ? dyn_cast<FieldDecl>(ME->getMemberDecl()) : nullptr;
  }

  /// `list_splice_init(&pool->drop_list, &batch)`: moved onto a local list.
  bool movedToLocal(const Stmt *S, const FieldDecl *F) {
    const auto *CE = dyn_cast<CallExpr>(S);
    const FunctionDecl *Callee = CE ? CE->getDirectCallee() : nullptr;
    if (!Callee || CE->getNumArgs() != 2 || !A.rules().isListMove(Callee->getName()))
      return false;
    const Expr *Batch = addressed(CE->getArg(1));
    const auto *To = Batch ? dyn_cast_or_null<VarDecl>(refDecl(Batch)) : nullptr;
    return addressedField(CE->getArg(0)) == F && To && To->hasLocalStorage();
  }

  /// A list (`&pool->drop_list`, `&req->registered`) the unit walks but
  /// never takes an entry from: it holds requests in use or waiting to be
  /// released, so putting one there recycles nothing. A list the unit only
  /// adds to may be a free list another unit takes from.
  bool onlyWalkedField(const Expr *Head) {
    const FieldDecl *F = addressedField(Head);
    if (!F)
      return false;
    auto [It, New] = WalkedLists.try_emplace(F, false);
    if (!New)
      return It->second;
    bool Taken = false, Walked = false;
    std::function<void(const Stmt *)> Scan = [&](const Stmt *S) {
      if (!S)
        return;
      Walked |= movedToLocal(S, F);
      if (const auto *Use = dyn_cast<MemberExpr>(S); Use && Use->getMemberDecl() == F) {
        ListUse U = A.rules().listMacro(outermostMacro(Use->getBeginLoc()));
        Taken |= U == ListUse::Take;
        Walked |= U == ListUse::Walk;
      }
      for (const Stmt *Child : S->children())
        Scan(Child);
    };
    for (const FunctionDecl *Fn : A.functions())
      Scan(Fn->getBody());
    return It->second = Walked && !Taken;
  }

  /// The macro the user wrote that \p Loc comes from, or "".
  StringRef outermostMacro(SourceLocation Loc) const {
    if (!Loc.isMacroID())
      return "";
    const SourceManager &SM = A.sources();
    SourceLocation At = SM.getExpansionLoc(Loc);
    return Lexer::getSourceText(CharSourceRange::getTokenRange(At, At), SM,
                                A.context().getLangOpts());
  }

  /// `return r;` or `*out = r;` after \p After in \p Fn.
  bool handedOutAfter(const FunctionDecl *Fn, const ValueDecl *Item, SourceLocation After) {
    auto IsItem = [&](const Expr *E) {
      std::optional<Location> L = E ? locationOf(E) : std::nullopt;
      return L && L->Root == Item && L->Steps.empty();
    };
    auto Later = [&](const Stmt *S) {
      return A.sources().isBeforeInTranslationUnit(After, S->getBeginLoc());
    };
    for (const Def &D : A.flow(Fn).defs())
      if (D.K == Def::Assign && D.S && Later(D.S) && IsItem(D.Value) &&
          isa_and_nonnull<ParmVarDecl>(D.Target.Root) && D.Target.Steps.size() == 1 &&
          !D.Target.Steps[0].Field)
        return true;
    for (const CFGBlock *B : *A.flow(Fn).cfg())
      for (const CFGElement &El : *B)
        if (auto CS = El.getAs<CFGStmt>())
          if (const auto *RS = dyn_cast<ReturnStmt>(CS->getStmt());
              RS && Later(RS) && IsItem(RS->getRetValue()))
            return true;
    return false;
  }

  /// Slots of handles the unit stores inside \p Container.
  /// With \p Arrays, also the handles of structs in the container's
  /// arrays (`s->clients[i].mw`).
  std::vector<SlotKey> handleSlotsWithin(const FunctionDecl *Fn,
                                         const Location &Container,
                                         bool Arrays = false) {
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
    // The struct's own handle fields, produced here or not: a request
    // whose MR comes from another unit goes with it too.
    Location Resolved = Container;
    QualType T = Container.Root ? Container.Root->getType() : QualType();
    for (const Location::Step &S : Container.Steps) {
      if (T.isNull() || S.Field) {
        T = S.Field ? S.Field->getType() : QualType();
        continue;
      }
      // `desc[i]` of `struct desc **desc`: one of the pointers.
      if (const auto *PT = T->getAs<PointerType>())
        T = PT->getPointeeType();
      else if (const auto *AT = T->getAsArrayTypeUnsafe())
        T = AT->getElementType();
      else
        T = QualType();
    }
    if (!T.isNull() && T->isPointerType())
      T = T->getPointeeType();
    // A struct embedded in an array (`&d->reqs[i]`) is the object itself.
    else if (Container.Steps.empty() || Container.Steps.back().Field)
      T = QualType();
    if (!T.isNull())
      if (const RecordDecl *RD = T->getAsRecordDecl())
        handleFields(Fn, Resolved, RD, 0, Found, Arrays);
    return Found;
  }

  /// Is \p Field the handle a work request names (`reg_wr.mr`,
  /// `wr.bind_mw.mw`)? It refers to a handle; it does not hold one.
  bool namesInWorkRequest(const Location &Field) const {
    std::optional<FieldStore> Role = A.classify(Field);
    return Role && (Role->Role == FieldRole::RegMr || Role->Role == FieldRole::BindMw ||
                    Role->Role == FieldRole::BindMr);
  }

  /// The handle fields of \p RD, inside embedded structs and unions too
  /// (`ibmr->u.frmr.mr`), as slots of the object \p Object names.
  void handleFields(const FunctionDecl *Fn, const Location &Object,
                    const RecordDecl *RD, unsigned Depth,
                    std::vector<SlotKey> &Found, bool Arrays = false) {
    if (!(RD = RD ? RD->getDefinition() : nullptr) || Depth > 3)
      return;
    for (const FieldDecl *F : RD->fields()) {
      Location Field = Object;
      Field.Steps.push_back({F});
      if (isHandleType(A, F->getType())) {
        if (namesInWorkRequest(Field))
          continue; // `reg_wr.mr`: names a handle kept elsewhere
        SlotKey Slot = SlotKey::of(Field, Fn);
        if (Slot.isShared() && !llvm::is_contained(Found, Slot))
          Found.push_back(Slot);
      } else if (const RecordDecl *Inner = F->getType()->getAsRecordDecl()) {
        handleFields(Fn, Field, Inner, Depth + 1, Found, Arrays);
      } else if (const auto *AT = F->getType()->getAsArrayTypeUnsafe();
                 AT && Arrays) {
        if (const RecordDecl *Elem = AT->getElementType()->getAsRecordDecl()) {
          Field.Steps.push_back({nullptr});
          handleFields(Fn, Field, Elem, Depth + 1, Found, Arrays);
        }
      }
    }
  }

  /// `desc = ulp_pool_get(pool)` inside a loop: the local now names
  /// another descriptor, whose handles are in a state this path does not
  /// know (the helper's summary, applied next, may tell).
  void repointed(const FunctionDecl *Fn, const CallExpr *CE, const FunctionDecl *Callee) {
    std::optional<Location> Result = A.resultOf(CE);
    if (!Result || !Result->Steps.empty() || !isa_and_nonnull<VarDecl>(Result->Root) ||
        isa<ParmVarDecl>(Result->Root) || isHandleType(A, Callee->getReturnType()))
      return;
    for (const SlotKey &Slot : handleSlotsWithin(Fn, *Result))
      add(event(LifeEventKind::Repoint, Slot, Fn, CE, CE->getBeginLoc(), Callee->getName()));
  }

  /// A call to a helper of this unit carries its effects (the solver
  /// applies its summary); anything else that receives a handle may keep or
  /// release it.
  void helperOrUnknown(const FunctionDecl *Fn, const CallExpr *CE) {
    const FunctionDecl *Callee = CE->getDirectCallee();
    const FunctionDecl *Def = Callee ? Callee->getDefinition() : nullptr;
    bool Helper = Def && llvm::is_contained(A.functions(), Def);
    if (Helper) {
      repointed(Fn, CE, Def);
      LifeEvent E = event(LifeEventKind::Call, SlotKey(), Fn, CE,
                          CE->getBeginLoc(), Def->getName());
      E.Callee = Def;
      for (unsigned I = 0; I < CE->getNumArgs(); ++I)
        if (onlyWalkedField(CE->getArg(I)))
          E.WalkedListArgs.push_back(I);
      for (unsigned I = 0; I < CE->getNumArgs() && I < Def->getNumParams(); ++I)
        if (Def->getParamDecl(I)->getType()->isIntegerType())
          if (auto Slot = Keys.keySlot(Fn, CE->getArg(I))) {
            // `mr->rkey` is as stable as the handle's place; a key kept
            // next to its window (`q->reqs[i].rkey`) as its own.
            std::optional<Location> Owner = keyOwner(A, CE->getArg(I));
            if (!Owner)
              Owner = locationOf(CE->getArg(I));
            E.KeyArgs.push_back({I, *Slot, !Owner || stable(Fn, *Owner)});
          }
      add(E);
      if (auto Result = A.resultOf(CE); Result && isHandleType(A, Def->getReturnType()))
        HelperResults.push_back({Fn, CE, Def, *Result});
      HelperCalls.push_back({Fn, CE, Def});
      return;
    }
    for (const Expr *Arg : CE->arguments())
      if (auto Slot = handleSlot(Fn, Arg))
        add(event(LifeEventKind::Escape, *Slot, Fn, CE, CE->getBeginLoc(),
                  Callee ? Callee->getName() : StringRef("call")));
    if (!Callee)
      releaseCallback(Fn, CE);
  }

  /// `x->page_release(r->pages[i])`, `pool->ops->free(pool, obj)`: a call
  /// through a function-pointer field named for a release hands back the
  /// last pointer it is given (the object; a leading one is the context).
  void releaseCallback(const FunctionDecl *Fn, const CallExpr *CE) {
    const auto *Field = dyn_cast<MemberExpr>(CE->getCallee()->IgnoreParenImpCasts());
    if (!Field || !A.rules().isReleaseCallback(Field->getMemberDecl()->getName()))
      return;
    for (unsigned I = CE->getNumArgs(); I-- > 0;)
      if (const Expr *Arg = CE->getArg(I);
          Arg->IgnoreParenImpCasts()->getType()->isPointerType()) {
        if (!handleSlot(Fn, Arg))
          released(Fn, CE, Arg, Field->getMemberDecl()->getName());
        return;
      }
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
      // Naming the MR or window in a work request (REG_MR, a bind) uses
      // it; the post decides what happens to it.
      std::optional<FieldStore> Into = A.classifyMember(Lhs);
      bool WorkRequest = Into && (Into->Role == FieldRole::RegMr ||
                                  Into->Role == FieldRole::BindMw ||
                                  Into->Role == FieldRole::BindMr);
      if (!Alias && !WorkRequest && (!Target || slotOf(A, *Target, Fn) != *From))
        add(event(LifeEventKind::Escape, *From, Fn, BO, BO->getBeginLoc(),
                  "store"));
    }
    if (Target) {
      pushed(Fn, BO, *Target, Rhs);
      flagCleared(Fn, BO, *Target, Rhs);
    }
    pushedMemory(Fn, BO, Lhs, Rhs);
    if (!isHandleType(A, Lhs->getType()) || !Target || namesInWorkRequest(*Target))
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

  /// Does a REG_MR work request grant remote rights (its access field)?
  bool grantsRemote(const std::vector<const FieldStore *> &Access) {
    uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
                      A.flagBit(Flag::RemoteAtomic);
    for (const FieldStore *Acc : Access)
      for (const FlagAlt &Alt :
           A.values(Acc->Fn)
               .flagsAfter(A.flow(Acc->Fn).resolve(Acc->Target), Acc->At)
               .Alts)
        if (Alt.Known & Remote)
          return true;
    return false;
  }

public:
  /// A REG_MR with remote rights built here but posted by code of another
  /// unit (the caller of xprtrdma's frwr_map posts it): the key is exposed
  /// where the registration is built.
  void exposeUnpostedRegistrations() {
    for (const FieldStore &Mr : A.stores()) {
      if (Mr.Role != FieldRole::RegMr || !Mr.Value)
        continue;
      bool Posted = llvm::any_of(W.posts(), [&](const PostSite &P) {
        return llvm::any_of(P.Chain, [&](const WrSlot &S) {
          return llvm::any_of(S.Names, [&](const auto &N) {
            return A.sameStorage(N.first, N.second, Mr.Object, Mr.Fn);
          });
        });
      });
      if (Posted)
        continue;
      std::vector<const FieldStore *> Access;
      for (const FieldStore &Acc : A.stores())
        if (Acc.Role == FieldRole::Access &&
            A.sameStorage(Acc.Object, Acc.Fn, Mr.Object, Mr.Fn))
          Access.push_back(&Acc);
      if (!grantsRemote(Access))
        continue;
      if (auto Slot = handleSlot(Mr.Fn, Mr.Value)) {
        LifeEvent E = event(LifeEventKind::Expose, *Slot, Mr.Fn, Mr.At,
                            Mr.At->getBeginLoc(),
                            A.rules().opcodeEnumerator(A.domain(), Opcode::RegMr));
        // Handed to code of another unit that posts it: when that call
        // fails, nothing was registered.
        E.Post = handOff(Mr);
        add(E);
      }
    }
  }

  /// The first call after \p Mr's store that is given the work request
  /// (`ext_post_write_imm(qp, &rwr.wr)`), or null.
  const CallExpr *handOff(const FieldStore &Mr) {
    struct Finder : RecursiveASTVisitor<Finder> {
      const TuAnalysis &A;
      const FieldStore &Mr;
      const CallExpr *Found = nullptr;
      Finder(const TuAnalysis &A, const FieldStore &Mr) : A(A), Mr(Mr) {}
      bool VisitCallExpr(CallExpr *CE) {
        if (Found || A.modelOf(CE) ||
            !A.sources().isBeforeInTranslationUnit(Mr.At->getEndLoc(), CE->getBeginLoc()))
          return true;
        for (const Expr *Arg : CE->arguments())
          if (auto L = locationOf(Arg)) {
            if (names(*L))
              Found = CE;
            // `wr = &rwr.wr` on one branch, NULL on the other.
            else if (L->Steps.empty())
              for (const Def *D : A.flow(Mr.Fn).reaching(*L, CE))
                if (D && D->K == Def::Assign)
                  if (auto V = locationOf(D->Value); V && names(*V))
                    Found = CE;
          }
        return true;
      }
      bool names(const Location &L) {
        return A.withinStorage(L, Mr.Fn, Mr.Object, Mr.Fn) ||
               A.withinStorage(Mr.Object, Mr.Fn, L, Mr.Fn);
      }
    } F(A, Mr);
    F.TraverseStmt(Mr.Fn->getBody());
    return F.Found;
  }

private:
  /// The MR a LOCAL_INV's key belongs to, or the parameter it came in
  /// through (its callers tie it to their handle).
  std::optional<SlotKey> invalidatedKey(const FunctionDecl *Fn, const Expr *Key) {
    if (auto Slot = Keys.keySlot(Fn, Key))
      return Slot;
    if (auto Slot = Keys.keyParameter(Fn, Key))
      return Slot;
    return Keys.soleHandleNextTo(Fn, Key);
  }

  /// The handles a post registers for remote access or invalidates: the
  /// chains built in the posting function; a helper's callers' chains are
  /// theirs, at their call.
  void posted(const FunctionDecl *Fn, const PostSite &P) {
    for (const PostSite::Alternative &Alt : P.Alternatives)
      if (!Alt.Via)
        posted(Fn, P.Call->Call, Alt.Chain);
  }

  void posted(const FunctionDecl *Fn, const Stmt *S, llvm::ArrayRef<WrSlot> Chain) {
    SourceLocation Loc = S->getBeginLoc();
    for (const WrSlot &W : Chain) {
      if (W.mayBe(Opcode::RegMr)) {
        bool Grants = grantsRemote(slotStores(A, W, FieldRole::Access));
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
          if (auto Slot = invalidatedKey(Key->Fn, Key->Value)) {
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
  /// Helper calls that hand a chain built in the caller to a post.
  llvm::DenseMap<const CallExpr *, std::vector<const PostSite::Alternative *>>
      HandedToPost;
  /// Memory behind a handle.
  struct Buffer {
    Location Memory;
    const FunctionDecl *Fn; // where Memory is named
    SlotKey Slot;           // the handle
    const Stmt *Binding;    // the registration that put it there
    bool Window;            // the handle is a window bound over it
  };
  std::vector<Buffer> Buffers;
  std::vector<LifeEvent> KeyLeaves;
  std::map<const FieldDecl *, bool> PendingLists;
  std::map<const FieldDecl *, bool> WalkedLists;
  std::map<const FieldDecl *, bool> InUseFlags; // see inUseFlag()
  std::vector<std::tuple<const FunctionDecl *, const CallExpr *, Location, std::string>>
      Allocations;
  std::vector<std::tuple<const FunctionDecl *, const CallExpr *, const FunctionDecl *>>
      HelperCalls;
  /// Helpers that release the memory a parameter points at: (index, unmap).
  std::map<const FunctionDecl *, std::set<std::pair<unsigned, bool>>> ParamReleased;
  size_t ParamReleases = 0; // entries in ParamReleased, to see it grow
  std::vector<std::tuple<const FunctionDecl *, const CallExpr *, const FunctionDecl *,
                         Location>>
      HelperResults;
  CompletionFields Fields;
  KeyTracker Keys;
};

void extractEvents(Lifecycle &L) {
  LifecycleBuilder B(L);
  for (const FunctionDecl *Fn : L.A.functions())
    B.findBuffers(Fn);
  for (const FunctionDecl *Fn : L.A.functions())
    B.extract(Fn);
  B.releaseThroughHelpers();
  B.produceFromHelpers();
  B.produceThroughLocals();
  B.freshAllocations();
  B.exposeUnpostedRegistrations();
  B.exposeLeavingKeys();
  B.destroyPools();
}

} // namespace ulplint
