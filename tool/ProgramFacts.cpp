//===- ProgramFacts.cpp - Other units' facts for hosts of one unit --------===//

#include "ProgramFacts.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include <mutex>
#include <set>

namespace ulplint::tool {

static bool hasProgramFacts(llvm::StringRef Dir) {
  llvm::SmallString<256> P(Dir);
  llvm::sys::path::append(P, ProgramFactsFile);
  return llvm::sys::fs::is_regular_file(P);
}

/// The value of the host's string option \p Name (clang-tidy's -p, clangd's
/// --compile-commands-dir): both are cl::opt<std::string> in the process.
static std::string hostOption(llvm::StringRef Name) {
  auto &Options = llvm::cl::getRegisteredOptions();
  auto It = Options.find(Name);
  if (It == Options.end() || !It->second->getNumOccurrences())
    return "";
  return *static_cast<llvm::cl::opt<std::string> *>(It->second);
}

std::string findProgramFactsDir(llvm::StringRef BuildDirectory,
                                llvm::StringRef CacheDir) {
  if (!CacheDir.empty())
    return CacheDir.str();
  if (std::optional<std::string> Env =
          llvm::sys::Process::GetEnv("ULPLINT_CACHE_DIR"))
    return *Env;
  for (llvm::StringRef Option : {"p", "compile-commands-dir"}) {
    llvm::SmallString<256> Dir(hostOption(Option));
    if (Dir.empty())
      continue;
    llvm::sys::fs::make_absolute(Dir);
    if (!llvm::sys::fs::is_directory(Dir)) // -p names the JSON file
      llvm::sys::path::remove_filename(Dir);
    llvm::sys::path::append(Dir, ".ulplint-cache");
    if (hasProgramFacts(Dir))
      return std::string(Dir);
  }
  for (llvm::SmallString<256> Dir = BuildDirectory; !Dir.empty();
       Dir = llvm::sys::path::parent_path(Dir)) {
    llvm::SmallString<256> Cache(Dir);
    llvm::sys::path::append(Cache, ".ulplint-cache");
    if (hasProgramFacts(Cache))
      return std::string(Cache);
  }
  return "";
}

namespace {
/// program-facts.json as read, per file.
struct FactsIndex {
  std::string Path;
  llvm::sys::TimePoint<> Modified;
  std::vector<std::pair<std::string, std::vector<std::string>>> Units;
};

/// Reads \p Path, or keeps the last reading while the file is unchanged
/// (clangd asks for every edit).
std::optional<FactsIndex> readIndex(const std::string &Path) {
  static std::mutex Lock;
  static std::optional<FactsIndex> Last;
  llvm::sys::fs::file_status St;
  if (llvm::sys::fs::status(Path, St))
    return std::nullopt;
  std::lock_guard<std::mutex> G(Lock);
  if (Last && Last->Path == Path && Last->Modified == St.getLastModificationTime())
    return Last;
  auto Buffer = llvm::MemoryBuffer::getFile(Path);
  if (!Buffer)
    return std::nullopt;
  llvm::Expected<llvm::json::Value> V = llvm::json::parse((*Buffer)->getBuffer());
  if (!V) {
    llvm::consumeError(V.takeError());
    return std::nullopt;
  }
  const llvm::json::Object *Root = V->getAsObject();
  const llvm::json::Object *Units = Root ? Root->getObject("units") : nullptr;
  if (!Units || Root->getInteger("version") != 1)
    return std::nullopt;
  FactsIndex Index{Path, St.getLastModificationTime(), {}};
  for (const auto &[File, Facts] : *Units) {
    std::vector<std::string> List;
    llvm::json::Path::Root R;
    if (!llvm::json::fromJSON(Facts, List, R))
      return std::nullopt;
    Index.Units.emplace_back(File.str(), std::move(List));
  }
  Last = std::move(Index);
  return Last;
}
} // namespace

std::optional<std::vector<std::string>>
otherUnitsFacts(llvm::StringRef MainFile, llvm::StringRef BuildDirectory,
                llvm::StringRef CacheDir) {
  std::string Dir = findProgramFactsDir(BuildDirectory, CacheDir);
  if (Dir.empty())
    return std::nullopt;
  llvm::SmallString<256> Path(Dir);
  llvm::sys::path::append(Path, ProgramFactsFile);
  std::optional<FactsIndex> Index = readIndex(std::string(Path));
  if (!Index)
    return std::nullopt;
  llvm::SmallString<256> Main(MainFile);
  llvm::sys::path::make_absolute(BuildDirectory, Main);
  llvm::sys::path::remove_dots(Main, true);
  std::set<std::string> Facts;
  for (const auto &[File, List] : Index->Units)
    if (File != Main)
      Facts.insert(List.begin(), List.end());
  return std::vector<std::string>(Facts.begin(), Facts.end());
}

} // namespace ulplint::tool
