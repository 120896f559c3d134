//===- SendQueueUndersizedCheck.h - rdma-send-queue-undersized --*- C++ -*-===//

#ifndef ULPLINT_CHECKS_SENDQUEUEUNDERSIZEDCHECK_H
#define ULPLINT_CHECKS_SENDQUEUEUNDERSIZEDCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

struct Linear;
class WorkRequests;
struct QpCreation;
struct RequestCost;

/// A send queue smaller than the work requests its requests post.
/// Docs: docs/checks/rdma-send-queue-undersized.md
class SendQueueUndersizedCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;
  struct Capacity;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  bool checkLocal(const TuAnalysis &A, const WorkRequests &W,
                  const QpCreation &Q, const Linear &Size, const Capacity &Cap,
                  const RequestCost &Cost, clang::SourceLocation At);
  void checkProgram(const TuAnalysis &A, const WorkRequests &W,
                    const QpCreation &Q, const Linear &Size,
                    const Capacity &Cap);
  void checkReceiveDrain(const TuAnalysis &A, const WorkRequests &W,
                         const QpCreation &Q);
  void reportDrain(const TuAnalysis &A, clang::SourceLocation At,
                   const std::string &What, const clang::CallExpr *Drain);
  void notePosts(const TuAnalysis &A, const RequestCost &Cost);
};

} // namespace ulplint

#endif
