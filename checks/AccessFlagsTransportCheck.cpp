//===- AccessFlagsTransportCheck.cpp - rdma-access-flags-transport --------===//

#include "AccessFlagsTransportCheck.h"
#include "engine/Program.h"
#include "clang/AST/ASTContext.h"

using namespace clang;

namespace ulplint {

AccessFlagsTransportCheck::AccessFlagsTransportCheck(
    StringRef Name, tidy::ClangTidyContext *Context)
    : RdmaCheck(Name, Context), AssumeIWarp(Options.get("AssumeIWarp", true)) {}

void AccessFlagsTransportCheck::storeOptions(
    tidy::ClangTidyOptions::OptionMap &Opts) {
  RdmaCheck::storeOptions(Opts);
  Options.store(Opts, "AssumeIWarp", AssumeIWarp);
}

void AccessFlagsTransportCheck::run(const TuAnalysis &A) {
  if (!A.flagBit(Flag::LocalWrite))
    return;
  const std::vector<AccessSite> &Sites = AccessSites::of(A).All;
  checkTransportTests(A, Sites);
  // A ULP that refuses iWARP devices never meets the READ-sink rule.
  if (AssumeIWarp && !Program::of(A).iwarpGuard())
    checkReadSinks(A, Sites);
}

static StringRef helperAdvice(const TuAnalysis &A, Domain D) {
  const auto &M = A.rules().domain(D).Migration;
  auto It = M.find(MigrationKey::TransportFlags);
  return It == M.end() ? StringRef() : StringRef(It->second);
}

void AccessFlagsTransportCheck::checkTransportTests(
    const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites) {
  for (const AccessSite &S : Sites) {
    const FlagAlt *Alt = S.Value.transportDependent();
    if (!Alt)
      continue;
    report(A, S.Loc,
           "access flags for '" + S.What +
               "' are chosen by an inline transport test; " +
               helperAdvice(A, S.D).str());
    note(A, Alt->TransportTest->getBeginLoc(), "transport tested here");
  }
}

/// Every path's flags are known and none grants remote write.
static bool surelyWithout(const FlagSet &V, uint64_t Bit) {
  if (V.empty())
    return false;
  for (const FlagAlt &Alt : V.Alts)
    if (!Alt.exact() || (Alt.Known & Bit) || Alt.TransportTest ||
        Alt.FromCoreHelper)
      return false;
  return true;
}

void AccessFlagsTransportCheck::checkReadSinks(
    const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites) {
  uint64_t RemoteWrite = A.flagBit(Flag::RemoteWrite);
  llvm::DenseSet<const AccessSite *> Reported;
  for (const ReadSink &Sink : readSinks(A)) {
    std::string OtherFileRefuses = factKey(FactKind::RefusesIwarp, Program::of(A).key());
    if (Sink.LocalDmaLkey) {
      reportUnless(A, Sink.ReadLoc,
             "RDMA READ into memory addressed with the PD's local_dma_lkey; "
             "on iWARP a READ sink must be registered with " +
                 A.flagName(Flag::RemoteWrite).str() + "; " +
                 helperAdvice(A, A.domain()).str(),
             OtherFileRefuses);
      continue;
    }
    for (const AccessSite *Reg : rightsOf(A, Sites, *Sink.Region, Sink.RegionFn)) {
      if (!surelyWithout(Reg->Value, RemoteWrite) ||
          !Reported.insert(Reg).second)
        continue;
      StringRef Name = A.rules().flagName(Reg->D, Flag::RemoteWrite);
      reportUnless(A, Reg->Loc,
                   "memory registered without " + Name.str() +
                       " is the sink of an RDMA READ; on iWARP the READ "
                       "response is a tagged write into the sink, so the "
                       "READ fails; " + helperAdvice(A, Reg->D).str(),
                   OtherFileRefuses);
      note(A, Sink.ReadLoc, "RDMA READ into this memory");
    }
  }
}

} // namespace ulplint
