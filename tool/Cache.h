//===- Cache.h - Unit results as JSON, and kept between runs -----*- C++ -*-===//
//
// A unit's result (findings with notes and fixes, compiler errors, facts and
// conditional findings) round-trips through JSON unchanged, so a result read
// back from the cache or from a shard output settles and prints exactly like
// a fresh one.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_CACHE_H
#define ULPLINT_TOOL_CACHE_H

#include "Driver.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/JSON.h"
#include <mutex>
#include <optional>

namespace ulplint::tool {

llvm::json::Value unitToJson(const UnitResult &U);
bool unitFromJson(const llvm::json::Value &V, UnitResult &U,
                  llvm::json::Path P);
/// A function whose analysis a budget cut short, as JSON and back.
llvm::json::Value incompleteToJson(const IncompleteAnalysis &I);
bool incompleteFromJson(const llvm::json::Value &V, IncompleteAnalysis &I,
                        llvm::json::Path P);

/// A hex digest of \p Data (xxh3, 128 bits): content identity, not security.
std::string contentHash(llvm::StringRef Data);

/// What makes two builds of ulplint analyse alike: the version, the Clang
/// libraries it runs on and the executable itself (the checks' code and the
/// embedded rules).
std::string toolIdentity(const char *Argv0, void *MainAddr);

/// The part of a unit's cache key known before parsing: the file, the
/// command clang runs (after rewriting), the effective check configuration
/// and the environment variables that add include directories (CPATH, ...).
std::string unitKey(llvm::StringRef File, llvm::StringRef Directory,
                    llvm::ArrayRef<std::string> Argv, llvm::StringRef Config);

/// "512M", "2G", "100K", "4096": bytes (K, M, G are powers of 1024).
llvm::Expected<uint64_t> parseSize(llvm::StringRef Text);

/// Results per unit under DIR/<tool identity>/, valid while every file the
/// unit read (main file and headers) has the content it had. Safe to share
/// between threads and between processes; entries are replaced atomically.
class ResultCache {
public:
  static llvm::Expected<std::unique_ptr<ResultCache>>
  open(llvm::StringRef Dir, llvm::StringRef ToolIdentity);

  /// The stored result, if every file it read is unchanged. A missing,
  /// stale or unreadable entry is a miss.
  std::optional<UnitResult> lookup(llvm::StringRef Key);
  /// Stores \p R with the files it read. A failure costs only a
  /// re-analysis next time, so it is not reported.
  void store(llvm::StringRef Key, const UnitResult &R,
             llvm::ArrayRef<InputFile> Inputs);

  llvm::StringRef directory() const { return Root; }

  /// Housekeeping after a run, over the whole cache directory (every build
  /// of ulplint's entries): removes temporary files that killed processes
  /// left (older than an hour: younger ones may be being written), then the
  /// least recently used entries until at most \p MaxBytes remain (0: no
  /// limit). Returns the number of entries removed.
  unsigned maintain(uint64_t MaxBytes);

  /// Records each unit's exported facts in the cache directory's
  /// program-facts.json (ProgramFacts.h), for the clang-tidy plugin and
  /// ulplint-clangd: units analysed now replace their entries, entries of
  /// other files of \p Database stay, files no longer in it go. Units that
  /// did not parse keep their last entry.
  llvm::Error recordProgramFacts(llvm::ArrayRef<UnitResult> Units,
                                 llvm::ArrayRef<std::string> Database);

private:
  explicit ResultCache(std::string Root) : Root(std::move(Root)) {}
  std::string entryPath(llvm::StringRef Key) const;
  /// Content hash of \p Path now, read once per run.
  std::string currentHash(llvm::StringRef Path);

  std::string Root;
  std::mutex Lock;
  llvm::StringMap<std::string> Hashes;
};

} // namespace ulplint::tool

#endif
