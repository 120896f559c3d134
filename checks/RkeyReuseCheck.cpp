//===- RkeyReuseCheck.cpp - rdma-rkey-reuse -------------------------------===//

#include "RkeyReuseCheck.h"
#include "engine/Lifecycle.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/Lex/Lexer.h"

using namespace clang;

namespace ulplint {

static bool incrementedAt(const TuAnalysis &A, const FunctionDecl *Fn,
                          const Location &L, const Stmt *At, unsigned Depth,
                          const Stmt *Loop = nullptr);
static bool allocationKey(const TuAnalysis &A, const FunctionDecl *Fn,
                          const Expr *Value, const Stmt *At);
static bool freshWindow(const TuAnalysis &A, const FunctionDecl *Fn,
                        const Expr *Mw, const Stmt *At);

/// Is \p E a key no peer has seen: the result of ibv_inc_rkey() or
/// ib_inc_rkey(), directly, through locals and fields, from a helper whose
/// every return is one, or set so by every caller before the call
/// (`r->rkey = ibv_inc_rkey(r->rkey); build_bind(q, r);`)?
static bool isIncrementedKey(const TuAnalysis &A, const FunctionDecl *Fn,
                             const Expr *E, unsigned Depth = 0) {
  E = stripExpr(E);
  if (!E || Depth > 6)
    return false;
  if (const auto *CE = dyn_cast<CallExpr>(E)) {
    if (const FunctionModel *M = A.modelOf(CE))
      return M->E == Effect::RkeyIncrement;
    const FunctionDecl *Callee = CE->getDirectCallee();
    Callee = Callee ? Callee->getDefinition() : nullptr;
    if (!Callee || !llvm::is_contained(A.functions(), Callee))
      return false;
    auto Returns = returnValues(Callee);
    return !Returns.empty() && llvm::all_of(Returns, [&](const Expr *R) {
      return isIncrementedKey(A, Callee, R, Depth + 1);
    });
  }
  auto L = locationOf(E);
  return L && incrementedAt(A, Fn, A.flow(Fn).resolve(*L), E, Depth);
}

/// Does the call \p Call in \p Caller pass a new key for \p L, the
/// parameter at \p Index of the callee (or a field reached through it)?
/// A caller that calls in a loop must make the key in that loop: one
/// computed before it is the same key for every iteration
/// (`key = ibv_inc_rkey(..); for (..) bind(x, key);`).
static bool passesNewKey(const TuAnalysis &A, const CallExpr *Call,
                         const FunctionDecl *Caller, unsigned Index,
                         const Location &L, unsigned Depth) {
  if (Index >= Call->getNumArgs())
    return false;
  const Expr *Arg = stripExpr(Call->getArg(Index));
  if (L.Steps.empty() && isa<CallExpr>(Arg))
    return isIncrementedKey(A, Caller, Arg, Depth + 1);
  if (const auto *UO = dyn_cast<UnaryOperator>(Arg); UO && UO->getOpcode() == UO_AddrOf)
    Arg = stripExpr(UO->getSubExpr());
  std::optional<Location> Outer = locationOf(Arg);
  if (!Outer)
    return false;
  Outer->Steps.append(L.Steps.begin(), L.Steps.end());
  const Stmt *Loop = enclosingLoop(A.flow(Caller).parents(), Call);
  return incrementedAt(A, Caller, A.flow(Caller).resolve(*Outer), Call, Depth + 1, Loop);
}

/// \p L (a parameter, or a field reached through one) holds a new key when
/// \p Fn starts: every caller in the unit passes one.
static bool newKeyFromCallers(const TuAnalysis &A, const FunctionDecl *Fn,
                              const Location &L, unsigned Depth) {
  const auto *P = dyn_cast_or_null<ParmVarDecl>(L.Root);
  if (!P)
    return false;
  auto Callers = A.callersOf(Fn);
  return !Callers.empty() && llvm::all_of(Callers, [&](const auto &CC) {
    return CC.second != Fn &&
           passesNewKey(A, CC.first, CC.second, P->getFunctionScopeIndex(), L, Depth);
  });
}

/// Is \p S inside \p Outer?
static bool inside(const ParentMap &PM, const Stmt *S, const Stmt *Outer) {
  for (; S; S = PM.getParent(S))
    if (S == Outer)
      return true;
  return false;
}

/// Every definition of \p L reaching \p At gives it a new key (inside
/// \p Loop, when given).
static bool incrementedAt(const TuAnalysis &A, const FunctionDecl *Fn,
                          const Location &L, const Stmt *At, unsigned Depth,
                          const Stmt *Loop) {
  if (Depth > 6)
    return false;
  auto Defs = A.flow(Fn).reaching(L, At);
  return !Defs.empty() && llvm::all_of(Defs, [&](const Def *D) {
    if (!D)
      return !Loop && newKeyFromCallers(A, Fn, L, Depth);
    if (Loop && !inside(A.flow(Fn).parents(), D->S, Loop))
      return false;
    return D->K == Def::Assign && (isIncrementedKey(A, Fn, D->Value, Depth + 1) ||
                                   allocationKey(A, Fn, D->Value, D->S));
  });
}

/// `rkey = c->mw->rkey` right after `c->mw = ibv_alloc_mw(..)` on every
/// path to it: the key of a window nobody has seen yet is a new key.
static bool allocationKey(const TuAnalysis &A, const FunctionDecl *Fn,
                          const Expr *Value, const Stmt *At) {
  const auto *ME = dyn_cast_or_null<MemberExpr>(stripExpr(Value));
  std::optional<FieldStore> F = ME ? A.classifyMember(ME) : std::nullopt;
  return F && F->Role == FieldRole::Rkey && F->Struct->Role == StructRole::Mw &&
         freshWindow(A, Fn, ME->getBase(), At);
}

/// A window allocated on every path to its bind (`w->mw = ibv_alloc_mw(..)`
/// above it): its first bind may use the allocation key, no peer has it.
static bool freshWindow(const TuAnalysis &A, const FunctionDecl *Fn,
                        const Expr *Mw, const Stmt *At) {
  auto L = locationOf(stripExpr(Mw));
  if (!L)
    return false;
  auto Defs = A.flow(Fn).reaching(A.flow(Fn).resolve(*L), At);
  return !Defs.empty() && llvm::all_of(Defs, [&](const Def *D) {
    const auto *CE = D && D->K == Def::Assign ? dyn_cast<CallExpr>(stripExpr(D->Value)) : nullptr;
    const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
    return M && M->E == Effect::MwAlloc;
  });
}

/// `post_bind(c, ps->mw, ps->mw->rkey)` right after `ps->mw =
/// ibv_alloc_mw(..)`: the allocation key of a window never bound, which no
/// peer has seen.
static bool keyOfFreshWindow(const TuAnalysis &A, const FunctionDecl *Fn,
                             const Expr *Key, const Stmt *At) {
  const auto *ME = dyn_cast_or_null<MemberExpr>(stripExpr(Key));
  bool Window = false;
  return ME && isHandleType(A, ME->getBase()->getType(), &Window) && Window &&
         freshWindow(A, Fn, ME->getBase(), At);
}

/// Is \p E (through locals) the MR's current key, masked or cast but not
/// changed (`key = mr->rkey & 0xff; ib_update_fast_reg_key(mr, key)`)?
/// `++key`, counters and anything else may well be new keys.
static bool isCurrentKey(const TuAnalysis &A, const FunctionDecl *Fn,
                         const Expr *E, unsigned Depth = 0) {
  E = stripExpr(E);
  if (!E || Depth > 4)
    return false;
  if (const auto *BO = dyn_cast<BinaryOperator>(E))
    return (BO->getOpcode() == BO_And || BO->getOpcode() == BO_Or) &&
           (isCurrentKey(A, Fn, BO->getLHS(), Depth + 1) ||
            isCurrentKey(A, Fn, BO->getRHS(), Depth + 1));
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    std::optional<FieldStore> F = A.classifyMember(ME);
    return F && F->Role == FieldRole::Rkey && F->Struct->Role == StructRole::Mr;
  }
  if (!isa<DeclRefExpr>(E))
    return false;
  auto L = locationOf(E);
  if (!L)
    return false;
  auto Defs = A.flow(Fn).reaching(A.flow(Fn).resolve(*L), E);
  return !Defs.empty() && llvm::all_of(Defs, [&](const Def *D) {
    return D && D->K == Def::Assign && isCurrentKey(A, Fn, D->Value, Depth + 1);
  });
}

