//===- Linear.h - Queue sizes as a*X + b over named quantities --*- C++ -*-===//
//
// `init_attr.cap.max_send_wr = factor * queue->queue_size + 1` evaluates to
// 3*queue->queue_size + 1 when every caller passes factor = 3. Terms are named
// by their source text so reports can quote them.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_LINEAR_H
#define ULPLINT_ENGINE_LINEAR_H

#include "clang/AST/Expr.h"
#include "llvm/ADT/SmallVector.h"
#include <optional>
#include <string>

namespace ulplint {

class TuAnalysis;

struct LinearTerm {
  int64_t Coef = 1;
  std::string Symbol;                 // source text: "queue->queue_size"
  const clang::Expr *E = nullptr;
  /// A named constant (`#define NBDR_SLOTS 64`, an enumerator): a quantity
  /// the code names, so it can be a queue depth, whose value is known.
  std::optional<int64_t> Value;
  /// The quantity reads a device limit (attrs.max_qp_wr).
  bool Limit = false;
  /// A product of two quantities neither of which is constant
  /// (`ep->re_max_requests * depth`): Symbol is the product, Factors its
  /// operands' texts.
  llvm::SmallVector<std::string, 2> Factors;
};

struct Linear {
  int64_t Const = 0;
  llvm::SmallVector<LinearTerm, 2> Terms;
  bool Opaque = false;         // part of the value could not be expressed
  bool ReadsDeviceLimit = false; // mentions max_qp_wr, max_sge, ...
  bool UsesCoreSizing = false; // rdma_rw_max_send_wr(), regcore, ...
  bool FromHelperFactor = false; // a factor computed by rdma_rw_mr_factor()

  /// Every term has a known value.
  bool isConstant() const { return value().has_value(); }
  /// The number this evaluates to, named constants included.
  std::optional<int64_t> value() const;
  /// Terms whose value is not known (the queue depths of `a*X + b`).
  bool hasUnknownTerms() const;
  /// "3*queue->queue_size+1"
  std::string str() const;
};

/// Evaluates \p E in \p Fn symbolically.
Linear evalLinear(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                  const clang::Expr *E);
/// The value of storage \p L (as named in \p Fn) right before \p At, through
/// assignments, `+=`/`-=` and initializers on every path; nullopt when no
/// definition in \p Fn reaches.
std::optional<Linear> linearAt(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                               const Location &L, const clang::Stmt *At);
/// The value of \p L right after the definition made by \p At.
std::optional<Linear> linearAfter(const TuAnalysis &A,
                                  const clang::FunctionDecl *Fn,
                                  const Location &L, const clang::Stmt *At);

} // namespace ulplint

#endif
