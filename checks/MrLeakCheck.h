//===- MrLeakCheck.h - rdma-mr-leak ---*- C++ -*-===//

#ifndef ULPLINT_CHECKS_MRLEAKCHECK_H
#define ULPLINT_CHECKS_MRLEAKCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// MRs and windows not released on some path, or overwritten while held. Docs: docs/checks/rdma-mr-leak.md
class MrLeakCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;

private:
  void reportNeverReleased(const TuAnalysis &A, const class Lifecycle &L);
};

} // namespace ulplint

#endif
