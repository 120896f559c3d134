//===- Cache.cpp - Unit results as JSON, and kept between runs ------------===//

#include "Cache.h"
#include "Files.h"
#include "ProgramFacts.h"
#include <map>
#include <set>
#include "clang/Basic/Version.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

using namespace clang::tidy;
namespace json = llvm::json;

namespace ulplint::tool {

//===-- JSON --------------------------------------------------------------===//

namespace {
json::Array replacementsToJson(const llvm::StringMap<clang::tooling::Replacements> &Fix) {
  // Sorted by file: StringMap's order is its hash table's.
  std::vector<llvm::StringRef> Files;
  for (const auto &Entry : Fix)
    Files.push_back(Entry.getKey());
  llvm::sort(Files);
  json::Array Out;
  for (llvm::StringRef File : Files) {
    json::Array Reps;
    for (const clang::tooling::Replacement &R : Fix.find(File)->second)
      Reps.push_back(json::Object{{"file", R.getFilePath()},
                                  {"offset", R.getOffset()},
                                  {"length", R.getLength()},
                                  {"text", R.getReplacementText()}});
    Out.push_back(json::Object{{"file", File}, {"replacements", std::move(Reps)}});
  }
  return Out;
}

json::Object messageToJson(const clang::tooling::DiagnosticMessage &M) {
  json::Array Ranges;
  for (const clang::tooling::FileByteRange &R : M.Ranges)
    Ranges.push_back(json::Object{
        {"file", R.FilePath}, {"offset", R.FileOffset}, {"length", R.Length}});
  return json::Object{{"text", M.Message},
                      {"file", M.FilePath},
                      {"offset", M.FileOffset},
                      {"fix", replacementsToJson(M.Fix)},
                      {"ranges", std::move(Ranges)}};
}

json::Object errorToJson(const ClangTidyError &E) {
  json::Array Notes;
  for (const auto &N : E.Notes)
    Notes.push_back(messageToJson(N));
  return json::Object{{"name", E.DiagnosticName},
                      {"level", static_cast<int64_t>(E.DiagLevel)},
                      {"buildDirectory", E.BuildDirectory},
                      {"warningAsError", E.IsWarningAsError},
                      {"aliases", E.EnabledDiagnosticAliases},
                      {"message", messageToJson(E.Message)},
                      {"notes", std::move(Notes)}};
}

json::Object conditionToJson(const ConditionalFinding &C) {
  return json::Object{{"check", C.Check},     {"file", C.File},
                      {"offset", C.Offset},   {"message", C.Message},
                      {"require", C.Require}, {"unless", C.Unless}};
}

/// The array \p Key of object \p V, or null after reporting at \p P.
const json::Array *arrayField(const json::Value &V, llvm::StringRef Key,
                              json::Path P) {
  const json::Object *O = V.getAsObject();
  const json::Array *A = O ? O->getArray(Key) : nullptr;
  if (!A)
    P.field(Key).report("expected an array");
  return A;
}

bool replacementsFromJson(const json::Value &V,
                          llvm::StringMap<clang::tooling::Replacements> &Fix,
                          json::Path P) {
  const json::Array *Files = V.getAsArray();
  if (!Files) {
    P.report("expected an array");
    return false;
  }
  for (size_t I = 0; I < Files->size(); ++I) {
    json::Path FP = P.index(I);
    std::string File;
    json::ObjectMapper O((*Files)[I], FP);
    if (!O || !O.map("file", File))
      return false;
    const json::Array *Reps = arrayField((*Files)[I], "replacements", FP);
    if (!Reps)
      return false;
    for (size_t J = 0; J < Reps->size(); ++J) {
      std::string RFile, Text;
      unsigned Offset = 0, Length = 0;
      json::ObjectMapper R((*Reps)[J], FP.field("replacements").index(J));
      if (!R || !R.map("file", RFile) || !R.map("offset", Offset) ||
          !R.map("length", Length) || !R.map("text", Text))
        return false;
      if (llvm::Error Err = Fix[File].add(
              clang::tooling::Replacement(RFile, Offset, Length, Text))) {
        llvm::consumeError(std::move(Err));
        FP.report("conflicting replacements");
        return false;
      }
    }
  }
  return true;
}

bool messageFromJson(const json::Value &V, clang::tooling::DiagnosticMessage &M,
                     json::Path P) {
  json::ObjectMapper O(V, P);
  if (!O || !O.map("text", M.Message) || !O.map("file", M.FilePath) ||
      !O.map("offset", M.FileOffset))
    return false;
  const json::Array *Ranges = arrayField(V, "ranges", P);
  const json::Value *Fix = V.getAsObject()->get("fix");
  if (!Ranges || !Fix || !replacementsFromJson(*Fix, M.Fix, P.field("fix")))
    return false;
  for (size_t I = 0; I < Ranges->size(); ++I) {
    clang::tooling::FileByteRange R;
    json::ObjectMapper RO((*Ranges)[I], P.field("ranges").index(I));
    if (!RO || !RO.map("file", R.FilePath) || !RO.map("offset", R.FileOffset) ||
        !RO.map("length", R.Length))
      return false;
    M.Ranges.push_back(std::move(R));
  }
  return true;
}

bool errorFromJson(const json::Value &V, ClangTidyError &E, json::Path P) {
  int Level = 0;
  json::ObjectMapper O(V, P);
  if (!O || !O.map("name", E.DiagnosticName) || !O.map("level", Level) ||
      !O.map("buildDirectory", E.BuildDirectory) ||
      !O.map("warningAsError", E.IsWarningAsError) ||
      !O.map("aliases", E.EnabledDiagnosticAliases))
    return false;
  const json::Array *Notes = arrayField(V, "notes", P);
  if (!Notes)
    return false;
  E.DiagLevel = static_cast<ClangTidyError::Level>(Level);
  const json::Value *Message = V.getAsObject()->get("message");
  if (!Message || !messageFromJson(*Message, E.Message, P.field("message")))
    return false;
  for (size_t I = 0; I < Notes->size(); ++I) {
    clang::tooling::DiagnosticMessage N;
    if (!messageFromJson((*Notes)[I], N, P.field("notes").index(I)))
      return false;
    E.Notes.push_back(std::move(N));
  }
  return true;
}

bool conditionFromJson(const json::Value &V, ConditionalFinding &C,
                       json::Path P) {
  json::ObjectMapper O(V, P);
  return O && O.map("check", C.Check) && O.map("file", C.File) &&
         O.map("offset", C.Offset) && O.mapOptional("message", C.Message) &&
         O.map("require", C.Require) && O.map("unless", C.Unless);
}
} // namespace

json::Value incompleteToJson(const IncompleteAnalysis &I) {
  return json::Object{{"file", I.File},
                      {"line", I.Line},
                      {"function", I.Function},
                      {"reason", I.Reason}};
}

bool incompleteFromJson(const json::Value &V, IncompleteAnalysis &I,
                        json::Path P) {
  json::ObjectMapper O(V, P);
  return O && O.map("file", I.File) && O.map("line", I.Line) &&
         O.map("function", I.Function) && O.map("reason", I.Reason);
}

json::Value unitToJson(const UnitResult &U) {
  json::Array Findings, Conditions;
  for (const ClangTidyError &E : U.Findings)
    Findings.push_back(errorToJson(E));
  json::Array Incomplete;
  for (const ConditionalFinding &C : U.Facts.Conditions)
    Conditions.push_back(conditionToJson(C));
  for (const IncompleteAnalysis &I : U.Facts.Incomplete)
    Incomplete.push_back(incompleteToJson(I));
  json::Object O{{"file", U.File},
                 {"findings", std::move(Findings)},
                 {"parseErrors", U.ParseErrors},
                 {"facts", U.Facts.Facts},
                 {"conditions", std::move(Conditions)},
                 {"incomplete", std::move(Incomplete)}};
  if (!U.Skipped.empty())
    O["skipped"] = U.Skipped;
  return O;
}

bool unitFromJson(const json::Value &V, UnitResult &U, json::Path P) {
  json::ObjectMapper O(V, P);
  if (!O || !O.map("file", U.File) || !O.map("parseErrors", U.ParseErrors) ||
      !O.map("facts", U.Facts.Facts) || !O.mapOptional("skipped", U.Skipped))
    return false;
  const json::Array *Findings = arrayField(V, "findings", P);
  const json::Array *Conditions = arrayField(V, "conditions", P);
  const json::Array *Incomplete = arrayField(V, "incomplete", P);
  if (!Findings || !Conditions || !Incomplete)
    return false;
  for (size_t I = 0; I < Incomplete->size(); ++I) {
    IncompleteAnalysis Item;
    if (!incompleteFromJson((*Incomplete)[I], Item, P.field("incomplete").index(I)))
      return false;
    U.Facts.Incomplete.push_back(std::move(Item));
  }
  for (size_t I = 0; I < Findings->size(); ++I) {
    ClangTidyError E("", ClangTidyError::Warning, "", false);
    if (!errorFromJson((*Findings)[I], E, P.field("findings").index(I)))
      return false;
    U.Findings.push_back(std::move(E));
  }
  for (size_t I = 0; I < Conditions->size(); ++I) {
    ConditionalFinding C;
    if (!conditionFromJson((*Conditions)[I], C, P.field("conditions").index(I)))
      return false;
    U.Facts.Conditions.push_back(std::move(C));
  }
  return true;
}

//===-- Keys --------------------------------------------------------------===//

std::string contentHash(llvm::StringRef Data) {
  llvm::XXH128_hash_t H = llvm::xxh3_128bits(llvm::arrayRefFromStringRef(Data));
  return llvm::utohexstr(H.high64, true, 16) + llvm::utohexstr(H.low64, true, 16);
}

/// Length-prefixed fields, so that no two field lists hash alike.
static void addField(std::string &Out, llvm::StringRef Field) {
  Out += std::to_string(Field.size());
  Out += ':';
  Out += Field;
}

std::string toolIdentity(const char *Argv0, void *MainAddr) {
  std::string Id;
  addField(Id, ULPLINT_VERSION);
  addField(Id, LLVM_VERSION_STRING);
  addField(Id, clang::getClangFullVersion()); // the shared libraries in use
  std::string Exe = llvm::sys::fs::getMainExecutable(Argv0, MainAddr);
  if (auto Buffer = llvm::MemoryBuffer::getFile(Exe, false, false))
    addField(Id, contentHash((*Buffer)->getBuffer()));
  else
    addField(Id, Exe); // unreadable: at least tell builds at other paths apart
  return contentHash(Id).substr(0, 16);
}

std::string unitKey(llvm::StringRef File, llvm::StringRef Directory,
                    llvm::ArrayRef<std::string> Argv, llvm::StringRef Config) {
  std::string Text;
  addField(Text, File);
  addField(Text, Directory);
  for (const std::string &A : Argv)
    addField(Text, A);
  addField(Text, Config);
  // Include directories from the environment, which clang's driver reads.
  for (const char *Var : {"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
                          "OBJC_INCLUDE_PATH", "OBJCPLUS_INCLUDE_PATH"}) {
    std::optional<std::string> Value = llvm::sys::Process::GetEnv(Var);
    addField(Text, Value ? std::string(Var) + "=" + *Value : "");
  }
  return contentHash(Text);
}

llvm::Expected<uint64_t> parseSize(llvm::StringRef Text) {
  llvm::StringRef Digits = Text.take_while(llvm::isDigit);
  std::string U = Text.drop_front(Digits.size()).lower();
  uint64_t N = 0;
  unsigned Shift = 0;
  if (U == "k" || U == "kib" || U == "kb")
    Shift = 10;
  else if (U == "m" || U == "mib" || U == "mb")
    Shift = 20;
  else if (U == "g" || U == "gib" || U == "gb")
    Shift = 30;
  else if (!U.empty() && U != "b")
    Digits = "";
  if (Digits.empty() || Digits.getAsInteger(10, N) || N > (UINT64_MAX >> Shift))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "invalid size '" + Text +
                                       "': expected a number of bytes, or "
                                       "with K, M or G (e.g. 512M)");
  return N << Shift;
}

