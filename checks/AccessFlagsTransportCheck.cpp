//===- AccessFlagsTransportCheck.cpp - rdma-access-flags-transport --------===//

#include "AccessFlagsTransportCheck.h"
#include "engine/Lifecycle.h"
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

void AccessFlagsTransportCheck::checkUnit(const TuAnalysis &A) {
  if (!A.flagBit(Flag::LocalWrite))
    return;
  const std::vector<AccessSite> &Sites = AccessSites::of(A).All;
  checkTransportTests(A, Sites);
  exportSinkRights(A, Sites);
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
  // `if (iwarp) access = A; else access = B;` is one choice: report the
  // test once, at the first site it decides.
  llvm::DenseSet<const Expr *> ReportedTests;
  for (const AccessSite &S : Sites) {
    const FlagAlt *Alt = S.Value.transportDependent();
    if (!Alt || !ReportedTests.insert(Alt->TransportTest).second)
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

/// A registration giving \p Sink its rights that surely lacks remote write.
static const AccessSite *sinkWithoutRemoteWrite(const TuAnalysis &A,
                                                llvm::ArrayRef<AccessSite> Sites,
                                                const ReadSink &Sink) {
  uint64_t RemoteWrite = A.flagBit(Flag::RemoteWrite);
  for (const AccessSite *Reg : sinkRights(A, Sites, Sink))
    if (surelyWithout(Reg->Value, RemoteWrite))
      return Reg;
  return nullptr;
}

/// The shared slot (`tgt_pool.mr`) a region names, if other files can too.
static std::optional<SlotKey> sharedSlot(const TuAnalysis &A,
                                         const Location &Region,
                                         const FunctionDecl *Fn) {
  SlotKey Slot = slotOf(A, Region, Fn);
  if (!Slot.isShared())
    return std::nullopt;
  return Slot;
}

/// Tells the program whether the MRs this unit registers into shared
/// storage may serve as READ sinks on iWARP: a READ posted in another file
/// (`tgt_io.c` reading into the pool `tgt_mem.c` registers) is judged by it.
void AccessFlagsTransportCheck::exportSinkRights(
    const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites) {
  const Program &P = Program::of(A);
  uint64_t RemoteWrite = A.flagBit(Flag::RemoteWrite);
  for (const AccessSite &S : Sites) {
    if ((S.K != AccessSite::Registration && S.K != AccessSite::FastReg) ||
        !S.Region)
      continue;
    std::optional<SlotKey> Slot = sharedSlot(A, *S.Region, S.RegionFn);
    if (!Slot)
      continue;
    FactKind K = surelyWithout(S.Value, RemoteWrite) ? FactKind::LacksRemoteWrite
                                                     : FactKind::GrantsRemoteWrite;
    P.exportFact(Lifecycle::fact(K, *Slot));
  }
}

/// The fault is the READ into memory that cannot take it: reported where
/// the READ is built or posted, with a note at the registration.
void AccessFlagsTransportCheck::checkReadSinks(
    const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites) {
  std::string OtherFileRefuses =
      factKey(FactKind::RefusesIwarp, Program::of(A).key());
  std::string RemoteWrite = A.flagName(Flag::RemoteWrite).str();
  llvm::DenseSet<unsigned> ReportedReads;
  for (const ReadSink &Sink : readSinks(A)) {
    if (!ReportedReads.insert(Sink.ReadLoc.getRawEncoding()).second)
      continue;
    if (Sink.LocalDmaLkey) {
      reportUnless(A, Sink.ReadLoc,
                   "RDMA READ into memory addressed with the PD's "
                   "local_dma_lkey; on iWARP a READ sink must be registered "
                   "with " + RemoteWrite + "; " +
                       helperAdvice(A, A.domain()).str(),
                   OtherFileRefuses);
      continue;
    }
    if (sinkRights(A, Sites, Sink).empty()) {
      reportSinkElsewhere(A, Sink, OtherFileRefuses);
      continue;
    }
    const AccessSite *Reg = sinkWithoutRemoteWrite(A, Sites, Sink);
    if (!Reg) {
      ReportedReads.erase(Sink.ReadLoc.getRawEncoding());
      continue;
    }
    StringRef Name = A.rules().flagName(Reg->D, Flag::RemoteWrite);
    reportUnless(A, Sink.ReadLoc,
                 "RDMA READ into memory registered without " + Name.str() +
                     "; on iWARP the READ response is a tagged write into "
                     "the sink, so the READ fails; " +
                     helperAdvice(A, Reg->D).str(),
                 OtherFileRefuses);
    note(A, Reg->Loc, "the sink is registered here");
  }
}

/// A READ into an MR that another file of the program registers: reported
/// when that file registers it without remote write and nothing in the
/// program grants it or refuses iWARP.
void AccessFlagsTransportCheck::reportSinkElsewhere(const TuAnalysis &A,
                                                    const ReadSink &Sink,
                                                    llvm::StringRef Refuses) {
  std::optional<SlotKey> Slot = sharedSlot(A, *Sink.Region, Sink.RegionFn);
  if (!Slot)
    return;
  reportIfProgram(
      A, Sink.ReadLoc,
      "RDMA READ into memory registered without " +
          A.flagName(Flag::RemoteWrite).str() + " (the MR in '" +
          Slot->str() + "' is registered in another file); on iWARP the "
          "READ response is a tagged write into the sink, so the READ "
          "fails; " + helperAdvice(A, A.domain()).str(),
      {Lifecycle::fact(FactKind::LacksRemoteWrite, *Slot)},
      {Lifecycle::fact(FactKind::GrantsRemoteWrite, *Slot), Refuses.str()});
}

} // namespace ulplint
