//===- ulplint.cpp - The ulplint command ----------------------------------===//
//
// Runs the rdma-* checks over a compile database, like clang-tidy but with
// CI in mind: parallel units each in a process of its own, a result cache,
// shards and their merge, baselines, machine-readable output and strict
// exit codes (0 no new findings, 1 new findings, 2 usage, input or output
// errors, or a unit not analysed).
//
//===----------------------------------------------------------------------===//

#include "Cache.h"
#include "Driver.h"
#include "Files.h"
#include "Output.h"
#include "Report.h"
#include "Shards.h"
#include "Worker.h"
#include "engine/Rules.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include <array>
#include <map>
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/WithColor.h"
#include "clang/Tooling/CompilationDatabase.h"

using namespace llvm;
using namespace ulplint;
using namespace ulplint::tool;

extern volatile int UlplintRdmaModuleAnchorSource;
static int LLVM_ATTRIBUTE_UNUSED ModuleAnchor = UlplintRdmaModuleAnchorSource;

namespace {
cl::OptionCategory Category("ulplint options");

cl::SubCommand MergeCommand(
    "merge", "Join shard outputs (--shard, JSON or SARIF) into the result of "
             "one run over the whole database");
/// Options of both the analysis and `merge`.
#define ULPLINT_SHARED cl::sub(cl::SubCommand::getTopLevel()), cl::sub(MergeCommand)

cl::list<std::string> ShardOutputs(cl::Positional,
                                   cl::desc("<shard output> ..."),
                                   cl::sub(MergeCommand), cl::cat(Category));
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
cl::opt<std::string> HeaderFilter(
    "header-filter",
    cl::desc("Regular expression of headers whose findings are reported, as "
             "in clang-tidy (the main file's always are); overrides "
             "HeaderFilterRegex of the configuration"),
    cl::value_desc("regex"), cl::cat(Category));
cl::opt<std::string> LineFilter(
    "line-filter",
    cl::desc("Report findings only in these lines of these files, as in "
             "clang-tidy: '[{\"name\": \"file.c\", \"lines\": [[1, 30]]}, ...]'"),
    cl::value_desc("json"), cl::cat(Category));
/// -h is LLVM's alias of --help and takes any unknown option starting with
/// h (--header-filer=...) for it; a plain option of that name does not.
cl::opt<bool> ShortHelp("h", cl::desc("Alias for --help"), cl::Hidden,
                        cl::sub(cl::SubCommand::getAll()));
cl::opt<std::string> Config("config",
                            cl::desc("Configuration in YAML, as in clang-tidy"),
                            cl::cat(Category));
cl::opt<std::string> ConfigFile("config-file",
                                cl::desc("Read the configuration from a file"),
                                cl::cat(Category));
cl::opt<unsigned> Jobs("j", cl::desc("Translation units analysed in parallel "
                                     "(default: all cores)"),
                       cl::Prefix, cl::init(0), cl::cat(Category));
cl::opt<std::string> Format(
    "format",
    cl::desc("Output format: text, json, sarif or codeclimate (GitLab Code "
             "Quality)"),
    cl::init("text"), ULPLINT_SHARED, cl::cat(Category));
cl::opt<std::string> SarifOutput(
    "sarif-output",
    cl::desc("Also write SARIF to this file, next to the --format output "
             "(e.g. text in the log and SARIF for code scanning)"),
    cl::value_desc("file"), ULPLINT_SHARED, cl::cat(Category));
cl::opt<std::string> FailOn(
    "fail-on",
    cl::desc("Lowest severity of a new finding that makes the exit status 1: "
             "error, warning or note (default: warning; notes are advice)"),
    cl::value_desc("severity"), cl::init("warning"), ULPLINT_SHARED,
    cl::cat(Category));
cl::opt<bool> UseColor(
    "use-color",
    cl::desc("Colours in the text output (default: when standard output is "
             "a terminal that has them); --use-color=false turns them off"),
    ULPLINT_SHARED, cl::cat(Category));
cl::opt<std::string> OutputFile("o", cl::desc("Write findings to this file"),
                                cl::value_desc("file"), ULPLINT_SHARED,
                                cl::cat(Category));
cl::opt<std::string> SourceRoot(
    "source-root",
    cl::desc("Root that file names in JSON and SARIF, fingerprints, "
             "--include/--exclude and --shard are relative to (default: the "
             "current directory)"),
    ULPLINT_SHARED, cl::cat(Category));
cl::opt<bool> Fix("fix", cl::desc("Apply the fix-its of the findings in place"),
                  cl::cat(Category));
cl::opt<bool> FixNotes("fix-notes",
                       cl::desc("With --fix, also apply fixes attached to notes "
                                "(migrations toward rdma_rw and regcore)"),
                       cl::cat(Category));
cl::opt<bool> FixErrors(
    "fix-errors",
    cl::desc("Apply fixes even in translation units that do not parse (as "
             "clang-tidy's --fix-errors; implies --fix)"),
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
cl::opt<bool> Quiet("quiet", cl::desc("No progress or summary lines on stderr"),
                    ULPLINT_SHARED, cl::cat(Category));
cl::list<std::string> Include(
    "include",
    cl::desc("Analyse only units whose path matches this glob (relative to "
             "the source root, or absolute; a directory covers what is "
             "under it). Repeatable"),
    cl::value_desc("glob"), cl::cat(Category));
cl::list<std::string> Exclude(
    "exclude", cl::desc("Skip units whose path matches this glob. Repeatable"),
    cl::value_desc("glob"), cl::cat(Category));
cl::opt<std::string> Shard(
    "shard",
    cl::desc("Analyse shard i of N of the units, for CI matrices; write "
             "--format=json or sarif and join the shards with `ulplint merge`"),
    cl::value_desc("i/N"), cl::cat(Category));
cl::opt<std::string> CacheDir(
    "cache-dir",
    cl::desc("Keep unit results here between runs (default with -p: "
             "BUILD_DIR/.ulplint-cache)"),
    cl::value_desc("dir"), cl::cat(Category));
cl::opt<std::string> CacheMaxSize(
    "cache-max-size",
    cl::desc("Bound of the cache directory: least recently used entries go "
             "first (K, M, G suffixes; 0 for no bound; default 1G)"),
    cl::value_desc("size"), cl::init("1G"), cl::cat(Category));
cl::opt<bool> NoCache("no-cache", cl::desc("Neither read nor write the cache"),
                      cl::cat(Category));
cl::opt<bool> SkipNonRdma(
    "skip-non-rdma",
    cl::desc("Skip, unparsed, units that include no RDMA header and name no "
             "RDMA API (a textual pre-scan, rules/prescan.yaml; default: on); "
             "--skip-non-rdma=false parses every unit"),
    cl::init(true), cl::cat(Category));
cl::opt<std::string> Baseline(
    "baseline",
    cl::desc("Findings already known (a --write-baseline file, or JSON or "
             "SARIF output): only others count as new and fail the run"),
    cl::value_desc("file"), ULPLINT_SHARED, cl::cat(Category));
cl::opt<std::string> WriteBaseline(
    "write-baseline",
    cl::desc("Record the findings of this run as the baseline (the run then "
             "succeeds unless a unit cannot be analysed)"),
    cl::value_desc("file"), ULPLINT_SHARED, cl::cat(Category));
cl::opt<bool> PrintCommands(
    "print-commands",
    cl::desc("Print the commands clang parses each selected unit with, as "
             "JSON, and exit (for testsuite/bench)"),
    cl::Hidden, cl::cat(Category));
cl::opt<std::string> UnitWorker(
    "unit-worker",
    cl::desc("Analyse the one unit a request file describes (ulplint runs "
             "itself this way for each unit)"),
    cl::value_desc("request"), cl::Hidden, cl::sub(cl::SubCommand::getAll()),
    cl::cat(Category));
cl::opt<unsigned> UnitStackSize(
    "unit-stack-size",
    cl::desc("Stack of each unit's analysis, in MiB (deeper nesting needs "
             "more)"),
    cl::init(64), cl::Hidden, cl::sub(cl::SubCommand::getAll()),
    cl::cat(Category));
#undef ULPLINT_SHARED

const char *Overview = R"(ulplint: static analysis of RDMA upper-layer-protocol code

  ulplint -p BUILD_DIR [files...]     analyse the compile database (all of it
                                      when no file is named)
  ulplint file.c -- <compiler flags>  analyse one file without a database
  ulplint -p BUILD_DIR --shard=i/N --format=json -o shard-i.json
  ulplint merge shard-*.json [-o FILE] [--format=...] [--baseline=FILE]
                                      join shard outputs into one result
  ulplint --list-checks | --explain rdma-<check>
  ulplint report -p BUILD_DIR -o report.html|report.md
                                      migration report (see report --help)

  ulplint -p BUILD_DIR --sarif-output=ulplint.sarif [--baseline=FILE]
                                      text in the log, SARIF for code scanning

Exit status: 0 no new findings, 1 new findings (of --fail-on's severity or
above: warning by default, notes never fail), 2 usage, input or output
errors, or a unit that could not be analysed.
)";

int usageError(const Twine &Msg) {
  WithColor::error(errs(), "ulplint") << Msg << "\n";
  return 2;
}

/// The compiler's complaints about the flags after '--', one "error:" each;
/// a ulplint option put there gets a hint.
std::string describeFlagErrors(StringRef Text) {
  SmallVector<StringRef, 4> Lines;
  Text.split(Lines, '\n', -1, false);
  std::string Out, Hint;
  auto &Known = cl::getRegisteredOptions();
  for (StringRef L : Lines) {
    L = L.trim();
    if (!L.consume_front("error: ") && !L.consume_front("warning: "))
      continue;
    Out += (Out.empty() ? "" : "; ") + L.str();
    StringRef Arg = L.split("unknown argument: '").second.split('\'').first;
    StringRef Name = Arg.ltrim('-').split('=').first;
    if (!Name.empty() && Known.count(Name) && Hint.empty())
      Hint = " ('" + Arg.str() + "' is a ulplint option: put it before '--'; "
             "what follows '--' goes to the compiler)";
  }
  return "compiler flags after '--': " + (Out.empty() ? Text.trim().str() : Out) +
         Hint;
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

#include "EmbeddedCheckDocs.inc"

/// The "## Example..." section of the check's page, without its heading.
StringRef checkPageExamples(StringRef Name) {
  for (const auto &Doc : EmbeddedCheckDocs) {
    if (Name != Doc.Check)
      continue;
    StringRef Text = Doc.Text;
    size_t Start = Text.find("\n## Example");
    if (Start == StringRef::npos)
      return "";
    Text = Text.drop_front(Start + 1).split('\n').second;
    return Text.take_front(Text.find("\n## ")).trim();
  }
  return "";
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
  if (StringRef Examples = checkPageExamples(Name); !Examples.empty())
    outs() << "\nExamples (" << Info->Doc << "):\n\n" << Examples << "\n";
  return 0;
}

/// Absolute source paths: named on the command line, or all of the database.
Expected<std::vector<std::string>>
inputFiles(const clang::tooling::CompilationDatabase &DB) {
  if (Sources.empty())
    return databaseFiles(DB);
  std::vector<std::string> Files;
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

std::string sourceRoot() {
  if (!SourceRoot.empty()) {
    SmallString<256> Root(SourceRoot);
    sys::fs::make_absolute(Root);
    return std::string(Root);
  }
  SmallString<256> Cwd;
  sys::fs::current_path(Cwd);
  return std::string(Cwd);
}

/// The units this run analyses: --include/--exclude, then --shard. Their
/// indices in the filtered list go with shard outputs.
Expected<std::vector<std::string>> selectUnits(ArrayRef<std::string> Files,
                                              const ShardSpec &Spec,
                                              std::vector<size_t> &Indices,
                                              size_t &Total) {
  auto Filter = PathFilter::create(Include, Exclude, sourceRoot());
  if (!Filter)
    return Filter.takeError();
  std::vector<std::string> Selected;
  Total = 0;
  for (const std::string &F : Files) {
    if (!Filter->accepts(F))
      continue;
    if (inShard(relativeTo(F, sourceRoot()), Spec)) {
      Indices.push_back(Total);
      Selected.push_back(F);
    }
    ++Total;
  }
  if (Total == 0)
    return createStringError(inconvertibleErrorCode(),
                             "no translation unit matches --include/--exclude");
  return Selected;
}

/// The cache directory: --cache-dir, else inside the build directory.
std::string cacheDirectory() {
  if (NoCache)
    return "";
  if (!CacheDir.empty() || BuildPath.empty())
    return CacheDir;
  SmallString<256> Dir(BuildPath);
  if (!sys::fs::is_directory(Dir))
    sys::path::remove_filename(Dir);
  sys::path::append(Dir, ".ulplint-cache");
  return std::string(Dir);
}

std::unique_ptr<ResultCache> openCache(const char *Argv0) {
  std::string Dir = cacheDirectory();
  if (Dir.empty())
    return nullptr;
  static int Anchor;
  auto Cache = ResultCache::open(Dir, toolIdentity(Argv0, &Anchor));
  if (!Cache) {
    if (!Quiet)
      WithColor::warning(errs(), "ulplint")
          << toString(Cache.takeError()) << "; running without a cache\n";
    else
      consumeError(Cache.takeError());
    return nullptr;
  }
  return std::move(*Cache);
}

/// Every file of the program: the database's, though only some are named.
std::vector<std::string>
programFiles(const clang::tooling::CompilationDatabase &DB,
             ArrayRef<std::string> Named) {
  if (auto All = databaseFiles(DB))
    return std::move(*All);
  else
    consumeError(All.takeError()); // '-- flags': the named files are all
  return Named.vec();
}

/// The facts the clang-tidy plugin and ulplint-clangd read (ProgramFacts.h);
/// failing to record them costs only their settling, so it is a warning.
void recordProgramFacts(ResultCache &Cache, ArrayRef<UnitResult> Units,
                        ArrayRef<std::string> Database) {
  Error E = Cache.recordProgramFacts(Units, Database);
  if (E && !Quiet)
    WithColor::warning(errs(), "ulplint")
        << "facts for the clang-tidy plugin not recorded: "
        << toString(std::move(E)) << "\n";
  consumeError(std::move(E));
}

/// --print-commands: what clang parses, for comparing with clang itself.
void printCommands(const clang::tooling::CompilationDatabase &DB,
                   ArrayRef<std::string> Files, const RunOptions &Run) {
  json::Array Out;
  for (const std::string &F : Files) {
    clang::tooling::CompileCommand Cmd = effectiveCommand(DB, F, Run);
    Out.push_back(json::Object{{"file", F},
                               {"directory", Cmd.Directory},
                               {"arguments", Cmd.CommandLine}});
  }
  outs() << formatv("{0:2}", json::Value(std::move(Out))) << "\n";
}

/// Colours in the text: --use-color, else when standard output is a
/// terminal that has them (as clang-tidy decides).
bool textColor() {
  if (UseColor.getNumOccurrences())
    return UseColor;
  return OutputFile.empty() && sys::Process::StandardOutHasColors();
}

/// Text goes to standard output as units finish, unless it goes to a file
/// (replaced whole) or a baseline decides what is new (which needs every
/// finding first).
bool streamText() {
  return Format == "text" && OutputFile.empty() && Baseline.empty() &&
         !MergeCommand;
}

/// The printer of streamed text, which the end of the run completes.
std::unique_ptr<TextPrinter> Streamer;

/// Prints what \p U found that no other unit can settle away: findings
/// with a condition on the program wait for the end of the run.
void streamUnit(const UnitResult &U, StringRef Root) {
  for (const Finding &F : collectFindings(ArrayRef(U), Root)) {
    const clang::tidy::ClangTidyError &E = *F.Error;
    bool Conditional = llvm::any_of(U.Facts.Conditions, [&](const ConditionalFinding &C) {
      return isConditionOf(C, E);
    });
    if (!Conditional)
      Streamer->print(F);
  }
  for (const IncompleteAnalysis &I : U.Facts.Incomplete)
    Streamer->print(I);
  outs().flush();
}

void writeFormat(raw_ostream &OS, StringRef Fmt, ArrayRef<Finding> Findings,
                 ArrayRef<UnitResult> Units, const OutputOptions &Opts) {
  if (Fmt == "json")
    writeJson(OS, Findings, Units, Opts);
  else if (Fmt == "sarif")
    writeSarif(OS, Findings, Units, Opts);
  else if (Fmt == "codeclimate")
    writeCodeClimate(OS, Findings, Opts);
  else
    writeText(OS, Findings, Units, textColor());
}

/// Writes the findings to -o (safely) or standard output, and SARIF to
/// --sarif-output.
Error writeOutputs(ArrayRef<Finding> Findings, ArrayRef<UnitResult> Units,
                   const OutputOptions &Opts) {
  Error E = Error::success();
  if (Streamer) { // text on standard output: the rest of it
    for (const Finding &F : Findings)
      Streamer->print(F);
    for (const IncompleteAnalysis &I : collectIncomplete(Units))
      Streamer->print(I);
  } else {
    E = writeFileSafely(OutputFile.empty() ? "-" : StringRef(OutputFile),
                        [&](raw_ostream &OS) {
                          writeFormat(OS, Format, Findings, Units, Opts);
                        });
  }
  if (SarifOutput.empty())
    return E;
  Error Sarif = writeFileSafely(SarifOutput, [&](raw_ostream &OS) {
    writeSarif(OS, Findings, Units, Opts);
  });
  return joinErrors(std::move(E), std::move(Sarif));
}

/// The findings shown (new ones, with a baseline) per check and severity.
void printSummaryTable(ArrayRef<Finding> Findings) {
  std::map<std::string, std::array<unsigned, 3>> Counts; // note, warning, error
  std::array<unsigned, 3> Total{};
  for (const Finding &F : Findings) {
    if (F.BaselineState == "unchanged")
      continue;
    int Rank = severityRank(F.Severity);
    ++Counts[F.Error->DiagnosticName][Rank];
    ++Total[Rank];
  }
  if (Counts.empty())
    return;
  size_t Width = 5;
  for (const auto &[Check, C] : Counts)
    Width = std::max(Width, Check.size());
  auto Row = [&](StringRef Name, const std::array<unsigned, 3> &C) {
    errs() << "  " << left_justify(Name, Width) << formatv("{0,7}{1,9}{2,6}\n",
                                                         C[2], C[1], C[0]);
  };
  errs() << "ulplint: " << (Baseline.empty() ? "findings" : "new findings")
         << " by check and severity:\n  " << left_justify("check", Width)
         << formatv("{0,7}{1,9}{2,6}\n", "error", "warning", "note");
  for (const auto &[Check, C] : Counts)
    Row(Check, C);
  Row("total", Total);
}

/// What --write-baseline keeps of the old baseline: the findings of units
/// not analysed this time (from --baseline, else from the file it replaces).
std::vector<BaselineEntry> keptBaseline(const OutputOptions &Opts,
                                        const StringSet<> &NotAnalysed) {
  if (NotAnalysed.empty())
    return {};
  if (Opts.Baseline)
    return Opts.Unverified;
  std::vector<BaselineEntry> Kept;
  auto Old = readBaseline(WriteBaseline);
  if (!Old) {
    consumeError(Old.takeError()); // none yet, or unusable: nothing to keep
    return Kept;
  }
  for (const BaselineEntry &B : *Old)
    if (NotAnalysed.contains(B.File))
      Kept.push_back(B);
  return Kept;
}

void reportBaseline(ArrayRef<Finding> Findings, const OutputOptions &Opts) {
  unsigned New = llvm::count_if(
      Findings, [](const Finding &F) { return F.BaselineState == "new"; });
  errs() << "ulplint: baseline: " << New << " new, " << Findings.size() - New
         << " unchanged, " << Opts.Fixed.size() << " fixed";
  if (!Opts.Unverified.empty())
    errs() << ", " << Opts.Unverified.size()
           << " unknown (in units not analysed)";
  errs() << "\n";
  for (const BaselineEntry &B : Opts.Fixed)
    errs() << "ulplint: fixed: " << B.File << ":" << B.Line << ": " << B.Message
           << " [" << B.Check << "]\n";
}

/// --fix: applies the fixes and says what was not applied; true when a
/// file could not be fixed.
bool fix(ArrayRef<Finding> Findings) {
  FixOptions Opts;
  Opts.FromNotes = FixNotes;
  Opts.FixErrors = FixErrors;
  FixSummary S = applyFixes(Findings, Opts);
  for (const std::string &E : S.Errors)
    WithColor::error(errs(), "ulplint") << E << "\n";
  if (S.NotParsed)
    WithColor::warning(errs(), "ulplint")
        << "fixes of " << S.NotParsed << " finding(s) not applied: their "
        << "translation unit does not parse (--fix-errors applies them anyway)\n";
  if (!Quiet)
    errs() << "ulplint: applied fixes of " << S.Applied << " finding(s)\n";
  return !S.Errors.empty();
}

/// Settles the units' conditions, compares with the baseline, writes the
/// outputs; returns the exit status. \p Shard goes into shard outputs.
int finish(std::vector<UnitResult> Units, std::optional<json::Value> Shard,
           StringRef MainFile) {
  OutputOptions Opts;
  Opts.Format = Format;
  Opts.SourceRoot = sourceRoot();
  Opts.Shard = std::move(Shard);
  settleConditions(Units);
  std::vector<Finding> Findings = collectFindings(Units, Opts.SourceRoot);
  StringSet<> NotAnalysed;
  for (const UnitResult &U : Units)
    if (!U.ParseErrors.empty())
      NotAnalysed.insert(relativeTo(U.File, Opts.SourceRoot));
  if (!Baseline.empty()) {
    auto Known = readBaseline(Baseline);
    if (!Known)
      return usageError(toString(Known.takeError()));
    Opts.Baseline = true;
    Opts.Fixed = applyBaseline(Findings, *Known, NotAnalysed, Opts.Unverified);
  }

  // Each output is written or reported; a failure is an I/O error (2).
  bool IOFailed = false;
  auto Report = [&](Error E) {
    if (E) {
      IOFailed = true;
      WithColor::error(errs(), "ulplint") << toString(std::move(E)) << "\n";
    }
  };
  Report(writeOutputs(Findings, Units, Opts));
  if (!WriteBaseline.empty())
    Report(writeBaseline(WriteBaseline, Findings, Opts.SourceRoot,
                         keptBaseline(Opts, NotAnalysed)));
  if (!ExportFixes.empty())
    Report(writeFileSafely(ExportFixes, [&](raw_ostream &OS) {
      exportFixes(OS, Findings, MainFile);
    }));
  if (Fix || FixErrors)
    IOFailed |= fix(Findings);

  if (!Quiet)
    printSummaryTable(Findings);
  unsigned Broken = reportBrokenUnits(Units, "ulplint");
  if (!Quiet) {
    if (Opts.Baseline)
      reportBaseline(Findings, Opts);
    errs() << "ulplint: " << Findings.size() << " finding(s) in "
           << Units.size() << " translation unit(s)"
           << (Broken ? ", " + std::to_string(Broken) + " not analysed" : "")
           << skippedSummary(Units) << "\n";
  }
  if (Broken || IOFailed)
    return 2;
  int Threshold = severityRank(FailOn);
  bool AnyNew = llvm::any_of(Findings, [&](const Finding &F) {
    return F.BaselineState != "unchanged" &&
           severityRank(F.Severity) >= Threshold;
  });
  return AnyNew && WriteBaseline.empty() ? 1 : 0;
}

/// `ulplint merge A B ...`: the shard outputs joined into one result.
int merge() {
  // Top-level options parse in subcommands too; refuse the analysis's.
  // (cl::list overloads &: std::addressof gives the option.)
  for (const cl::Option *O : std::initializer_list<const cl::Option *>{
           &BuildPath, &Checks, &HeaderFilter, &LineFilter, &Config, &ConfigFile, &Jobs, &Fix, &FixNotes, &FixErrors,
           &ExportFixes, std::addressof(ExtraArgs),
           std::addressof(ExtraArgsBefore), std::addressof(Include),
           std::addressof(Exclude), &Shard, &CacheDir, &CacheMaxSize, &NoCache,
           &PrintCommands, &ListChecks, &Explain})
    if (O->getNumOccurrences())
      return usageError("'merge' joins shard outputs; " +
                        StringRef(O->ArgStr.size() > 1 ? "--" : "-") +
                        O->ArgStr + " is for the analysis");
  if (ShardOutputs.empty())
    return usageError("'merge' needs the shard outputs to join");
  auto Units = mergeShards(ShardOutputs);
  if (!Units)
    return usageError("merge: " + toString(Units.takeError()));
  return finish(std::move(*Units), std::nullopt, "");
}

/// Loads the database: -p, '--' flags, or one found above the first source.
Expected<std::unique_ptr<clang::tooling::CompilationDatabase>>
loadInputDatabase(std::unique_ptr<clang::tooling::CompilationDatabase> Fixed) {
  auto Fail = [](const Twine &Msg) {
    return createStringError(inconvertibleErrorCode(), Msg);
  };
  if (!BuildPath.empty()) {
    if (Fixed)
      return Fail("use either -p or '--' compiler flags, not both");
    return loadDatabase(BuildPath);
  }
  if (Fixed)
    return std::move(Fixed);
  if (Sources.empty())
    return Fail("no input: pass -p BUILD_DIR, or files followed by "
                "'-- <compiler flags>' (see --help)");
  std::string Err;
  auto Found = clang::tooling::CompilationDatabase::autoDetectFromSource(
      Sources[0], Err);
  if (!Found)
    return Fail("no compilation database found for '" + Sources[0] +
                "': pass -p BUILD_DIR or '-- <compiler flags>'");
  return firstCommandOnly(std::move(Found));
}

int analyzeDatabase(std::unique_ptr<clang::tooling::CompilationDatabase> Fixed,
                    const char *Argv0) {
  ShardSpec Spec;
  if (Shard.getNumOccurrences()) {
    auto Parsed = parseShard(Shard);
    if (!Parsed)
      return usageError(toString(Parsed.takeError()));
    Spec = *Parsed;
  }
  auto DB = loadInputDatabase(std::move(Fixed));
  if (!DB)
    return usageError(toString(DB.takeError()));
  auto AllFiles = inputFiles(**DB);
  if (!AllFiles)
    return usageError(toString(AllFiles.takeError()));
  std::vector<size_t> Indices;
  size_t Total = 0;
  auto Files = selectUnits(*AllFiles, Spec, Indices, Total);
  if (!Files)
    return usageError(toString(Files.takeError()));
  if (Error E = checkDirectories(**DB, *Files))
    return usageError(toString(std::move(E)));

  RunOptions Run;
  Run.Checks = Checks;
  Run.Config = Config;
  if (HeaderFilter.getNumOccurrences())
    Run.HeaderFilter = HeaderFilter;
  Run.LineFilter = LineFilter;
  Run.ConfigFile = ConfigFile;
  Run.ExtraArgs = ExtraArgs;
  Run.ExtraArgsBefore = ExtraArgsBefore;
  Run.Jobs = Jobs;
  Run.StackMiB = UnitStackSize;
  Run.SkipNonRdma = SkipNonRdma;
  if (PrintCommands) {
    printCommands(**DB, *Files, Run);
    return 0;
  }
  if (Error E = verifyConfiguration(Run, *Files))
    return usageError(toString(std::move(E)));
  auto MaxCache = parseSize(CacheMaxSize);
  if (!MaxCache)
    return usageError("--cache-max-size: " + toString(MaxCache.takeError()));
  Run.Progress = !Quiet && sys::Process::StandardErrIsDisplayed();
  std::unique_ptr<ResultCache> Cache = openCache(Argv0);
  Run.Cache = Cache.get();

  if (streamText()) {
    Streamer = std::make_unique<TextPrinter>(outs(), textColor());
    Run.OnUnitDone = [Root = sourceRoot()](const UnitResult &U) {
      streamUnit(U, Root);
    };
  }
  RunStats Stats;
  std::vector<UnitResult> Units = analyze(**DB, *Files, Run, Stats);
  if (Cache && !Quiet)
    errs() << "ulplint: " << Units.size() << " unit(s): " << Stats.Analysed
           << " analysed, " << Stats.FromCache << " from the cache"
           << (Stats.Skipped ? ", " + std::to_string(Stats.Skipped) +
                                   " skipped (no RDMA code)"
                             : "")
           << "\n";
  if (Cache)
    recordProgramFacts(*Cache, Units, programFiles(**DB, *AllFiles));
  if (Cache)
    if (unsigned Pruned = Cache->maintain(*MaxCache); Pruned && !Quiet)
      errs() << "ulplint: cache: " << Pruned
             << " least recently used entries removed (--cache-max-size="
             << CacheMaxSize << ")\n";
  std::optional<json::Value> ShardData;
  if (Spec.Count)
    ShardData = shardSection(Spec, Total, Indices, Units);
  return finish(std::move(Units), std::move(ShardData),
                Files->empty() ? "" : Files->front());
}
} // namespace

/// The exit status of the command line.
static int run(int argc, const char **argv);

int main(int argc, const char **argv) {
  InitLLVM X(argc, argv);
  int Rc = run(argc, argv);
  Streamer.reset(); // before standard output goes at exit
  // A failed standard output is an I/O error, whatever the findings.
  if (Error E = flushStandardOutput()) {
    WithColor::error(errs(), "ulplint") << toString(std::move(E)) << "\n";
    Rc = 2;
  }
  errs().clear_error(); // nowhere left to report it
  return Rc;
}

static int run(int argc, const char **argv) {
  // The driver knows a cross compiler's target only if it is registered.
  InitializeAllTargetInfos();
  // `file.c -- flags` names the compile command on the command line.
  std::string FixedError;
  std::unique_ptr<clang::tooling::CompilationDatabase> DB =
      clang::tooling::FixedCompilationDatabase::loadFromCommandLine(
          argc, argv, FixedError);

  cl::HideUnrelatedOptions(Category);
  cl::HideUnrelatedOptions(Category, MergeCommand);
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
  if (!UnitWorker.empty())
    return runUnitWorker(UnitWorker);
  if (ShortHelp) {
    cl::PrintHelpMessage(false, true);
    return 0;
  }
  if (UnitStackSize < 1 || UnitStackSize > 4095)
    return usageError("--unit-stack-size must be between 1 and 4095 (MiB)");
  static int Anchor;
  setWorkerExecutable(sys::fs::getMainExecutable(argv[0], &Anchor));
  if (ReportCommand)
    return runReport();
  if (ListChecks)
    return listChecks();
  if (!Explain.empty())
    return explain(Explain);
  if (!is_contained({"text", "json", "sarif", "codeclimate"}, Format))
    return usageError("unknown --format '" + Format +
                      "' (expected text, json, sarif or codeclimate)");
  if (!is_contained({"error", "warning", "note"}, FailOn))
    return usageError("unknown --fail-on '" + FailOn +
                      "' (expected error, warning or note)");
  if (FixNotes && !Fix && !FixErrors)
    return usageError("--fix-notes needs --fix");
  if (!FixedError.empty())
    return usageError(describeFlagErrors(FixedError));
  if (MergeCommand) {
    if (DB)
      return usageError("'merge' joins shard outputs; '--' compiler flags "
                        "are for the analysis");
    return merge();
  }
  return analyzeDatabase(std::move(DB), argv[0]);
}