//===-- The cache ---------------------------------------------------------===//

/// Sets a file's modification time to now; --cache-max-size prunes by it.
static void touch(llvm::StringRef Path) {
  int FD;
  if (llvm::sys::fs::openFileForReadWrite(Path, FD, llvm::sys::fs::CD_OpenExisting,
                                          llvm::sys::fs::OF_None))
    return;
  (void)llvm::sys::fs::setLastAccessAndModificationTime(
      FD, std::chrono::system_clock::now());
  llvm::sys::Process::SafelyCloseFileDescriptor(FD);
}

namespace {
struct CacheFile {
  std::string Path;
  uint64_t Size;
  llvm::sys::TimePoint<> Modified;
};

/// Every regular file under \p Dir.
std::vector<CacheFile> filesUnder(llvm::StringRef Dir) {
  std::vector<CacheFile> Files;
  std::error_code EC;
  for (llvm::sys::fs::recursive_directory_iterator It(Dir, EC), End;
       It != End && !EC; It.increment(EC)) {
    llvm::sys::fs::file_status St;
    if (llvm::sys::fs::status(It->path(), St) || !llvm::sys::fs::is_regular_file(St))
      continue;
    Files.push_back({It->path(), St.getSize(), St.getLastModificationTime()});
  }
  return Files;
}

bool isTemporary(llvm::StringRef Path) {
  llvm::StringRef Name = llvm::sys::path::filename(Path);
  // Ours, and llvm::writeToOutput's of earlier ulplint versions.
  return Name.contains(TempFileMarker) || Name.contains(".temp-stream-");
}
} // namespace

