//===- Analysis.h - The shared per-translation-unit engine ------*- C++ -*-===//
//
// One TuAnalysis exists per translation unit. It is built once, on the first
// check that asks for it, and every rdma-* check reads the same facts: the
// modelled API calls, the stores into modelled struct fields (work requests,
// bind infos, QP attributes), and per-function data flow.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_ANALYSIS_H
#define ULPLINT_ENGINE_ANALYSIS_H

#include "Facts.h"
#include "Flow.h"
#include "Rules.h"
#include "Slots.h"
#include "clang/Basic/SourceLocation.h"
#include "llvm/ADT/DenseMap.h"
#include <map>
#include <memory>
#include <vector>

namespace clang {
class ASTContext;
class CallExpr;
class FunctionDecl;
class SourceManager;
} // namespace clang

namespace ulplint {

/// A call to a modelled API function inside an analysed function.
struct ApiCall {
  const clang::CallExpr *Call = nullptr;
  const FunctionModel *Model = nullptr;
  const clang::FunctionDecl *Caller = nullptr;

  /// The argument with \p Role, or null when the model has no such role.
  const clang::Expr *arg(ArgRole Role) const;
};

/// A store into a field with a modelled role: `wr.opcode = IBV_WR_SEND`,
/// `req->reg_wr.access = ...`, a designated initializer `.opcode = ...`.
struct FieldStore {
  const StructModel *Struct = nullptr;
  FieldRole Role = FieldRole::Opcode;
  /// The object the field belongs to (`req.reg_wr.wr` for a work request;
  /// containers such as ib_reg_wr are normalised to their embedded WR).
  Location Object;
  /// The stored location itself (`req.reg_wr.access`).
  Location Target;
  const clang::Expr *Value = nullptr; // null for a zeroing store
  const clang::Stmt *At = nullptr;    // assignment, declaration or call
  const clang::Expr *Spelling = nullptr; // for diagnostics: LHS or init
  bool Compound = false;
  const clang::FunctionDecl *Fn = nullptr;
};

/// What the engine knows about one translation unit.
class TuAnalysis {
public:
  /// The analysis of \p Ctx's translation unit, built on first use and freed
  /// with the ASTContext. \p Wrappers is the ApiWrappers option (see
  /// parseApiWrappers); the first check of the unit decides it.
  static TuAnalysis &get(clang::ASTContext &Ctx, llvm::StringRef Wrappers = "");

  explicit TuAnalysis(clang::ASTContext &Ctx, llvm::StringRef Wrappers = "");
  ~TuAnalysis();

  clang::ASTContext &context() const { return Ctx; }
  const clang::SourceManager &sources() const;
  const Rules &rules() const { return R; }
  /// Kernel when the unit is compiled with __KERNEL__, else userspace.
  Domain domain() const { return TuDomain; }

  llvm::ArrayRef<const clang::FunctionDecl *> functions() const {
    return Functions;
  }
  llvm::ArrayRef<ApiCall> calls() const { return Calls; }
  llvm::ArrayRef<FieldStore> stores() const { return Stores; }

  const FunctionModel *modelOf(const clang::CallExpr *CE) const;
  /// Direct calls to \p Callee from analysed functions, with their callers.
  std::vector<std::pair<const clang::CallExpr *, const clang::FunctionDecl *>>
  callersOf(const clang::FunctionDecl *Callee) const;
  /// Calls to \p Callee inside \p Caller.
  std::vector<const clang::CallExpr *> callsTo(const clang::FunctionDecl *Caller,
                                               const clang::FunctionDecl *Callee) const;

  /// A model derived from this analysis (work requests, lifecycles, ...),
  /// built on first use: T must be constructible from a TuAnalysis.
  template <typename T> const T &cached() const {
    static const char Key = 0;
    std::shared_ptr<void> &Slot = Derived[&Key];
    if (!Slot)
      Slot = std::shared_ptr<void>(new T(*this),
                                   [](void *P) { delete static_cast<T *>(P); });
    return *static_cast<const T *>(Slot.get());
  }
  FunctionFlow &flow(const clang::FunctionDecl *FD) const;
  /// A value evaluator for expressions inside \p FD.
  ValueEval values(const clang::FunctionDecl *FD) const;

  /// The modelled struct of a record type (through pointers and typedefs).
  const StructModel *structOf(clang::QualType T) const;
  /// A pointer to a connection-lifetime object (QP, CQ, PD, cm_id, ...:
  /// connection_types in rules/).
  bool isConnectionPointer(clang::QualType T) const;
  /// A struct that holds such a pointer: a connection, device or server.
  bool holdsConnection(const clang::RecordDecl *RD) const;
  /// Storage reached through a field of such a struct, or a global
  /// (`&c->pool.slots[i]`, `g_store.leases`): kept by the connection, not
  /// by one request.
  bool ownedByConnection(const clang::Expr *E) const;
  /// Role of a member access chain, with the object that owns the field.
  /// `req->reg_wr.wr.opcode` -> (ib_send_wr model, "opcode", req.reg_wr.wr).
  std::optional<FieldStore> classifyMember(const clang::Expr *LValue) const;
  /// Same for a location (used for members set by braced initializers).
  std::optional<FieldStore> classify(const Location &Target) const;

