//===- ClangdMain.cpp - clangd with the rdma checks built in --------------===//
//
// ulplint-clangd is upstream clangd 22 (clangdMain from Debian's
// libclangdMain.a) with the rdma clang-tidy module linked in: clangd cannot
// load clang-tidy plugins, but it runs every check registered in the
// process. Everything else (options, configuration, protocol) is clangd's.
// docs/editors.md says how to point an editor at it.
//
//===----------------------------------------------------------------------===//

namespace clang::clangd {
int clangdMain(int argc, char *argv[]); // clang-tools-extra/clangd/tool
} // namespace clang::clangd

// Defined next to the module's registration (checks/RdmaTidyModule.cpp);
// using it keeps that object, and so the registration, in the link.
extern volatile int UlplintRdmaModuleAnchorSource;

int main(int argc, char *argv[]) {
  (void)UlplintRdmaModuleAnchorSource;
  return clang::clangd::clangdMain(argc, argv);
}