unsigned ResultCache::maintain(uint64_t MaxBytes) {
  llvm::StringRef Dir = llvm::sys::path::parent_path(Root);
  auto Now = std::chrono::system_clock::now();
  std::vector<CacheFile> Entries;
  uint64_t Total = 0;
  for (CacheFile &F : filesUnder(Dir)) {
    if (isTemporary(F.Path)) {
      if (Now - F.Modified > std::chrono::hours(1))
        llvm::sys::fs::remove(F.Path);
      continue;
    }
    if (!llvm::StringRef(F.Path).ends_with(".json") ||
        llvm::sys::path::filename(F.Path) == ProgramFactsFile)
      continue; // not an entry
    Total += F.Size;
    Entries.push_back(std::move(F));
  }
  if (!MaxBytes || Total <= MaxBytes)
    return 0;
  llvm::sort(Entries, [](const CacheFile &A, const CacheFile &B) {
    return A.Modified < B.Modified;
  });
  unsigned Removed = 0;
  for (const CacheFile &F : Entries) {
    if (Total <= MaxBytes)
      break;
    if (!llvm::sys::fs::remove(F.Path)) {
      Total -= F.Size;
      ++Removed;
    }
  }
  return Removed;
}

llvm::Expected<std::unique_ptr<ResultCache>>
ResultCache::open(llvm::StringRef Dir, llvm::StringRef ToolIdentity) {
  llvm::SmallString<256> Root(Dir);
  llvm::sys::fs::make_absolute(Root);
  llvm::sys::path::append(Root, "v1-" + ToolIdentity);
  if (std::error_code EC = llvm::sys::fs::create_directories(Root))
    return llvm::createStringError(EC, "cannot create cache directory '" +
                                           Root + "': " + EC.message());
  return std::unique_ptr<ResultCache>(new ResultCache(std::string(Root)));
}

