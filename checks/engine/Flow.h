//===- Flow.h - Locations, reaching definitions and value evaluation -*- C++ -*-===//
//
// The intra-procedural layer of the engine. A Location names storage the
// analyses track (a variable, optionally followed by fields and array
// elements); FunctionFlow computes, over Clang's CFG, which assignments reach
// each point of a function; ValueEval evaluates flag-like integer
// expressions to the set of values they may have there.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_FLOW_H
#define ULPLINT_ENGINE_FLOW_H

#include "clang/AST/Expr.h"
#include "clang/Analysis/CFG.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include <memory>
#include <optional>
#include <string>

namespace clang {
class ParentMap;
class FunctionDecl;
} // namespace clang

namespace ulplint {

class TuAnalysis;

/// Storage named by an lvalue expression: `req->reg_wr.wr.opcode`,
/// `ctx->mws[i]`, `flags`. Array elements collapse to one location.
struct Location {
  struct Step {
    const clang::FieldDecl *Field = nullptr; // null: array element
    bool operator==(const Step &O) const { return Field == O.Field; }
  };
  const clang::ValueDecl *Root = nullptr;
  llvm::SmallVector<Step, 4> Steps;

  bool operator==(const Location &O) const {
    return Root == O.Root && Steps == O.Steps;
  }
  bool operator!=(const Location &O) const { return !(*this == O); }
  /// An order for keying maps (by address: not stable across runs).
  bool operator<(const Location &O) const {
    if (Root != O.Root)
      return Root < O.Root;
    return std::lexicographical_compare(
        Steps.begin(), Steps.end(), O.Steps.begin(), O.Steps.end(),
        [](const Step &L, const Step &R) { return L.Field < R.Field; });
  }
  /// True when this location is `Other` or lies inside it.
  bool isWithin(const Location &Other) const;
  /// The first \p Len steps.
  Location prefix(size_t Len) const;
  /// The field of the last field step (`mr` in `conn->mrs[i].mr`, `mrs` in
  /// `conn->mrs[i]`), or null.
  const clang::FieldDecl *lastField() const;
  /// Readable spelling: "req->reg_wr.wr.opcode" is written "req.reg_wr.wr.opcode".
  std::string str() const;
  /// Dotted field path after the root ("reg_wr.wr.opcode").
  std::string fieldPath(size_t From = 0) const;
};

/// The initializer of the member named by \p Steps inside the braced
/// initializer \p Init, or null when it cannot tell.
const clang::Expr *subInitializer(const clang::Expr *Init,
                                  llvm::ArrayRef<Location::Step> Steps);

/// The location an lvalue-ish expression names, looking through parens,
/// casts, `*p` and `&x`. Does not follow aliases (see FunctionFlow::resolve).
std::optional<Location> locationOf(const clang::Expr *E);

/// Strip parens, implicit and explicit casts.
const clang::Expr *stripExpr(const clang::Expr *E);
/// The statement a branch ends with: \p S itself, or the last statement of
/// its block, through nested blocks (null for an empty block).
const clang::Stmt *lastStatement(const clang::Stmt *S);
/// The values \p Fn's return statements give back, in body order.
llvm::SmallVector<const clang::Expr *, 4> returnValues(const clang::FunctionDecl *Fn);
/// The condition an if, for, while or do statement tests, or null.
const clang::Expr *conditionOf(const clang::Stmt *S);
/// Is \p S inside \p Outer (a descendant in \p PM)?
bool isInside(const clang::ParentMap &PM, const clang::Stmt *S,
              const clang::Stmt *Outer);
/// The innermost for, while or do loop around \p S (null outside loops).
const clang::Stmt *enclosingLoop(const clang::ParentMap &PM, const clang::Stmt *S);

/// The initializer of the member named by \p Steps inside the braced
/// initializer \p Init (semantic form), or null when it cannot tell.


/// One assignment to a location inside a function.
struct Def {
  enum Kind {
    Assign,   // L = V, or a declaration with an initializer
    Compound, // L op= V
    Increment,
    Zero,     // memset(&L, 0, ...) or an implicitly zeroed member
    Unknown,  // &L escaped to a call, or L declared without initializer
  };
  Kind K = Unknown;
  Location Target;
  const clang::Stmt *S = nullptr;      // the assignment / declaration / call
  const clang::Expr *Value = nullptr;  // right-hand side or initializer
  clang::BinaryOperatorKind Op = clang::BO_Assign;
};

/// Reaching definitions for the locations written in one function.
class FunctionFlow {
public:
  FunctionFlow(const clang::FunctionDecl *FD, clang::ASTContext &Ctx);
  ~FunctionFlow();

  const clang::FunctionDecl *function() const { return FD; }
  const clang::CFG *cfg() const { return Graph.get(); }
  const clang::ParentMap &parents() const { return *PM; }
  llvm::ArrayRef<Def> defs() const { return Defs; }
  /// Does a definition stand at \p S?
  bool definesAt(const clang::Stmt *S) const { return DefsAt.count(S); }
  /// The last definition at \p S of \p L or of storage containing it.
  const Def *lastDefAt(const clang::Stmt *S, const Location &L) const;

