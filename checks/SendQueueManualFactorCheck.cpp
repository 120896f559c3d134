//===- SendQueueManualFactorCheck.cpp - rdma-send-queue-manual-factor -----===//

#include "SendQueueManualFactorCheck.h"
#include "engine/Program.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/Lex/Lexer.h"

using namespace clang;

namespace ulplint {

/// The depth and factor of `factor * depth`: the depth is the struct field
/// or global, the factor the ULP's own number.
static bool splitFactor(const Linear &V, std::string &Depth,
                        std::string &Factor) {
  if (V.UsesCoreSizing || V.FromHelperFactor)
    return false;
  // `3 * conn->cmds_max + misc` with misc = ISX_MAX_TX_MISC_PDUS + 1: named
  // constants added once are slack, not the factored depth.
  const LinearTerm *Main = nullptr;
  for (const LinearTerm &T : V.Terms) {
    if (V.Terms.size() > 1 && T.Value && T.Coef == 1 && T.Factors.empty())
      continue;
    if (Main)
      return false;
    Main = &T;
  }
  if (!Main)
    return false;
  const LinearTerm &T = *Main;
  if (T.Factors.empty()) {
    if (T.Coef < 2 || !T.E)
      return false;
    Depth = T.Symbol;
    Factor = std::to_string(T.Coef);
    return true;
  }
  auto IsField = [](StringRef S) {
    return S.contains("->") || S.contains('.');
  };
  if (IsField(T.Factors[1]) && !IsField(T.Factors[0])) {
    Factor = T.Factors[0];
    Depth = T.Factors[1];
  } else if (IsField(T.Factors[0]) && !IsField(T.Factors[1])) {
    Factor = T.Factors[1];
    Depth = T.Factors[0];
  } else {
    return false;
  }
  return true;
}

/// `attr.cap.max_send_wr = depth + b;` and `attr.cap.max_rdma_ctxs = depth;`
static std::vector<FixItHint> rdmaRwFix(const TuAnalysis &A,
                                        const FieldStore &S,
                                        const std::string &Depth,
                                        int64_t Const) {
  const auto *BO = dyn_cast<BinaryOperator>(S.At);
  const ASTContext &Ctx = A.context();
  if (!BO || BO->getOpcode() != BO_Assign)
    return {};
  std::string Lhs = sourceText(Ctx, BO->getLHS());
  CharSourceRange Rhs = userRange(Ctx, BO->getRHS());
  // `attr.cap.max_send_wr` -> `attr.cap.max_rdma_ctxs`: the two fields are
  // siblings in the model (cap.max_send_wr, cap.max_rdma_ctxs).
  auto LastField = [&](FieldRole R) {
    StringRef Path = S.Struct->pathOf(R);
    return Path.substr(Path.rfind('.') + 1);
  };
  StringRef Suffix = LastField(FieldRole::MaxSendWr);
  StringRef CtxsField = LastField(FieldRole::MaxRdmaCtxs);
  if (Rhs.isInvalid() || Suffix.empty() || CtxsField.empty() ||
      !StringRef(Lhs).ends_with(Suffix))
    return {};
  std::string Ctxs = Lhs.substr(0, Lhs.size() - Suffix.size()) + CtxsField.str();
  std::string NewRhs = Depth + (Const ? " + " + std::to_string(Const) : "");
  const SourceManager &SM = Ctx.getSourceManager();
  SourceLocation AfterSemi = Lexer::findLocationAfterToken(
      SM.getFileLoc(BO->getEndLoc()), tok::semi, SM, Ctx.getLangOpts(), false);
  if (AfterSemi.isInvalid())
    return {};
  // Indent like the statement being replaced.
  StringRef Line = Lexer::getIndentationForLine(SM.getFileLoc(BO->getBeginLoc()), SM);
  return {FixItHint::CreateReplacement(Rhs, NewRhs),
          FixItHint::CreateInsertion(AfterSemi, "\n" + Line.str() + Ctxs +
                                                    " = " + Depth + ";")};
}

void SendQueueManualFactorCheck::checkUnit(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  // The registrations may be posted by another file of the ULP: then only
  // ulplint, which sees the whole program, can tell.
  bool Here = W.postsRegistrations();
  llvm::DenseSet<const FunctionDecl *> Reported;
  for (const FieldStore &S : A.stores()) {
    if (S.Role != FieldRole::MaxSendWr || S.Struct->Role != StructRole::QpInitAttr ||
        Reported.count(S.Fn))
      continue;
    // rdma_rw users size their contexts; their max_send_wr is their own.
    bool UsesRw = llvm::any_of(A.stores(), [&](const FieldStore &O) {
      return O.Role == FieldRole::MaxRdmaCtxs &&
             A.sameStorage(O.Object, O.Fn, S.Object, S.Fn);
    });
    std::optional<Linear> V = linearAfter(A, S.Fn, S.Target, S.At);
    std::string Depth, Factor;
    if (UsesRw || !V || !splitFactor(*V, Depth, Factor))
      continue;
    Reported.insert(S.Fn);
    bool Kernel = A.domain() == Domain::Kernel;
    const auto &Migration = A.rules().domain(A.domain()).Migration;
    auto Advice = [&](MigrationKey K) {
      auto It = Migration.find(K);
      return It == Migration.end() ? std::string() : It->second;
    };
    std::string Message =
        "max_send_wr multiplies the queue depth '" + Depth +
        "' by a hand-made factor '" + Factor +
        "' for registration and invalidation work requests; " +
        Advice(MigrationKey::QueueFactor);
    if (Here)
      report(A, S.Spelling->getBeginLoc(), Message);
    else if (!reportIfProgram(A, S.Spelling->getBeginLoc(), Message,
                              {factKey(FactKind::PostsRegistration, Program::of(A).key())}, {}))
      continue;
    DiagnosticBuilder N = note(A, S.Spelling->getBeginLoc(),
                               Advice(MigrationKey::QueueFactorNote));
    // The fix rewrites the sum from the depth and the constant: only when
    // no named constant would be lost.
    if (Kernel && V->Terms.size() == 1 && V->Terms.front().Factors.empty())
      for (const FixItHint &Fix : rdmaRwFix(A, S, Depth, V->Const))
        N << Fix;
  }
}

} // namespace ulplint
