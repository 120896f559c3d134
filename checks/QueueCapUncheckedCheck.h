//===- QueueCapUncheckedCheck.h - rdma-queue-cap-unchecked ------*- C++ -*-===//

#ifndef ULPLINT_CHECKS_QUEUECAPUNCHECKEDCHECK_H
#define ULPLINT_CHECKS_QUEUECAPUNCHECKEDCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// Constant QP capacities beyond what every device supports, never compared
/// with the device's limits. Docs: docs/checks/rdma-queue-cap-unchecked.md
class QueueCapUncheckedCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
};

} // namespace ulplint

#endif