/// The rules' fix-it template \p T with its one placeholder \p Name.
static std::string fixText(const TuAnalysis &A, FixTemplate T, StringRef Name,
                           const std::string &Value) {
  const auto &Fixits = A.rules().domain(A.domain()).Fixits;
  auto It = Fixits.find(T);
  if (It == Fixits.end())
    return "";
  return expandTemplate(It->second, {{Name, Value}});
}

/// The key rotation (`ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));`)
/// inserted before \p At.
static std::optional<FixItHint> rotationFix(const TuAnalysis &A, const Stmt *At,
                                            const Expr *Mr) {
  const ASTContext &Ctx = A.context();
  const SourceManager &SM = Ctx.getSourceManager();
  std::string Handle = sourceText(Ctx, Mr);
  SourceLocation Begin = At->getBeginLoc();
  std::string Text = fixText(A, FixTemplate::RotateKey, "mr", Handle);
  if (Handle.empty() || Text.empty() || Begin.isMacroID())
    return std::nullopt;
  StringRef Indent = Lexer::getIndentationForLine(Begin, SM);
  return FixItHint::CreateInsertion(Begin, Text + "\n" + Indent.str());
}

/// Does reaching \p At imply having passed \p S (both in \p Fn, \p S
/// first)? Yes unless \p S sits in a branch, loop body or case that does
/// not also hold \p At.
static bool dominates(const TuAnalysis &A, const FunctionDecl *Fn, const Stmt *S,
                      const Stmt *At) {
  const ParentMap &PM = A.flow(Fn).parents();
  for (const Stmt *Child = S, *P = PM.getParent(S); P;
       Child = P, P = PM.getParent(P)) {
    bool Branch = (isa<IfStmt>(P) && cast<IfStmt>(P)->getCond() != Child) ||
                  isa<ForStmt>(P) || isa<WhileStmt>(P) || isa<SwitchCase>(P) ||
                  isa<ConditionalOperator>(P) ||
                  (isa<BinaryOperator>(P) && cast<BinaryOperator>(P)->isLogicalOp());
    if (!Branch)
      continue;
    // `At` must sit in the same child of P (the same branch or loop body).
    for (const Stmt *Q = At; Q; Q = PM.getParent(Q))
      if (Q == Child)
        return true;
    return false;
  }
  return true;
}

