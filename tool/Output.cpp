//===- Output.cpp - Findings as text, JSON and SARIF; fixes ---------------===//

#include "Output.h"
#include "Cache.h"
#include "Files.h"
#include "Sorting.h"
#include "engine/Rules.h"
#include "clang-tidy/ClangTidy.h"
#include "clang/Basic/DiagnosticOptions.h"
#include "clang/Basic/FileManager.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Frontend/TextDiagnostic.h"
#include "clang/Tooling/Core/Diagnostic.h"
#include "clang/Tooling/Core/Replacement.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/xxhash.h"
#include <map>
#include <set>

using namespace clang::tidy;
namespace json = llvm::json;

namespace ulplint::tool {

namespace {
/// File contents read once, for positions, excerpts and fixes.
class SourceCache {
public:
  llvm::StringRef text(const std::string &Path) {
    auto &Slot = Files[Path];
    if (!Slot) {
      auto Buffer = llvm::MemoryBuffer::getFile(Path);
      Slot = Buffer ? std::move(*Buffer)
                    : llvm::MemoryBuffer::getMemBuffer("", Path);
    }
    return Slot->getBuffer();
  }
  std::pair<unsigned, unsigned> lineColumn(const std::string &Path,
                                           unsigned Offset) {
    llvm::StringRef T = text(Path);
    Offset = std::min<size_t>(Offset, T.size());
    llvm::StringRef Before = T.take_front(Offset);
    unsigned Line = Before.count('\n') + 1;
    size_t LineStart = Before.rfind('\n');
    unsigned Column =
        Offset - (LineStart == llvm::StringRef::npos ? 0 : LineStart + 1) + 1;
    return {Line, Column};
  }
  llvm::StringRef line(const std::string &Path, unsigned Line) {
    llvm::StringRef T = text(Path);
    for (unsigned I = 1; I < Line && !T.empty(); ++I)
      T = T.split('\n').second;
    return T.split('\n').first.rtrim("\r");
  }

private:
  std::map<std::string, std::unique_ptr<llvm::MemoryBuffer>> Files;
};

SourceCache &sources() {
  static SourceCache Cache;
  return Cache;
}

std::string absolutePath(llvm::StringRef Path, llvm::StringRef BuildDir) {
  llvm::SmallString<256> P(Path);
  if (llvm::sys::path::is_relative(P) && !BuildDir.empty()) {
    P = BuildDir;
    llvm::sys::path::append(P, Path);
  }
  llvm::sys::path::remove_dots(P, true);
  return std::string(P);
}

std::string normalizeSpace(llvm::StringRef S) {
  std::string Out;
  for (char C : S.trim())
    if (!llvm::isSpace(C) || (Out.size() && Out.back() != ' '))
      Out += llvm::isSpace(C) ? ' ' : C;
  return Out;
}
} // namespace

std::string relativeTo(llvm::StringRef Path, llvm::StringRef Root) {
  if (Root.empty())
    return Path.str();
  llvm::SmallString<256> R(Root);
  llvm::sys::path::remove_dots(R, true);
  if (!R.ends_with("/"))
    R += "/";
  if (Path.starts_with(R))
    return Path.drop_front(R.size()).str();
  return Path.str();
}

std::vector<Finding> collectFindings(llvm::ArrayRef<UnitResult> Units,
                                     llvm::StringRef SourceRoot) {
  std::vector<Finding> Out;
  using Key = std::tuple<std::string, std::string, unsigned, std::string>;
  // The unit each finding is credited to: one that parsed, if any did.
  std::map<Key, const UnitResult *> Seen;
  std::map<std::string, unsigned> Occurrences;
  for (const UnitResult &U : Units) {
    std::vector<Finding> Unit;
    for (const ClangTidyError &E : U.Findings) {
      Finding F;
      F.Error = &E;
      F.Unit = &U;
      F.File = absolutePath(E.Message.FilePath, E.BuildDirectory);
      auto [It, New] = Seen.try_emplace(
          Key{E.DiagnosticName, F.File, E.Message.FileOffset, E.Message.Message},
          &U);
      if (!New) {
        if (!It->second->ParseErrors.empty() && U.ParseErrors.empty())
          It->second = &U;
        continue;
      }
      std::tie(F.Line, F.Column) =
          sources().lineColumn(F.File, E.Message.FileOffset);
      const RuleInfo *Rule = Rules::embedded().rule(E.DiagnosticName);
      F.Severity = Rule ? Rule->Severity : "warning";
      Unit.push_back(std::move(F));
    }
    sortKeepingTies(Unit, [](const Finding &A, const Finding &B) {
      return std::tie(A.File, A.Line, A.Column) <
             std::tie(B.File, B.Line, B.Column);
    });
    Out.insert(Out.end(), Unit.begin(), Unit.end());
  }
  for (Finding &F : Out)
    F.Unit = Seen[Key{F.Error->DiagnosticName, F.File, F.Error->Message.FileOffset,
                      F.Error->Message.Message}];
  // Fingerprints survive edits elsewhere in the file: the check, the file
  // (relative to the source root, so the same on every machine), the
  // finding's own line with whitespace normalised, and which occurrence of
  // that combination it is.
  for (Finding &F : Out) {
    std::string Key = F.Error->DiagnosticName + "\n" +
                      relativeTo(F.File, SourceRoot) + "\n" +
                      normalizeSpace(sources().line(F.File, F.Line));
    unsigned N = Occurrences[Key]++;
    F.Fingerprint = llvm::utohexstr(llvm::xxh3_64bits(Key + "\n" + std::to_string(N)),
                                    /*LowerCase=*/true, 16);
  }
  return Out;
}

//===-- Text --------------------------------------------------------------===//

std::vector<IncompleteAnalysis>
collectIncomplete(llvm::ArrayRef<UnitResult> Units) {
  std::vector<IncompleteAnalysis> Out;
  std::set<std::tuple<std::string, unsigned, std::string>> Seen;
  for (const UnitResult &U : Units)
    for (const IncompleteAnalysis &I : U.Facts.Incomplete)
      if (Seen.insert({I.File, I.Line, I.Function}).second)
        Out.push_back(I);
  return Out;
}

std::string incompleteMessage(const IncompleteAnalysis &I) {
  return "analysis incomplete in " + I.Function + ": " + I.Reason +
         "; findings there may be missing";
}

int severityRank(llvm::StringRef Severity) {
  return Severity == "error" ? 2 : Severity == "warning" ? 1 : 0;
}

static clang::DiagnosticsEngine::Level levelOf(llvm::StringRef Severity) {
  if (Severity == "error")
    return clang::DiagnosticsEngine::Error;
  return Severity == "note" ? clang::DiagnosticsEngine::Note
                            : clang::DiagnosticsEngine::Warning;
}

/// The renderer with a source manager of its own over the real files, as
/// clang-tidy's ErrorReporter has.
struct TextPrinter::Impl {
  Impl(llvm::raw_ostream &OS, bool Color)
      : Files(clang::FileSystemOptions(), llvm::vfs::getRealFileSystem()),
        Diags(clang::DiagnosticIDs::create(), DiagOpts,
              new clang::IgnoringDiagConsumer()),
        SM(Diags, Files) {
    DiagOpts.ShowColors = Color;
    if (Color)
      OS.enable_colors(true);
    Renderer = std::make_unique<clang::TextDiagnostic>(OS, LangOpts, DiagOpts);
  }

