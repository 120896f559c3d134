//===- SendQueueUndersizedCheck.cpp - rdma-send-queue-undersized ----------===//

#include "SendQueueUndersizedCheck.h"
#include "engine/WorkRequests.h"

using namespace clang;

namespace ulplint {

void SendQueueUndersizedCheck::run(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  // Posts can only be tied to a queue when the unit creates one kind.
  if (W.creations().size() != 1 || W.posts().empty())
    return;
  const QpCreation &Q = W.creations().front();
  std::optional<Linear> Size = capValue(A, Q, FieldRole::MaxSendWr);
  if (Q.CoreManaged || !Size || Size->Opaque || Size->Terms.size() != 1 ||
      !Size->Terms.front().Factors.empty())
    return;
  if (llvm::any_of(W.posts(), [](const PostSite &P) { return !P.Complete; }))
    return; // a chain the engine could not follow: no bound
  std::vector<const WrSlot *> Slots = W.perIoSlots();
  int64_t PerRequest = Size->Terms.front().Coef;
  int64_t Cost = static_cast<int64_t>(Slots.size());
  int64_t Drain = W.drains() ? 1 : 0;
  const FieldStore *Store = Q.Caps.at(FieldRole::MaxSendWr);
  std::string Depth = Size->Terms.front().Symbol;
  if (Cost > PerRequest) {
    report(A, Store->Spelling->getBeginLoc(),
           "each request posts up to " + std::to_string(Cost) + " WRs (" +
               WorkRequests::describe(Slots) + ") but max_send_wr is " +
               Size->str() + "; with " + Depth +
               " requests in flight the send queue overflows and posts fail");
    for (const WrSlot *S : Slots)
      if (S->Loc.isValid())
        note(A, S->Loc, "work request built here");
    return;
  }
  if (Drain > Size->Const)
    report(A, Store->Spelling->getBeginLoc(),
           "max_send_wr is " + Size->str() + ", " + std::to_string(PerRequest) +
               " per request, but ib_drain_qp() needs one more entry; draining "
               "a full queue hangs");
}

} // namespace ulplint
