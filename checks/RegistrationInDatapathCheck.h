//===- RegistrationInDatapathCheck.h - rdma-registration-in-datapath -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_REGISTRATIONINDATAPATHCHECK_H
#define ULPLINT_CHECKS_REGISTRATIONINDATAPATHCHECK_H

#include "engine/RdmaCheck.h"

namespace ulplint {

/// Memory registered, allocated or deregistered once per I/O: on the submit
/// or completion path. Docs: docs/checks/rdma-registration-in-datapath.md
class RegistrationInDatapathCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }
};

} // namespace ulplint

#endif
