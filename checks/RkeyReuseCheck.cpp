//===- RkeyReuseCheck.cpp - rdma-rkey-reuse -------------------------------===//

#include "RkeyReuseCheck.h"
#include "engine/Lifecycle.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/Lex/Lexer.h"

using namespace clang;

namespace ulplint {

/// Is \p E (through locals) the result of ibv_inc_rkey()/ib_inc_rkey()?
static bool isIncrementedKey(const TuAnalysis &A, const FunctionDecl *Fn,
                             const Expr *E, unsigned Depth = 0) {
  E = stripExpr(E);
  if (!E || Depth > 4)
    return false;
  if (const auto *CE = dyn_cast<CallExpr>(E)) {
    const FunctionModel *M = A.modelOf(CE);
    return M && M->E == Effect::RkeyIncrement;
  }
  if (auto L = locationOf(E))
    for (const Def *D : A.flow(Fn).reaching(A.flow(Fn).resolve(*L), E))
      if (!D || D->K != Def::Assign || !isIncrementedKey(A, Fn, D->Value, Depth + 1))
        return false;
  return locationOf(E).has_value();
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

void RkeyReuseCheck::run(const TuAnalysis &A) {
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
    if (L.has(Slot, LifeEventKind::Rotate) || !Done.insert(Slot).second)
      continue;
    const LifeEvent *Produced = L.first(Slot, LifeEventKind::Produce);
    if (Produced && !Produced->Reusable)
      continue; // a fresh registration each time
    // Registered again only if the MR comes back: from a pool, or after an
    // invalidation. An MR registered once for its lifetime keeps its key.
    bool Reused = (Produced && Produced->By == Effect::MrPoolGet) ||
                  L.has(Slot, LifeEventKind::InvalidatePost) ||
                  L.has(Slot, LifeEventKind::InvalidateRemote) ||
                  L.has(Slot, LifeEventKind::Release);
    if (!Reused)
      continue;
    {
      std::string Rotation =
          StringRef(fixText(A, FixTemplate::RotateKey, "mr", "mr")).rtrim(';').str();
      DiagnosticBuilder D = reportUnless(
          A, S.At->getBeginLoc(),
          A.rules().opcodeEnumerator(A.domain(), Opcode::RegMr).str() +
              " re-registers an MR without rotating its key (" + Rotation +
              "); a peer that kept the old rkey reaches the new buffer",
          Lifecycle::fact(FactKind::Rotates, Slot));
      if (auto Fix = rotationFix(A, S.At, S.Value))
        D << *Fix;
    }
    if (Produced)
      note(A, Produced->Loc, "MR taken from '" + Produced->What + "' here");
  }
  // Type-2 windows: the bind names the new rkey.
  auto CheckBindKey = [&](const FunctionDecl *Fn, const Expr *Key,
                          const Expr *Mw) {
    if (!Key || isIncrementedKey(A, Fn, Key))
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
      CheckBindKey(C.Caller, C.arg(ArgRole::Rkey), C.arg(ArgRole::Mw));
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::BindRkey || !S.Value)
      continue;
    const FieldStore *Mw = nullptr;
    for (const FieldStore &O : A.stores())
      if (O.Role == FieldRole::BindMw && O.Fn == S.Fn &&
          A.sameStorage(O.Object, O.Fn, S.Object, S.Fn))
        Mw = &O;
    if (Mw && Mw->Value)
      CheckBindKey(S.Fn, S.Value, Mw->Value);
  }
}

} // namespace ulplint
