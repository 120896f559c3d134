//===- Shards.cpp - Which units a run analyses; merging shard runs --------===//

#include "Shards.h"
#include "Cache.h"
#include "Output.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/xxhash.h"
#include <map>
#include <optional>

namespace json = llvm::json;

namespace ulplint::tool {

static llvm::Error selectionError(const llvm::Twine &Msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), Msg);
}

//===-- Path filters ------------------------------------------------------===//

/// Each glob, and the glob with "/*" for what is under a directory.
llvm::Error PathFilter::addGlobs(llvm::ArrayRef<std::string> Patterns,
                                 llvm::StringRef Option,
                                 std::vector<llvm::GlobPattern> &Out) {
  for (const std::string &Text : Patterns) {
    llvm::StringRef Trimmed = llvm::StringRef(Text).rtrim('/');
    for (std::string P : {Trimmed.str(), Trimmed.str() + "/*"}) {
      auto Glob = llvm::GlobPattern::create(Texts.emplace_back(std::move(P)));
      if (!Glob)
        return selectionError("invalid --" + Option + " pattern '" + Text +
                              "': " + llvm::toString(Glob.takeError()));
      Out.push_back(std::move(*Glob));
    }
  }
  return llvm::Error::success();
}

llvm::Expected<PathFilter> PathFilter::create(llvm::ArrayRef<std::string> Include,
                                              llvm::ArrayRef<std::string> Exclude,
                                              llvm::StringRef SourceRoot) {
  PathFilter F;
  F.Root = SourceRoot.str();
  if (llvm::Error E = F.addGlobs(Include, "include", F.Include))
    return std::move(E);
  if (llvm::Error E = F.addGlobs(Exclude, "exclude", F.Exclude))
    return std::move(E);
  return F;
}

bool PathFilter::matchesAny(const std::vector<llvm::GlobPattern> &Patterns,
                            llvm::StringRef AbsolutePath) const {
  std::string Relative = relativeTo(AbsolutePath, Root);
  return llvm::any_of(Patterns, [&](const llvm::GlobPattern &G) {
    return G.match(AbsolutePath) || G.match(Relative);
  });
}

bool PathFilter::accepts(llvm::StringRef AbsolutePath) const {
  if (!Include.empty() && !matchesAny(Include, AbsolutePath))
    return false;
  return !matchesAny(Exclude, AbsolutePath);
}

//===-- Shards ------------------------------------------------------------===//

std::string ShardSpec::str() const {
  return std::to_string(Index) + "/" + std::to_string(Count);
}

llvm::Expected<ShardSpec> parseShard(llvm::StringRef Text) {
  auto [I, N] = Text.split('/');
  ShardSpec S;
  if (I.getAsInteger(10, S.Index) || N.getAsInteger(10, S.Count) ||
      S.Count == 0 || S.Index == 0 || S.Index > S.Count)
    return selectionError("invalid shard '" + Text +
                          "': expected i/N with 1 <= i <= N, e.g. 2/4");
  return S;
}

bool inShard(llvm::StringRef RelativePath, const ShardSpec &S) {
  if (!S.Count)
    return true;
  // The hash's high half scaled to [0, N): uniform for any N.
  uint64_t High = llvm::xxh3_64bits(llvm::arrayRefFromStringRef(RelativePath)) >> 32;
  return (High * S.Count) >> 32 == S.Index - 1;
}

json::Value shardSection(const ShardSpec &S, size_t Total,
                         llvm::ArrayRef<size_t> Indices,
                         llvm::ArrayRef<UnitResult> Units) {
  json::Array Items;
  for (size_t I = 0; I < Units.size(); ++I)
    Items.push_back(json::Object{{"index", static_cast<int64_t>(Indices[I])},
                                 {"result", unitToJson(Units[I])}});
  return json::Object{{"shard", S.str()},
                      {"total", static_cast<int64_t>(Total)},
                      {"units", std::move(Items)}};
}

//===-- Merging -----------------------------------------------------------===//

namespace {
struct ShardOutput {
  ShardSpec Spec;
  size_t Total = 0;
  std::vector<std::pair<size_t, UnitResult>> Units;
};
} // namespace

/// The shard section and the version of a JSON or SARIF output.
static std::pair<const json::Object *, std::optional<llvm::StringRef>>
locateShard(const json::Value &Doc) {
  const json::Object *Root = Doc.getAsObject();
  if (!Root)
    return {nullptr, std::nullopt};
  if (const json::Array *Runs = Root->getArray("runs")) {
    const json::Object *Run = Runs->size() == 1 ? (*Runs)[0].getAsObject() : nullptr;
    const json::Object *Props = Run ? Run->getObject("properties") : nullptr;
    const json::Object *Ours = Props ? Props->getObject("ulplint") : nullptr;
    const json::Object *Tool = Run ? Run->getObject("tool") : nullptr;
    const json::Object *Driver = Tool ? Tool->getObject("driver") : nullptr;
    return {Ours ? Ours->getObject("shard") : nullptr,
            Driver ? Driver->getString("version") : std::nullopt};
  }
  return {Root->getObject("shard"), Root->getString("version")};
}

