//===- Inventory.h - Where a unit manages registration by hand --*- C++ -*-===//
//
// The migration view of a translation unit: every place that allocates,
// maps, registers or invalidates memory, sizes a send queue or handles a
// remote invalidation itself, with the role the memory plays (exposed to the
// peer, moved by RDMA READ/WRITE, local) and the core API that replaces it
// (rules/api/*.yaml, `migration`). rdma-local-mr-management and
// rdma-registration-in-datapath report from it; `ulplint report` collects it
// through a SiteScope.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_INVENTORY_H
#define ULPLINT_ENGINE_INVENTORY_H

#include "Analysis.h"
#include "Facts.h"
#include "clang/Basic/Diagnostic.h"
#include <map>
#include <string>
#include <vector>

namespace ulplint {

struct ReadSink;

enum class SiteKind {
  Allocation,         // ib_alloc_mr, ibv_reg_mr, ibv_alloc_mw, pool init/get
  Mapping,            // ib_map_mr_sg
  RegistrationPost,   // IB_WR_REG_MR, IBV_WR_BIND_MW, ibv_bind_mw
  Invalidation,       // LOCAL_INV, dereg, dealloc, pool put
  QueueSizing,        // max_send_wr chosen by the ULP
  RemoteInvalidation, // a WITH_INV completion accepted by the ULP
  CoreManaged,        // rdma_rw / regcore: already migrated
};

/// What the registered memory is for; picks the replacement API.
enum class SiteRole { Expose, DataTransfer, Local };

llvm::StringRef siteKindName(SiteKind K);
llvm::StringRef siteRoleName(SiteRole R);
/// The `migration` entry of the rules that replaces sites of role \p R.
MigrationKey migrationKeyOf(SiteRole R);

struct RegistrationSite {
  SiteKind Kind = SiteKind::Allocation;
  SiteRole Role = SiteRole::Local;
  clang::SourceLocation Loc;
  const clang::FunctionDecl *Fn = nullptr;
  std::string Api;                 // "ib_alloc_mr", "IB_WR_REG_MR", ...
  const ApiCall *Call = nullptr;   // for calls
  bool Datapath = false;           // runs per I/O (see Datapath below)
  /// The registration-cache rewrite (regcoreCacheRewrite), if mechanical.
  std::vector<clang::FixItHint> Fixes;
  bool FixInPlace = false;
  bool fixable() const { return !Fixes.empty(); }
};

/// Why a function runs once per I/O.
/// Does \p C post send work requests or reap completions (what puts its
/// caller on the data path)?
bool isDatapathCall(const ApiCall &C);

struct DatapathReason {
  const clang::FunctionDecl *Seed = nullptr; // the submit or completion function
  clang::SourceLocation At;                  // its post or poll, or its decl
  std::string What;                          // "posts work requests (ibv_post_send)"
  /// Seeded by the call of a helper that posts, not by a post: weaker
  /// evidence (a setup function may send a message through the helper).
  bool Indirect = false;
};

/// Where the MR a (de)registration call produces or releases is stored.
std::optional<Location> registeredHandle(const TuAnalysis &A, const ApiCall &C);

class Inventory {
public:
  static const Inventory &of(const TuAnalysis &A);
  explicit Inventory(const TuAnalysis &A);

  llvm::ArrayRef<RegistrationSite> sites() const { return Sites; }
  /// The submit and completion paths: functions that post send work
  /// requests or reap completions, and every function of the unit they
  /// call. Null when \p Fn is not on them.
  const DatapathReason *datapath(const clang::FunctionDecl *Fn) const;
  /// Does the registration call \p C run per I/O? Its function is on the
  /// data path; when only through a helper that posts, it registers memory
  /// the I/O brings or deregisters an MR registered per I/O.
  bool onDatapath(const ApiCall &C) const;
  /// A session function (`echo_serve_one`, a benchmark's run loop) posts
  /// and polls only inside loops: \p S, outside every loop of \p Fn, is
  /// its setup or teardown and runs once per session, not per I/O.
  bool outsideIoLoop(const clang::FunctionDecl *Fn, const clang::Stmt *S) const;
  /// The core API that replaces a site (rules/api/*.yaml, `migration`).
  std::string replacement(const RegistrationSite &S) const;
  std::string replacement(MigrationKey Key) const;

private:
  void collectCalls();
  void collectWorkRequests();
  void collectQueues();
  void collectRemoteInvalidations();
  void findDatapath();
  SiteRole roleOf(const ApiCall &C) const;
  const ApiCall *producerOf(const ApiCall &C) const;
  SiteRole unitRole() const;
  void scanWorkRequests();
  bool addressesRdma(const ApiCall &C) const;
  void add(RegistrationSite S);
  void exportSites() const;

  const TuAnalysis &A;
  std::vector<RegistrationSite> Sites;
  std::map<const clang::FunctionDecl *, DatapathReason> Datapath;
  bool PostsRdma = false; // the unit moves data with RDMA READ/WRITE itself
  bool UsesRdmaRw = false; // the unit calls rdma_rw_ctx_init
  SiteRole UnitRole = SiteRole::Local; // see unitRole()
  std::vector<ReadSink> RdmaBuffers; // local sides of RDMA READ/WRITE
};

/// The rewrite of a registration call into the registration cache:
/// `mr = ibv_reg_mr(pd, a, l, f);` -> `regcore_mr_get(core, a, l, f, &mr);`,
/// the handle's type to `struct regcore_mr`, each `ibv_dereg_mr(mr)` to
/// `regcore_mr_put(core, mr)`. Empty unless the rewrite is mechanical: a
/// `struct regcore *` in scope at every rewritten call, the handle declared
/// in the main file and only used for its keys, null tests and the calls
/// rewritten. \p InPlace tells whether the handle is a local variable (the
/// fix stays inside the function) or a struct field.
std::vector<clang::FixItHint> regcoreCacheRewrite(const TuAnalysis &A,
                                                  const ApiCall &Registration,
                                                  bool &InPlace);

} // namespace ulplint

#endif
