//===- RemoteAccessOverbroadCheck.cpp - rdma-remote-access-overbroad ------===//

#include "RemoteAccessOverbroadCheck.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"

using namespace clang;

namespace ulplint {

void RemoteAccessOverbroadCheck::run(const TuAnalysis &A) {
  if (!A.flagBit(Flag::LocalWrite))
    return;
  for (const AccessSite &S : AccessSites::of(A).All) {
    if (S.K != AccessSite::Registration && S.K != AccessSite::FastReg)
      continue;
    checkUnusedRights(A, S);
    checkImplicitOdp(A, S);
  }
  checkGlobalRkey(A);
}

static uint64_t remoteBits(const TuAnalysis &A) {
  return A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
         A.flagBit(Flag::RemoteAtomic);
}

/// Storage that code in other translation units cannot name.
static bool isUnitPrivate(const TuAnalysis &A, const Location &Region,
                          const FunctionDecl *Fn) {
  Location R = A.flow(Fn).resolve(Region);
  if (isa<ParmVarDecl>(R.Root) && R.Steps.empty())
    return false; // the caller has the MR too
  if (SlotKey::of(R, Fn).isLocal())
    return true; // a local of Fn
  const auto *VD = dyn_cast<VarDecl>(R.Root);
  if (VD && VD->hasGlobalStorage() && R.Steps.empty())
    return !VD->isExternallyVisible();
  if (R.Steps.empty() || !R.Steps.front().Field)
    return false;
  const RecordDecl *RD = R.Steps.front().Field->getParent();
  return A.sources().isInMainFile(A.sources().getExpansionLoc(RD->getLocation()));
}

void RemoteAccessOverbroadCheck::checkUnusedRights(const TuAnalysis &A,
                                                   const AccessSite &S) {
  uint64_t Remote = remoteBits(A);
  uint64_t Granted = 0;
  for (const FlagAlt &Alt : S.Value.Alts)
    if (Alt.exact())
      Granted |= Alt.Known & Remote;
  if (!Granted || !S.Region || !isUnitPrivate(A, *S.Region, S.RegionFn) ||
      rkeyMayLeave(A, *S.Region, S.RegionFn))
    return;
  bool Local = SlotKey::of(A.flow(S.RegionFn).resolve(*S.Region), S.RegionFn).isLocal();
  report(A, S.Loc,
         "'" + S.What + "' grants " + accessNames(A, S.D, Granted) +
             " but the MR's rkey never leaves this " +
             (Local ? "function" : "translation unit") +
             "; no peer can use these rights, drop them");
}

static bool isAllOnes(std::optional<int64_t> V, const Expr *E,
                      const ASTContext &Ctx) {
  if (!V)
    return false;
  unsigned Width = Ctx.getTypeSize(E->getType());
  uint64_t Mask = Width >= 64 ? ~uint64_t(0) : ((uint64_t(1) << Width) - 1);
  return (static_cast<uint64_t>(*V) & Mask) == Mask;
}

void RemoteAccessOverbroadCheck::checkImplicitOdp(const TuAnalysis &A,
                                                  const AccessSite &S) {
  if (S.K != AccessSite::Registration)
    return;
  const Expr *Addr = S.Call->arg(ArgRole::Addr);
  const Expr *Length = S.Call->arg(ArgRole::Length);
  if (!Addr || !Length)
    return;
  ValueEval VE = A.values(S.Fn);
  const ASTContext &Ctx = A.context();
  bool ZeroAddr = Addr->isNullPointerConstant(
                      const_cast<ASTContext &>(Ctx),
                      Expr::NPC_ValueDependentIsNotNull) != Expr::NPCK_NotNull;
  if (!ZeroAddr || !isAllOnes(VE.constant(Length), Length, Ctx))
    return;
  uint64_t OnDemand = A.flagBit(Flag::OnDemand);
  uint64_t Remote = remoteBits(A);
  for (const FlagAlt &Alt : S.Value.Alts) {
    if (!(Alt.Known & OnDemand) || !(Alt.Known & Remote))
      continue;
    report(A, S.Loc,
           "implicit ODP registration of the whole address space grants " +
               accessNames(A, S.D, Alt.Known & Remote) +
               "; any peer holding the rkey can reach all of the process's "
               "memory, register the buffers the peer needs instead");
    return;
  }
}

void RemoteAccessOverbroadCheck::checkGlobalRkey(const TuAnalysis &A) {
  StringRef Name = A.rules().flagName(Domain::Kernel, Flag::UnsafeGlobalRkey);
  const auto &Migration = A.rules().domain(Domain::Kernel).Migration;
  auto It = Migration.find(MigrationKey::GlobalRkey);
  std::string Advice = It == Migration.end() ? std::string() : It->second;
  std::optional<int64_t> Bit = A.enumValue(Name);
  if (!Bit || !*Bit)
    return;
  for (const ApiCall &C : A.calls()) {
    const Expr *Flags = C.Model->E == Effect::PdAlloc ? C.arg(ArgRole::Flags) : nullptr;
    if (!Flags)
      continue;
    FlagSet V = A.values(C.Caller).flags(Flags);
    for (const FlagAlt &Alt : V.Alts)
      if (Alt.Known & static_cast<uint64_t>(*Bit)) {
        report(A, Flags->IgnoreParenImpCasts()->getBeginLoc(),
               Name.str() + " gives any peer that learns the PD's global "
                            "rkey remote read and write access to all of "
                            "memory; " + Advice);
        break;
      }
  }
}

} // namespace ulplint
