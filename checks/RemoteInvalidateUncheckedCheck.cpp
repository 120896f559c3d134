//===- RemoteInvalidateUncheckedCheck.cpp - rdma-remote-invalidate-unchecked ===//

#include "RemoteInvalidateUncheckedCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

void RemoteInvalidateUncheckedCheck::run(const TuAnalysis &A) {
  StringRef FlagText = A.flagName(Flag::WithInvalidate);
  const StructModel *Wc = A.rules().structure(A.domain(), StructRole::Wc);
  std::string Field =
      "wc->" + (Wc ? Wc->pathOf(FieldRole::InvalidatedRkey) : StringRef()).str();
  for (const Lifecycle::RemoteInvalidation &R :
       Lifecycle::of(A).remoteInvalidations()) {
    if (R.Checked)
      continue;
    report(A, R.If->getCond()->getBeginLoc(),
           "completion with " + FlagText.str() +
               " is accepted without comparing the invalidated rkey (" +
               Field +
               ") with the request's; a peer that invalidates another key "
               "leaves this request's memory open to it");
  }
}

} // namespace ulplint
