//===- Worker.h - Each unit in a process of its own ---------------*- C++ -*-===//
//
// A unit that crashes clang or the checks (a stack overflow on deeply nested
// code, an assertion, a null dereference) must cost that unit only. Each
// unit is analysed by a worker: ulplint itself, started with the hidden
// option --unit-worker=REQUEST. The run reports a crashed unit as not
// analysed, with the reason, and writes every other unit's result.
//
// In-process recovery (llvm::CrashRecoveryContext) was tried and rejected:
// its POSIX handler is installed without SA_ONSTACK and worker threads have
// no alternate signal stack, so a stack overflow kills the whole process;
// and even with both added, the longjmp out of the crash leaves behind any
// lock the crashing thread held (a malloc arena, a function-local static's
// guard, the engine's analysis cache), so a later unit can hang the run.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_WORKER_H
#define ULPLINT_TOOL_WORKER_H

#include "Driver.h"

namespace ulplint::tool {

/// The executable that runs workers (set once by main).
void setWorkerExecutable(std::string Path);

/// Analyses the unit of \p Cmd in a worker process; a crash comes back as
/// a unit that was not analysed, with the reason as its error.
UnitResult analyzeIsolated(const clang::tooling::CompileCommand &Cmd,
                           const RunOptions &Opts);

/// The worker's side of --unit-worker=REQUEST; its exit status.
int runUnitWorker(llvm::StringRef RequestPath);

/// Removes the run's temporary directory for worker files.
void removeWorkerFiles();

} // namespace ulplint::tool

#endif
