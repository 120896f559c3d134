//===- UnmapBeforeInvalidateCheck.h - rdma-unmap-before-invalidate ---*- C++ -*-===//

#ifndef ULPLINT_CHECKS_UNMAPBEFOREINVALIDATECHECK_H
#define ULPLINT_CHECKS_UNMAPBEFOREINVALIDATECHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// Memory released before its LOCAL_INV completed. Docs: docs/checks/rdma-unmap-before-invalidate.md
class UnmapBeforeInvalidateCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;

};

} // namespace ulplint

#endif
