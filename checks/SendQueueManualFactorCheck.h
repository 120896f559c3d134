//===- SendQueueManualFactorCheck.h - rdma-send-queue-manual-factor -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_SENDQUEUEMANUALFACTORCHECK_H
#define ULPLINT_CHECKS_SENDQUEUEMANUALFACTORCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// max_send_wr = factor * depth with a hand-made registration factor.
/// Docs: docs/checks/rdma-send-queue-manual-factor.md
class SendQueueManualFactorCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }
};

} // namespace ulplint

#endif
