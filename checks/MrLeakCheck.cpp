//===- MrLeakCheck.cpp - rdma-mr-leak -------------------------------------===//

#include "MrLeakCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

static std::string handleWord(const LifeEvent *Produced) {
  return Produced && Produced->Window ? "memory window" : "memory region";
}

void MrLeakCheck::run(const TuAnalysis &A) {
  const Lifecycle &L = Lifecycle::of(A);
  for (const LifeIncident &I : L.incidents()) {
    std::string What = handleWord(I.Produced);
    std::string From = I.Produced ? " from '" + I.Produced->What + "'" : "";
    if (I.K == LifeIncident::LeakAtReturn) {
      SourceLocation Loc = I.Exit ? I.Exit->getBeginLoc() : I.Fn->getEndLoc();
      report(A, Loc,
             std::string(I.ErrorBranch ? "error path returns" : "returns") +
                 " without releasing the " + What + From +
                 (I.Local ? "" : " (held in " + I.Slot.str() + ")") + "; it leaks");
      if (I.Produced)
        note(A, I.Produced->Loc, What + " obtained here");
      if (I.ErrorBranch)
        note(A, I.ErrorBranch->getBeginLoc(), "error path taken here");
    } else if (I.K == LifeIncident::LeakOverwrite) {
      report(A, I.loc(),
             I.At->K == LifeEventKind::ContainerRelease
                 ? "'" + I.At->What + "' frees the struct that still holds a " +
                       What + From + "; it leaks"
                 : "the " + What + From + " is overwritten while still held; "
                   "it leaks");
      if (I.Produced)
        note(A, I.Produced->Loc, What + " obtained here");
    }
  }
  // A handle kept in a struct that nothing ever releases.
  std::set<SlotKey> Done;
  for (const LifeEvent &E : L.events()) {
    if (E.K != LifeEventKind::Produce || !E.Slot.isShared() ||
        !Done.insert(E.Slot).second)
      continue;
    bool Released = false;
    for (LifeEventKind K : {LifeEventKind::Release, LifeEventKind::Deregister,
                            LifeEventKind::ContainerRelease, LifeEventKind::Escape})
      Released |= L.has(E.Slot, K);
    if (Released)
      continue;
    reportUnless(A, E.Loc,
                 "the " + handleWord(&E) + " from '" + E.What +
                     "' is stored in '" + E.Slot.str() +
                     "' but nothing releases it; it leaks",
                 Lifecycle::fact(FactKind::Releases, E.Slot));
  }
}

} // namespace ulplint
