//===- Shards.h - Which units a run analyses; merging shard runs -*- C++ -*-===//
//
// CI spreads a large database over machines: `--shard=i/N` analyses a fixed
// part of the units, and `ulplint merge` joins the parts. A shard output
// carries each unit's result before conditions are settled, with its facts,
// so the merge settles them over the whole program exactly as a single run
// does.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_SHARDS_H
#define ULPLINT_TOOL_SHARDS_H

#include "Driver.h"
#include "llvm/Support/GlobPattern.h"
#include "llvm/Support/JSON.h"
#include <list>

namespace ulplint::tool {

/// --include and --exclude: globs over the path relative to the source
/// root and over the absolute path; a pattern naming a directory covers
/// what is under it.
class PathFilter {
public:
  static llvm::Expected<PathFilter> create(llvm::ArrayRef<std::string> Include,
                                           llvm::ArrayRef<std::string> Exclude,
                                           llvm::StringRef SourceRoot);
  bool accepts(llvm::StringRef AbsolutePath) const;
  bool empty() const { return Include.empty() && Exclude.empty(); }

private:
  llvm::Error addGlobs(llvm::ArrayRef<std::string> Texts,
                       llvm::StringRef Option,
                       std::vector<llvm::GlobPattern> &Out);
  bool matchesAny(const std::vector<llvm::GlobPattern> &Patterns,
                  llvm::StringRef AbsolutePath) const;
  /// The patterns' text: a GlobPattern refers to it. A list keeps each
  /// string where it is when the filter moves.
  std::list<std::string> Texts;
  std::vector<llvm::GlobPattern> Include, Exclude;
  std::string Root;
};

/// Shard Index of Count (1-based); Count 0 is no sharding.
struct ShardSpec {
  unsigned Index = 0, Count = 0;
  std::string str() const;
};

/// Parses "i/N" with 1 <= i <= N.
llvm::Expected<ShardSpec> parseShard(llvm::StringRef Text);

/// Whether the unit at \p RelativePath belongs to shard \p S: a hash of the
/// path, so a unit stays in its shard when others come and go (per-shard
/// caches stay warm), and every machine agrees.
bool inShard(llvm::StringRef RelativePath, const ShardSpec &S);

/// The shard section of an output: the shard, the number of units of the
/// whole run and, per unit of this shard, its index in the whole run and
/// its unsettled result.
llvm::json::Value shardSection(const ShardSpec &S, size_t Total,
                               llvm::ArrayRef<size_t> Indices,
                               llvm::ArrayRef<UnitResult> Units);

/// The units of the whole run from its shard outputs (JSON or SARIF), in
/// the order a single run has them. Every shard must be there once.
llvm::Expected<std::vector<UnitResult>>
mergeShards(llvm::ArrayRef<std::string> Paths);

} // namespace ulplint::tool

#endif