std::string ResultCache::entryPath(llvm::StringRef Key) const {
  llvm::SmallString<256> P(Root);
  llvm::sys::path::append(P, Key.take_front(2), Key + ".json");
  return std::string(P);
}

std::string ResultCache::currentHash(llvm::StringRef Path) {
  {
    std::lock_guard<std::mutex> G(Lock);
    auto It = Hashes.find(Path);
    if (It != Hashes.end())
      return It->second;
  }
  auto Buffer = llvm::MemoryBuffer::getFile(Path, false, false);
  std::string Hash = Buffer ? contentHash((*Buffer)->getBuffer()) : "missing";
  std::lock_guard<std::mutex> G(Lock);
  return Hashes.try_emplace(Path, Hash).first->second;
}

std::optional<UnitResult> ResultCache::lookup(llvm::StringRef Key) {
  auto Buffer = llvm::MemoryBuffer::getFile(entryPath(Key));
  if (!Buffer)
    return std::nullopt;
  llvm::Expected<json::Value> Entry = json::parse((*Buffer)->getBuffer());
  if (!Entry) {
    llvm::consumeError(Entry.takeError());
    return std::nullopt;
  }
  const json::Object *O = Entry->getAsObject();
  const json::Array *Inputs = O ? O->getArray("inputs") : nullptr;
  const json::Value *Result = O ? O->get("result") : nullptr;
  if (!Inputs || !Result)
    return std::nullopt;
  UnitResult U;
  U.Inputs.reserve(Inputs->size());
  for (const json::Value &In : *Inputs) {
    const json::Array *Pair = In.getAsArray();
    if (!Pair || Pair->size() != 2)
      return std::nullopt;
    std::optional<llvm::StringRef> Path = (*Pair)[0].getAsString();
    std::optional<llvm::StringRef> Hash = (*Pair)[1].getAsString();
    if (!Path || !Hash || currentHash(*Path) != *Hash)
      return std::nullopt;
    U.Inputs.push_back({Path->str(), Hash->str()});
  }
  json::Path::Root R("cache entry");
  if (!unitFromJson(*Result, U, R)) {
    llvm::consumeError(R.getError());
    return std::nullopt;
  }
  touch(entryPath(Key)); // recently used: pruned last
  return U;
}

