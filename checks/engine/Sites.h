//===- Sites.h - Places where the analyses' questions are asked -*- C++ -*-===//
//
// Derived facts several checks share: where access rights are requested,
// which memory region a work request or bind names.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_SITES_H
#define ULPLINT_ENGINE_SITES_H

#include "Analysis.h"

namespace ulplint {

/// A place that requests access rights for memory.
struct AccessSite {
  enum Kind {
    Registration, // ibv_reg_mr and variants, rdma_reg_*
    FastReg,      // IB_WR_REG_MR: ib_reg_wr.access
    WindowBind,   // memory window bind: mw_access_flags / ibv_wr_bind_mw
    DeviceKey,    // mlx5dv_wr_mr_list / _interleaved
  };
  Kind K = Registration;
  const clang::FunctionDecl *Fn = nullptr;
  /// The flags expression as written (argument or stored value); null when
  /// the flags are implied by the call (rdma_reg_write).
  const clang::Expr *Flags = nullptr;
  clang::SourceLocation Loc;
  FlagSet Value;
  const ApiCall *Call = nullptr;
  const FieldStore *Store = nullptr;
  Domain D = Domain::Userspace;
  /// The API named in messages: "ibv_reg_mr", "IB_WR_REG_MR", ...
  std::string What;
  /// The memory region whose rights these are (the call's result, the
  /// reg_wr.mr / bind_info.mr member), when known.
  std::optional<Location> Region;
  const clang::FunctionDecl *RegionFn = nullptr; // function naming Region
};

/// Every place the unit requests access rights, computed once per unit.
struct AccessSites {
  static const AccessSites &of(const TuAnalysis &A);
  explicit AccessSites(const TuAnalysis &A);
  std::vector<AccessSite> All;
};

/// A site inside a helper that takes the flags or the MR as parameters
/// (`lab_reg(d, d->bounce_mr, &sg, IB_ACCESS_LOCAL_WRITE | ...)`), seen at
/// each call of the unit with what that caller passes: Fn and Loc are the
/// caller and the call. Empty when the site takes neither from parameters.
std::vector<AccessSite> siteAtCalls(const TuAnalysis &A, const AccessSite &S);

/// Does some RDMA READ of the unit land in the MR stored in \p Region, as
/// registered in \p RegFn (any registration when null)?
bool isReadSink(const TuAnalysis &A, const Location &Region,
                const clang::FunctionDecl *Fn,
                const clang::FunctionDecl *RegFn = nullptr);

/// The opcodes a store into a work request's opcode field may write.
llvm::SmallVector<Opcode, 2> opcodesOf(const TuAnalysis &A,
                                       const FieldStore &OpcodeStore);

/// Local memory that receives an RDMA READ.
struct ReadSink {
  const clang::FunctionDecl *Fn = nullptr;
  clang::SourceLocation ReadLoc;          // where the READ is built or posted
  std::optional<Location> Region;         // the MR whose lkey addresses it
  const clang::FunctionDecl *RegionFn = nullptr; // function naming Region
  bool LocalDmaLkey = false;              // addressed with pd->local_dma_lkey
};
std::vector<ReadSink> readSinks(const TuAnalysis &A);
/// Local memory of RDMA READs and WRITEs (sinks and sources).
std::vector<ReadSink> rdmaLocalBuffers(const TuAnalysis &A);

/// Where a read of an MR's rkey takes the key: nowhere (a comparison, an
/// invalidation, a rotation), into memory a later post sends (a message, a
/// descriptor), or to code the analysis cannot see.
enum class KeyUse { Local, Staged, Leaves };
KeyUse rkeyUse(const TuAnalysis &A, const clang::FunctionDecl *Fn,
               const clang::Expr *Read);

/// Does this read of an MR's rkey (`mr->rkey`) hand the key to anyone: a
/// message, a descriptor, a function of another unit? Comparisons,
/// invalidations and rotations keep it local; copies into locals and
/// helpers' parameters are followed.
bool rkeyReadLeaves(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                    const clang::Expr *Read);

/// Can the rkey of the MR stored in \p Region (as named in \p Fn) reach a
/// peer, or code the analysis cannot see? Comparisons, invalidations, key
/// rotation and the MR's own fast registration keep it local.
bool rkeyMayLeave(const TuAnalysis &A, const Location &Region,
                  const clang::FunctionDecl *Fn);

/// The sites that give the memory region stored in \p Region (as named in
/// \p Fn) its rights: registrations whose result lands there, directly or
/// through a helper's return value, and fast registrations of that MR. A
/// registration in \p Fn itself is preferred over ones elsewhere.
std::vector<const AccessSite *> rightsOf(const TuAnalysis &A,
                                         llvm::ArrayRef<AccessSite> Sites,
                                         const Location &Region,
                                         const clang::FunctionDecl *Fn);

/// The sites that give the sink of a READ (or the source of a WRITE) its
/// rights, as seen from the function that builds or posts it: rightsOf()
/// its region, preferring registrations requested in that same function
/// (`lmig_pull_dirty()` sets reg_wr.access itself and lets a helper build
/// the READ).
std::vector<const AccessSite *> sinkRights(const TuAnalysis &A,
                                           llvm::ArrayRef<AccessSite> Sites,
                                           const ReadSink &Sink);

/// Spelled names of the access bits set in \p Bits: "IBV_ACCESS_REMOTE_WRITE".
std::string accessNames(const TuAnalysis &A, Domain D, uint64_t Bits);

} // namespace ulplint

#endif