  clang::SourceLocation location(llvm::StringRef Path, unsigned Offset) {
    if (Path.empty())
      return {};
    llvm::Expected<clang::FileEntryRef> File = Files.getFileRef(Path);
    if (!File) {
      llvm::consumeError(File.takeError());
      return {};
    }
    clang::FileID ID = SM.getOrCreateFileID(*File, clang::SrcMgr::C_User);
    return SM.getLocForStartOfFile(ID).getLocWithOffset(Offset);
  }
  clang::CharSourceRange range(llvm::StringRef Path, unsigned Offset,
                               unsigned Length) {
    clang::SourceLocation Begin = location(Path, Offset);
    if (Begin.isInvalid())
      return {};
    return clang::CharSourceRange::getCharRange(Begin,
                                                Begin.getLocWithOffset(Length));
  }

  /// One message with its ranges and the fix-its in its own file.
  void emit(const clang::tooling::DiagnosticMessage &M, llvm::StringRef BuildDir,
            clang::DiagnosticsEngine::Level Level, llvm::StringRef Text) {
    std::string File = absolutePath(M.FilePath, BuildDir);
    clang::SourceLocation Loc = location(File, M.FileOffset);
    llvm::SmallVector<clang::CharSourceRange, 4> Ranges;
    for (const clang::tooling::FileByteRange &R : M.Ranges)
      if (clang::CharSourceRange CR = range(absolutePath(R.FilePath, BuildDir),
                                            R.FileOffset, R.Length);
          CR.isValid())
        Ranges.push_back(CR);
    llvm::SmallVector<clang::FixItHint, 4> Hints;
    for (const auto &[FixFile, Reps] : M.Fix)
      for (const clang::tooling::Replacement &R : Reps)
        if (absolutePath(FixFile, BuildDir) == File)
          if (clang::CharSourceRange CR = range(File, R.getOffset(), R.getLength());
              CR.isValid())
            Hints.push_back(clang::FixItHint::CreateReplacement(
                CR, R.getReplacementText()));
    if (Loc.isInvalid()) { // e.g. "this fix will not be applied"
      Renderer->emitDiagnostic(clang::FullSourceLoc(), Level, Text, {}, {});
      return;
    }
    Renderer->emitDiagnostic(clang::FullSourceLoc(Loc, SM), Level, Text, Ranges,
                             Hints);
  }

