//===- Output.h - Findings as text, JSON and SARIF; fixes --------*- C++ -*-===//

#ifndef ULPLINT_TOOL_OUTPUT_H
#define ULPLINT_TOOL_OUTPUT_H

#include "Driver.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>

namespace ulplint::tool {

/// A finding ready for output: the clang-tidy error plus what the formats
/// need (positions, severity from the catalog, a stable fingerprint).
struct Finding {
  const clang::tidy::ClangTidyError *Error = nullptr;
  /// The unit that reported it (one that parsed, if several did).
  const UnitResult *Unit = nullptr;
  std::string File;       // absolute path
  unsigned Line = 0, Column = 0;
  std::string Severity;   // error | warning | note, from rules/catalog.yaml
  std::string Fingerprint;
  std::string BaselineState; // with --baseline: "new" or "unchanged"
};

/// The name of the fingerprints below in SARIF partialFingerprints and in
/// baselines; it changes whenever their computation does.
inline constexpr llvm::StringLiteral FingerprintKind = "ulplintFingerprint/v2";

/// Positions and fingerprints for every finding, deduplicated, in input
/// order. Fingerprints name files relative to \p SourceRoot.
std::vector<Finding> collectFindings(llvm::ArrayRef<UnitResult> Units,
                                     llvm::StringRef SourceRoot);

/// \p Path as the path of a URI reference (RFC 3986): every byte but
/// unreserved characters and '/' percent-encoded, so spaces, '%', '#', '?'
/// and non-ASCII names stay one valid reference.
std::string uriPath(llvm::StringRef Path);
/// The inverse of uriPath.
std::string uriPathDecoded(llvm::StringRef Uri);

/// \p Path relative to \p Root if it is inside it, else unchanged.
std::string relativeTo(llvm::StringRef Path, llvm::StringRef Root);

/// A finding recorded in a baseline file.
struct BaselineEntry {
  std::string Fingerprint, Check, File, Message; // File: as in JSON output
  unsigned Line = 0;
};

struct OutputOptions {
  std::string Format = "text"; // text | json | sarif
  std::string SourceRoot;      // relative URIs in SARIF and JSON
  /// With --baseline: findings say whether they are new, and the baseline's
  /// findings that are gone are listed as fixed.
  bool Baseline = false;
  std::vector<BaselineEntry> Fixed;
  /// Baseline findings in units that were not analysed: not known to be
  /// fixed, and kept by --write-baseline.
  std::vector<BaselineEntry> Unverified;
  /// Shard outputs carry the units' unsettled results and facts for
  /// `ulplint merge` (Shards.h).
  std::optional<llvm::json::Value> Shard;
};

/// The functions whose analysis a budget cut short, each once, in unit
/// order: findings may be missing there.
std::vector<IncompleteAnalysis>
collectIncomplete(llvm::ArrayRef<UnitResult> Units);

/// "analysis incomplete in F: reason", as every format words it.
std::string incompleteMessage(const IncompleteAnalysis &I);

/// The rank of a catalog severity for --fail-on: note 0, warning 1, error 2.
int severityRank(llvm::StringRef Severity);

/// Text in clang-tidy's shape, printed by clang's own diagnostic renderer
/// (TextDiagnostic, as clang-tidy's handleErrors prints): the catalog's
/// severity, the source line with the range underlined, fix-it lines, the
/// notes, and colours when asked. Each finding and incomplete analysis is
/// printed once, however often it is handed over, so units can be printed
/// as they finish and the rest at the end.
class TextPrinter {
public:
  TextPrinter(llvm::raw_ostream &OS, bool Color);
  ~TextPrinter();
  /// Prints \p F unless it was printed or a baseline holds it.
  void print(const Finding &F);
  void print(const IncompleteAnalysis &I);

private:
  struct Impl;
  std::unique_ptr<Impl> P;
};

/// Text shows the findings a baseline does not hold, and where the analysis
/// was incomplete.
void writeText(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
               llvm::ArrayRef<UnitResult> Units, bool Color);
/// GitLab Code Quality (a Code Climate subset): an array of issues.
void writeCodeClimate(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                      const OutputOptions &Opts);
void writeJson(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
               llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts);
void writeSarif(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts);

struct FixOptions {
  /// A finding without a fix of its own uses its first note's.
  bool FromNotes = false;
  /// Also fix findings of units that do not parse (clang-tidy's --fix-errors).
  bool FixErrors = false;
};

struct FixSummary {
  unsigned Applied = 0;     // findings whose fixes are now in the files
  unsigned NotParsed = 0;   // findings left alone: their unit does not parse
  std::vector<std::string> Errors; // files that could not be fixed, and why
};

/// Applies the fix-its of \p Findings to the files in place. Replacements
/// are grouped by file identity (device and inode), so a file reached
/// through a symbolic link or a hard link is fixed once; a file whose
/// content changed since its unit read it is left alone and reported.
FixSummary applyFixes(llvm::ArrayRef<Finding> Findings, const FixOptions &Opts);

/// clang-apply-replacements YAML for every finding with a fix.
void exportFixes(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                 llvm::StringRef MainFile);

//===-- Baselines (Baseline.cpp) ------------------------------------------===//

/// The findings of a baseline file, or of a JSON or SARIF output of ulplint.
llvm::Expected<std::vector<BaselineEntry>> readBaseline(llvm::StringRef Path);
/// Writes \p Findings, then \p Kept (entries of units not analysed), as a
/// baseline.
llvm::Error writeBaseline(llvm::StringRef Path, llvm::ArrayRef<Finding> Findings,
                          llvm::StringRef SourceRoot,
                          llvm::ArrayRef<BaselineEntry> Kept = {});
/// Marks each finding "new" or "unchanged" by its fingerprint; returns the
/// baseline's findings that no longer occur. Those in \p NotAnalysed files
/// (relative to the source root) go to \p Unverified instead: their unit
/// said nothing.
std::vector<BaselineEntry>
applyBaseline(llvm::MutableArrayRef<Finding> Findings,
              llvm::ArrayRef<BaselineEntry> Baseline,
              const llvm::StringSet<> &NotAnalysed,
              std::vector<BaselineEntry> &Unverified);

} // namespace ulplint::tool

#endif
