//===- ulplint.cpp - The ulplint command ----------------------------------===//
//
// Runs the rdma-* checks over a compile database, like clang-tidy but with
// CI in mind: parallel units, machine-readable output and strict exit codes
// (0 no findings, 1 findings, 2 usage or input errors).
//
//===----------------------------------------------------------------------===//

#include "Driver.h"
#include "Output.h"
#include "Report.h"
#include "engine/Rules.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/WithColor.h"
#include "clang/Tooling/CompilationDatabase.h"

using namespace llvm;
using namespace ulplint;
using namespace ulplint::tool;

extern volatile int UlplintRdmaModuleAnchorSource;
static int LLVM_ATTRIBUTE_UNUSED ModuleAnchor = UlplintRdmaModuleAnchorSource;

namespace {
cl::OptionCategory Category("ulplint options");

cl::list<std::string> Sources(cl::Positional, cl::desc("[<source> ...]"),
                              cl::cat(Category));
cl::opt<std::string> BuildPath(
    "p", cl::desc("Build directory holding compile_commands.json (or the file "
                  "itself). Without files, every unit in it is analysed."),
    cl::value_desc("build-path"), cl::cat(Category));
cl::opt<std::string> Checks(
    "checks",
    cl::desc("Comma-separated globs of checks to run, as in clang-tidy; added "
             "after the configuration's (e.g. -rdma-access-flags-transport)"),
    cl::cat(Category));
cl::opt<std::string> Config("config",
                            cl::desc("Configuration in YAML, as in clang-tidy"),
                            cl::cat(Category));
cl::opt<std::string> ConfigFile("config-file",
                                cl::desc("Read the configuration from a file"),
                                cl::cat(Category));
cl::opt<unsigned> Jobs("j", cl::desc("Translation units analysed in parallel "
                                     "(default: all cores)"),
                       cl::Prefix, cl::init(0), cl::cat(Category));
cl::opt<std::string> Format("format",
                            cl::desc("Output format: text, json or sarif"),
                            cl::init("text"), cl::cat(Category));
cl::opt<std::string> OutputFile("o", cl::desc("Write findings to this file"),
                                cl::value_desc("file"), cl::cat(Category));
cl::opt<std::string> SourceRoot(
    "source-root",
    cl::desc("Root that file names in JSON and SARIF are relative to "
             "(default: the current directory)"),
    cl::cat(Category));
cl::opt<bool> Fix("fix", cl::desc("Apply the fix-its of the findings in place"),
                  cl::cat(Category));
cl::opt<bool> FixNotes("fix-notes",
                       cl::desc("With --fix, also apply fixes attached to notes "
                                "(migrations toward rdma_rw and regcore)"),
                       cl::cat(Category));
cl::opt<std::string> ExportFixes(
    "export-fixes",
    cl::desc("Write fixes as clang-apply-replacements YAML to this file"),
    cl::value_desc("file"), cl::cat(Category));
cl::list<std::string> ExtraArgs("extra-arg",
                                cl::desc("Argument to append to each compile command"),
                                cl::cat(Category));
cl::list<std::string> ExtraArgsBefore(
    "extra-arg-before", cl::desc("Argument to prepend to each compile command"),
    cl::cat(Category));
cl::opt<bool> ListChecks("list-checks",
                         cl::desc("List the checks with severity and summary"),
                         cl::cat(Category));
cl::opt<std::string> Explain("explain",
                             cl::desc("Explain a check: rationale and fix guidance"),
                             cl::value_desc("check"), cl::cat(Category));
cl::opt<bool> Quiet("quiet", cl::desc("No summary line on stderr"),
                    cl::cat(Category));

const char *Overview = R"(ulplint: static analysis of RDMA upper-layer-protocol code

  ulplint -p BUILD_DIR [files...]     analyse the compile database (all of it
                                      when no file is named)
  ulplint file.c -- <compiler flags>  analyse one file without a database
  ulplint --list-checks | --explain rdma-<check>
  ulplint report -p BUILD_DIR -o report.html|report.md
                                      migration report (see report --help)

Exit status: 0 no findings, 1 findings, 2 usage or input errors.
)";