  clang::DiagnosticOptions DiagOpts;
  clang::LangOptions LangOpts;
  clang::FileManager Files;
  clang::DiagnosticsEngine Diags;
  clang::SourceManager SM;
  std::unique_ptr<clang::TextDiagnostic> Renderer;
  std::set<std::tuple<std::string, std::string, unsigned, std::string>> Printed;
  std::set<std::tuple<std::string, unsigned, std::string>> PrintedIncomplete;
};

TextPrinter::TextPrinter(llvm::raw_ostream &OS, bool Color)
    : P(std::make_unique<Impl>(OS, Color)) {}
TextPrinter::~TextPrinter() = default;

void TextPrinter::print(const Finding &F) {
  const ClangTidyError &E = *F.Error;
  if (F.BaselineState == "unchanged" ||
      !P->Printed
           .insert({E.DiagnosticName, F.File, E.Message.FileOffset,
                    E.Message.Message})
           .second)
    return;
  P->emit(E.Message, E.BuildDirectory, levelOf(F.Severity),
          E.Message.Message + " [" + E.DiagnosticName + "]");
  for (const auto &Note : E.Notes)
    P->emit(Note, E.BuildDirectory, clang::DiagnosticsEngine::Note, Note.Message);
}

void TextPrinter::print(const IncompleteAnalysis &I) {
  if (!P->PrintedIncomplete.insert({I.File, I.Line, I.Function}).second)
    return;
  clang::SourceLocation Loc;
  if (clang::SourceLocation Start = P->location(I.File, 0); Start.isValid())
    Loc = P->SM.translateLineCol(P->SM.getFileID(Start), I.Line, 1);
  // The place without its source line: the function is the subject.
  bool Snippet = P->DiagOpts.ShowCarets;
  P->DiagOpts.ShowCarets = false;
  P->Renderer->emitDiagnostic(
      Loc.isValid() ? clang::FullSourceLoc(Loc, P->SM) : clang::FullSourceLoc(),
      clang::DiagnosticsEngine::Note, incompleteMessage(I), {}, {});
  P->DiagOpts.ShowCarets = Snippet;
}

void writeText(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
               llvm::ArrayRef<UnitResult> Units, bool Color) {
  TextPrinter Printer(OS, Color);
  for (const Finding &F : Findings)
    Printer.print(F);
  for (const IncompleteAnalysis &I : collectIncomplete(Units))
    Printer.print(I);
}

//===-- JSON and SARIF ----------------------------------------------------===//

namespace {
struct Region {
  unsigned StartLine, StartColumn, EndLine, EndColumn;
};
Region regionOf(const std::string &File, unsigned Offset, unsigned Length) {
  auto [L1, C1] = sources().lineColumn(File, Offset);
  auto [L2, C2] = sources().lineColumn(File, Offset + Length);
  return {L1, C1, L2, C2};
}

/// The fixes of a finding as (file, replacements) pairs with absolute paths.
std::vector<std::pair<std::string, std::vector<clang::tooling::Replacement>>>
fixesOf(const ClangTidyError &E) {
  std::vector<std::pair<std::string, std::vector<clang::tooling::Replacement>>> Out;
  for (const auto &[File, Reps] : E.Message.Fix) {
    std::vector<clang::tooling::Replacement> List(Reps.begin(), Reps.end());
    Out.emplace_back(absolutePath(File, E.BuildDirectory), std::move(List));
  }
  return Out;
}

json::Array fixedToJson(llvm::ArrayRef<BaselineEntry> Fixed) {
  json::Array Out;
  for (const BaselineEntry &B : Fixed)
    Out.push_back(json::Object{{"check", B.Check},
                               {"message", B.Message},
                               {"file", B.File},
                               {"line", B.Line},
                               {"fingerprint", B.Fingerprint}});
  return Out;
}

json::Array incompleteToJsonOutput(llvm::ArrayRef<UnitResult> Units,
                                   llvm::StringRef SourceRoot) {
  json::Array Out;
  for (const IncompleteAnalysis &I : collectIncomplete(Units))
    Out.push_back(json::Object{{"file", relativeTo(I.File, SourceRoot)},
                               {"line", I.Line},
                               {"function", I.Function},
                               {"reason", I.Reason}});
  return Out;
}

/// Units the pre-scan skipped, with the reason: they are counted in "units"
/// but were not parsed.
static json::Array skippedToJson(llvm::ArrayRef<UnitResult> Units,
                                 llvm::StringRef SourceRoot) {
  json::Array Out;
  for (const UnitResult &U : Units)
    if (!U.Skipped.empty())
      Out.push_back(json::Object{{"file", relativeTo(U.File, SourceRoot)},
                                 {"reason", U.Skipped}});
  return Out;
}

/// Units not analysed, with paths relative to the source root as findings'.
json::Array unitErrors(llvm::ArrayRef<UnitResult> Units,
                       llvm::StringRef SourceRoot) {
  json::Array Errors;
  for (const UnitResult &U : Units)
    for (const std::string &Msg : U.ParseErrors)
      Errors.push_back(json::Object{{"file", relativeTo(U.File, SourceRoot)},
                                    {"message", Msg}});
  return Errors;
}
} // namespace

void writeJson(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
               llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts) {
  json::Array Items;
  for (const Finding &F : Findings) {
    const ClangTidyError &E = *F.Error;
    json::Array Notes, Fixes;
    for (const auto &N : E.Notes) {
      if (N.FilePath.empty()) {
        Notes.push_back(json::Object{{"message", N.Message}});
        continue;
      }
      std::string File = absolutePath(N.FilePath, E.BuildDirectory);
      auto [Line, Column] = sources().lineColumn(File, N.FileOffset);
      Notes.push_back(json::Object{{"file", relativeTo(File, Opts.SourceRoot)},
                                   {"line", Line},
                                   {"column", Column},
                                   {"message", N.Message}});
    }
    for (const auto &[File, Reps] : fixesOf(E))
      for (const auto &R : Reps) {
        Region G = regionOf(File, R.getOffset(), R.getLength());
        Fixes.push_back(json::Object{{"file", relativeTo(File, Opts.SourceRoot)},
                                     {"offset", R.getOffset()},
                                     {"length", R.getLength()},
                                     {"line", G.StartLine},
                                     {"column", G.StartColumn},
                                     {"replacement", R.getReplacementText().str()}});
      }
    json::Object Item{{"check", E.DiagnosticName},
                      {"severity", F.Severity},
                      {"message", E.Message.Message},
                      {"file", relativeTo(F.File, Opts.SourceRoot)},
                      {"line", F.Line},
                      {"column", F.Column},
                      {"fingerprint", F.Fingerprint},
                      {"notes", std::move(Notes)},
                      {"fixes", std::move(Fixes)}};
    if (Opts.Baseline)
      Item["baselineState"] = F.BaselineState;
    Items.push_back(std::move(Item));
  }
  json::Object Root{{"tool", "ulplint"},
                    {"version", ULPLINT_VERSION},
                    {"findings", std::move(Items)},
                    {"errors", unitErrors(Units, Opts.SourceRoot)},
                    {"incomplete", incompleteToJsonOutput(Units, Opts.SourceRoot)},
                    {"units", static_cast<int64_t>(Units.size())},
                    {"skipped", skippedToJson(Units, Opts.SourceRoot)}};
  if (Opts.Baseline)
    Root["fixed"] = fixedToJson(Opts.Fixed);
  if (Opts.Shard)
    Root["shard"] = *Opts.Shard;
  OS << llvm::formatv("{0:2}", json::Value(std::move(Root))) << "\n";
}

std::string uriPath(llvm::StringRef Path) {
  std::string Out;
  for (unsigned char C : Path) {
    if (llvm::isAlnum(C) || llvm::StringRef("-._~/").contains(C))
      Out += C;
    else
      Out += "%" + llvm::utohexstr(C, /*LowerCase=*/false, 2);
  }
  return Out;
}

std::string uriPathDecoded(llvm::StringRef Uri) {
  std::string Out;
  for (size_t I = 0; I < Uri.size(); ++I) {
    unsigned Byte;
    if (Uri[I] == '%' && I + 2 < Uri.size() &&
        !Uri.substr(I + 1, 2).getAsInteger(16, Byte)) {
      Out += static_cast<char>(Byte);
      I += 2;
    } else {
      Out += Uri[I];
    }
  }
  return Out;
}

static json::Object sarifLocation(const std::string &File, unsigned Line,
                                  unsigned Column, const OutputOptions &Opts) {
  std::string Rel = relativeTo(File, Opts.SourceRoot);
  json::Object Artifact{{"uri", uriPath(Rel)}};
  if (llvm::sys::path::is_relative(Rel))
    Artifact["uriBaseId"] = "SRCROOT";
  else
    Artifact["uri"] = "file://" + uriPath(Rel);
  return json::Object{
      {"physicalLocation",
       json::Object{{"artifactLocation", std::move(Artifact)},
                    {"region", json::Object{{"startLine", Line},
                                            {"startColumn", Column}}}}}};
}

static json::Object sarifFix(const ClangTidyError &E, const OutputOptions &Opts) {
  json::Array Changes;
  for (const auto &[File, Reps] : fixesOf(E)) {
    json::Array Replacements;
    for (const auto &R : Reps) {
      Region G = regionOf(File, R.getOffset(), R.getLength());
      Replacements.push_back(json::Object{
          {"deletedRegion", json::Object{{"startLine", G.StartLine},
                                         {"startColumn", G.StartColumn},
                                         {"endLine", G.EndLine},
                                         {"endColumn", G.EndColumn}}},
          {"insertedContent", json::Object{{"text", R.getReplacementText().str()}}}});
    }
    json::Object Loc = sarifLocation(File, 1, 1, Opts);
    json::Object *Physical = Loc.getObject("physicalLocation");
    Changes.push_back(json::Object{
        {"artifactLocation", std::move(*Physical->get("artifactLocation"))},
        {"replacements", std::move(Replacements)}});
  }
  return json::Object{
      {"description", json::Object{{"text", "Apply the suggested change"}}},
      {"artifactChanges", std::move(Changes)}};
}

/// The notes that have a place, as SARIF related locations.
static json::Array sarifRelated(const ClangTidyError &E,
                                const OutputOptions &Opts) {
  json::Array Related;
  unsigned Id = 1;
  for (const auto &N : E.Notes) {
    if (N.FilePath.empty())
      continue; // tool remarks such as "this fix will not be applied"
    std::string File = absolutePath(N.FilePath, E.BuildDirectory);
    auto [Line, Column] = sources().lineColumn(File, N.FileOffset);
    json::Object Loc = sarifLocation(File, Line, Column, Opts);
    Loc["id"] = Id++;
    Loc["message"] = json::Object{{"text", N.Message}};
    Related.push_back(std::move(Loc));
  }
  return Related;
}

/// The path to a finding: its notes in the order the check gives them
/// ("MR obtained here", "error path taken here"), then the finding itself.
static json::Object sarifCodeFlow(const Finding &F, const json::Array &Related,
                                  const OutputOptions &Opts) {
  json::Array Steps;
  for (const json::Value &R : Related) {
    json::Object Loc = *R.getAsObject();
    Loc.erase("id");
    Steps.push_back(json::Object{{"location", std::move(Loc)}});
  }
  json::Object Last = sarifLocation(F.File, F.Line, F.Column, Opts);
  Last["message"] = json::Object{{"text", F.Error->Message.Message}};
  Steps.push_back(json::Object{{"location", std::move(Last)}});
  return json::Object{
      {"threadFlows", json::Array{json::Object{{"locations", std::move(Steps)}}}}};
}

void writeSarif(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                llvm::ArrayRef<UnitResult> Units, const OutputOptions &Opts) {
  const Rules &R = Rules::embedded();
  json::Array RuleList;
  std::map<std::string, unsigned> RuleIndex;
  for (const RuleInfo &Info : R.catalog()) {
    RuleIndex[Info.Name] = RuleList.size();
    RuleList.push_back(json::Object{
        {"id", Info.Name},
        {"name", Info.Name},
        {"shortDescription", json::Object{{"text", Info.Summary}}},
        {"fullDescription", json::Object{{"text", Info.Rationale}}},
        {"help", json::Object{{"text", Info.Fix},
                              {"markdown", Info.Rationale + "\n\n**Fix:** " + Info.Fix}}},
        {"defaultConfiguration", json::Object{{"level", Info.Severity}}},
        // No helpUri: the docs live in the repository, not at a public URL.
        {"properties", json::Object{{"category", Info.Category},
                                    {"documentation", Info.Doc}}}});
  }
  json::Array Results;
  for (const Finding &F : Findings) {
    const ClangTidyError &E = *F.Error;
    json::Object Result{
        {"ruleId", E.DiagnosticName},
        {"level", F.Severity},
        {"message", json::Object{{"text", E.Message.Message}}},
        {"locations", json::Array{sarifLocation(F.File, F.Line, F.Column, Opts)}},
        {"partialFingerprints",
         json::Object{{FingerprintKind, F.Fingerprint}}}};
    auto It = RuleIndex.find(E.DiagnosticName);
    if (It != RuleIndex.end())
      Result["ruleIndex"] = It->second;
    if (Opts.Baseline)
      Result["baselineState"] = F.BaselineState;
    json::Array Related = sarifRelated(E, Opts);
    if (!Related.empty()) {
      Result["codeFlows"] = json::Array{sarifCodeFlow(F, Related, Opts)};
      Result["relatedLocations"] = std::move(Related);
    }
    if (!E.Message.Fix.empty())
      Result["fixes"] = json::Array{sarifFix(E, Opts)};
    Results.push_back(std::move(Result));
  }
  json::Array Notifications;
  bool Failed = false;
  for (const UnitResult &U : Units)
    for (const std::string &Msg : U.ParseErrors) {
      Failed = true;
      Notifications.push_back(json::Object{
          {"level", "error"},
          {"message", json::Object{{"text", U.File + ": " + Msg}}}});
    }
  // Incomplete analyses are notes about the run, not results.
  for (const IncompleteAnalysis &I : collectIncomplete(Units))
    Notifications.push_back(json::Object{
        {"level", "note"},
        {"message", json::Object{{"text", incompleteMessage(I)}}},
        {"locations", json::Array{sarifLocation(I.File, I.Line, 1, Opts)}}});
  std::string Root = Opts.SourceRoot;
  if (!Root.empty() && Root.back() != '/')
    Root += '/';
  json::Object Run{
      {"tool",
       json::Object{{"driver",
                     json::Object{{"name", "ulplint"},
                                  {"version", ULPLINT_VERSION},
                                  {"rules", std::move(RuleList)}}}}},
      {"originalUriBaseIds",
       json::Object{{"SRCROOT", json::Object{{"uri", "file://" + uriPath(Root)}}}}},
      {"invocations",
       json::Array{json::Object{
           {"executionSuccessful", !Failed},
           {"toolExecutionNotifications", std::move(Notifications)}}}},
      {"results", std::move(Results)}};
  // Fixed findings are not results with baselineState "absent": GitHub code
  // scanning ignores baselineState and would open alerts for them.
  json::Object Properties;
  if (Opts.Baseline)
    Properties["fixed"] = fixedToJson(Opts.Fixed);
  if (Opts.Shard)
    Properties["shard"] = *Opts.Shard;
  if (!Properties.empty())
    Run["properties"] = json::Object{{"ulplint", std::move(Properties)}};
  json::Object Log{
      {"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
      {"version", "2.1.0"},
      {"runs", json::Array{std::move(Run)}}};
  OS << llvm::formatv("{0:2}", json::Value(std::move(Log))) << "\n";
}

void writeCodeClimate(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                      const OutputOptions &Opts) {
  // GitLab's MR widget compares fingerprints with the target branch's
  // report itself, so every finding goes in, as in SARIF.
  json::Array Issues;
  for (const Finding &F : Findings) {
    llvm::StringRef Severity = F.Severity == "error"     ? "critical"
                               : F.Severity == "warning" ? "major"
                                                         : "info";
    Issues.push_back(json::Object{
        {"type", "issue"},
        {"check_name", F.Error->DiagnosticName},
        {"description", F.Error->Message.Message},
        {"categories", json::Array{"Bug Risk"}},
        {"severity", Severity},
        {"fingerprint", F.Fingerprint},
        {"location",
         json::Object{{"path", relativeTo(F.File, Opts.SourceRoot)},
                      {"lines", json::Object{{"begin", F.Line}}}}}});
  }
  OS << llvm::formatv("{0:2}", json::Value(std::move(Issues))) << "\n";
}

//===-- Fixes -------------------------------------------------------------===//

namespace {
/// The fixes of one file, however many paths reach it.
struct FileFixes {
  std::string Path; // the first path a fix named
  clang::tooling::Replacements Reps;
  std::set<std::tuple<unsigned, unsigned, std::string>> Seen;
  std::string Hash;    // the content its units analysed
  std::string Problem; // why it is not fixed
};
using FixMap = std::map<llvm::sys::fs::UniqueID, FileFixes>;

/// The content hash \p U saw for the file \p ID, or "" if unknown.
std::string hashSeenBy(const UnitResult &U, llvm::sys::fs::UniqueID ID) {
  for (const InputFile &In : U.Inputs) {
    llvm::sys::fs::UniqueID InID;
    if (!llvm::sys::fs::getUniqueID(In.Path, InID) && InID == ID)
      return In.Hash;
  }
  return "";
}

/// Adds the replacements of one finding: all, or none if one conflicts.
/// Replacements another path to the same file already brought are skipped;
/// returns the files the finding changes (none: a duplicate or a conflict).
std::vector<llvm::sys::fs::UniqueID>
addFinding(const Finding &F,
           const llvm::StringMap<clang::tooling::Replacements> &Fix,
           FixMap &Files) {
  std::vector<std::pair<llvm::sys::fs::UniqueID, clang::tooling::Replacement>> New;
  for (const auto &[File, Reps] : Fix) {
    std::string Path = absolutePath(File, F.Error->BuildDirectory);
    llvm::sys::fs::UniqueID ID;
    if (std::error_code EC = llvm::sys::fs::getUniqueID(Path, ID)) {
      FileFixes &Missing = Files[{}]; // no file has this identity
      Missing.Path = Path;
      Missing.Problem = EC.message();
      return {};
    }
    FileFixes &FF = Files[ID];
    std::string Seen = F.Unit ? hashSeenBy(*F.Unit, ID) : "";
    if (FF.Path.empty()) {
      FF.Path = Path;
      FF.Hash = Seen;
    } else if (FF.Hash != Seen) {
      FF.Problem = "its units read different versions of it";
    }
    for (const auto &R : Reps)
      if (FF.Seen.insert({R.getOffset(), R.getLength(), R.getReplacementText().str()})
              .second)
        New.push_back({ID, clang::tooling::Replacement(FF.Path, R.getOffset(),
                                                       R.getLength(),
                                                       R.getReplacementText())});
  }
  FixMap Trial; // only the replacements of the files this finding touches
  for (auto &[ID, R] : New) {
    auto &T = Trial.try_emplace(ID, Files[ID]).first->second;
    if (llvm::Error Err = T.Reps.add(R)) {
      llvm::consumeError(std::move(Err));
      for (auto &[ID2, R2] : New) // forget the conflicting finding's keys
        Files[ID2].Seen.erase({R2.getOffset(), R2.getLength(),
                               R2.getReplacementText().str()});
      return {};
    }
  }
  std::vector<llvm::sys::fs::UniqueID> Touched;
  for (auto &[ID, T] : Trial) {
    Files[ID].Reps = std::move(T.Reps);
    Touched.push_back(ID);
  }
  return Touched;
}

/// Writes one fixed file; an error message, or "" when it is written.
std::string writeFixed(const FileFixes &FF) {
  std::string Where = "cannot fix '" + FF.Path + "': ";
  if (!FF.Problem.empty())
    return Where + FF.Problem;
  auto Buffer = llvm::MemoryBuffer::getFile(FF.Path, false, false);
  if (!Buffer)
    return Where + Buffer.getError().message();
  if (FF.Hash.empty() || contentHash((*Buffer)->getBuffer()) != FF.Hash)
    return Where + "it changed after it was analysed (the fixes' offsets "
                   "would be wrong); run ulplint again";
  auto Fixed = clang::tooling::applyAllReplacements((*Buffer)->getBuffer(), FF.Reps);
  if (!Fixed)
    return Where + llvm::toString(Fixed.takeError());
  if (llvm::Error E = writeFileSafely(
          FF.Path, [&](llvm::raw_ostream &OS) { OS << *Fixed; }))
    return llvm::toString(std::move(E));
  return "";
}
} // namespace

FixSummary applyFixes(llvm::ArrayRef<Finding> Findings, const FixOptions &Opts) {
  FixSummary S;
  FixMap Files;
  std::vector<std::vector<llvm::sys::fs::UniqueID>> Applied;
  for (const Finding &F : Findings) {
    const ClangTidyError &E = *F.Error;
    const llvm::StringMap<clang::tooling::Replacements> *Fix =
        Opts.FromNotes ? clang::tooling::selectFirstFix(E) : &E.Message.Fix;
    if (!Fix || Fix->empty())
      continue;
    if (F.Unit && !F.Unit->ParseErrors.empty() && !Opts.FixErrors) {
      ++S.NotParsed;
      continue;
    }
    std::vector<llvm::sys::fs::UniqueID> Touched = addFinding(F, *Fix, Files);
    if (!Touched.empty())
      Applied.push_back(std::move(Touched));
  }
  std::set<llvm::sys::fs::UniqueID> Failed;
  for (const auto &[ID, FF] : Files) {
    if (FF.Reps.empty() && FF.Problem.empty())
      continue;
    std::string Error = writeFixed(FF);
    if (!Error.empty()) {
      S.Errors.push_back(std::move(Error));
      Failed.insert(ID);
    }
  }
  for (const auto &Touched : Applied)
    S.Applied += llvm::none_of(Touched, [&](auto ID) { return Failed.count(ID); });
  return S;
}

void exportFixes(llvm::raw_ostream &OS, llvm::ArrayRef<Finding> Findings,
                 llvm::StringRef MainFile) {
  std::vector<ClangTidyError> Errors;
  for (const Finding &F : Findings)
    Errors.push_back(*F.Error);
  exportReplacements(MainFile, Errors, OS);
}

} // namespace ulplint::tool
