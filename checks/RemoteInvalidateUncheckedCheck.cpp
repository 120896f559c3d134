//===- RemoteInvalidateUncheckedCheck.cpp - rdma-remote-invalidate-unchecked ===//

#include "RemoteInvalidateUncheckedCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

void RemoteInvalidateUncheckedCheck::checkUnit(const TuAnalysis &A) {
  StringRef FlagText = A.flagName(Flag::WithInvalidate);
  const StructModel *Wc = A.rules().structure(A.domain(), StructRole::Wc);
  std::string Field =
      "wc->" + (Wc ? Wc->pathOf(FieldRole::InvalidatedRkey) : StringRef()).str();
  const Lifecycle &L = Lifecycle::of(A);
  std::string Message = "completion with " + FlagText.str() +
                        " is accepted without comparing the invalidated rkey (" +
                        Field +
                        ") with the request's; a peer that invalidates another "
                        "key leaves this request's memory open to it";
  for (const Lifecycle::RemoteInvalidation &R : L.remoteInvalidations()) {
    if (R.Checked)
      continue;
    SourceLocation Loc = R.If->getCond()->getBeginLoc();
    // Handed to a function of another unit: that unit may compare it.
    if (!R.External.empty())
      reportUnless(A, Loc, Message,
                   factKey(FactKind::ComparesInvalidatedKey, R.External));
    else
      report(A, Loc, Message);
  }
  // Compared, but the request is completed on the branch where the key was
  // another one (logged, recovery queued, and the pages handed back anyway).
  std::set<const Stmt *> Reported;
  for (const LifeIncident &I : L.incidents()) {
    if (I.K != LifeIncident::ReleaseAfterMismatch || !I.Mismatch ||
        !Reported.insert(I.Mismatch).second)
      continue;
    const Expr *Cond = nullptr;
    if (const auto *If = dyn_cast<IfStmt>(I.Mismatch))
      Cond = If->getCond();
    report(A, Cond ? Cond->getBeginLoc() : I.Mismatch->getBeginLoc(),
           "the invalidated rkey (" + Field +
               ") is found to be another key, but the request is still "
               "completed: its memory is released with its own rkey valid");
    note(A, I.At->Loc,
         "'" + I.At->What + "' releases the memory region here");
  }
}

} // namespace ulplint
