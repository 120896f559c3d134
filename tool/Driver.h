//===- Driver.h - Running the rdma checks over a compile database -*- C++ -*-===//

#ifndef ULPLINT_TOOL_DRIVER_H
#define ULPLINT_TOOL_DRIVER_H

#include "engine/Facts.h"
#include "engine/Inventory.h"
#include "clang-tidy/ClangTidyDiagnosticConsumer.h"
#include "clang-tidy/ClangTidyOptions.h"
#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/Support/Error.h"
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ulplint::tool {

class ResultCache;
struct UnitResult;

/// What the user asked ulplint to run.
struct RunOptions {
  std::string Checks;      // --checks, appended to the configuration's
  std::string Config;      // --config (YAML)
  std::string ConfigFile;  // --config-file
  std::optional<std::string> HeaderFilter; // --header-filter, over the configuration's
  std::string LineFilter;  // --line-filter (JSON, as in clang-tidy)
  std::vector<std::string> ExtraArgs, ExtraArgsBefore;
  unsigned Jobs = 0;       // 0: all cores
  bool Progress = false;   // a progress line on stderr (a terminal)
  ResultCache *Cache = nullptr;
  /// Keep the registration sites of each unit (`ulplint report`).
  bool CollectSites = false;
  /// Skip, unparsed, the units a pre-scan finds no RDMA code in (Prescan.h).
  bool SkipNonRdma = true;
  /// The stack a unit is analysed on, in MiB: deeply nested code needs more
  /// than the usual 8 MiB.
  unsigned StackMiB = 64;
  /// Called with each unit's result as soon as it and every unit before it
  /// are done (input order, whatever -j), one call at a time; the progress
  /// line is cleared first. Findings can be printed as units finish.
  std::function<void(const UnitResult &)> OnUnitDone;
};

/// A file a unit read, and the hash of the content it read.
struct InputFile {
  std::string Path;
  std::string Hash; // empty: hash the file as it is on disk
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
  /// When the analysis crashed: the worker's stack dump, for bug reports.
  std::string CrashLog;
  /// The files the unit read and the content hash it saw: --fix refuses a
  /// file that changed since (its offsets would be wrong).
  std::vector<InputFile> Inputs;
  /// Why the unit was not parsed although it could be ("no RDMA code": the
  /// pre-scan found none); empty when it was analysed.
  std::string Skipped;
};

/// The reason UnitResult::Skipped gives for a unit the pre-scan skipped.
inline constexpr llvm::StringLiteral NoRdmaCode = "no RDMA code";

/// Drops the findings whose condition another unit's fact settles.
void settleConditions(std::vector<UnitResult> &Units);
/// Is \p E the finding \p C makes conditional (same check, place and
/// text; entries cached before texts were kept match any text there)?
bool isConditionOf(const ConditionalFinding &C, const clang::tidy::ClangTidyError &E);

/// Loads the compile database named by -p (a directory or the JSON file).
/// Relative `directory` entries are relative to the database's directory;
/// a file listed more than once keeps its first command.
llvm::Expected<std::unique_ptr<clang::tooling::CompilationDatabase>>
loadDatabase(llvm::StringRef BuildPath);

/// Every file of \p DB, sorted, each once; an error when there is none.
llvm::Expected<std::vector<std::string>>
databaseFiles(const clang::tooling::CompilationDatabase &DB);

/// Each command's directory must exist: clang's tooling aborts otherwise.
llvm::Error checkDirectories(const clang::tooling::CompilationDatabase &DB,
                             llvm::ArrayRef<std::string> Files);

/// \p DB answering with one command per file, its first (as clangd does):
/// a file is analysed once however often a build compiles it.
std::unique_ptr<clang::tooling::CompilationDatabase>
firstCommandOnly(std::unique_ptr<clang::tooling::CompilationDatabase> DB);

/// The command clang parses \p File with: the database's, rewritten by
/// rules/compile-flags.yaml and the --extra-arg options, syntax-only.
clang::tooling::CompileCommand
effectiveCommand(const clang::tooling::CompilationDatabase &DB,
                 llvm::StringRef File, const RunOptions &Opts);

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

/// One error line per unit that does not parse, from \p Tool; returns how
/// many there are.
unsigned reportBrokenUnits(llvm::ArrayRef<UnitResult> Units,
                           llvm::StringRef Tool);

struct RunStats {
  unsigned Analysed = 0, FromCache = 0;
  unsigned Skipped = 0; // by the pre-scan: no RDMA code
};

/// ", N skipped (no RDMA code)" for the summary lines, or "" when none was.
std::string skippedSummary(llvm::ArrayRef<UnitResult> Units);

/// Runs the checks on the unit of \p Cmd (a final command, see
/// effectiveCommand) in this process, recording the files it read in
/// \p Inputs. Worker processes call it (Worker.h).
UnitResult analyzeUnit(const clang::tooling::CompileCommand &Cmd,
                       const RunOptions &Opts, std::vector<InputFile> &Inputs);

/// Analyses \p Files, -j at a time, or takes their results from the cache;
/// results come back in input order, conditions not yet settled.
std::vector<UnitResult> analyze(const clang::tooling::CompilationDatabase &DB,
                                llvm::ArrayRef<std::string> Files,
                                const RunOptions &Opts, RunStats &Stats);

} // namespace ulplint::tool

#endif
