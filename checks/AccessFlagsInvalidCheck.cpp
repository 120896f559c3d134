//===- AccessFlagsInvalidCheck.cpp - rdma-access-flags-invalid ------------===//

#include "AccessFlagsInvalidCheck.h"
#include "clang/AST/ASTContext.h"

using namespace clang;

namespace ulplint {

void AccessFlagsInvalidCheck::checkUnit(const TuAnalysis &A) {
  if (!A.flagBit(Flag::LocalWrite))
    return; // the unit does not include a verbs header
  Fixed.clear();
  const std::vector<AccessSite> &Sites = AccessSites::of(A).All;
  for (const AccessSite &S : Sites) {
    if (S.K == AccessSite::WindowBind)
      checkBind(A, S, Sites);
    else
      checkRequest(A, S);
  }
}

static constexpr uint64_t Always = ~uint64_t(0);

/// Alternatives that surely request \p Requires rights (or, with Always,
/// any rights) without \p Bit.
static const FlagAlt *missing(const FlagSet &V, uint64_t Requires,
                              uint64_t Bit, unsigned &Count) {
  const FlagAlt *First = nullptr;
  Count = 0;
  for (const FlagAlt &Alt : V.Alts)
    if (Alt.exact() && (Requires == Always || (Alt.Known & Requires)) &&
        !(Alt.Known & Bit)) {
      ++Count;
      First = First ? First : &Alt;
    }
  return First;
}

static StringRef failureOf(const AccessSite &S) {
  switch (S.K) {
  case AccessSite::Registration:
    return "the registration fails with EINVAL";
  case AccessSite::FastReg:
    return "the registration work request completes with an error";
  case AccessSite::DeviceKey:
    return "the mkey configuration fails";
  case AccessSite::WindowBind:
    return "the bind fails";
  }
  return "";
}

/// Points at the assignment that produced the flags when it is not the
/// expression being reported.
static const Stmt *originNote(const FlagAlt &Alt, const AccessSite &S) {
  if (!Alt.Origin || !S.Flags)
    return nullptr;
  if (S.Flags->getSourceRange().fullyContains(Alt.Origin->getSourceRange()))
    return nullptr;
  return Alt.Origin;
}

void AccessFlagsInvalidCheck::checkRequest(const TuAnalysis &A,
                                           const AccessSite &S) {
  uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteAtomic);
  uint64_t Local = A.flagBit(Flag::LocalWrite);
  unsigned Bad = 0;
  const FlagAlt *Alt = missing(S.Value, Remote, Local, Bad);
  if (!Alt)
    return;
  std::string Requested = accessNames(A, S.D, Alt->Known & Remote);
  StringRef LocalName = A.rules().flagName(S.D, Flag::LocalWrite);
  std::string Msg = "'" + S.What + "' requests " + Requested + " without " +
                    LocalName.str() + "; " + failureOf(S).str();
  if (Bad < S.Value.Alts.size())
    Msg += " on some paths";
  {
    DiagnosticBuilder D = report(A, S.Loc, Msg);
    if (S.Flags)
      if (auto Fix = addFlagFix(A.context(), S.Flags, LocalName))
        D << *Fix;
  }
  if (const Stmt *Origin = originNote(*Alt, S))
    note(A, Origin->getBeginLoc(), "access flags computed here");
}

void AccessFlagsInvalidCheck::checkBind(const TuAnalysis &A,
                                        const AccessSite &Bind,
                                        llvm::ArrayRef<AccessSite> Sites) {
  if (!Bind.Region)
    return;
  uint64_t Remote = A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteAtomic);
  uint64_t Granted = 0;
  for (const FlagAlt &Alt : Bind.Value.Alts)
    Granted |= Alt.Known;
  for (const AccessSite *RegPtr : rightsOf(A, Sites, *Bind.Region, Bind.RegionFn)) {
    const AccessSite &Reg = *RegPtr;
    if (Reg.K != AccessSite::Registration)
      continue;
    // A window needs MW_BIND on its MR, and LOCAL_WRITE there when the
    // window grants remote write or atomic access (ibv_bind_mw(3)).
    std::string Missing;
    std::string Why;
    auto Require = [&](bool Needed, Flag F, StringRef Reason) {
      uint64_t Bit = A.flagBit(F);
      unsigned Count = 0;
      // Any registration path that surely lacks the flag breaks the bind.
      if (!Needed || !Bit || !missing(Reg.Value, Always, Bit, Count))
        return;
      Missing += (Missing.empty() ? "" : " | ") +
                 A.rules().flagName(Reg.D, F).str();
      Why += (Why.empty() ? "" : "; ") + Reason.str();
    };
    Require(Granted & Remote, Flag::LocalWrite,
            "a window granting remote write or atomic access needs local "
            "write access on its MR");
    Require(true, Flag::MwBind,
            "windows can only be bound to MRs registered for binding");
    if (Missing.empty())
      continue;
    {
      DiagnosticBuilder D = report(
          A, Bind.Loc,
          "memory window bound to an MR registered without " + Missing +
              "; " + Why + ", so the bind fails");
      if (Reg.Flags && Fixed.insert(Reg.Flags).second)
        if (auto Fix = addFlagFix(A.context(), Reg.Flags, Missing))
          D << *Fix;
    }
    note(A, Reg.Loc, "MR registered here");
  }
}

} // namespace ulplint
