//===- Report.cpp - The migration report ----------------------------------===//

#include "Report.h"
#include "Files.h"
#include "Sorting.h"
#include "engine/Rules.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/MemoryBuffer.h"
#include <map>
#include <set>

using namespace llvm;

namespace ulplint::tool {

cl::SubCommand ReportCommand(
    "report", "Write a migration report: where each ULP still manages "
              "memory registration by hand, and what replaces it");

namespace report {

cl::OptionCategory Category("ulplint report options");
cl::opt<std::string> BuildPath("p", cl::desc("Build directory with compile_commands.json (or the file)"),
                               cl::value_desc("dir"), cl::sub(ReportCommand),
                               cl::cat(Category));
cl::opt<std::string> OutputFile("o", cl::desc("Write the report here (default: standard output)"),
                                cl::value_desc("file"), cl::sub(ReportCommand),
                                cl::cat(Category));
cl::opt<std::string> Format("format",
                            cl::desc("html or md (default: md when -o ends in .md, else html)"),
                            cl::sub(ReportCommand), cl::cat(Category));
cl::opt<std::string> SourceRoot("source-root",
                                cl::desc("Paths in the report are relative to this directory "
                                         "(default: the deepest directory holding every source)"),
                                cl::sub(ReportCommand), cl::cat(Category));
cl::opt<std::string> SourceUrl("source-url",
                               cl::desc("Link sites to URL + path + '#L' + line; {version} "
                                        "is the kernel tree's version from its Makefile (e.g. "
                                        "https://elixir.bootlin.com/linux/v{version}/source/); "
                                        "default: relative file links"),
                               cl::sub(ReportCommand), cl::cat(Category));
cl::opt<std::string> UlpMapFile("ulp-map",
                                cl::desc("YAML list of {name, path} (path: a regex on the "
                                         "relative path) naming this project's ULPs"),
                                cl::sub(ReportCommand), cl::cat(Category));
cl::opt<std::string> Title("title", cl::desc("Title of the report (default: with the "
                                            "kernel version for a Linux tree)"),
                           cl::init("Memory registration migration report"),
                           cl::sub(ReportCommand), cl::cat(Category));
cl::opt<unsigned> Jobs("j", cl::desc("Translation units analysed in parallel (default: all cores)"),
                       cl::init(0), cl::Prefix, cl::sub(ReportCommand), cl::cat(Category));
cl::list<std::string> ExtraArgs("extra-arg",
                                cl::desc("Additional argument to append to the compiler command line"),
                                cl::sub(ReportCommand), cl::cat(Category));

// -------------------------------------------------------------- the model

const char *const Kinds[] = {"allocation",   "mapping",
                             "registration", "invalidation",
                             "queue-sizing", "remote-invalidation"};
const char *const KindLabels[] = {"MR allocation", "mapping", "REG_MR / bind",
                                  "invalidation",  "SQ sizing",
                                  "remote invalidation"};
const char *const KindColors[] = {"#4e79a7", "#59a14f", "#e15759",
                                  "#f28e2b", "#b07aa1", "#76b7b2"};
constexpr size_t NumKinds = std::size(Kinds);

struct Site {
  SiteRecord R;
  std::string RelFile;
};

struct Ulp {
  std::string Name;
  std::vector<Site> Sites;     // hand-managed, in file order
  unsigned Core = 0;           // core-managed sites
  std::set<std::string> CoreApis;
  unsigned PerKind[NumKinds] = {};
  unsigned Fixable = 0, Datapath = 0, Effort = 0;
  std::vector<const Finding *> Findings;

