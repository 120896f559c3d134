//===- RemoteInvalidateUncheckedCheck.cpp - rdma-remote-invalidate-unchecked ===//

#include "RemoteInvalidateUncheckedCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

void RemoteInvalidateUncheckedCheck::run(const TuAnalysis &A) {
  StringRef FlagText = A.flagName(Flag::WithInvalidate);
  StringRef Field = A.domain() == Domain::Kernel ? "wc->ex.invalidate_rkey"
                                                 : "wc->invalidated_rkey";
  for (const Lifecycle::RemoteInvalidation &R :
       Lifecycle::of(A).remoteInvalidations()) {
    if (R.Checked)
      continue;
    report(A, R.If->getCond()->getBeginLoc(),
           "completion with " + FlagText.str() +
               " is accepted without comparing the invalidated rkey (" +
               Field.str() +
               ") with the request's; a peer that invalidates another key "
               "leaves this request's memory open to it");
  }
}

} // namespace ulplint