void ResultCache::store(llvm::StringRef Key, const UnitResult &R,
                        llvm::ArrayRef<InputFile> Inputs) {
  json::Array In;
  for (const InputFile &F : Inputs)
    In.push_back(json::Array{F.Path, F.Hash.empty() ? currentHash(F.Path) : F.Hash});
  json::Object Entry{{"inputs", std::move(In)}, {"result", unitToJson(R)}};
  std::string Path = entryPath(Key);
  if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(Path)))
    return;
  // A temporary file renamed into place: readers never see half an entry.
  WriteOptions Opts;
  Opts.Durable = false; // a torn entry is a miss
  Opts.RespectReadOnly = false;
  llvm::Error E = writeFileSafely(
      Path, [&](llvm::raw_ostream &OS) { OS << json::Value(std::move(Entry)); },
      Opts);
  llvm::consumeError(std::move(E));
}

} // namespace ulplint::tool

namespace ulplint::tool {

llvm::Error ResultCache::recordProgramFacts(llvm::ArrayRef<UnitResult> Units,
                                            llvm::ArrayRef<std::string> Database) {
  llvm::SmallString<256> Path(llvm::sys::path::parent_path(Root));
  llvm::sys::path::append(Path, ProgramFactsFile);
  std::set<llvm::StringRef> Files(Database.begin(), Database.end());
  std::map<std::string, json::Value> Entries;
  if (auto Old = llvm::MemoryBuffer::getFile(Path)) {
    llvm::Expected<json::Value> V = json::parse((*Old)->getBuffer());
    if (!V)
      llvm::consumeError(V.takeError()); // unusable: rewritten whole
    else if (const json::Object *O = V->getAsObject())
      if (const json::Object *OldUnits = O->getObject("units"))
        for (const auto &[File, Facts] : *OldUnits)
          if (Files.count(File))
            Entries.insert({File.str(), json::Value(Facts)});
  }
  for (const UnitResult &U : Units)
    if (U.ParseErrors.empty()) {
      std::set<std::string> Facts(U.Facts.Facts.begin(), U.Facts.Facts.end());
      Entries.insert_or_assign(
          U.File, json::Value(std::vector<std::string>(Facts.begin(), Facts.end())));
    }
  json::Object UnitsJson;
  for (auto &[File, Facts] : Entries)
    UnitsJson[File] = std::move(Facts);
  WriteOptions Opts;
  Opts.Durable = false; // rebuilt by the next run
  Opts.RespectReadOnly = false;
  return writeFileSafely(
      Path,
      [&](llvm::raw_ostream &OS) {
        OS << llvm::formatv("{0:1}", json::Value(json::Object{
                                         {"version", 1},
                                         {"units", std::move(UnitsJson)}}))
           << "\n";
      },
      Opts);
}

} // namespace ulplint::tool
