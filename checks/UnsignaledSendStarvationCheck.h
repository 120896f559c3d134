//===- UnsignaledSendStarvationCheck.h - rdma-unsignaled-send-starvation -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_UNSIGNALEDSENDSTARVATIONCHECK_H
#define ULPLINT_CHECKS_UNSIGNALEDSENDSTARVATIONCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

class WorkRequests;
struct WrSlot;

/// Send queues whose entries are never reclaimed: nothing is ever signaled,
/// or signaling waits on a counter nobody advances.
/// Docs: docs/checks/rdma-unsignaled-send-starvation.md
class UnsignaledSendStarvationCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void run(const TuAnalysis &A) override;

private:
  void checkNeverSignaled(const TuAnalysis &A, const WorkRequests &W);
  void checkStuckCounters(const TuAnalysis &A, const WorkRequests &W);
};

} // namespace ulplint

#endif
