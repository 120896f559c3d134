//===- ProgramFacts.h - Other units' facts for hosts of one unit -*- C++ -*-===//
//
// ulplint settles findings that depend on other units (checks/engine/
// Facts.h) once every unit is analysed. The clang-tidy plugin and
// ulplint-clangd see one unit. After a ulplint run, the cache directory
// holds every unit's exported facts (program-facts.json, written by
// ResultCache::recordProgramFacts), and these hosts read the other units'
// facts from it to settle their conditional findings the way ulplint does.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_PROGRAMFACTS_H
#define ULPLINT_TOOL_PROGRAMFACTS_H

#include "llvm/ADT/StringRef.h"
#include <optional>
#include <string>
#include <vector>

namespace ulplint::tool {

/// The file in the cache directory: {"version": 1, "units": {FILE: [FACT]}}.
inline constexpr llvm::StringLiteral ProgramFactsFile = "program-facts.json";

/// The cache directory whose program facts apply to a unit: \p CacheDir
/// (the CacheDir check option) if given, else $ULPLINT_CACHE_DIR, else the
/// .ulplint-cache of the database directory the host was given (clang-tidy's
/// -p, clangd's --compile-commands-dir), else the nearest directory at or
/// above \p BuildDirectory (the unit's compile command directory) holding
/// .ulplint-cache/program-facts.json. Empty when there is none.
std::string findProgramFactsDir(llvm::StringRef BuildDirectory,
                                llvm::StringRef CacheDir);

/// The facts that every unit but \p MainFile exported in the last ulplint
/// run over the program, or nullopt when no run left them (then conditional
/// findings stay as the host decides without them).
std::optional<std::vector<std::string>>
otherUnitsFacts(llvm::StringRef MainFile, llvm::StringRef BuildDirectory,
                llvm::StringRef CacheDir);

} // namespace ulplint::tool

#endif
