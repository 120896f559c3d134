//===- Prescan.cpp - Skipping units that hold no RDMA code ----------------===//

#include "Prescan.h"
#include "clang/Lex/DependencyDirectivesScanner.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/YAMLParser.h"
#include <deque>

namespace ulplint::tool {

namespace {
namespace embedded_prescan {
struct EmbeddedRuleFile {
  const char *Path;
  const char *Text;
};
#include "EmbeddedPrescan.inc"
} // namespace embedded_prescan
} // namespace

llvm::Expected<PrescanRules> parsePrescanRules(llvm::StringRef Text) {
  PrescanRules Out;
  llvm::SourceMgr SM;
  std::string Problem;
  SM.setDiagHandler(
      [](const llvm::SMDiagnostic &D, void *Ctx) {
        *static_cast<std::string *>(Ctx) = D.getMessage().str();
      },
      &Problem);
  llvm::yaml::Stream Stream(Text, SM);
  auto Fail = [&](llvm::Twine Msg) {
    return llvm::createStringError(std::make_error_code(std::errc::invalid_argument),
                                   "prescan.yaml: " + Msg);
  };
  auto Doc = Stream.begin();
  if (Doc == Stream.end())
    return Fail("empty");
  auto *Root = llvm::dyn_cast_or_null<llvm::yaml::MappingNode>(Doc->getRoot());
  if (!Root)
    return Fail("expected a mapping");
  for (llvm::yaml::KeyValueNode &KV : *Root) {
    auto *Key = llvm::dyn_cast_or_null<llvm::yaml::ScalarNode>(KV.getKey());
    auto *List = llvm::dyn_cast_or_null<llvm::yaml::SequenceNode>(KV.getValue());
    if (!Key || !List)
      return Fail("expected `key: [list of names]`");
    llvm::SmallString<32> KeyStorage;
    llvm::StringRef Name = Key->getValue(KeyStorage);
    std::vector<std::string> *Into = Name == "headers" ? &Out.Headers
                                     : Name == "identifier_prefixes"
                                         ? &Out.IdentifierPrefixes
                                     : Name == "not_rdma" ? &Out.NotRdma
                                                          : nullptr;
    if (!Into)
      return Fail("unknown key '" + Name + "'");
    for (llvm::yaml::Node &Item : *List) {
      auto *S = llvm::dyn_cast<llvm::yaml::ScalarNode>(&Item);
      if (!S)
        return Fail("'" + Name + "' must list plain names");
      llvm::SmallString<64> Storage;
      Into->push_back(S->getValue(Storage).str());
    }
  }
  if (!Problem.empty() || Stream.failed())
    return Fail(Problem.empty() ? "malformed YAML" : Problem);
  if (Out.Headers.empty() || Out.IdentifierPrefixes.empty())
    return Fail("'headers' and 'identifier_prefixes' must not be empty");
  return Out;
}

const PrescanRules &prescanRules() {
  static const PrescanRules Rules = [] {
    auto R = parsePrescanRules(embedded_prescan::EmbeddedRuleFiles[0].Text);
    if (!R)
      llvm::report_fatal_error(llvm::Twine("ulplint: embedded rules: ") +
                               llvm::toString(R.takeError()));
    return std::move(*R);
  }();
  return Rules;
}

bool Prescanner::isRdmaHeader(llvm::StringRef Name) const {
  for (const std::string &H : Rules.Headers)
    if (Name == H || (Name.ends_with(H) &&
                      Name.drop_back(H.size()).ends_with("/")))
      return true;
  return false;
}

static bool isIdentifierStart(char C) {
  return llvm::isAlpha(C) || C == '_';
}
static bool isIdentifierChar(char C) {
  return llvm::isAlnum(C) || C == '_';
}

const Prescanner::FileScan &Prescanner::scan(const std::string &Path) {
  {
    std::lock_guard<std::mutex> G(Lock);
    auto It = Scanned.find(Path);
    if (It != Scanned.end())
      return It->second;
  }
  FileScan Result;
  auto Buffer = llvm::MemoryBuffer::getFile(Path, /*IsText=*/false,
                                            /*RequiresNullTerminator=*/false);
  if (!Buffer) {
    Result.Rdma = true; // cannot tell: parse the unit
  } else {
    llvm::StringRef Text = (*Buffer)->getBuffer();
    // Identifiers with an RDMA prefix, anywhere (comments count too: a
    // false "RDMA" only costs a parse).
    for (size_t I = 0, N = Text.size(); I < N && !Result.Rdma;) {
      if (!isIdentifierStart(Text[I])) {
        ++I;
        continue;
      }
      size_t End = I + 1;
      while (End < N && isIdentifierChar(Text[End]))
        ++End;
      llvm::StringRef Word = Text.slice(I, End);
      for (const std::string &P : Rules.IdentifierPrefixes)
        if (Word.starts_with(P)) {
          Result.Rdma = true;
          break;
        }
      I = End;
    }
    llvm::SmallVector<clang::dependency_directives_scan::Token, 64> Tokens;
    llvm::SmallVector<clang::dependency_directives_scan::Directive, 32> Directives;
    if (!Result.Rdma &&
        clang::scanSourceForDependencyDirectives(Text, Tokens, Directives)) {
      Result.Rdma = true; // the scanner gave up: parse the unit
    } else if (!Result.Rdma) {
      using namespace clang::dependency_directives_scan;
      for (const Directive &D : Directives) {
        if (D.Kind != pp_include && D.Kind != pp_import &&
            D.Kind != pp_include_next && D.Kind != pp___include_macros)
          continue;
        // `# include <name>`: the text after the directive's name.
        if (D.Tokens.size() < 3)
          continue;
        unsigned Begin = D.Tokens[2].Offset;
        llvm::StringRef Rest =
            Text.slice(Begin, D.Tokens.back().getEnd()).trim();
        Include Inc;
        if (Rest.starts_with("<") && Rest.contains('>')) {
          Inc.Angled = true;
          Inc.Name = Rest.substr(1, Rest.find('>') - 1).str();
        } else if (Rest.starts_with("\"") && Rest.find('"', 1) != llvm::StringRef::npos) {
          Inc.Name = Rest.substr(1, Rest.find('"', 1) - 1).str();
        } else {
          continue; // computed include: not followed
        }
        if (isRdmaHeader(Inc.Name)) {
          Result.Rdma = true;
          break;
        }
        Result.Includes.push_back(std::move(Inc));
      }
    }
    if (Result.Rdma)
      Result.Includes.clear();
  }
  std::lock_guard<std::mutex> G(Lock);
  return Scanned.try_emplace(Path, std::move(Result)).first->second;
}

/// System locations: headers there are not the project's and are not read.
static bool isSystemPath(llvm::StringRef Path) {
  return Path.starts_with("/usr/");
}

bool Prescanner::mayHoldRdma(const clang::tooling::CompileCommand &Cmd) {
  auto Absolute = [&](llvm::StringRef P) {
    llvm::SmallString<256> Out(P);
    if (!llvm::sys::path::is_absolute(Out)) {
      Out = Cmd.Directory;
      llvm::sys::path::append(Out, P);
    }
    llvm::sys::path::remove_dots(Out, /*remove_dot_dot=*/true);
    return std::string(Out);
  };
  // Search paths of the command: -iquote and -I are the project's.
  std::vector<std::string> Quote, Angled, Forced;
  llvm::ArrayRef<std::string> Args = Cmd.CommandLine;
  for (size_t I = 1; I < Args.size(); ++I) {
    llvm::StringRef A = Args[I];
    auto Value = [&](llvm::StringRef Flag) -> std::optional<std::string> {
      if (A == Flag && I + 1 < Args.size())
        return Args[++I];
      if (A.starts_with(Flag) && A.size() > Flag.size())
        return A.drop_front(Flag.size()).str();
      return std::nullopt;
    };
    if (auto V = Value("-iquote"))
      Quote.push_back(Absolute(*V));
    else if (A == "-include" && I + 1 < Args.size())
      Forced.push_back(Args[++I]);
    else if (auto V = Value("-I"))
      Angled.push_back(Absolute(*V));
    else if (A == "--include-directory" && I + 1 < Args.size())
      Angled.push_back(Absolute(Args[++I]));
  }
  auto Find = [&](llvm::StringRef Name, llvm::StringRef Dir,
                  const std::vector<std::string> &Dirs) -> std::string {
    auto Try = [&](llvm::StringRef D) -> std::string {
      llvm::SmallString<256> P(D);
      llvm::sys::path::append(P, Name);
      llvm::sys::path::remove_dots(P, true);
      return llvm::sys::fs::is_regular_file(P) ? std::string(P) : std::string();
    };
    if (llvm::sys::path::is_absolute(Name))
      return llvm::sys::fs::is_regular_file(Name) ? Name.str() : std::string();
    if (!Dir.empty())
      if (std::string P = Try(Dir); !P.empty())
        return P;
    for (const std::string &D : Dirs)
      if (std::string P = Try(D); !P.empty())
        return P;
    return "";
  };
  std::vector<std::string> QuoteThenAngled = Quote;
  QuoteThenAngled.insert(QuoteThenAngled.end(), Angled.begin(), Angled.end());

  llvm::StringSet<> Seen;
  std::deque<std::string> Work;
  Work.push_back(Absolute(Cmd.Filename));
  for (const std::string &F : Forced) {
    if (isRdmaHeader(F))
      return true;
    // Not a regular file (missing, a pipe): cannot tell, and reading a pipe
    // would take its content from the compiler.
    std::string P = Find(F, Cmd.Directory, QuoteThenAngled);
    if (P.empty())
      return true;
    Work.push_back(P);
  }
  while (!Work.empty()) {
    std::string Path = std::move(Work.front());
    Work.pop_front();
    if (!Seen.insert(Path).second)
      continue;
    const FileScan &S = scan(Path);
    if (S.Rdma)
      return true;
    llvm::StringRef Dir = llvm::sys::path::parent_path(Path);
    for (const Include &Inc : S.Includes) {
      std::string P = Inc.Angled ? Find(Inc.Name, "", Angled)
                                 : Find(Inc.Name, Dir, QuoteThenAngled);
      // A quoted include the project's paths do not resolve may be a
      // generated or missing header: parse the unit, which then reports
      // it, rather than skip it.
      if (P.empty() && !Inc.Angled)
        return true;
      if (!P.empty() && !isSystemPath(P) && !Seen.count(P))
        Work.push_back(std::move(P));
    }
  }
  return false;
}

} // namespace ulplint::tool
