//===- Output.h - Findings as text, JSON and SARIF; fixes --------*- C++ -*-===//

#ifndef ULPLINT_TOOL_OUTPUT_H
#define ULPLINT_TOOL_OUTPUT_H

#include "Driver.h"
#include "llvm/Support/raw_ostream.h"

namespace ulplint::tool {

/// A finding ready for output: the clang-tidy error plus what the formats
/// need (positions, severity from the catalog, a stable fingerprint).
struct Finding {
  const clang::tidy::ClangTidyError *Error = nullptr;
  std::string File;       // absolute path
  unsigned Line = 0, Column = 0;
  std::string Severity;   // error | warning | note, from rules/catalog.yaml
  std::string Fingerprint;
};

/// \p Path relative to \p Root when it lies below it, else unchanged.
std::string relativeTo(llvm::StringRef Path, llvm::StringRef Root);

/// Positions and fingerprints for every finding, deduplicated, in input
/// order.
std::vector<Finding> collectFindings(llvm::ArrayRef<UnitResult> Units);

struct OutputOptions {
  std::string Format = "text"; // text | json | sarif
  std::string SourceRoot;      // relative URIs in SARIF and JSON
};

void writeText(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings);
void writeJson(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
               llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts);
void writeSarif(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts);

/// Applies the fix-its of \p Findings to the files in place. With
/// \p FromNotes, a finding without a fix of its own uses its first note's.
/// Returns the number of findings whose fixes were applied.
llvm::Expected<unsigned> applyFixes(llvm::ArrayRef<Finding> Findings,
                                    bool FromNotes);

/// clang-apply-replacements YAML for every finding with a fix.
void exportFixes(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                 llvm::StringRef MainFile);

} // namespace ulplint::tool

#endif