/// How a rotation in the registering function fails to give this REG_MR a
/// new key, if it does: it runs on some paths only, after the key was
/// captured, or writes back the key the MR already has.
static std::optional<std::string> rotationGap(const TuAnalysis &A,
                                              const LifeEvent &Rot,
                                              const FieldStore &Reg) {
  const SourceManager &SM = A.sources();
  if (!SM.isBeforeInTranslationUnit(Rot.S->getBeginLoc(), Reg.At->getBeginLoc()))
    return "the key is rotated only after the registration took it";
  if (!dominates(A, Reg.Fn, Rot.S, Reg.At))
    return "the key is rotated on some paths only";
  const auto *CE = dyn_cast<CallExpr>(Rot.S);
  const FunctionModel *M = CE ? A.modelOf(CE) : nullptr;
  std::optional<unsigned> Key = M ? M->arg(ArgRole::Key) : std::nullopt;
  if (Key && *Key < CE->getNumArgs() && isCurrentKey(A, Reg.Fn, CE->getArg(*Key)))
    return "the key written back is not a new one";
  return std::nullopt;
}

/// \p Key, read at \p At in \p Fn, is the value of one of \p Fn's
/// parameters as the call passed it: reports each call in the unit that
/// passes a key that is not new, at its argument (through \p Depth more
/// helpers that pass their own parameter on), with a note at \p Bound, the
/// bind's key. False when \p Fn's callers
/// are not all in view, so the bind itself is judged.
bool RkeyReuseCheck::reportAtCallers(const TuAnalysis &A, const FunctionDecl *Fn,
                                     const Expr *Key, const Stmt *At,
                                     const Expr *Bound, unsigned Depth) {
  std::optional<Location> L = locationOf(stripExpr(Key));
  const auto *P = L && L->Steps.empty() ? dyn_cast_or_null<ParmVarDecl>(L->Root) : nullptr;
  if (!P || Depth > 2)
    return false;
  if (!A.flow(Fn).onlyEntryValue(*L, At))
    return false; // the parameter is assigned before the bind
  auto Callers = A.callersOf(Fn);
  if (Callers.empty() || llvm::any_of(Callers, [&](const auto &CC) {
        return CC.second == Fn || P->getFunctionScopeIndex() >= CC.first->getNumArgs();
      }))
    return false;
  for (const auto &[Call, Caller] : Callers) {
    const Expr *Arg = Call->getArg(P->getFunctionScopeIndex());
    if (passesNewKey(A, Call, Caller, P->getFunctionScopeIndex(), *L, 0) ||
        keyOfFreshWindow(A, Caller, Arg, Call))
      continue;
    if (reportAtCallers(A, Caller, Arg, Call, Bound, Depth + 1))
      continue;
    report(A, Arg->getBeginLoc(),
           "memory window re-bound by '" + Fn->getName().str() +
               "' with the key passed here, which is not a new one; a peer "
               "holding the old rkey keeps access to the re-bound memory");
    note(A, Bound->getBeginLoc(), "the window is bound with that key here");
  }
  return true;
}

