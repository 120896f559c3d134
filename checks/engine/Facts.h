//===- Facts.h - What one unit tells the whole program ----------*- C++ -*-===//
//
// The sinks the engine writes into while a unit is analysed: facts for the
// whole program, conditional findings, registration sites for the migration
// report, and functions whose analysis was cut short. Clang-free, so the
// driver includes it alone.
//
// Some questions span files: xprtrdma registers in frwr_ops.c and
// invalidates from rpc_rdma.c; RDS refuses iWARP devices in ib.c and posts
// RDMA READs in ib_send.c. A unit exports facts, and findings may depend on
// a fact another unit exports ("report unless the ULP refuses iWARP").
// ulplint installs a sink per unit and settles conditions once every unit
// is analysed; the clang-tidy plugin has no sink and keeps each finding.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_FACTS_H
#define ULPLINT_ENGINE_FACTS_H

#include "llvm/ADT/StringRef.h"
#include <optional>
#include <string>
#include <vector>

namespace ulplint {

/// What a fact says. Subjects are shared slots ("nvme_rdma_request.mr") or
/// the program a unit belongs to.
enum class FactKind {
  Exposes,           // the slot's rkey is handed to a peer
  Invalidates,       // LOCAL_INV or a checked remote invalidation of the slot
  Deregisters,       // the slot's MR is deregistered
  Releases,          // the slot's handle is released, recycled or passed on
  Rotates,           // the slot's key is rotated
  RefusesIwarp,      // the program refuses iWARP devices
  Posts,             // the program posts send work requests
  PostsRegistration, // ... among them REG_MR, LOCAL_INV or BIND_MW
  Signals,           // ... and some of them ask for a completion
  ComparesInvalidatedKey, // the function compares a caller's key with an MR's
  TearsDown,         // a teardown releases the handles of the struct
  GrantsRemoteWrite, // some registration of the slot may grant remote write
  LacksRemoteWrite,  // a registration of the slot surely grants no remote write
  PostsRdma,         // the program posts RDMA READ/WRITE work requests itself
  PostsOn,           // some unit posts on the QP stored in the subject
  SignalsOn,         // ... and some post there asks for a completion
  SendQueueCost,     // one request posts at least N WRs on a QP ("qp>=N")
  RkeyLeaves,        // the rkey of an MR field may reach a peer from this unit
  Defines,           // the unit defines the external function (subject: name)
  Moves,             // the unit moves an integer slot ("slot:up", "slot:down")
};

/// The spelling units exchange: "exposes:nvme_rdma_request.mr".
std::string factKey(FactKind K, llvm::StringRef Subject);

/// A finding kept only if every fact in \c Require and none in \c Unless is
/// exported by some unit of the program.
struct ConditionalFinding {
  std::string Check;
  std::string File;
  unsigned Offset = 0;
  /// The finding's text: another finding of the check at the same place
  /// (a window's and its MR's release at one free()) is not this one.
  std::string Message;
  std::vector<std::string> Require;
  std::vector<std::string> Unless;
};

/// A function the engine could not analyse completely: a budget cut
/// paths short, so findings there may be missing.
struct IncompleteAnalysis {
  std::string File;
  unsigned Line = 0;
  std::string Function;
  std::string Reason;
};

struct UnitFacts {
  std::vector<std::string> Facts;
  std::vector<ConditionalFinding> Conditions;
  std::vector<IncompleteAnalysis> Incomplete;
};

/// The sink of the unit analysed on this thread, or null (plugin, clangd).
UnitFacts *currentFacts();

/// For hosts that see one unit (the clang-tidy plugin, ulplint-clangd): the
/// facts the other units of the program exported in the last ulplint run,
/// or nullopt when there are none to be found. tool/PluginFacts.cpp sets it
/// to tool/ProgramFacts.cpp's reader; ulplint itself installs sinks and
/// never asks.
using ProgramFactsProvider = std::optional<std::vector<std::string>> (*)(
    llvm::StringRef MainFile, llvm::StringRef BuildDirectory,
    llvm::StringRef CacheDir);
void setProgramFactsProvider(ProgramFactsProvider Provider);
ProgramFactsProvider programFactsProvider();
/// Installs \p Sink for the current thread for the lifetime of the guard.
class FactScope {
public:
  explicit FactScope(UnitFacts *Sink);
  ~FactScope();

private:
  UnitFacts *Saved;
};

/// One registration site as `ulplint report` keeps it.
struct SiteRecord {
  std::string Kind, Role, Api, Target, Function, File;
  unsigned Line = 0, Column = 0;
  bool Datapath = false, Fixable = false;
  /// A few lines of source around the site, and the first one's number.
  std::string Excerpt;
  unsigned ExcerptLine = 0;
};
struct SiteSink {
  std::vector<SiteRecord> Sites;
};
/// The report's sink for the unit analysed on this thread, or null.
SiteSink *currentSiteSink();
class SiteScope {
public:
  explicit SiteScope(SiteSink *Sink);
  ~SiteScope();

private:
  SiteSink *Saved;
};

} // namespace ulplint

#endif
