//===- LocalMrManagementCheck.h - rdma-local-mr-management -----*- C++ -*-===//

#ifndef ULPLINT_CHECKS_LOCALMRMANAGEMENTCHECK_H
#define ULPLINT_CHECKS_LOCALMRMANAGEMENTCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

struct RegistrationSite;

/// The ULP allocates, maps, registers or pools MRs and windows itself; names
/// the core-managed API that replaces each site.
/// Docs: docs/checks/rdma-local-mr-management.md
class LocalMrManagementCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  bool reportable(const TuAnalysis &A, const RegistrationSite &S) const;
};

} // namespace ulplint

#endif
