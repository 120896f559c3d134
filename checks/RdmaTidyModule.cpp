//===- RdmaTidyModule.cpp - The rdma clang-tidy module --------------------===//
//
// Registers every rdma-* check. Linked into ulplint, the clang-tidy plugin
// and ulplint-clangd.
//
//===----------------------------------------------------------------------===//

#include "AccessFlagsInvalidCheck.h"
#include "AccessFlagsTransportCheck.h"
#include "InvalidationLeakCheck.h"
#include "LocalMrManagementCheck.h"
#include "MrLeakCheck.h"
#include "QueueCapUncheckedCheck.h"
#include "RegistrationInDatapathCheck.h"
#include "RemoteInvalidateUncheckedCheck.h"
#include "RkeyReuseCheck.h"
#include "UnmapBeforeInvalidateCheck.h"
#include "RemoteAccessOverbroadCheck.h"
#include "SendQueueManualFactorCheck.h"
#include "SendQueueUndersizedCheck.h"
#include "UnsignaledSendStarvationCheck.h"
#include "clang-tidy/ClangTidyModule.h"

namespace ulplint {

class RdmaTidyModule : public clang::tidy::ClangTidyModule {
public:
  void addCheckFactories(clang::tidy::ClangTidyCheckFactories &F) override {
    F.registerCheck<AccessFlagsInvalidCheck>("rdma-access-flags-invalid");
    F.registerCheck<AccessFlagsTransportCheck>("rdma-access-flags-transport");
    F.registerCheck<RemoteAccessOverbroadCheck>("rdma-remote-access-overbroad");
    F.registerCheck<SendQueueUndersizedCheck>("rdma-send-queue-undersized");
    F.registerCheck<SendQueueManualFactorCheck>("rdma-send-queue-manual-factor");
    F.registerCheck<UnsignaledSendStarvationCheck>(
        "rdma-unsignaled-send-starvation");
    F.registerCheck<QueueCapUncheckedCheck>("rdma-queue-cap-unchecked");
    F.registerCheck<InvalidationLeakCheck>("rdma-invalidation-leak");
    F.registerCheck<RemoteInvalidateUncheckedCheck>(
        "rdma-remote-invalidate-unchecked");
    F.registerCheck<RkeyReuseCheck>("rdma-rkey-reuse");
    F.registerCheck<UnmapBeforeInvalidateCheck>("rdma-unmap-before-invalidate");
    F.registerCheck<MrLeakCheck>("rdma-mr-leak");
    F.registerCheck<LocalMrManagementCheck>("rdma-local-mr-management");
    F.registerCheck<RegistrationInDatapathCheck>(
        "rdma-registration-in-datapath");
  }
};

} // namespace ulplint

static clang::tidy::ClangTidyModuleRegistry::Add<ulplint::RdmaTidyModule>
    X("rdma-module", "Checks for RDMA upper-layer protocol code.");

// Referenced by drivers that link the module statically, so the linker keeps
// the registration above.
volatile int UlplintRdmaModuleAnchorSource = 0;