static llvm::Expected<ShardOutput> readShardOutput(llvm::StringRef Path) {
  auto Fail = [&](const llvm::Twine &Msg) {
    return selectionError("'" + Path + "': " + Msg);
  };
  auto Buffer = llvm::MemoryBuffer::getFile(Path);
  if (!Buffer)
    return Fail("cannot read it: " + Buffer.getError().message());
  llvm::Expected<json::Value> Doc = json::parse((*Buffer)->getBuffer());
  if (!Doc)
    return Fail("malformed JSON: " + llvm::toString(Doc.takeError()));
  auto [Shard, Version] = locateShard(*Doc);
  if (!Shard)
    return Fail("not a shard output (write shards with --shard=i/N and "
                "--format=json or --format=sarif)");
  if (Version != llvm::StringRef(ULPLINT_VERSION))
    return Fail("written by ulplint " + Version.value_or("?") +
                ", this is ulplint " ULPLINT_VERSION);
  ShardOutput Out;
  std::optional<llvm::StringRef> Spec = Shard->getString("shard");
  std::optional<int64_t> Total = Shard->getInteger("total");
  const json::Array *Units = Shard->getArray("units");
  if (!Spec || !Total || *Total < 0 || !Units)
    return Fail("malformed shard section");
  auto Parsed = parseShard(*Spec);
  if (!Parsed)
    return Fail(llvm::toString(Parsed.takeError()));
  Out.Spec = *Parsed;
  Out.Total = *Total;
  for (size_t I = 0; I < Units->size(); ++I) {
    const json::Object *O = (*Units)[I].getAsObject();
    std::optional<int64_t> Index = O ? O->getInteger("index") : std::nullopt;
    const json::Value *Result = O ? O->get("result") : nullptr;
    UnitResult U;
    std::string Where = "shard.units[" + std::to_string(I) + "].result";
    json::Path::Root R(Where); // keeps a reference to Where
    if (!Index || *Index < 0 || *Index >= *Total || !Result)
      return Fail("malformed unit " + llvm::Twine(I) + " in the shard section");
    if (!unitFromJson(*Result, U, R))
      return Fail(llvm::toString(R.getError()));
    Out.Units.emplace_back(*Index, std::move(U));
  }
  return Out;
}

llvm::Expected<std::vector<UnitResult>>
mergeShards(llvm::ArrayRef<std::string> Paths) {
  std::map<unsigned, std::string> Seen; // shard index -> its file
  std::vector<std::optional<UnitResult>> Units;
  unsigned Count = 0;
  for (const std::string &Path : Paths) {
    auto Shard = readShardOutput(Path);
    if (!Shard)
      return Shard.takeError();
    if (Seen.empty()) {
      Count = Shard->Spec.Count;
      Units.resize(Shard->Total);
    } else if (Shard->Spec.Count != Count || Shard->Total != Units.size()) {
      return selectionError("'" + Path + "' is shard " + Shard->Spec.str() +
                            " of " + llvm::Twine(Shard->Total) +
                            " units; '" + Seen.begin()->second + "' is of " +
                            llvm::Twine(Count) + " shards of " +
                            llvm::Twine(Units.size()) + " units");
    }
    auto [It, New] = Seen.try_emplace(Shard->Spec.Index, Path);
    if (!New)
      return selectionError("shard " + Shard->Spec.str() + " given twice: '" +
                            It->second + "' and '" + Path + "'");
    for (auto &[Index, U] : Shard->Units) {
      if (Units[Index])
        return selectionError("unit '" + U.File + "' is in two shards ('" +
                              Path + "'): were the shards run on the same "
                              "database, filters and source root?");
      Units[Index] = std::move(U);
    }
  }
  for (unsigned I = 1; I <= Count; ++I)
    if (!Seen.count(I))
      return selectionError("shard " + ShardSpec{I, Count}.str() +
                            " is missing");
  std::vector<UnitResult> Out;
  for (size_t I = 0; I < Units.size(); ++I) {
    if (!Units[I])
      return selectionError("unit " + llvm::Twine(I) + " of " +
                            llvm::Twine(Units.size()) +
                            " is in no shard: were the shards run on the same "
                            "database, filters and source root?");
    Out.push_back(std::move(*Units[I]));
  }
  return Out;
}

} // namespace ulplint::tool
