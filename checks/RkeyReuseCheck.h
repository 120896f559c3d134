//===- RkeyReuseCheck.h - rdma-rkey-reuse ---*- C++ -*-===//

#ifndef ULPLINT_CHECKS_RKEYREUSECHECK_H
#define ULPLINT_CHECKS_RKEYREUSECHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// MRs re-registered and windows re-bound without rotating the key. Docs: docs/checks/rdma-rkey-reuse.md
class RkeyReuseCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  bool reportAtCallers(const TuAnalysis &A, const clang::FunctionDecl *Fn,
                       const clang::Expr *Key, const clang::Stmt *At,
                       const clang::Expr *Bound, unsigned Depth);
};

} // namespace ulplint

#endif
