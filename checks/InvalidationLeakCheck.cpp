//===- InvalidationLeakCheck.cpp - rdma-invalidation-leak -----------------===//

#include "InvalidationLeakCheck.h"
#include "engine/Lifecycle.h"

using namespace clang;

namespace ulplint {

static std::string releaseText(const LifeEvent &E, const std::string &What) {
  switch (E.K) {
  case LifeEventKind::BufferRelease:
    return "'" + What + "' releases the memory behind";
  case LifeEventKind::ContainerRelease:
    return "'" + What + "' recycles the request that holds";
  default:
    return "'" + What + "' releases";
  }
}

void InvalidationLeakCheck::checkUnit(const TuAnalysis &A) {
  const Lifecycle &L = Lifecycle::of(A);
  // One finding per place: several releases reached through one call are
  // one mistake at that call.
  std::set<const void *> Reported;
  for (const LifeIncident &I : L.incidents()) {
    if (I.K != LifeIncident::ReleaseWhileExposed &&
        I.K != LifeIncident::ReleaseSkipsInvalidation)
      continue;
    if (!Reported.insert(I.Anchor ? static_cast<const void *>(I.Anchor) : I.At).second)
      continue;
    std::string Msg = releaseText(*I.At, I.what()) + " a " + I.handleNoun();
    if (I.K == LifeIncident::ReleaseSkipsInvalidation)
      Msg += " without invalidating its rkey on some paths, while other paths "
             "of this function invalidate it first";
    else if (I.Unconfirmed == LifeIncident::StatusUnchecked)
      Msg += " when its LOCAL_INV completes, without checking the completion's "
             "status: a LOCAL_INV that failed or was flushed leaves the rkey valid";
    else if (I.Unconfirmed == LifeIncident::InvalidationFailed)
      Msg += " after its LOCAL_INV completed in error: the rkey is still valid";
    else
      Msg += " whose rkey is still valid for the peer: no LOCAL_INV or checked "
             "remote invalidation on this path";
    report(A, I.loc(), Msg + "; the peer keeps access to memory that is "
                             "handed back");
    if (I.Anchor)
      note(A, I.At->Loc, I.releasedHere());
    // Freed first, deregistered later on the same path.
    if (I.Invalidation && I.Invalidation->K == LifeEventKind::Deregister)
      note(A, I.Invalidation->Loc,
           "the memory region is deregistered only here, after its memory "
           "was handed back");
    if (I.Exposed)
      note(A, I.Exposed->Loc,
           "rkey handed to the peer here (" + I.Exposed->What + ")");
    if (I.ErrorBranch)
      note(A, I.ErrorBranch->getBeginLoc(), "error path taken here");
  }
  reportAcrossUnits(A, L, Reported);
}

/// A release in a unit that never exposes the slot, of a slot another unit
/// exposes and nobody invalidates: only the whole program can tell.
void InvalidationLeakCheck::reportAcrossUnits(
    const TuAnalysis &A, const Lifecycle &L, const std::set<const void *> &Reported) {
  std::set<SlotKey> Done;
  for (const LifeEvent &E : L.events()) {
    bool Buffer = E.K == LifeEventKind::BufferRelease;
    if ((E.K != LifeEventKind::Release && E.K != LifeEventKind::ContainerRelease &&
         !Buffer) ||
        !E.Slot.isShared() || !L.releasesHeld(&E))
      continue;
    // A setup that recycles what it just produced gave no key out yet.
    bool ProducedHere = L.has(E.Slot, LifeEventKind::Produce, E.Fn);
    // A place the paths already judged keeps that finding, unconditionally.
    if (ProducedHere || Reported.count(&E) || !Done.insert(E.Slot).second)
      continue;
    if (L.has(E.Slot, LifeEventKind::Expose) || L.has(E.Slot, LifeEventKind::KeyStaged) ||
        L.has(E.Slot, LifeEventKind::InvalidatePost) ||
        L.has(E.Slot, LifeEventKind::InvalidateRemote))
      continue;
    // Freeing the memory of an MR that is deregistered somewhere is a
    // question of order the paths answer; never deregistering is not.
    if (Buffer && L.has(E.Slot, LifeEventKind::Deregister))
      continue;
    std::string Msg = releaseText(E, E.What) +
                      " a memory region registered for remote access, and "
                      "nothing invalidates its rkey (no LOCAL_INV, no checked "
                      "remote invalidation" +
                      (Buffer ? std::string(", no deregistration") : "") +
                      "); the peer keeps access to memory that is handed back";
    std::string Invalidates = Lifecycle::fact(
        Buffer ? FactKind::Deregisters : FactKind::Invalidates, E.Slot);
    reportIfProgram(A, E.Loc, Msg, {Lifecycle::fact(FactKind::Exposes, E.Slot)},
                    {Invalidates});
  }
}

} // namespace ulplint