int usageError(const Twine &Msg) {
  WithColor::error(errs(), "ulplint") << Msg << "\n";
  return 2;
}

int listChecks() {
  const Rules &R = Rules::embedded();
  for (const std::string &Name : registeredChecks()) {
    const RuleInfo *Info = R.rule(Name);
    outs() << Name << " [" << (Info ? Info->Severity : "?") << "]\n    "
           << (Info ? Info->Summary : "") << "\n";
  }
  return 0;
}

int explain(StringRef Name) {
  const RuleInfo *Info = Rules::embedded().rule(Name);
  if (!Info)
    return usageError("unknown check '" + Name + "' (see --list-checks)");
  outs() << Info->Name << "\n"
         << "  severity: " << Info->Severity << "\n"
         << "  category: " << Info->Category << "\n"
         << "  documentation: " << Info->Doc << "\n\n"
         << Info->Summary << "\n\nWhy:\n" << Info->Rationale << "\nFix:\n"
         << Info->Fix;
  return 0;
}

/// Absolute source paths: named on the command line, or all of the database.
Expected<std::vector<std::string>>
inputFiles(const clang::tooling::CompilationDatabase &DB) {
  std::vector<std::string> Files;
  if (Sources.empty()) {
    Files = DB.getAllFiles();
    llvm::sort(Files);
    Files.erase(std::unique(Files.begin(), Files.end()), Files.end());
    if (Files.empty())
      return createStringError(inconvertibleErrorCode(),
                               "the compilation database has no entries");
    return Files;
  }
  for (const std::string &S : Sources) {
    SmallString<256> Abs(S);
    sys::fs::make_absolute(Abs);
    sys::path::remove_dots(Abs, true);
    if (!sys::fs::exists(Abs))
      return createStringError(inconvertibleErrorCode(),
                               "no such file: '" + S + "'");
    if (DB.getCompileCommands(Abs).empty())
      return createStringError(inconvertibleErrorCode(),
                               "no compile command for '" + S +
                                   "' in the compilation database");
    Files.push_back(std::string(Abs));
  }
  return Files;
}

/// Each command's directory must exist: clang's tooling aborts otherwise.
Error checkDirectories(const clang::tooling::CompilationDatabase &DB,
                       ArrayRef<std::string> Files) {
  for (const std::string &F : Files)
    for (const auto &Cmd : DB.getCompileCommands(F))
      if (!sys::fs::is_directory(Cmd.Directory))
        return createStringError(inconvertibleErrorCode(),
                                 "compile command for '" + F +
                                     "' runs in missing directory '" +
                                     Cmd.Directory + "'");
  return Error::success();
}

int writeOutput(ArrayRef<Finding> Findings, ArrayRef<UnitResult> Units) {
  OutputOptions Opts;
  Opts.Format = Format;
  Opts.SourceRoot = SourceRoot;
  if (Opts.SourceRoot.empty()) {
    SmallString<256> Cwd;
    sys::fs::current_path(Cwd);
    Opts.SourceRoot = std::string(Cwd);
  }
  std::unique_ptr<raw_fd_ostream> File;
  raw_ostream *OS = &outs();
  if (!OutputFile.empty()) {
    std::error_code EC;
    File = std::make_unique<raw_fd_ostream>(OutputFile, EC);
    if (EC)
      return usageError("cannot write '" + OutputFile + "': " + EC.message());
    OS = File.get();
  }
  if (Format == "json")
    writeJson(*OS, Findings, Units, Opts);
  else if (Format == "sarif")
    writeSarif(*OS, Findings, Units, Opts);
  else
    writeText(*OS, Findings);
  return 0;
}
} // namespace

