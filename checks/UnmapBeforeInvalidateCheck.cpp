//===- UnmapBeforeInvalidateCheck.cpp - rdma-unmap-before-invalidate ------===//

#include "UnmapBeforeInvalidateCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

void UnmapBeforeInvalidateCheck::checkUnit(const TuAnalysis &A) {
  for (const LifeIncident &I : Lifecycle::of(A).incidents()) {
    if (I.K != LifeIncident::ReleaseBeforeInvalidated || !I.Invalidation)
      continue;
    std::string How = I.Invalidation->Signaled ? "a LOCAL_INV that nothing waits for"
                                               : "an unsignaled LOCAL_INV";
    report(A, I.loc(),
           "'" + I.what() + "' runs right after posting " + How +
               "; until the invalidation completes the peer can still access "
               "the memory being released");
    if (I.Anchor)
      note(A, I.At->Loc, I.releasedHere());
    note(A, I.Invalidation->Loc, "LOCAL_INV posted here");
  }
}

} // namespace ulplint