  /// Where the result of a modelled call is stored (`ctx->mr = ibv_reg_mr(...)`).
  std::optional<Location> resultOf(const clang::CallExpr *CE) const;
  /// True when two locations, each read in its own function, name the same
  /// storage: equal after alias resolution in one function, or reached
  /// through pointers to the same struct field (one shared SlotKey) across two.
  bool sameStorage(const Location &L1, const clang::FunctionDecl *F1,
                   const Location &L2, const clang::FunctionDecl *F2) const;
  /// sameStorage() of locations already resolved in their functions, with
  /// their slot keys: for callers that bucket stores by that key.
  bool sameResolvedStorage(const Location &R1, const clang::FunctionDecl *F1,
                           const SlotKey &K1, const Location &R2,
                           const clang::FunctionDecl *F2, const SlotKey &K2) const;
  /// True when storage \p L1 (read in \p F1) lies inside \p L2 (in \p F2).
  bool withinStorage(const Location &L1, const clang::FunctionDecl *F1,
                     const Location &L2, const clang::FunctionDecl *F2) const;
  /// Calls whose result is stored in \p Handle (registrations, allocations).
  /// Helpers of this unit count: `mr = ulp_get_mr(c)` where ulp_get_mr
  /// returns what ib_mr_pool_get() gave it.
  std::vector<const ApiCall *> producersOf(const Location &Handle,
                                           const clang::FunctionDecl *Where,
                                           llvm::ArrayRef<Effect> Effects,
                                           unsigned Depth = 0) const;
  /// Modelled calls whose result \p FD returns.
  std::vector<const ApiCall *> returnedProducers(const clang::FunctionDecl *FD,
                                                 llvm::ArrayRef<Effect> Effects,
                                                 unsigned Depth = 0) const;

  /// A read of tracked storage: the expression and the function it is in.
  struct Use {
    const clang::Expr *E;
    const clang::FunctionDecl *Fn;
  };
  /// Every expression in an analysed function that names \p Handle.
  std::vector<Use> usesOf(const Location &Handle,
                          const clang::FunctionDecl *Where) const;

  /// The member of \p Object that has \p Role in its struct model
  /// (`wr` + send_flags -> `wr.send_flags`), if the model names one.
  std::optional<Location> member(const Location &Object, FieldRole Role) const;

  /// Value of an enumerator declared in the unit, by name.
  std::optional<int64_t> enumValue(llvm::StringRef Name) const;
  /// Name of the enumerator of \p T's enum type with value \p V.
  llvm::StringRef enumeratorName(clang::QualType T, int64_t V) const;


  /// The value of \p F's enumerator in this unit's API (its headers), or 0
  /// when the unit does not declare it.
  uint64_t flagBit(Flag F) const;
  /// Spelling of \p F in this unit's API.
  llvm::StringRef flagName(Flag F) const { return R.flagName(TuDomain, F); }

private:
  void collect();
  void collectFunction(const clang::FunctionDecl *FD);
  void addInitStores(const clang::FunctionDecl *FD, const clang::Stmt *At,
                     const Location &Object, clang::QualType T,
                     const clang::Expr *Init);

  clang::ASTContext &Ctx;
  const Rules &R;
  Domain TuDomain = Domain::Userspace;
  std::vector<const clang::FunctionDecl *> Functions;
  std::vector<ApiCall> Calls;
  std::vector<FieldStore> Stores;
  mutable llvm::DenseMap<const clang::FunctionDecl *,
                         std::unique_ptr<FunctionFlow>>
      Flows;
  mutable std::map<Flag, uint64_t> FlagBits;
  llvm::DenseMap<const clang::CallExpr *, Location> Results;
  std::vector<std::pair<const clang::CallExpr *, const clang::FunctionDecl *>>
      DirectCalls;
  /// DirectCalls by canonical callee (callersOf), built on first use.
  mutable llvm::DenseMap<
      const clang::FunctionDecl *,
      std::vector<std::pair<const clang::CallExpr *, const clang::FunctionDecl *>>>
      CallersByCallee;
  mutable size_t CallersIndexed = 0;
  mutable llvm::DenseMap<const void *, std::shared_ptr<void>> Derived;
  llvm::StringMap<const FunctionModel *> Wrappers;
  mutable bool EnumsIndexed = false;
  mutable llvm::StringMap<int64_t> Enumerators;
  llvm::DenseMap<const clang::CallExpr *, const clang::FunctionDecl *> CallerOf;
};

/// Parses the ApiWrappers option, `wrapper=modelled;...`: calls to a
/// project's own `wrapper` (same arguments) count as calls to the modelled
/// API function, e.g. `ulp_post_send=ib_post_send;ulp_get_mr=ib_mr_pool_get`.
llvm::Expected<llvm::StringMap<const FunctionModel *>>
parseApiWrappers(llvm::StringRef Spec, const Rules &R);

/// The source location a diagnostic about \p E should use: where the user
/// wrote it, even when \p E comes out of a macro from a system header.
clang::SourceLocation userLoc(const clang::SourceManager &SM,
                              clang::SourceLocation Loc);
/// The user-written text range of \p E, or an invalid range when \p E is not
/// a contiguous piece of the user's code (e.g. part of a macro body).
clang::CharSourceRange userRange(const clang::ASTContext &Ctx,
                                 const clang::Expr *E);
/// Source text of \p E as written, for messages.
std::string sourceText(const clang::ASTContext &Ctx, const clang::Expr *E);

} // namespace ulplint

#endif
