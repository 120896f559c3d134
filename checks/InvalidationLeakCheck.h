//===- InvalidationLeakCheck.h - rdma-invalidation-leak ---*- C++ -*-===//

#ifndef ULPLINT_CHECKS_INVALIDATIONLEAKCHECK_H
#define ULPLINT_CHECKS_INVALIDATIONLEAKCHECK_H

#include "engine/RdmaCheck.h"
#include <set>

namespace ulplint {

/// Some path releases or recycles a memory region whose rkey is still valid for the peer. Docs: docs/checks/rdma-invalidation-leak.md
class InvalidationLeakCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  void reportAcrossUnits(const TuAnalysis &A, const class Lifecycle &L,
                         const std::set<const void *> &Reported);
};

} // namespace ulplint

#endif
