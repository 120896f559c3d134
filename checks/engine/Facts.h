//===- Facts.h - What one unit tells the whole program ----------*- C++ -*-===//
//
// Some questions span files: xprtrdma registers in frwr_ops.c and
// invalidates from rpc_rdma.c; RDS refuses iWARP devices in ib.c and posts
// RDMA READs in ib_send.c. A unit exports facts, and findings may depend on
// a fact another unit exports ("report unless the ULP refuses iWARP").
// ulplint installs a sink per unit and settles conditions once every unit
// is analysed; the clang-tidy plugin has no sink and keeps each finding.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_FACTS_H
#define ULPLINT_ENGINE_FACTS_H

#include "llvm/ADT/StringRef.h"
#include <string>
#include <vector>

namespace ulplint {

/// A finding kept only if every fact in \c Require and none in \c Unless is
/// exported by some unit of the program.
struct ConditionalFinding {
  std::string Check;
  std::string File;
  unsigned Offset = 0;
  std::vector<std::string> Require;
  std::vector<std::string> Unless;
};

struct UnitFacts {
  std::vector<std::string> Facts;
  std::vector<ConditionalFinding> Conditions;
};

/// The sink of the unit analysed on this thread, or null (plugin, clangd).
UnitFacts *currentFacts();
/// Installs \p Sink for the current thread for the lifetime of the guard.
class FactScope {
public:
  explicit FactScope(UnitFacts *Sink);
  ~FactScope();

private:
  UnitFacts *Saved;
};

} // namespace ulplint

#endif
