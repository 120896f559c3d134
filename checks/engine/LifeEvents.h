//===- LifeEvents.h - Inside the lifecycle model ----------------*- C++ -*-===//
//
// Pieces shared by the three parts of the lifecycle model: event extraction
// (LifeEvents.cpp), remote-invalidation recognition (RemoteInvalidation.cpp)
// and the path-sensitive solver (LifeSolver.cpp). Not for checks: they read
// Lifecycle.h.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_LIFEEVENTS_H
#define ULPLINT_ENGINE_LIFEEVENTS_H

#include "Lifecycle.h"
#include "Program.h"
#include <map>

namespace ulplint {

/// How far the lifecycle model follows things. Each bound degrades to a
/// sound answer ("not a key", "no effect known"); the solver's own bounds
/// are in LifeSolver.cpp and report the functions they cut short.
namespace budget {
/// Copies followed from an rkey value back to its MR (`u32 k = mr->rkey`).
constexpr unsigned KeyCopyDepth = 4;
/// Helper calls followed when summarising a helper's effects.
constexpr unsigned SummaryDepth = 3;
/// Helpers looked into for a comparison of the invalidated rkey.
constexpr unsigned InvalidatedKeyHelperDepth = 2;
/// Nesting of `!`, likely() and statement expressions around a null test.
constexpr unsigned NullTestDepth = 16;
/// CFG blocks from an early-exit branch to its goto or return.
constexpr unsigned ErrorExitHops = 3;
} // namespace budget

/// Does \p Fn receive a completion (a work completion parameter)?
bool takesCompletion(const TuAnalysis &A, const clang::FunctionDecl *Fn);

/// The handle whose key an rkey/lkey expression reads: `mr->rkey` -> mr.
std::optional<Location> keyOwner(const TuAnalysis &A, const clang::Expr *E);

/// Reads of a completion's flags or invalidated rkey, through copies such as
/// xprtrdma's `rep->rr_wc_flags = wc->wc_flags`.
class CompletionFields {
public:
  explicit CompletionFields(const TuAnalysis &A);
  /// WcFlags / InvalidatedRkey for an expression that reads one.
  std::optional<FieldRole> role(const clang::FunctionDecl *Fn,
                                const clang::Expr *E) const;
  /// Does field \p F hold a copy of a completion's invalidated rkey?
  bool isInvalidatedKeyCopy(const clang::FieldDecl *F) const;
  /// Does \p E read the opcode of a completion (`wc->opcode`, a copy)?
  bool isCompletionOpcode(const clang::FunctionDecl *Fn, const clang::Expr *E) const {
    return role(Fn, E) == FieldRole::WcOpcode;
  }

private:
  /// The role of a value stored as a copy: `(flags & WITH_INV) ?
  /// read_invalidated_rkey(cq) : 0` is the invalidated rkey too.
  std::optional<FieldRole> copiedRole(const clang::FunctionDecl *Fn,
                                      const clang::Expr *Value) const;

  const TuAnalysis &A;
  std::map<SlotKey, FieldRole> Copies;
  /// Fields of a completion context on the poller's stack (`rx.inv_rkey =
  /// wc[i].invalidated_rkey`, `&rx` handed to the handlers), by field.
  std::map<const clang::FieldDecl *, FieldRole> StackCopies;
};

/// Which MR an rkey value belongs to.
class KeyTracker {
public:
  explicit KeyTracker(const TuAnalysis &A);
  /// The slot of the MR whose key \p E holds, directly or through a copy.
  std::optional<SlotKey> keySlot(const clang::FunctionDecl *Fn,
                                 const clang::Expr *E, unsigned Depth = 0) const;
  /// The slot of an integer parameter of \p Fn whose entry value \p E is
  /// (`srp_inv_rkey(req, ch, u32 rkey)`): the key the caller passes.
  std::optional<SlotKey> keyParameter(const clang::FunctionDecl *Fn,
                                      const clang::Expr *E) const;
  /// A key field no code ties to a handle (`inv.invalidate_rkey = r->key`
  /// with the window bound in another unit): the one handle of its struct.
  std::optional<SlotKey> soleHandleNextTo(const clang::FunctionDecl *Fn,
                                          const clang::Expr *E) const;

private:
  std::vector<SlotKey> holdersOf(const clang::FunctionDecl *Fn,
                                 const clang::Expr *Value,
                                 const clang::Stmt *At) const;

  const TuAnalysis &A;
  /// `x->f = mr->rkey` anywhere in the unit makes x->f a holder of mr's key.
  std::map<SlotKey, SlotKey> Holders;
};

/// The branches of \p Fn that accept a remote invalidation and whether they
/// compare the invalidated rkey.
/// The equality tests of an invalidated rkey against an MR's key go to
/// \p Compares. A function that compares a key its caller passes exports
/// compares-invalidated-key:<name> for callers in other units.
std::vector<Lifecycle::RemoteInvalidation>
findRemoteInvalidations(const TuAnalysis &A, const CompletionFields &CF,
                        const KeyTracker &Keys, const clang::FunctionDecl *Fn,
                        std::map<const clang::Expr *, Lifecycle::KeyCompare> &Compares);

/// Extracts every function's events into \p L, helpers' effects included.
void extractEvents(Lifecycle &L);

} // namespace ulplint

#endif
