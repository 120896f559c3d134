//===- RemoteAccessOverbroadCheck.h - rdma-remote-access-overbroad -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_REMOTEACCESSOVERBROADCHECK_H
#define ULPLINT_CHECKS_REMOTEACCESSOVERBROADCHECK_H

#include "engine/RdmaCheck.h"
#include "engine/Sites.h"

namespace ulplint {

/// Remote rights no peer can use (the rkey never leaves the code), remote
/// rights on whole-address-space ODP registrations, and the PD's unsafe
/// global rkey. Docs: docs/checks/rdma-remote-access-overbroad.md
class RemoteAccessOverbroadCheck : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  void checkUnusedRights(const TuAnalysis &A, const AccessSite &S);
  bool checkImplicitOdp(const TuAnalysis &A, const AccessSite &S);
  void checkGlobalRkey(const TuAnalysis &A);
  void exportLeavingKeys(const TuAnalysis &A);
};

} // namespace ulplint

#endif