void RkeyReuseCheck::checkUnit(const TuAnalysis &A) {
  const Lifecycle &L = Lifecycle::of(A);
  std::set<SlotKey> Done;
  // Fast registrations of an MR that is used again and again.
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::RegMr || !S.Value || !isHandleType(A, stripExpr(S.Value)->getType()))
      continue;
    auto Loc = locationOf(S.Value);
    if (!Loc)
      continue;
    SlotKey Slot = slotOf(A, *Loc, S.Fn);
    // Rotations elsewhere (a map helper, a completion) are trusted, unless
    // this function rotates itself: then its own rotation must give this
    // registration its new key.
    std::vector<const LifeEvent *> Here;
    bool Elsewhere = false;
    for (const LifeEvent &E : L.events()) {
      if (E.K != LifeEventKind::Rotate || E.Slot != Slot)
        continue;
      if (E.Fn == S.Fn && E.S)
        Here.push_back(&E);
      else
        Elsewhere = true;
    }
    std::optional<std::string> Gap;
    if (!Here.empty()) {
      for (const LifeEvent *R : Here) {
        Gap = rotationGap(A, *R, S);
        if (!Gap)
          break;
      }
      if (!Gap)
        continue;
    } else if (Elsewhere) {
      continue;
    }
    if (!Gap && !Done.insert(Slot).second)
      continue;
    const LifeEvent *Produced = L.first(Slot, LifeEventKind::Produce);
    if (Produced && !Produced->Reusable)
      continue; // a fresh registration each time
    // Registered again only if the MR comes back: from a pool, or after an
    // invalidation. An MR registered once for its lifetime keeps its key.
    bool Reused = Gap || (Produced && Produced->By == Effect::MrPoolGet) ||
                  L.has(Slot, LifeEventKind::InvalidatePost) ||
                  L.has(Slot, LifeEventKind::InvalidateRemote) ||
                  L.has(Slot, LifeEventKind::Release);
    if (!Reused)
      continue;
    {
      std::string Rotation =
          StringRef(fixText(A, FixTemplate::RotateKey, "mr", "mr")).rtrim(';').str();
      std::string Op = A.rules().opcodeEnumerator(A.domain(), Opcode::RegMr).str();
      std::string Message =
          Gap ? Op + " may re-register an MR with its previous key: " + *Gap +
                    " (" + Rotation + " must run on every path before the key "
                    "is read); a peer that kept the old rkey reaches the new buffer"
              : Op + " re-registers an MR without rotating its key (" + Rotation +
                    "); a peer that kept the old rkey reaches the new buffer";
      // A rotation this function gets wrong is this unit's finding; none at
      // all may still happen in another unit.
      DiagnosticBuilder D =
          Gap ? report(A, S.At->getBeginLoc(), Message)
              : reportUnless(A, S.At->getBeginLoc(), Message,
                             Lifecycle::fact(FactKind::Rotates, Slot));
      if (!Gap)
        if (auto Fix = rotationFix(A, S.At, S.Value))
          D << *Fix;
    }
    if (Produced)
      note(A, Produced->Loc, "MR taken from '" + Produced->What + "' here");
  }
  // Type-2 windows: the bind names the new rkey.
  auto CheckBindKey = [&](const FunctionDecl *Fn, const Expr *Key,
                          const Expr *Mw, const Stmt *At) {
    if (!Key || isIncrementedKey(A, Fn, Key) || freshWindow(A, Fn, Mw, At))
      return;
    // A helper that binds with the key its caller passes
    // (`post_bind(h, f, key, ..)`): each call decides.
    if (reportAtCallers(A, Fn, Key, At, Key, 0))
      return;
    std::string MwText = sourceText(A.context(), Mw);
    std::string NewKey = fixText(A, FixTemplate::NewWindowKey, "mw", MwText);
    DiagnosticBuilder D = report(
        A, Key->getBeginLoc(),
        "memory window re-bound without a new key; pass " + NewKey +
            " so a peer holding the old rkey loses access");
    CharSourceRange Range = userRange(A.context(), Key);
    if (!MwText.empty() && !NewKey.empty() && Range.isValid())
      D << FixItHint::CreateReplacement(Range, NewKey);
  };
  for (const ApiCall &C : A.calls())
    if (C.Model->E == Effect::WrxOp && C.Model->Op == Opcode::BindMw)
      CheckBindKey(C.Caller, C.arg(ArgRole::Rkey), C.arg(ArgRole::Mw), C.Call);
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::BindRkey || !S.Value)
      continue;
    const FieldStore *Mw = nullptr;
    for (const FieldStore &O : A.stores())
      if (O.Role == FieldRole::BindMw && O.Fn == S.Fn &&
          A.sameStorage(O.Object, O.Fn, S.Object, S.Fn))
        Mw = &O;
    if (Mw && Mw->Value)
      CheckBindKey(S.Fn, S.Value, Mw->Value, Mw->At);
  }
}

} // namespace ulplint
