//===- Prescan.h - Skipping units that hold no RDMA code --------*- C++ -*-===//
//
// Before a unit is parsed, a textual pre-scan decides whether it can hold
// RDMA code at all: its main file, the files it forces in with -include and
// the project headers it includes (resolved through the includer's
// directory, -iquote and -I, outside /usr) are read with clang's
// dependency-directives scanner for their #include lines and scanned for
// identifiers. A unit none of whose files includes an RDMA header or names
// an identifier with an RDMA prefix (rules/prescan.yaml) is skipped
// unparsed: no check can find anything in it.
//
// The scan is conservative: both branches of every #if count, comments and
// strings count; a file that cannot be read or scanned, a quoted #include
// the project's paths do not resolve (a missing or generated header) and an
// -include that is not a regular file all make the unit parsed.
// It does not follow computed includes (`#include MACRO`) or headers found
// only through -isystem, -idirafter or the compiler's default directories;
// their spelled names are still compared with the RDMA headers.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_PRESCAN_H
#define ULPLINT_TOOL_PRESCAN_H

#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include <mutex>
#include <string>
#include <vector>

namespace ulplint::tool {

/// rules/prescan.yaml.
struct PrescanRules {
  std::vector<std::string> Headers;
  std::vector<std::string> IdentifierPrefixes;
  std::vector<std::string> NotRdma;
};

/// The embedded rules/prescan.yaml (a fatal error when it does not parse:
/// the build embeds it).
const PrescanRules &prescanRules();

/// Parses the text of a prescan.yaml.
llvm::Expected<PrescanRules> parsePrescanRules(llvm::StringRef Text);

/// Shared by the units of a run (thread-safe): each file is read and
/// scanned once.
class Prescanner {
public:
  explicit Prescanner(const PrescanRules &Rules = prescanRules())
      : Rules(Rules) {}

  /// True when the unit compiled by \p Cmd may hold RDMA code; false only
  /// when none of the files the scan reaches names an RDMA header or
  /// identifier.
  bool mayHoldRdma(const clang::tooling::CompileCommand &Cmd);

  /// Does \p Name, as spelled in an #include, name an RDMA header?
  bool isRdmaHeader(llvm::StringRef Name) const;

private:
  struct Include {
    std::string Name;
    bool Angled = false;
  };
  struct FileScan {
    bool Rdma = false; // names an RDMA identifier or header, or unreadable
    std::vector<Include> Includes;
  };
  const FileScan &scan(const std::string &Path);

  const PrescanRules &Rules;
  std::mutex Lock;
  llvm::StringMap<FileScan> Scanned;
};

} // namespace ulplint::tool

#endif