int main(int argc, const char **argv) {
  InitLLVM X(argc, argv);
  // `file.c -- flags` names the compile command on the command line.
  std::string FixedError;
  std::unique_ptr<clang::tooling::CompilationDatabase> DB =
      clang::tooling::FixedCompilationDatabase::loadFromCommandLine(
          argc, argv, FixedError);

  cl::HideUnrelatedOptions(Category);
  cl::SetVersionPrinter([](raw_ostream &OS) {
    OS << "ulplint " << ULPLINT_VERSION << " (LLVM " << LLVM_VERSION_STRING
       << ")\n";
  });
  std::string ParseErrors;
  raw_string_ostream ErrStream(ParseErrors);
  if (!cl::ParseCommandLineOptions(argc, argv, Overview, &ErrStream)) {
    errs() << ErrStream.str();
    return 2;
  }
  if (ReportCommand)
    return runReport();
  if (ListChecks)
    return listChecks();
  if (!Explain.empty())
    return explain(Explain);
  if (Format != "text" && Format != "json" && Format != "sarif")
    return usageError("unknown --format '" + Format +
                      "' (expected text, json or sarif)");
  if (FixNotes && !Fix)
    return usageError("--fix-notes needs --fix");

  if (!FixedError.empty())
    return usageError(FixedError);
  if (!BuildPath.empty()) {
    if (DB)
      return usageError("use either -p or '--' compiler flags, not both");
    auto Loaded = loadDatabase(BuildPath);
    if (!Loaded)
      return usageError(toString(Loaded.takeError()));
    DB = std::move(*Loaded);
  } else if (!DB) {
    if (Sources.empty())
      return usageError("no input: pass -p BUILD_DIR, or files followed by "
                        "'-- <compiler flags>' (see --help)");
    std::string Err;
    DB = clang::tooling::CompilationDatabase::autoDetectFromSource(Sources[0],
                                                                   Err);
    if (!DB)
      return usageError("no compilation database found for '" + Sources[0] +
                        "': pass -p BUILD_DIR or '-- <compiler flags>'");
  }

  auto Files = inputFiles(*DB);
  if (!Files)
    return usageError(toString(Files.takeError()));
  if (Error E = checkDirectories(*DB, *Files))
    return usageError(toString(std::move(E)));

  RunOptions Run;
  Run.Checks = Checks;
  Run.Config = Config;
  Run.ConfigFile = ConfigFile;
  Run.ExtraArgs = ExtraArgs;
  Run.ExtraArgsBefore = ExtraArgsBefore;
  Run.Jobs = Jobs;
  Run.Quiet = Quiet;
  if (Error E = verifyConfiguration(Run, *Files))
    return usageError(toString(std::move(E)));

  std::vector<UnitResult> Units = analyze(*DB, *Files, Run);
  settleConditions(Units);
  std::vector<Finding> Findings = collectFindings(Units);

  if (int Rc = writeOutput(Findings, Units))
    return Rc;
  if (!ExportFixes.empty()) {
    std::error_code EC;
    raw_fd_ostream OS(ExportFixes, EC);
    if (EC)
      return usageError("cannot write '" + ExportFixes + "': " + EC.message());
    exportFixes(OS, Findings, Files->front());
  }
  if (Fix) {
    auto Applied = applyFixes(Findings, FixNotes);
    if (!Applied)
      return usageError(toString(Applied.takeError()));
    if (!Quiet)
      errs() << "ulplint: applied fixes of " << *Applied << " finding(s)\n";
  }

  unsigned Broken = 0;
  for (const UnitResult &U : Units)
    if (!U.ParseErrors.empty()) {
      ++Broken;
      WithColor::error(errs(), "ulplint")
          << U.File << ": cannot be analysed: " << U.ParseErrors.front()
          << (U.ParseErrors.size() > 1
                  ? " (and " + std::to_string(U.ParseErrors.size() - 1) +
                        " more errors)"
                  : std::string())
          << "\n";
    }
  if (!Quiet)
    errs() << "ulplint: " << Findings.size() << " finding(s) in "
           << Units.size() << " translation unit(s)"
           << (Broken ? ", " + std::to_string(Broken) + " not analysed" : "")
           << "\n";
  if (Broken)
    return 2;
  return Findings.empty() ? 0 : 1;
}
