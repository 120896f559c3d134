//===- SendQueueUndersizedCheck.h - rdma-send-queue-undersized --*- C++ -*-===//

#ifndef ULPLINT_CHECKS_SENDQUEUEUNDERSIZEDCHECK_H
#define ULPLINT_CHECKS_SENDQUEUEUNDERSIZEDCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// A send queue smaller than the work requests its requests post.
/// Docs: docs/checks/rdma-send-queue-undersized.md
class SendQueueUndersizedCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void run(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }
};

} // namespace ulplint

#endif
