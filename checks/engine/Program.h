//===- Program.h - The program a unit belongs to ----------------*- C++ -*-===//
//
// Some questions span files: xprtrdma registers in frwr_ops.c and
// invalidates from rpc_rdma.c; RDS refuses iWARP devices in ib.c and posts
// RDMA READs in ib_send.c. A unit tells its program facts (Facts.h), and
// learns here what it knows of the program itself.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_PROGRAM_H
#define ULPLINT_ENGINE_PROGRAM_H

#include "Analysis.h"

namespace ulplint {

class Program {
public:
  static const Program &of(const TuAnalysis &A);
  explicit Program(const TuAnalysis &A);

  /// The program the unit belongs to, for facts shared between its files:
  /// the main file's directory.
  const std::string &key() const { return Key; }
  /// A fact about this program: factKey(K, key()).
  std::string fact(FactKind K) const { return factKey(K, Key); }
  /// Tells the whole program (ulplint only) a fact about this unit.
  void exportFact(llvm::StringRef Fact) const;
  /// An `if` that makes this unit refuse devices other than InfiniBand/RoCE
  /// (`if (dev->node_type != RDMA_NODE_IB_CA) return;`), or null.
  const clang::Stmt *iwarpGuard() const { return IWarpGuard; }

private:
  std::string Key;
  const clang::Stmt *IWarpGuard = nullptr;
};

} // namespace ulplint

#endif
