//===- QueueCapUncheckedCheck.cpp - rdma-queue-cap-unchecked --------------===//

#include "QueueCapUncheckedCheck.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include <map>
#include <set>

using namespace clang;

namespace ulplint {

namespace {
/// The device limits each function reads (role names such as limit_wr).
class LimitReads : public RecursiveASTVisitor<LimitReads> {
public:
  explicit LimitReads(const TuAnalysis &A) : A(A) {}
  std::map<const FunctionDecl *, std::set<FieldRole>> Roles;
  const FunctionDecl *Current = nullptr;
  bool VisitMemberExpr(MemberExpr *ME) {
    if (auto FS = A.classifyMember(ME))
      if (isDeviceLimit(FS->Role))
        Roles[Current].insert(FS->Role);
    return true;
  }

private:
  const TuAnalysis &A;
};

struct CapRule {
  FieldRole Role;
  const char *Limit;      // what to compare with, for the message
  std::optional<FieldRole> LimitRole; // none: read back the cap
};
const CapRule CapRules[] = {
    {FieldRole::MaxSendWr, "the device's max_qp_wr", FieldRole::LimitWr},
    {FieldRole::MaxRecvWr, "the device's max_qp_wr", FieldRole::LimitWr},
    {FieldRole::MaxSendSge, "the device's max_sge", FieldRole::LimitSge},
    {FieldRole::MaxRecvSge, "the device's max_sge", FieldRole::LimitSge},
    {FieldRole::MaxInlineData, "the inline size the device grants", std::nullopt},
};

/// Functions on the path to a creation: where it is, where the capacity is
/// stored, and their direct callers.
std::set<const FunctionDecl *> pathTo(const TuAnalysis &A, const QpCreation &Q,
                                      const FieldStore &Store) {
  std::set<const FunctionDecl *> Fns = {Q.Fn, Store.Fn};
  for (const FunctionDecl *F : {Q.Fn, Store.Fn})
    for (const auto &Caller : A.callersOf(F))
      Fns.insert(Caller.second);
  return Fns;
}

/// The granted capacity is read back after creation (the verbs update cap).
bool readsBack(const TuAnalysis &A, const FieldStore &Store) {
  for (const TuAnalysis::Use &U : A.usesOf(Store.Target, Store.Fn)) {
    const auto *BO = dyn_cast_or_null<BinaryOperator>(
        A.flow(U.Fn).parents().getParent(U.E));
    if (!BO || !BO->isAssignmentOp() || BO->getLHS() != U.E)
      return true;
  }
  return false;
}
} // namespace

void QueueCapUncheckedCheck::checkUnit(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  if (W.creations().empty())
    return;
  LimitReads Limits(A);
  for (const FunctionDecl *Fn : A.functions()) {
    Limits.Current = Fn;
    Limits.TraverseStmt(Fn->getBody());
  }
  bool Kernel = A.domain() == Domain::Kernel;
  const auto &Portable = A.rules().domain(A.domain()).PortableCaps;
  for (const QpCreation &Q : W.creations()) {
    if (Q.CoreManaged)
      continue;
    for (const CapRule &Rule : CapRules) {
      auto Store = Q.Caps.find(Rule.Role);
      auto Floor = Portable.find(Rule.Role);
      if (Store == Q.Caps.end() || Floor == Portable.end())
        continue;
      std::optional<Linear> V = capValue(A, Q, Rule.Role);
      if (!V || !V->value() || *V->value() <= Floor->second)
        continue;
      // rdma_rw_init_qp() clamps max_send_wr when contexts are declared.
      if (Rule.Role == FieldRole::MaxSendWr && Q.Caps.count(FieldRole::MaxRdmaCtxs))
        continue;
      const FieldStore &S = *Store->second;
      bool Checked = false;
      if (Rule.LimitRole) {
        for (const FunctionDecl *F : pathTo(A, Q, S))
          Checked |= Limits.Roles[F].count(*Rule.LimitRole) ||
                     Limits.Roles[F].count(FieldRole::LimitRecvSge);
      } else {
        Checked = readsBack(A, S);
      }
      if (Checked)
        continue;
      report(A, S.Spelling->getBeginLoc(),
             fieldRoleName(Rule.Role).str() + " = " + std::to_string(*V->value()) +
                 " is requested without comparing it with " + Rule.Limit +
                 "; QP creation fails on devices with smaller limits (" +
                 std::to_string(Floor->second) +
                 " is the most every RDMA device supports); " +
                 (Kernel ? "clamp it to ib_device.attrs"
                         : "clamp it to what ibv_query_device() reports"));
    }
  }
}

} // namespace ulplint
