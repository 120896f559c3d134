//===- MrLeakCheck.cpp - rdma-mr-leak -------------------------------------===//

#include "MrLeakCheck.h"
#include "engine/Lifecycle.h"
#include "engine/Program.h"

using namespace clang;

namespace ulplint {

/// The call that produced the handle, also when a local carried it into
/// the slot (`mr = ib_mr_pool_get(..); req->mr = mr;`).
static SourceLocation obtainedAt(const LifeEvent &Produced) {
  return Produced.Binding ? Produced.Binding->getBeginLoc() : Produced.Loc;
}

void MrLeakCheck::checkUnit(const TuAnalysis &A) {
  const Lifecycle &L = Lifecycle::of(A);
  std::set<std::pair<unsigned, SlotKey>> Reported; // one finding per place
  for (const LifeIncident &I : L.incidents()) {
    if ((I.K == LifeIncident::LeakAtReturn || I.K == LifeIncident::LeakOverwrite) &&
        !Reported.insert({I.loc().getRawEncoding(), I.Slot}).second)
      continue;
    std::string What = I.handleNoun();
    std::string From = I.Produced ? " from '" + I.Produced->What + "'" : "";
    if (I.K == LifeIncident::LeakAtReturn) {
      SourceLocation Loc = I.Exit ? I.Exit->getBeginLoc() : I.Fn->getEndLoc();
      report(A, Loc,
             std::string(I.ErrorBranch ? "error path returns" : "returns") +
                 " without releasing the " + What + From +
                 (I.Local ? "" : " (held in " + I.Slot.str() + ")") + "; it leaks");
      if (I.Produced)
        note(A, obtainedAt(*I.Produced), What + " obtained here");
      if (I.ErrorBranch)
        note(A, I.ErrorBranch->getBeginLoc(), "error path taken here");
    } else if (I.K == LifeIncident::LeakOverwrite) {
      report(A, I.loc(),
             I.At->K == LifeEventKind::ContainerRelease
                 ? "'" + I.At->What + "' frees the struct that still holds a " +
                       What + From + "; it leaks"
                 : I.Produced ? "the " + What + From +
                                    " is overwritten while still held; it leaks"
                              : "'" + I.Slot.str() + "' is overwritten while it "
                                "still holds a " + What + "; it leaks");
      if (I.Produced)
        note(A, obtainedAt(*I.Produced), What + " obtained here");
      else if (I.HeldAt)
        note(A, I.HeldAt->getBeginLoc(), "this path saw the " + What + " here");
    }
  }
  reportNeverReleased(A, L);
}

/// The struct a shared slot lives in ("" for globals): what a teardown
/// releases together.
static std::string ownerOf(const SlotKey &S) {
  const RecordDecl *RD = S.record();
  return RD ? recordName(RD) : std::string();
}

/// Handles the program keeps for good need no release (a server's one
/// registration, freed at exit). But when a teardown releases the other
/// handles of the same struct, a handle it skips is forgotten: that leaks.
void MrLeakCheck::reportNeverReleased(const TuAnalysis &A, const Lifecycle &L) {
  // Teardowns here: a function releasing a handle it does not produce.
  std::set<std::string> TornDown;
  for (const LifeEvent &E : L.events()) {
    if ((E.K != LifeEventKind::Deregister && E.K != LifeEventKind::Release) ||
        !E.Slot.isShared())
      continue;
    if (!L.has(E.Slot, LifeEventKind::Produce, E.Fn)) {
      TornDown.insert(ownerOf(E.Slot));
      Program::of(A).exportFact(factKey(FactKind::TearsDown, ownerOf(E.Slot)));
    }
  }
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
    std::string Message = std::string("the ") + handleNoun(E.Window) + " from '" +
                          E.What + "' is stored in '" + E.Slot.str() +
                          "' but nothing releases it, while the handles next "
                          "to it are released; it leaks";
    std::string Releases = Lifecycle::fact(FactKind::Releases, E.Slot);
    if (TornDown.count(ownerOf(E.Slot)))
      reportUnless(A, E.Loc, Message, Releases);
    else
      reportIfProgram(A, E.Loc, Message,
                      {factKey(FactKind::TearsDown, ownerOf(E.Slot))}, {Releases});
  }
}

} // namespace ulplint
