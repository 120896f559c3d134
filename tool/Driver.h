//===- Driver.h - Running the rdma checks over a compile database -*- C++ -*-===//

#ifndef ULPLINT_TOOL_DRIVER_H
#define ULPLINT_TOOL_DRIVER_H

#include "engine/Facts.h"
#include "engine/Inventory.h"
#include "clang-tidy/ClangTidyDiagnosticConsumer.h"
#include "clang-tidy/ClangTidyOptions.h"
#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/Support/Error.h"
#include <memory>
#include <string>
#include <vector>

namespace ulplint::tool {

/// What the user asked ulplint to run.
struct RunOptions {
  std::string Checks;      // --checks, appended to the configuration's
  std::string Config;      // --config (YAML)
  std::string ConfigFile;  // --config-file
  std::vector<std::string> ExtraArgs, ExtraArgsBefore;
  unsigned Jobs = 1;
  bool Quiet = false;
  /// Keep the registration sites of each unit (`ulplint report`).
  bool CollectSites = false;
};

/// The result of analysing one translation unit.
struct UnitResult {
  std::string File;
  std::vector<clang::tidy::ClangTidyError> Findings;
  /// Compiler errors: a unit that does not parse is an input error.
  std::vector<std::string> ParseErrors;
  /// Facts for other units, and findings that depend on theirs.
  UnitFacts Facts;
  /// Registration sites, when RunOptions::CollectSites.
  SiteSink Sites;
};

/// Drops the findings whose condition another unit's fact settles.
void settleConditions(std::vector<UnitResult> &Units);

/// Loads the compile database named by -p (a directory or the JSON file).
llvm::Expected<std::unique_ptr<clang::tooling::CompilationDatabase>>
loadDatabase(llvm::StringRef BuildPath);

/// The rewrite of compile commands from rules/compile-flags.yaml.
std::vector<std::string> sanitizeCommand(llvm::ArrayRef<std::string> Args);

/// The options provider ulplint uses: .clang-tidy files as clang-tidy reads
/// them, rdma-* enabled unless a configuration names rdma checks itself,
/// and the command line on top.
/// \p FS resolves relative paths (it follows the unit's working directory).
llvm::Expected<std::unique_ptr<clang::tidy::ClangTidyOptionsProvider>>
makeOptionsProvider(const RunOptions &Opts,
                    llvm::IntrusiveRefCntPtr<llvm::vfs::FileSystem> FS = nullptr);

/// Validates --checks and CheckOptions against the registered checks.
llvm::Error verifyConfiguration(const RunOptions &Opts,
                                llvm::ArrayRef<std::string> Files);

/// Names of every registered rdma-* check.
std::vector<std::string> registeredChecks();

/// Analyses \p Files, -j at a time; results come back in input order.
std::vector<UnitResult> analyze(const clang::tooling::CompilationDatabase &DB,
                                llvm::ArrayRef<std::string> Files,
                                const RunOptions &Opts);

} // namespace ulplint::tool

#endif
