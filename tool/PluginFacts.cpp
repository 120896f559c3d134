//===- PluginFacts.cpp - Program facts for the plugin and ulplint-clangd --===//
//
// Hands the engine the reader of the facts a ulplint run recorded
// (ProgramFacts.h), so the clang-tidy plugin and ulplint-clangd settle
// conditional findings as ulplint does. The engine's entry point,
// ulplint::setProgramFactsProvider (checks/engine/Facts.h), is referenced
// weakly: without it the hosts keep deciding from their one unit.
//
//===----------------------------------------------------------------------===//

#include "ProgramFacts.h"

namespace ulplint {
using ProgramFactsProvider = std::optional<std::vector<std::string>> (*)(
    llvm::StringRef MainFile, llvm::StringRef BuildDirectory,
    llvm::StringRef CacheDir);
void setProgramFactsProvider(ProgramFactsProvider Provider)
    __attribute__((weak));
} // namespace ulplint

namespace {
const bool Registered = [] {
  if (ulplint::setProgramFactsProvider)
    ulplint::setProgramFactsProvider(&ulplint::tool::otherUnitsFacts);
  return true;
}();
} // namespace
