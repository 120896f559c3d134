//===- RdmaTidyModule.cpp - The rdma clang-tidy module --------------------===//
//
// Registers every rdma-* check. Linked into ulplint, the clang-tidy plugin
// and ulplint-clangd.
//
//===----------------------------------------------------------------------===//

#include "AccessFlagsInvalidCheck.h"
#include "AccessFlagsTransportCheck.h"
#include "RemoteAccessOverbroadCheck.h"
#include "clang-tidy/ClangTidyModule.h"

namespace ulplint {

class RdmaTidyModule : public clang::tidy::ClangTidyModule {
public:
  void addCheckFactories(clang::tidy::ClangTidyCheckFactories &F) override {
    F.registerCheck<AccessFlagsInvalidCheck>("rdma-access-flags-invalid");
    F.registerCheck<AccessFlagsTransportCheck>("rdma-access-flags-transport");
    F.registerCheck<RemoteAccessOverbroadCheck>("rdma-remote-access-overbroad");
  }
};

} // namespace ulplint

static clang::tidy::ClangTidyModuleRegistry::Add<ulplint::RdmaTidyModule>
    X("rdma-module", "Checks for RDMA upper-layer protocol code.");

// Referenced by drivers that link the module statically, so the linker keeps
// the registration above.
volatile int UlplintRdmaModuleAnchorSource = 0;
