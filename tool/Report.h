//===- Report.h - The migration report: sites per ULP as HTML or Markdown -===//
//
// `ulplint report -p BUILD_DIR -o report.html` runs every rdma-* check with
// the registration inventory (checks/engine/Inventory.h) switched on and
// writes, per ULP, where registration is still managed by hand, what
// replaces each site, which sites have automatic fixes, an effort estimate
// and the other findings in the same code. docs/reports.md describes it.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_REPORT_H
#define ULPLINT_TOOL_REPORT_H

#include "Output.h"
#include "llvm/Support/CommandLine.h"

namespace ulplint::tool {

/// `ulplint report ...`; true when the command line named it.
extern llvm::cl::SubCommand ReportCommand;

/// Runs the report subcommand after the command line was parsed.
int runReport();

struct ReportOptions {
  std::string Format = "html"; // html | md
  std::string SourceRoot;      // paths in the report are relative to it
  std::string SourceUrl;       // links: SourceUrl + relative path + "#L" + line
  std::string KernelVersion;   // of a Linux tree (its Makefile), or empty
  std::string Title = "Memory registration migration report";
  std::vector<UlpPattern> ExtraUlps; // --ulp-map, before rules/ulps.yaml
};

/// Writes the report of analysed \p Units and their \p Findings.
void writeReport(llvm::raw_ostream &OS, llvm::ArrayRef<UnitResult> Units,
                 llvm::ArrayRef<Finding> Findings, const ReportOptions &Opts);

} // namespace ulplint::tool

#endif
