//===- AccessFlagsInvalidCheck.h - rdma-access-flags-invalid ----*- C++ -*-===//

#ifndef ULPLINT_CHECKS_ACCESSFLAGSINVALIDCHECK_H
#define ULPLINT_CHECKS_ACCESSFLAGSINVALIDCHECK_H

#include "engine/RdmaCheck.h"
#include "engine/Sites.h"

namespace ulplint {

/// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE in a registration, a
/// fast registration or the MR under a memory window bind.
/// Docs: docs/checks/rdma-access-flags-invalid.md
class AccessFlagsInvalidCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;

private:
  void checkRequest(const TuAnalysis &A, const AccessSite &S);
  void checkBind(const TuAnalysis &A, const AccessSite &Bind,
                 llvm::ArrayRef<AccessSite> Sites);
  /// Registrations already given a fix-it, so two binds of one MR do not
  /// propose the same edit twice.
  llvm::DenseSet<const clang::Expr *> Fixed;
};

} // namespace ulplint

#endif
