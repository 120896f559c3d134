//===- Lifecycle.h - Typestate of registration handles ----------*- C++ -*-===//
//
// The life of a memory region or window as the code drives it:
//
//   produced -> exposed (REG_MR/BIND_MW posted with remote rights, or a
//   remote-capable registration) -> invalidation posted (LOCAL_INV) ->
//   invalidated (or a remote invalidation accepted) -> released (pool put,
//   deregistration, DMA unmap, the request freed or recycled)
//
// Handles are identified by storage: `req->mr` in the submit path and in the
// completion path of the same request type is one handle ("slot"). Events
// are extracted once per function; a path-sensitive solver over Clang's CFG
// then walks each function per slot, with the effects of helpers of the
// same unit applied at their call sites (function summaries), and records
// incidents the lifecycle checks report. Slot-level facts (exposed,
// invalidated, released, key rotated) are exported so ulplint can decide
// questions that span files.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_LIFECYCLE_H
#define ULPLINT_ENGINE_LIFECYCLE_H

#include "Analysis.h"
#include "Slots.h"
#include "llvm/ADT/SetVector.h"
#include <map>
#include <set>

namespace ulplint {

enum class LifeEventKind {
  Produce,          // a handle is stored here (registration, allocation, pool get)
  Expose,           // the key becomes valid for a peer
  Rotate,           // the key is rotated (ib_update_fast_reg_key)
  InvalidatePost,   // LOCAL_INV of the handle's key is posted
  InvalidateRemote, // a remote invalidation of the key is accepted
  Deregister,       // dereg / dealloc: key dead, handle gone
  Release,          // pool put: handle gone, key still valid
  BufferRelease,    // the memory behind the handle is unmapped or freed
  ContainerRelease, // the struct holding the handle is freed or recycled
  Clear,            // the handle is set to NULL
  Overwrite,        // the handle is overwritten
  Escape,           // the handle goes to code the analysis cannot see
  Wait,             // the function waits for a completion
  Call,             // a helper of this unit runs: its summary applies
  Bind,             // memory is put behind the handle (map, rereg, window bind)
  KeyStaged,        // the rkey is written into a message that is not sent yet
  Post,             // work requests are posted: staged keys leave with them
  Fresh,            // the struct holding the handle was just allocated
  Repoint,          // the local naming that struct now names another one
};

struct LifeEvent {
  LifeEventKind K = LifeEventKind::Escape;
  SlotKey Slot;                        // invalid for Wait
  const clang::Stmt *S = nullptr;      // CFG element it happens at
  const clang::FunctionDecl *Fn = nullptr;
  clang::SourceLocation Loc;
  bool Signaled = true;    // InvalidatePost: the LOCAL_INV asks for a completion
  bool Checked = true;     // InvalidateRemote: the invalidated rkey is compared
  bool Reusable = false;   // Produce: pool get / fast-registration MR
  Effect By = Effect::None; // Produce: the call's effect (mr.pool_get, ...)
  bool Stable = true;       // the handle names one object each time (no a[i])
  bool Remote = false;      // Produce: registered with remote rights
  bool Lazy = false;        // Produce: only when the slot is empty (a cache)
  bool Recycle = false;     // ContainerRelease: back to a free list, not freed
  /// ContainerRelease: onto a list the unit only walks (requests in use, a
  /// drop list): the list keeps the handle, nothing reuses it.
  bool Parked = false;
  /// ContainerRelease onto the list a parameter names (`park(mr, list)`):
  /// parked when the caller passes a list the unit only walks.
  const clang::ParmVarDecl *ListParam = nullptr;
  /// Call: the arguments that are lists the unit only walks, by index.
  std::vector<unsigned> WalkedListArgs;
  /// BufferRelease: the registration or mapping that put this memory
  /// behind the handle; Produce / Bind: the call itself.
  const clang::Stmt *Binding = nullptr;
  bool Window = false;     // the handle is a memory window
  /// BufferRelease: memory next to the handle in its struct, perhaps (not
  /// known to be) the memory behind it.
  bool Guessed = false;
  /// BufferRelease: memory this function allocated on every path to the
  /// release, while the handle is bound elsewhere: not the handle's memory.
  bool FreshMemory = false;
  /// KeyStaged: into the caller's memory (a pointer parameter's target)
  /// or a global, not a message of this function.
  bool Outward = false;
  std::string What;        // API in messages: "ib_mr_pool_put", "kfree"
  const clang::Stmt *Via = nullptr; // a helper call the event comes from
  const clang::FunctionDecl *Callee = nullptr; // Call: the helper
  /// Call: integer arguments that carry a handle's key (`inv_rkey(req,
  /// mr->rkey)`), by parameter index.
  struct KeyArg {
    unsigned Param;
    SlotKey Slot;
    bool Stable; // names one handle each time (not `(*pfr)->mr->rkey`)
  };
  std::vector<KeyArg> KeyArgs;
  /// Expose / InvalidatePost from a post: the post call, whose failure
  /// undoes the event on the branch that tests it.
  const clang::Stmt *Post = nullptr;
};

/// "memory window" or "memory region", for messages.
inline const char *handleNoun(bool Window) {
  return Window ? "memory window" : "memory region";
}

/// Something the solver found on a path.
struct LifeIncident {
  enum Kind {
    ReleaseWhileExposed,   // released with the key still valid for the peer
    ReleaseSkipsInvalidation, // other paths of the function invalidate first
    ReleaseBeforeInvalidated, // right after an unawaited LOCAL_INV
    LeakAtReturn,          // a produced handle still held when the function returns
    LeakOverwrite,         // a held handle overwritten or its holder freed
    ReleaseAfterMismatch,  // released after a remote invalidation of another key
  };
  Kind K;
  SlotKey Slot;
  const clang::FunctionDecl *Fn = nullptr;
  const LifeEvent *At = nullptr;           // the release / overwrite event
  bool Window = false;                     // the slot holds a memory window
  const clang::Stmt *Exit = nullptr;       // LeakAtReturn: the return
  const LifeEvent *Produced = nullptr;
  const LifeEvent *Exposed = nullptr;
  const LifeEvent *Invalidation = nullptr;
  const clang::Stmt *ErrorBranch = nullptr; // the early-exit branch taken
  bool Local = false;                       // the handle is a local variable
  /// ReleaseAfterMismatch: the branch where the invalidated rkey was found
  /// to be another key.
  const clang::Stmt *Mismatch = nullptr;
  /// LeakOverwrite of a handle the function did not produce: where the
  /// path learned it was there (a non-null test, its key read).
  const clang::Stmt *HeldAt = nullptr;
  /// The call through which a root reached this incident in a helper.
  const clang::Stmt *Via = nullptr;
  /// Where to report: the call, in the function whose state made the
  /// helper's action wrong (`nvt_unmap_data(req)` in a timeout handler that
  /// never invalidated), or null to report at the action itself.
  const clang::Stmt *Anchor = nullptr;
  const clang::FunctionDecl *AnchorFn = nullptr;
  /// Reached after the function saw a post of its own fail and went on
  /// releasing: its mistake, whatever state its callers entered it in.
  bool OwnFailure = false;
  /// ReleaseWhileExposed in a LOCAL_INV's done callback: the invalidation
  /// was never confirmed by the completion's status, or it failed.
  enum Confirmation { Confirmed, StatusUnchecked, InvalidationFailed };
  Confirmation Unconfirmed = Confirmed;

