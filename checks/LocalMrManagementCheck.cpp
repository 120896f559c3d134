//===- LocalMrManagementCheck.cpp - rdma-local-mr-management --------------===//

#include "LocalMrManagementCheck.h"
#include "engine/Inventory.h"

using namespace clang;

namespace ulplint {

/// "allocates a memory region", "maps pages into an MR", ...
static std::string action(const RegistrationSite &S) {
  Effect E = S.Call ? S.Call->Model->E : Effect::None;
  switch (E) {
  case Effect::MrRegister: return "registers memory";
  case Effect::MrReregister: return "re-registers memory";
  case Effect::MrAlloc: return "allocates a memory region";
  case Effect::MwAlloc: return "allocates a memory window";
  case Effect::MwBind: return "binds a memory window";
  case Effect::MrPoolInit: return "builds a pool of memory regions";
  case Effect::MrPoolGet: return "takes a memory region from its pool";
  case Effect::MrPoolPut: return "puts a memory region back into its pool";
  case Effect::MrDeregister: return "deregisters a memory region";
  case Effect::MrMap: return "maps pages into a memory region";
  default:
    return S.Kind == SiteKind::RegistrationPost
               ? "posts a registration work request"
               : "manages a registration";
  }
}

static StringRef purpose(SiteRole R) {
  switch (R) {
  case SiteRole::Expose: return "to give the peer a key to local memory";
  case SiteRole::DataTransfer: return "for its own RDMA READ/WRITE";
  case SiteRole::Local: return "for local access on every I/O";
  }
  llvm_unreachable("role");
}

bool LocalMrManagementCheck::reportable(const TuAnalysis &A,
                                        const RegistrationSite &S) const {
  Effect E = S.Call ? S.Call->Model->E : Effect::None;
  switch (S.Kind) {
  case SiteKind::Allocation:
    // A ring of message buffers registered once for local access is not
    // what the core takes over; registrations per I/O or for a peer are.
    if (E == Effect::MrRegister || E == Effect::MrReregister)
      return S.Role != SiteRole::Local || S.Datapath;
    return true;
  case SiteKind::Mapping:
  case SiteKind::RegistrationPost:
    return true;
  case SiteKind::Invalidation:
    // The kernel's MR lifetime calls; userspace deregistration pairs with a
    // registration that is reported already.
    return A.domain() == Domain::Kernel &&
           (E == Effect::MrDeregister || E == Effect::MrPoolPut);
  default:
    return false;
  }
}

void LocalMrManagementCheck::checkUnit(const TuAnalysis &A) {
  const Inventory &Inv = Inventory::of(A);
  for (const RegistrationSite &S : Inv.sites()) {
    if (!reportable(A, S))
      continue;
    std::string Target = Inv.replacement(S);
    report(A, S.Loc,
           "'" + S.Api + "' " + action(S) + " " + purpose(S.Role).str() +
               "; the ULP manages registration itself" +
               (Target.empty() ? "" : "; use " + Target));
  }
}

} // namespace ulplint
