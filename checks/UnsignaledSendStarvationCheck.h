//===- UnsignaledSendStarvationCheck.h - rdma-unsignaled-send-starvation -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_UNSIGNALEDSENDSTARVATIONCHECK_H
#define ULPLINT_CHECKS_UNSIGNALEDSENDSTARVATIONCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

class WorkRequests;
struct WrSlot;
struct CounterWrite;
struct CounterRead;

/// Send queues whose entries are never reclaimed: nothing is ever signaled,
/// or signaling waits on a counter nobody advances.
/// Docs: docs/checks/rdma-unsignaled-send-starvation.md
class UnsignaledSendStarvationCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;

private:
  void checkNeverSignaled(const TuAnalysis &A, const WorkRequests &W);
  void checkStuckCounters(const TuAnalysis &A, const WorkRequests &W);
  void judgeCondition(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                      const clang::Expr *Cond,
                      llvm::ArrayRef<CounterWrite> Writes);
  static bool hasDisjunction(const clang::Expr *E, bool Negated);
  void reportStuck(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                   const CounterRead &R, const clang::VarDecl *Restarting);
  void exportMoves(const TuAnalysis &A, llvm::ArrayRef<CounterWrite> Writes);
  static std::string movesFact(llvm::StringRef Slot, unsigned Moves);
};

} // namespace ulplint

#endif