  /// The location findings about this incident use.
  clang::SourceLocation loc() const;
  /// The call named at loc(): the helper when reported at its call,
  /// otherwise the API that releases.
  std::string what() const;
  /// Note text for the release inside the helper reported at its call.
  std::string releasedHere() const;
  /// "memory window" or "memory region", for messages.
  const char *handleNoun() const;
};

class Lifecycle {
public:
  static const Lifecycle &of(const TuAnalysis &A);
  explicit Lifecycle(const TuAnalysis &A);

  llvm::ArrayRef<LifeEvent> events() const { return Events; }
  llvm::ArrayRef<LifeIncident> incidents() const { return Incidents; }
  /// Does some event of \p K happen to \p Slot in this unit (in \p Fn,
  /// when given)?
  bool has(const SlotKey &Slot, LifeEventKind K,
           const clang::FunctionDecl *Fn = nullptr) const;
  /// The first event of \p K for \p Slot, if any.
  const LifeEvent *first(const SlotKey &Slot, LifeEventKind K) const;
  /// Did some path reach \p Release while the handle was held (not NULL,
  /// not already released)?
  bool releasesHeld(const LifeEvent *Release) const {
    return Holding.count(Release) != 0;
  }
  /// The events and incidents, one per line (--dump-lifecycle).
  void dump(llvm::raw_ostream &OS) const;
  /// "exposes:<slot>" etc., the facts ulplint shares between units.
  static std::string fact(FactKind K, const SlotKey &Slot);

  /// Functions whose walk a budget cut short (their findings may be missing).
  llvm::ArrayRef<const clang::FunctionDecl *> incomplete() const {
    return Incomplete.getArrayRef();
  }

private:
  void exportFacts() const;
  void reportIncomplete() const;

  const TuAnalysis &A;
  std::vector<LifeEvent> Events;
  std::vector<LifeIncident> Incidents;
  /// Events by the statement they happen at, per function.
  std::map<const clang::Stmt *, std::vector<size_t>> AtStmt;
public:
  /// A branch that accepts a remote invalidation.
  struct RemoteInvalidation {
    const clang::IfStmt *If = nullptr;
    bool AcceptThen = true;             // the accepting branch
    std::vector<SlotKey> Slots;         // slots whose key it compares
    bool Checked = false;               // it compares the invalidated rkey
    /// Unchecked here, but passed to this function of another unit, which
    /// may compare it (compares-invalidated-key:<name>).
    std::string External;
    const clang::FunctionDecl *Fn = nullptr;
  };
  llvm::ArrayRef<RemoteInvalidation> remoteInvalidations() const {
    return RemoteInvs;
  }
  /// An equality test of an invalidated rkey against an MR's key.
  struct KeyCompare {
    SlotKey Slot;
    bool EqualWhenTrue = true; // `==`: the keys match when the test holds
  };

private:
  std::vector<RemoteInvalidation> RemoteInvs;
  std::map<const clang::Expr *, KeyCompare> KeyCompares;
  std::set<const LifeEvent *> Holding;
  llvm::SetVector<const clang::FunctionDecl *> Incomplete;
  friend class LifecycleBuilder;
  friend class LifeSolver;
  friend void extractEvents(Lifecycle &L);
};

/// The slot a location names inside \p Fn, after its aliases.
SlotKey slotOf(const TuAnalysis &A, const Location &L,
               const clang::FunctionDecl *Fn);

/// Is \p T a pointer to a memory region or window struct of the models?
bool isHandleType(const TuAnalysis &A, clang::QualType T, bool *Window = nullptr);

} // namespace ulplint

#endif