  /// Definitions of \p L (or of storage containing it) that may reach \p At;
  /// a null entry stands for the value \p L has when the function starts.
  llvm::SmallVector<const Def *, 4> reaching(const Location &L,
                                             const clang::Stmt *At) const;
  /// Does only the value \p L had on entry reach \p At (a parameter as
  /// the caller passed it: no assignment in the function reaches)?
  bool onlyEntryValue(const Location &L, const clang::Stmt *At) const {
    auto Defs = reaching(L, At);
    return Defs.size() == 1 && !Defs.front();
  }
  /// Follows single-assignment local pointers: `mr` after `mr = req->mr`
  /// resolves to `req.mr`.
  Location resolve(Location L) const;
  /// Can control flow get from \p From to \p To?
  bool reachableFrom(const clang::Stmt *From, const clang::Stmt *To) const;

  /// Memos of this function's queries (Flow.cpp): reaching() by (statement,
  /// location) and ValueEval's values of a location at a statement by
  /// (statement, location, depth). Both are pure functions of their key, so
  /// every ValueEval made for the function shares them.
  struct Memo;
  Memo &memo() const;

private:
  void collectDefs();
  void addDef(Def D);
  void solve();
  llvm::SmallVector<const Def *, 4> solveReaching(const Location &L,
                                                  const clang::Stmt *At) const;
  std::pair<const clang::CFGBlock *, unsigned> position(const clang::Stmt *S) const;

  const clang::FunctionDecl *FD;
  clang::ASTContext &Ctx;
  std::unique_ptr<clang::CFG> Graph;
  std::unique_ptr<clang::ParentMap> PM;
  llvm::SmallVector<Def, 16> Defs;
  llvm::DenseMap<const clang::Stmt *, llvm::SmallVector<unsigned, 1>> DefsAt;
  llvm::DenseMap<const clang::Stmt *, std::pair<const clang::CFGBlock *, unsigned>>
      Positions;
  std::vector<llvm::BitVector> In; // per block ID
  mutable std::unique_ptr<Memo> Memos;
  llvm::DenseMap<const clang::ValueDecl *, const Def *> SingleDef;
};

/// A set of possible values of a bit-flag expression. Each alternative knows
/// the bits it surely sets and the bits it may set (unknown contributions).
struct FlagAlt {
  uint64_t Known = 0;
  uint64_t Maybe = 0;
  const clang::Stmt *Origin = nullptr;          // definition it came from
  const clang::Expr *TransportTest = nullptr;   // chosen by a transport test
  bool FromCoreHelper = false;                  // e.g. regcore_access_flags()

  bool exact() const { return Maybe == 0; }
  bool mayHave(uint64_t Bits) const { return (Known | Maybe) & Bits; }
  bool has(uint64_t Bits) const { return (Known & Bits) == Bits; }
};

struct FlagSet {
  llvm::SmallVector<FlagAlt, 4> Alts;
  static FlagSet unknown(const clang::Stmt *Origin = nullptr);
  static FlagSet constant(uint64_t V, const clang::Stmt *Origin = nullptr);
  void add(const FlagSet &O);
  bool empty() const { return Alts.empty(); }
  /// First alternative chosen by a transport test, if any.
  const FlagAlt *transportDependent() const;
};

/// Evaluates integer flag expressions inside one function.
class ValueEval {
public:
  ValueEval(const TuAnalysis &A, const FunctionFlow &Flow, unsigned BaseDepth = 0)
      : A(A), Flow(Flow), BaseDepth(BaseDepth) {}

  FlagSet flags(const clang::Expr *E) const;
  /// Value of \p L (as named in this function) when \p At executes.
  FlagSet flagsAt(const Location &L, const clang::Stmt *At) const;
  /// Value of \p L right after the definition(s) made by statement \p At.
  FlagSet flagsAfter(const Location &L, const clang::Stmt *At) const;
  /// The expression is (or reads a local computed from) a transport test.
  const clang::Expr *transportTest(const clang::Expr *Cond) const;
  /// The if-statement condition testing the transport that controls \p S.
  const clang::Expr *controllingTransportTest(const clang::Stmt *S) const;
  /// Integer constant value, if the expression folds.
  std::optional<int64_t> constant(const clang::Expr *E) const;

private:
  FlagSet eval(const clang::Expr *E, unsigned Depth) const;
  FlagSet evalDef(const Def &D, unsigned Depth) const;
  FlagSet evalLocation(const clang::Stmt *Use, const Location &L,
                       unsigned Depth) const;
  FlagSet evalLocationUncached(const clang::Stmt *Use, const Location &L,
                               unsigned Depth) const;
  FlagSet evalReaching(const Def &D, const Location &L, unsigned Depth) const;
  FlagSet fromCallers(const Location &L, unsigned Depth) const;
  /// Values a helper of this unit returns, whatever its arguments.
  FlagSet evalCall(const clang::CallExpr *CE, unsigned Depth) const;

  const TuAnalysis &A;
  const FunctionFlow &Flow;
  unsigned BaseDepth;
};

} // namespace ulplint

#endif