  unsigned hand() const { return Sites.size(); }
  std::string status() const {
    bool Rw = CoreApis.count("rdma_rw_ctx_init") || CoreApis.count("regcore_rw_ctx_init");
    if (hand() == 0)
      return !Core ? "no registration"
             : Rw  ? "core-managed (READ/WRITE through " +
                        std::string(CoreApis.count("rdma_rw_ctx_init") ? "rdma_rw" : "regcore") + ")"
                   : "core-managed";
    return Core ? "partly migrated" : "hand-managed";
  }
};

size_t kindIndex(StringRef Kind) {
  for (size_t I = 0; I < NumKinds; ++I)
    if (Kind == Kinds[I])
      return I;
  return NumKinds;
}

/// The ULP a relative path belongs to: the first matching pattern, else
/// the directory.
std::string ulpOf(StringRef RelFile, ArrayRef<UlpPattern> Patterns,
                  StringRef Root) {
  for (const UlpPattern &P : Patterns)
    if (Regex(P.Path, Regex::Newline).match(RelFile))
      return P.Name;
  StringRef Dir = sys::path::parent_path(RelFile);
  return Dir.empty() ? sys::path::filename(Root).str() : Dir.str();
}

std::string effortBucket(const Ulp &U, const UlpMap &M) {
  if (U.hand() == 0)
    return "none";
  auto Scale = [&](StringRef Key, unsigned Default) {
    auto It = M.EffortScale.find(Key.str());
    return It == M.EffortScale.end() ? Default : It->second;
  };
  if (U.Effort < Scale("small", 8))
    return "small";
  if (U.Effort < Scale("medium", 24))
    return "medium";
  return "large";
}

unsigned points(const Site &S, const UlpMap &M) {
  auto It = M.Effort.find(S.R.Fixable ? "fixable" : S.R.Kind);
  return It == M.Effort.end() ? 1 : It->second;
}

/// A ULP that registers nothing itself sizes its send queue for its own
/// work requests only: that is not registration to migrate.
void dropOwnQueueSizing(Ulp &U, const UlpMap &M) {
  bool OnlySizing = llvm::all_of(U.Sites, [](const Site &S) {
    return S.R.Kind == "queue-sizing";
  });
  if (!OnlySizing || U.Sites.empty())
    return;
  for (const Site &S : U.Sites)
    U.Effort -= points(S, M);
  U.PerKind[kindIndex("queue-sizing")] = 0;
  U.Datapath = U.Fixable = 0;
  U.Sites.clear();
}

std::vector<Ulp> buildModel(ArrayRef<UnitResult> Units,
                            ArrayRef<Finding> Findings,
                            const ReportOptions &Opts) {
  std::vector<UlpPattern> Patterns = Opts.ExtraUlps;
  const UlpMap &M = Rules::embedded().ulps();
  Patterns.insert(Patterns.end(), M.Ulps.begin(), M.Ulps.end());

  std::map<std::string, Ulp> ByName;
  std::set<std::string> Seen; // a header's sites come with every includer
  for (const UnitResult &U : Units)
    for (const SiteRecord &R : U.Sites.Sites) {
      std::string Key = R.File + ":" + std::to_string(R.Line) + ":" +
                        std::to_string(R.Column) + ":" + R.Kind + ":" + R.Api;
      if (!Seen.insert(Key).second)
        continue;
      Site S{R, relativeTo(R.File, Opts.SourceRoot)};
      Ulp &Into = ByName[ulpOf(S.RelFile, Patterns, Opts.SourceRoot)];
      if (R.Kind == "core-managed") {
        ++Into.Core;
        Into.CoreApis.insert(R.Api);
        continue;
      }
      size_t K = kindIndex(R.Kind);
      if (K < NumKinds)
        ++Into.PerKind[K];
      Into.Fixable += R.Fixable;
      Into.Datapath += R.Datapath;
      Into.Effort += points(S, M);
      Into.Sites.push_back(std::move(S));
    }
  for (const Finding &F : Findings) {
    StringRef Check = F.Error->DiagnosticName;
    if (Check == "rdma-local-mr-management")
      continue; // the sites themselves
    std::string Name =
        ulpOf(relativeTo(F.File, Opts.SourceRoot), Patterns, Opts.SourceRoot);
    auto It = ByName.find(Name);
    if (It != ByName.end())
      It->second.Findings.push_back(&F);
  }
  std::vector<Ulp> Out;
  for (auto &[Name, U] : ByName) {
    U.Name = Name;
    dropOwnQueueSizing(U, M);
    sortKeepingTies(U.Sites, [](const Site &A, const Site &B) {
      return std::tie(A.RelFile, A.R.Line, A.R.Column) <
             std::tie(B.RelFile, B.R.Line, B.R.Column);
    });
    if (U.hand() || U.Core)
      Out.push_back(std::move(U));
  }
  // Most work first; migrated ULPs after the hand-managed ones.
  sortKeepingTies(Out, [](const Ulp &A, const Ulp &B) {
    return std::make_tuple(A.hand() == 0, -(int)A.Effort, A.Name) <
           std::make_tuple(B.hand() == 0, -(int)B.Effort, B.Name);
  });
  return Out;
}

/// A site's link: into --source-url, else to the file relative to the
/// report; "#L<line>" either way (GitHub, GitLab and elixir jump there).
std::string link(const ReportOptions &Opts, StringRef RelFile, unsigned Line) {
  return Opts.SourceUrl + RelFile.str() + "#L" + std::to_string(Line);
}

std::string coreSummary(const Ulp &U) {
  std::string S;
  for (const std::string &Api : U.CoreApis)
    S += (S.empty() ? "" : ", ") + Api;
  return S;
}

// ---------------------------------------------------------------- HTML

std::string esc(StringRef S) {
  std::string Out;
  for (char C : S)
    switch (C) {
    case '&': Out += "&amp;"; break;
    case '<': Out += "&lt;"; break;
    case '>': Out += "&gt;"; break;
    case '"': Out += "&quot;"; break;
    default: Out += C;
    }
  return Out;
}

unsigned legendItemWidth(StringRef Text) { return 14 + Text.size() * 7 + 14; }

/// Stacked horizontal bars: hand-managed sites per ULP by kind, and the
/// core-managed ones in grey.
void writeChart(raw_ostream &OS, ArrayRef<Ulp> Ulps) {
  const unsigned Label = 230, BarH = 18, Gap = 6, Width = 560, Top = 34;
  unsigned Max = 1;
  for (const Ulp &U : Ulps)
    Max = std::max(Max, U.hand() + U.Core);
  double Scale = double(Width) / Max;
  unsigned H = Top + Ulps.size() * (BarH + Gap) + 10;
  unsigned LegendW = 0;
  for (size_t K = 0; K <= NumKinds; ++K)
    LegendW += legendItemWidth(K < NumKinds ? KindLabels[K] : "core-managed");
  unsigned W = std::max(Label + Width + 60, 20 + LegendW);
  OS << "<svg class=\"chart\" role=\"img\" width=\"" << W << "\" height=\""
     << H << "\" viewBox=\"0 0 " << W << " " << H
     << "\" xmlns=\"http://www.w3.org/2000/svg\">\n"
     << "<title>Registration sites per ULP, by kind</title>\n";
  // Legend.
  unsigned X = 20;
  for (size_t K = 0; K <= NumKinds; ++K) {
    StringRef Color = K < NumKinds ? KindColors[K] : "#bab0ac";
    StringRef Text = K < NumKinds ? KindLabels[K] : "core-managed";
    OS << "<rect x=\"" << X << "\" y=\"4\" width=\"10\" height=\"10\" fill=\""
       << Color << "\"/><text x=\"" << X + 14 << "\" y=\"13\">" << Text
       << "</text>\n";
    X += legendItemWidth(Text);
  }
  unsigned Y = Top;
  for (const Ulp &U : Ulps) {
    OS << "<text x=\"" << Label - 6 << "\" y=\"" << Y + 13
       << "\" text-anchor=\"end\">" << esc(U.Name) << "</text>\n";
    double At = Label;
    auto Segment = [&](unsigned N, StringRef Color, StringRef What) {
      if (!N)
        return;
      OS << "<rect x=\"" << format("%.1f", At) << "\" y=\"" << Y
         << "\" width=\"" << format("%.1f", N * Scale) << "\" height=\"" << BarH
         << "\" fill=\"" << Color << "\"><title>" << esc(U.Name) << ": " << N
         << " " << What << "</title></rect>\n";
      At += N * Scale;
    };
    for (size_t K = 0; K < NumKinds; ++K)
      Segment(U.PerKind[K], KindColors[K], KindLabels[K]);
    Segment(U.Core, "#bab0ac", "core-managed");
    OS << "<text x=\"" << format("%.1f", At + 4) << "\" y=\"" << Y + 13
       << "\">" << U.hand() << (U.Core ? " + " + std::to_string(U.Core) : "")
       << "</text>\n";
    Y += BarH + Gap;
  }
  OS << "</svg>\n";
}

std::string anchor(StringRef Prefix, size_t I) {
  return (Prefix + Twine(I)).str();
}

void writeExcerpt(raw_ostream &OS, const Site &S) {
  OS << "<pre class=\"excerpt\">";
  unsigned N = S.R.ExcerptLine;
  for (StringRef Line : split(StringRef(S.R.Excerpt).rtrim('\n'), '\n')) {
    bool Here = N == S.R.Line;
    OS << (Here ? "<mark>" : "") << format("%5u  ", N) << esc(Line)
       << (Here ? "</mark>" : "") << "\n";
    ++N;
  }
  OS << "</pre>\n";
}

void writeHtml(raw_ostream &OS, ArrayRef<Ulp> Ulps, const ReportOptions &Opts,
               unsigned NumUnits) {
  const UlpMap &M = Rules::embedded().ulps();
  OS << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<title>" << esc(Opts.Title) << "</title>\n<style>\n"
     << "body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}\n"
     << "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:3px 6px;text-align:left;vertical-align:top}th{background:#f3f3f3}\n"
     << "table.summary{font-size:88%}td.n{text-align:right}.excerpt{background:#f8f8f8;border:1px solid #ddd;"
        "padding:4px;overflow-x:auto}mark{background:#fff3a0}\n"
     << ".chart text{font-size:12px;font-family:sans-serif}\n"
     << ".hand-managed{color:#b00}.partly{color:#a60}.core-managed{color:#070}\n"
     << "</style>\n</head>\n<body>\n<h1>" << esc(Opts.Title) << "</h1>\n";
  OS << "<p>";
  if (!Opts.KernelVersion.empty())
    OS << "Linux " << esc(Opts.KernelVersion)
       << " (VERSION, PATCHLEVEL, SUBLEVEL and EXTRAVERSION of the tree's "
          "Makefile). ";
  OS << NumUnits << " translation units analysed by ulplint; paths "
     << "relative to <code>" << esc(Opts.SourceRoot) << "</code>. A "
     << "<em>site</em> is a place where the ULP allocates, maps, registers or "
        "invalidates memory, sizes its send queue for that, or handles a "
        "remote invalidation itself; <em>core-managed</em> sites already use "
        "rdma_rw or regcore. Effort: points per site kind (rules/ulps.yaml), "
        "small &lt; "
     << (M.EffortScale.count("small") ? M.EffortScale.at("small") : 8)
     << " &le; medium &lt; "
     << (M.EffortScale.count("medium") ? M.EffortScale.at("medium") : 24)
     << " &le; large.</p>\n";
  OS << "<h2>Sites per ULP</h2>\n";
  writeChart(OS, Ulps);
  OS << "<table class=\"summary\">\n<tr><th>ULP</th><th>status</th>";
  for (const char *L : KindLabels)
    OS << "<th>" << L << "</th>";
  OS << "<th>core-managed</th><th>per I/O</th><th>automatic fixes</th>"
        "<th>other findings</th><th>effort</th></tr>\n";
  for (size_t I = 0; I < Ulps.size(); ++I) {
    const Ulp &U = Ulps[I];
    std::string Status = U.status();
    OS << "<tr><td><a href=\"#" << anchor("ulp-", I) << "\">" << esc(U.Name)
       << "</a></td><td class=\"" << StringRef(Status).split(' ').first << "\">"
       << Status << "</td>";
    for (unsigned N : U.PerKind)
      OS << "<td class=\"n\">" << N << "</td>";
    OS << "<td class=\"n\">" << U.Core << "</td><td class=\"n\">" << U.Datapath
       << "</td><td class=\"n\">" << U.Fixable << "</td><td class=\"n\">"
       << U.Findings.size() << "</td><td>" << effortBucket(U, M) << " ("
       << U.Effort << ")</td></tr>\n";
  }
  OS << "</table>\n";

  size_t SiteNo = 0;
  for (size_t I = 0; I < Ulps.size(); ++I) {
    const Ulp &U = Ulps[I];
    OS << "<h2 id=\"" << anchor("ulp-", I) << "\">" << esc(U.Name) << "</h2>\n"
       << "<p>Status: <strong>" << U.status() << "</strong>. "
       << U.hand() << " hand-managed site(s), " << U.Core
       << " core-managed";
    if (U.Core)
      OS << " (" << esc(coreSummary(U)) << ")";
    OS << "; effort " << effortBucket(U, M) << " (" << U.Effort
       << " points).</p>\n";
    if (!U.Sites.empty()) {
      OS << "<table class=\"sites\">\n<tr><th>#</th><th>kind</th><th>API</th>"
            "<th>where</th><th>function</th><th>role</th><th>replace with</th>"
            "<th>per I/O</th><th>fix</th></tr>\n";
      size_t First = SiteNo;
      for (const Site &S : U.Sites) {
        std::string Id = anchor("site-", SiteNo);
        OS << "<tr><td><a href=\"#" << Id << "\">" << SiteNo + 1 << "</a></td><td>"
           << esc(S.R.Kind) << "</td><td><code>" << esc(S.R.Api)
           << "</code></td><td><a href=\"" << esc(link(Opts, S.RelFile, S.R.Line))
           << "\">" << esc(S.RelFile) << ":" << S.R.Line << "</a></td><td><code>"
           << esc(S.R.Function) << "</code></td><td>" << esc(S.R.Role)
           << "</td><td>" << esc(S.R.Target) << "</td><td>"
           << (S.R.Datapath ? "yes" : "") << "</td><td>"
           << (S.R.Fixable ? "automatic" : "") << "</td></tr>\n";
        ++SiteNo;
      }
      OS << "</table>\n<details><summary>Code excerpts</summary>\n";
      for (size_t K = 0; K < U.Sites.size(); ++K) {
        const Site &S = U.Sites[K];
        OS << "<div id=\"" << anchor("site-", First + K) << "\"><p>" << First + K + 1
           << ". <a href=\"" << esc(link(Opts, S.RelFile, S.R.Line)) << "\">"
           << esc(S.RelFile) << ":" << S.R.Line << "</a> <code>" << esc(S.R.Api)
           << "</code></p>\n";
        writeExcerpt(OS, S);
        OS << "</div>\n";
      }
      OS << "</details>\n";
    }
    if (!U.Findings.empty()) {
      OS << "<h3>Other findings</h3>\n<ul>\n";
      for (const Finding *F : U.Findings) {
        std::string Rel = relativeTo(F->File, Opts.SourceRoot);
        OS << "<li><a href=\"" << esc(link(Opts, Rel, F->Line)) << "\">"
           << esc(Rel) << ":" << F->Line << "</a> [" << esc(F->Error->DiagnosticName)
           << "] " << esc(F->Error->Message.Message) << "</li>\n";
      }
      OS << "</ul>\n";
    }
  }
  OS << "<p><small>Generated by ulplint " << ULPLINT_VERSION
     << ". Regenerate with <code>ulplint report</code>; see docs/reports.md."
        "</small></p>\n</body>\n</html>\n";
}

// ------------------------------------------------------------ Markdown

std::string mdCell(StringRef S) {
  std::string Out;
  for (char C : S)
    Out += C == '|' ? std::string("\\|") : std::string(1, C == '\n' ? ' ' : C);
  return Out;
}

std::string siteLine(const Site &S) {
  StringRef Excerpt = S.R.Excerpt;
  unsigned N = S.R.ExcerptLine;
  for (StringRef Line : split(Excerpt, '\n')) {
    if (N++ == S.R.Line)
      return Line.trim().str();
  }
  return "";
}

void writeMarkdown(raw_ostream &OS, ArrayRef<Ulp> Ulps,
                   const ReportOptions &Opts, unsigned NumUnits) {
  const UlpMap &M = Rules::embedded().ulps();
  OS << "# " << Opts.Title << "\n\n";
  if (!Opts.KernelVersion.empty())
    OS << "Linux " << Opts.KernelVersion
       << " (VERSION, PATCHLEVEL, SUBLEVEL and EXTRAVERSION of the tree's "
          "Makefile). ";
  OS << NumUnits << " translation units analysed by ulplint. A *site* is a "
        "place where the ULP allocates, maps, registers or invalidates "
        "memory, sizes its send queue for that, or handles a remote "
        "invalidation itself; *core-managed* sites already use rdma_rw or "
        "regcore. Effort is in points per site kind (rules/ulps.yaml).\n\n";
  OS << "| ULP | status |";
  for (const char *L : KindLabels)
    OS << " " << L << " |";
  OS << " core-managed | per I/O | automatic fixes | other findings | effort |\n|---|---|";
  for (size_t K = 0; K < NumKinds; ++K)
    OS << "---:|";
  OS << "---:|---:|---:|---:|---|\n";
  for (const Ulp &U : Ulps) {
    OS << "| " << mdCell(U.Name) << " | " << U.status() << " |";
    for (unsigned N : U.PerKind)
      OS << " " << N << " |";
    OS << " " << U.Core << " | " << U.Datapath << " | " << U.Fixable << " | "
       << U.Findings.size() << " | " << effortBucket(U, M) << " (" << U.Effort
       << ") |\n";
  }
  for (const Ulp &U : Ulps) {
    OS << "\n## " << U.Name << "\n\n**" << U.status() << "**: " << U.hand()
       << " hand-managed site(s), " << U.Core << " core-managed";
    if (U.Core)
      OS << " (" << coreSummary(U) << ")";
    OS << "; effort " << effortBucket(U, M) << " (" << U.Effort << " points).\n";
    if (!U.Sites.empty()) {
      OS << "\n| kind | API | where | function | role | replace with | per I/O | fix |\n"
            "|---|---|---|---|---|---|---|---|\n";
      for (const Site &S : U.Sites)
        OS << "| " << S.R.Kind << " | `" << mdCell(S.R.Api) << "` | ["
           << S.RelFile << ":" << S.R.Line << "](" << link(Opts, S.RelFile, S.R.Line)
           << ") `" << mdCell(siteLine(S)) << "` | `" << S.R.Function << "` | "
           << S.R.Role << " | " << mdCell(S.R.Target) << " | "
           << (S.R.Datapath ? "yes" : "") << " | "
           << (S.R.Fixable ? "automatic" : "") << " |\n";
    }
    if (!U.Findings.empty()) {
      OS << "\nOther findings:\n\n";
      for (const Finding *F : U.Findings) {
        std::string Rel = relativeTo(F->File, Opts.SourceRoot);
        OS << "- [" << Rel << ":" << F->Line << "](" << link(Opts, Rel, F->Line)
           << ") `" << F->Error->DiagnosticName << "`: "
           << F->Error->Message.Message << "\n";
      }
    }
  }
  OS << "\n---\nGenerated by ulplint " << ULPLINT_VERSION
     << " (`ulplint report`, docs/reports.md).\n";
}

int fail(const Twine &Msg) {
  WithColor::error(errs(), "ulplint report") << Msg << "\n";
  return 2;
}

Expected<std::vector<UlpPattern>> readUlpMap(StringRef Path) {
  auto Buffer = MemoryBuffer::getFile(Path);
  if (!Buffer)
    return createStringError(Buffer.getError(), "cannot read --ulp-map '" +
                                                    Path + "': " +
                                                    Buffer.getError().message());
  auto Parsed = Rules::parseUlpList((*Buffer)->getBuffer());
  if (!Parsed)
    return createStringError(inconvertibleErrorCode(),
                             "--ulp-map '" + Path + "': " +
                                 toString(Parsed.takeError()));
  std::vector<UlpPattern> Out = std::move(*Parsed);
  for (const UlpPattern &P : Out) {
    std::string Err;
    if (!Regex(P.Path).isValid(Err))
      return createStringError(inconvertibleErrorCode(),
                               "--ulp-map '" + Path + "': bad path regex '" +
                                   P.Path + "': " + Err);
  }
  return Out;
}

/// The version of the Linux tree at \p Root, as its tags spell it (6.12,
/// 6.12.118, 6.13-rc3), from VERSION, PATCHLEVEL, SUBLEVEL and
/// EXTRAVERSION of its Makefile; empty when \p Root is not a kernel tree.
std::string kernelVersion(StringRef Root) {
  SmallString<256> Path(Root);
  sys::path::append(Path, "Makefile");
  auto Buffer = MemoryBuffer::getFile(Path);
  if (!Buffer)
    return "";
  std::map<std::string, std::string> Vars;
  SmallVector<StringRef, 16> Lines;
  (*Buffer)->getBuffer().take_front(4096).split(Lines, '\n');
  for (StringRef L : Lines) {
    auto [Name, Value] = L.split('=');
    Name = Name.trim();
    if (Name == "VERSION" || Name == "PATCHLEVEL" || Name == "SUBLEVEL" ||
        Name == "EXTRAVERSION")
      Vars.emplace(Name.str(), Value.trim().str());
  }
  const std::string &V = Vars["VERSION"], &P = Vars["PATCHLEVEL"],
                    &S = Vars["SUBLEVEL"];
  if (V.empty() || P.empty() || !llvm::all_of(V + P + S, [](char C) { return isDigit(C); }))
    return "";
  return V + "." + P + (S.empty() || S == "0" ? "" : "." + S) +
         Vars["EXTRAVERSION"];
}

/// The deepest directory that holds every file.
std::string commonDirectory(ArrayRef<std::string> Files) {
  StringRef Common = sys::path::parent_path(Files.front());
  for (StringRef F : Files)
    while (!Common.empty() &&
           !(F.starts_with(Common) &&
             (F.size() == Common.size() || sys::path::is_separator(F[Common.size()]))))
      Common = sys::path::parent_path(Common);
  return Common.str();
}

} // namespace report

void writeReport(raw_ostream &OS, ArrayRef<UnitResult> Units,
                 ArrayRef<Finding> Findings, const ReportOptions &Opts) {
  std::vector<report::Ulp> Ulps = report::buildModel(Units, Findings, Opts);
  if (Opts.Format == "md")
    report::writeMarkdown(OS, Ulps, Opts, Units.size());
  else
    report::writeHtml(OS, Ulps, Opts, Units.size());
}

int runReport() {
  using namespace report;
  if (BuildPath.empty())
    return fail("-p BUILD_DIR is required");
  ReportOptions Opts;
  Opts.Title = Title;
  Opts.SourceUrl = SourceUrl;
  Opts.Format = !Format.empty() ? std::string(Format)
                : StringRef(OutputFile).ends_with(".md") ? "md" : "html";
  if (Opts.Format != "html" && Opts.Format != "md")
    return fail("unknown --format '" + Format + "' (expected html or md)");
  if (!UlpMapFile.empty()) {
    auto Map = readUlpMap(UlpMapFile);
    if (!Map)
      return fail(toString(Map.takeError()));
    Opts.ExtraUlps = std::move(*Map);
  }
  auto DB = loadDatabase(BuildPath);
  if (!DB)
    return fail(toString(DB.takeError()));
  auto AllFiles = databaseFiles(**DB);
  if (!AllFiles)
    return fail(toString(AllFiles.takeError()));
  const std::vector<std::string> &Files = *AllFiles;
  if (Error E = checkDirectories(**DB, Files))
    return fail(toString(std::move(E)));

  SmallString<256> Root(SourceRoot.empty() ? commonDirectory(Files)
                                            : std::string(SourceRoot));
  sys::fs::make_absolute(Root);
  sys::path::remove_dots(Root, true);
  Opts.SourceRoot = std::string(Root);
  // A Linux tree names its version: in the title, and in links to
  // sources of exactly that version.
  Opts.KernelVersion = kernelVersion(Opts.SourceRoot);
  if (!Opts.KernelVersion.empty() && !Title.getNumOccurrences())
    Opts.Title = "Linux " + Opts.KernelVersion + ": " + Opts.Title;
  if (size_t At = Opts.SourceUrl.find("{version}"); At != std::string::npos) {
    if (Opts.KernelVersion.empty())
      return fail("--source-url names {version}, but '" + Opts.SourceRoot +
                  "' has no kernel Makefile with VERSION and PATCHLEVEL");
    Opts.SourceUrl.replace(At, 9, Opts.KernelVersion);
  }

  RunOptions Run;
  Run.Checks = "rdma-*";
  Run.ExtraArgs = ExtraArgs;
  Run.Jobs = Jobs ? unsigned(Jobs) : llvm::hardware_concurrency().compute_thread_count();
  Run.CollectSites = true;
  RunStats Stats;
  std::vector<UnitResult> Units = analyze(**DB, Files, Run, Stats);
  settleConditions(Units);
  std::vector<Finding> Findings = collectFindings(Units, Opts.SourceRoot);

  Error Written = writeFileSafely(OutputFile.empty() ? "-" : StringRef(OutputFile),
                                  [&](raw_ostream &OS) {
                                    writeReport(OS, Units, Findings, Opts);
                                  });
  if (Written)
    return fail(toString(std::move(Written)));

  unsigned Broken = reportBrokenUnits(Units, "ulplint report");
  size_t NumSites = 0;
  for (const UnitResult &U : Units)
    NumSites += U.Sites.Sites.size();
  errs() << "ulplint report: " << Units.size() << " translation unit(s), "
         << NumSites << " registration site(s)"
         << (Broken ? ", " + std::to_string(Broken) + " not analysed" : "")
         << skippedSummary(Units)
         << (OutputFile.empty() ? "" : " -> " + OutputFile) << "\n";
  return Broken ? 2 : 0;
}

} // namespace ulplint::tool
