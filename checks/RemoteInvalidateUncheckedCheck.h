//===- RemoteInvalidateUncheckedCheck.h - rdma-remote-invalidate-unchecked ---*- C++ -*-===//

#ifndef ULPLINT_CHECKS_REMOTEINVALIDATEUNCHECKEDCHECK_H
#define ULPLINT_CHECKS_REMOTEINVALIDATEUNCHECKEDCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// Remote invalidation accepted without checking which rkey was invalidated. Docs: docs/checks/rdma-remote-invalidate-unchecked.md
class RemoteInvalidateUncheckedCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;

};

} // namespace ulplint

#endif
