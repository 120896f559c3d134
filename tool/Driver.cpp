//===- Driver.cpp - Running the rdma checks over a compile database -------===//
//
// clang-tidy's own engine (ClangTidyASTConsumerFactory, the diagnostic
// consumer with NOLINT handling and fix-it merging) runs the checks; this
// file supplies compile commands, configuration and parallelism.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"
#include "Cache.h"
#include "Prescan.h"
#include "Worker.h"
#include "engine/Rules.h"
#include "clang-tidy/ClangTidy.h"
#include "clang-tidy/ClangTidyModule.h"
#include "clang-tidy/GlobList.h"
#include "clang/Frontend/CompilerInstance.h"
#include "clang/Frontend/FrontendActions.h"
#include "clang/Lex/PreprocessorOptions.h"
#include "clang/Tooling/ArgumentsAdjusters.h"
#include "clang/Tooling/JSONCompilationDatabase.h"
#include "clang/Tooling/Tooling.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/GlobPattern.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/VirtualFileSystem.h"
#include <chrono>
#include <mutex>

using namespace clang;
using namespace clang::tidy;
using namespace clang::tooling;

namespace ulplint::tool {

static llvm::Error inputError(const llvm::Twine &Msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), Msg);
}

//===-- Compile databases -------------------------------------------------===//

namespace {
/// One command per file, the first the database lists.
class FirstCommandDatabase : public CompilationDatabase {
public:
  explicit FirstCommandDatabase(std::unique_ptr<CompilationDatabase> Inner)
      : Inner(std::move(Inner)) {}
  std::vector<CompileCommand>
  getCompileCommands(llvm::StringRef File) const override {
    std::vector<CompileCommand> Commands = Inner->getCompileCommands(File);
    if (Commands.size() > 1)
      Commands.resize(1);
    return Commands;
  }
  std::vector<std::string> getAllFiles() const override {
    return Inner->getAllFiles();
  }
  std::vector<CompileCommand> getAllCompileCommands() const override {
    std::vector<CompileCommand> All;
    for (const std::string &File : getAllFiles())
      for (CompileCommand &C : getCompileCommands(File))
        All.push_back(std::move(C));
    return All;
  }

private:
  std::unique_ptr<CompilationDatabase> Inner;
};

std::string absoluteIn(llvm::StringRef Path, llvm::StringRef Base) {
  llvm::SmallString<256> Abs(Path);
  if (llvm::sys::path::is_relative(Abs)) {
    Abs = Base;
    llvm::sys::path::append(Abs, Path);
  }
  llvm::sys::path::remove_dots(Abs, true);
  return std::string(Abs);
}
} // namespace

/// The database with absolute `directory` and `file` entries free of "."
/// and "..": clang's tooling would resolve a relative directory against
/// the current directory, and would take "./a.c" and "a.c" for two files.
static llvm::Expected<std::string> normalizeDatabase(llvm::StringRef Text,
                                                     llvm::StringRef DbDir) {
  llvm::Expected<llvm::json::Value> Root = llvm::json::parse(Text);
  if (!Root)
    return Root.takeError();
  llvm::json::Array *Entries = Root->getAsArray();
  if (!Entries)
    return inputError("expected an array of compile commands");
  for (llvm::json::Value &Entry : *Entries) {
    llvm::json::Object *O = Entry.getAsObject();
    std::optional<llvm::StringRef> Dir = O ? O->getString("directory") : std::nullopt;
    std::optional<llvm::StringRef> File = O ? O->getString("file") : std::nullopt;
    if (!Dir || !File)
      continue; // clang's parser names what is missing
    std::string AbsDir = absoluteIn(*Dir, DbDir);
    std::string AbsFile = absoluteIn(*File, AbsDir);
    (*O)["directory"] = std::move(AbsDir);
    (*O)["file"] = std::move(AbsFile);
  }
  std::string Out;
  llvm::raw_string_ostream(Out) << llvm::json::Value(std::move(*Root));
  return Out;
}

llvm::Expected<std::unique_ptr<CompilationDatabase>>
loadDatabase(llvm::StringRef BuildPath) {
  llvm::SmallString<256> Json(BuildPath);
  llvm::sys::fs::make_absolute(Json);
  if (llvm::sys::fs::is_directory(Json))
    llvm::sys::path::append(Json, "compile_commands.json");
  if (!llvm::sys::fs::exists(Json))
    return inputError("no compilation database at '" + Json + "'");
  auto Buffer = llvm::MemoryBuffer::getFile(Json);
  if (!Buffer)
    return inputError("cannot read compilation database '" + Json +
                      "': " + Buffer.getError().message());
  auto Text = normalizeDatabase((*Buffer)->getBuffer(),
                                llvm::sys::path::parent_path(Json));
  if (!Text)
    return inputError("cannot read compilation database '" + Json +
                      "': " + llvm::toString(Text.takeError()));
  std::string Err;
  std::unique_ptr<CompilationDatabase> DB = JSONCompilationDatabase::loadFromBuffer(
      *Text, Err, JSONCommandLineSyntax::AutoDetect);
  if (!DB)
    return inputError("cannot read compilation database '" + Json +
                      "': " + Err);
  // As clang-tidy reads databases: @response files expanded, and the target
  // and driver mode taken from the compiler's name (aarch64-linux-gnu-gcc
  // means --target=aarch64-linux-gnu).
  DB = inferTargetAndDriverMode(
      expandResponseFiles(std::move(DB), llvm::vfs::getRealFileSystem()));
  return firstCommandOnly(std::move(DB));
}

llvm::Expected<std::vector<std::string>>
databaseFiles(const CompilationDatabase &DB) {
  std::vector<std::string> Files = DB.getAllFiles();
  llvm::sort(Files);
  Files.erase(std::unique(Files.begin(), Files.end()), Files.end());
  if (Files.empty())
    return inputError("the compilation database has no entries");
  return Files;
}

llvm::Error checkDirectories(const CompilationDatabase &DB,
                             llvm::ArrayRef<std::string> Files) {
  for (const std::string &F : Files)
    for (const CompileCommand &Cmd : DB.getCompileCommands(F))
      if (!llvm::sys::fs::is_directory(Cmd.Directory))
        return inputError("compile command for '" + F +
                          "' runs in missing directory '" + Cmd.Directory +
                          "'");
  return llvm::Error::success();
}

std::unique_ptr<CompilationDatabase>
firstCommandOnly(std::unique_ptr<CompilationDatabase> DB) {
  return std::make_unique<FirstCommandDatabase>(std::move(DB));
}

std::vector<std::string> sanitizeCommand(llvm::ArrayRef<std::string> Args) {
  const CompileFlagRules &R = Rules::embedded().compileFlags();
  std::vector<std::string> Out;
  for (size_t I = 0; I < Args.size(); ++I) {
    llvm::StringRef A = Args[I];
    if (I > 0) {
      if (llvm::is_contained(R.Drop, A))
        continue;
      if (llvm::any_of(R.DropPrefix,
                       [&](const std::string &P) { return A.starts_with(P); }))
        continue;
      if (llvm::is_contained(R.DropWithValue, A)) {
        ++I;
        continue;
      }
    }
    Out.push_back(A.str());
  }
  // Inserted before the input file so they apply to it.
  size_t InsertAt = Out.empty() ? 0 : 1;
  Out.insert(Out.begin() + InsertAt, R.Add.begin(), R.Add.end());
  return Out;
}

CompileCommand effectiveCommand(const CompilationDatabase &DB,
                                llvm::StringRef File, const RunOptions &Opts) {
  std::vector<CompileCommand> Commands = DB.getCompileCommands(File);
  CompileCommand Cmd = Commands.empty() ? CompileCommand() : Commands.front();
  // ClangTool's own adjusters first, as ClangTool runs them.
  ArgumentsAdjuster Adjust = combineAdjusters(
      combineAdjusters(getClangStripOutputAdjuster(),
                       getClangSyntaxOnlyAdjuster()),
      getClangStripDependencyFileAdjuster());
  Adjust = combineAdjusters(
      Adjust, [](const CommandLineArguments &Args, llvm::StringRef) {
        return sanitizeCommand(Args);
      });
  if (!Opts.ExtraArgsBefore.empty())
    Adjust = combineAdjusters(
        Adjust, getInsertArgumentAdjuster(Opts.ExtraArgsBefore,
                                          ArgumentInsertPosition::BEGIN));
  if (!Opts.ExtraArgs.empty())
    Adjust = combineAdjusters(
        Adjust, getInsertArgumentAdjuster(Opts.ExtraArgs,
                                          ArgumentInsertPosition::END));
  Adjust = combineAdjusters(Adjust, getStripPluginsAdjuster());
  Cmd.CommandLine = Adjust(Cmd.CommandLine, Cmd.Filename);
  return Cmd;
}

//===-- Configuration -----------------------------------------------------===//

/// The checks ulplint runs unless told otherwise: every rdma-* check but the
/// migration advice, which `ulplint report` and --checks ask for.
static constexpr llvm::StringLiteral DefaultChecks =
    "rdma-*,-rdma-local-mr-management";

namespace {
/// clang-tidy's file-based options, with rdma-* turned on for sources whose
/// .clang-tidy files do not mention rdma checks: a project's configuration
/// for other clang-tidy checks must not silence ulplint.
class UlplintOptionsProvider : public FileOptionsProvider {
public:
  using FileOptionsProvider::FileOptionsProvider;
  std::vector<OptionsSource> getRawOptions(llvm::StringRef File) override {
    std::vector<OptionsSource> Sources = FileOptionsProvider::getRawOptions(File);
    bool Mentioned = llvm::any_of(Sources, [](const OptionsSource &S) {
      return S.second != OptionsSourceTypeDefaultBinary && S.first.Checks &&
             llvm::StringRef(*S.first.Checks).contains("rdma");
    });
    if (!Mentioned) {
      ClangTidyOptions Enable;
      Enable.Checks = DefaultChecks.str();
      // Before the command line, which comes last and must win.
      auto Pos = Sources.end();
      if (!Sources.empty() &&
          Sources.back().second == OptionsSourceTypeCheckCommandLineOption)
        Pos = std::prev(Sources.end());
      Sources.insert(Pos, {Enable, "ulplint default"});
    }
    return Sources;
  }
};
} // namespace

/// clang-tidy's line filter shape, checked here: its own parser prints
/// YAML errors of its own.
static llvm::Error checkLineFilter(llvm::StringRef Text) {
  llvm::Expected<llvm::json::Value> V = llvm::json::parse(Text);
  if (!V)
    return V.takeError();
  auto Shape = [] {
    return inputError(
        "expected [{\"name\": \"file.c\", \"lines\": [[1, 30], ...]}, ...]");
  };
  const llvm::json::Array *Files = V->getAsArray();
  if (!Files)
    return Shape();
  for (const llvm::json::Value &F : *Files) {
    const llvm::json::Object *O = F.getAsObject();
    if (!O || !O->getString("name"))
      return Shape();
    const llvm::json::Value *Lines = O->get("lines");
    if (!Lines)
      continue;
    const llvm::json::Array *Ranges = Lines->getAsArray();
    if (!Ranges)
      return Shape();
    for (const llvm::json::Value &R : *Ranges) {
      const llvm::json::Array *Pair = R.getAsArray();
      if (!Pair || Pair->size() != 2 || !(*Pair)[0].getAsUINT64() ||
          !(*Pair)[1].getAsUINT64())
        return Shape();
    }
  }
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<ClangTidyOptionsProvider>>
makeOptionsProvider(const RunOptions &Opts,
                    llvm::IntrusiveRefCntPtr<llvm::vfs::FileSystem> FS) {
  ClangTidyGlobalOptions Global;
  if (!Opts.LineFilter.empty()) {
    if (llvm::Error E = checkLineFilter(Opts.LineFilter))
      return inputError("invalid --line-filter '" + Opts.LineFilter + "': " +
                        llvm::toString(std::move(E)));
    parseLineFilter(Opts.LineFilter, Global);
  }
  ClangTidyOptions Defaults = ClangTidyOptions::getDefaults();
  Defaults.Checks = ("-*," + DefaultChecks).str();
  Defaults.HeaderFilterRegex = "";
  ClangTidyOptions Override;
  if (!Opts.Checks.empty())
    Override.Checks = Opts.Checks;
  if (Opts.HeaderFilter) {
    std::string Problem;
    if (!llvm::Regex(*Opts.HeaderFilter).isValid(Problem))
      return inputError("invalid --header-filter '" + *Opts.HeaderFilter +
                        "': " + Problem);
    Override.HeaderFilterRegex = *Opts.HeaderFilter;
  }
  if (!Opts.Config.empty() || !Opts.ConfigFile.empty()) {
    std::string Text = Opts.Config;
    if (!Opts.ConfigFile.empty()) {
      auto Buffer = llvm::MemoryBuffer::getFile(Opts.ConfigFile);
      if (!Buffer)
        return inputError("cannot read --config-file '" + Opts.ConfigFile +
                          "': " + Buffer.getError().message());
      Text = (*Buffer)->getBuffer().str();
    }
    auto Parsed = parseConfiguration(llvm::MemoryBufferRef(Text, "config"));
    if (!Parsed)
      return inputError("invalid configuration: " +
                        Parsed.getError().message());
    ClangTidyOptions Config = std::move(*Parsed);
    if (Config.Checks && !llvm::StringRef(*Config.Checks).contains("rdma"))
      Config.Checks = *Config.Checks + "," + DefaultChecks.str();
    return std::make_unique<ConfigOptionsProvider>(
        Global, Defaults, std::move(Config), std::move(Override), FS);
  }
  return std::make_unique<UlplintOptionsProvider>(Global, Defaults, Override,
                                                  FS);
}

std::vector<std::string> registeredChecks() {
  ClangTidyCheckFactories Factories;
  for (const auto &Entry : ClangTidyModuleRegistry::entries())
    Entry.instantiate()->addCheckFactories(Factories);
  std::vector<std::string> Names;
  for (const auto &F : Factories)
    Names.push_back(F.getKey().str());
  llvm::sort(Names);
  return Names;
}

/// Positive terms of a checks glob that match no registered check.
static std::vector<std::string> unknownChecks(llvm::StringRef Globs,
                                              llvm::ArrayRef<std::string> Known) {
  std::vector<std::string> Unknown;
  llvm::SmallVector<llvm::StringRef, 8> Terms;
  Globs.split(Terms, ',', -1, false);
  for (llvm::StringRef Term : Terms) {
    Term = Term.trim();
    if (Term.empty() || Term.starts_with("-") || !Term.starts_with("rdma"))
      continue;
    auto Pattern = llvm::GlobPattern::create(Term);
    if (!Pattern ||
        llvm::none_of(Known, [&](const std::string &N) {
          return Pattern->match(N);
        }))
      Unknown.push_back(Term.str());
  }
  return Unknown;
}

/// Some unit must have a check enabled: a run that analyses nothing must not
/// pass (clang-tidy refuses too). Typos such as `-*,rdam-*` end here.
static llvm::Error checkSomethingEnabled(const RunOptions &Opts,
                                         llvm::ArrayRef<std::string> Files,
                                         ClangTidyOptionsProvider &Provider,
                                         llvm::ArrayRef<std::string> Known) {
  for (const std::string &File : Files) {
    GlobList Enabled(Provider.getOptions(File).Checks.value_or(""));
    if (llvm::any_of(Known, [&](const std::string &N) { return Enabled.contains(N); }))
      return llvm::Error::success();
  }
  if (!Opts.Checks.empty())
    return inputError("--checks='" + Opts.Checks + "' leaves no check enabled "
                      "(see --list-checks)");
  return inputError("the configuration (.clang-tidy, --config) leaves no check "
                    "enabled (see --list-checks)");
}

/// The .clang-tidy files clang-tidy would read for \p File must parse:
/// clang-tidy itself only prints the error and carries on with defaults.
static llvm::Error verifyConfigFiles(llvm::StringRef File,
                                     std::set<std::string> &Checked) {
  llvm::SmallString<256> Dir(llvm::sys::path::parent_path(File));
  for (; !Dir.empty(); Dir = llvm::sys::path::parent_path(Dir)) {
    llvm::SmallString<256> Config(Dir);
    llvm::sys::path::append(Config, ".clang-tidy");
    if (!llvm::sys::fs::exists(Config))
      continue;
    if (!Checked.insert(std::string(Config)).second)
      return llvm::Error::success();
    auto Buffer = llvm::MemoryBuffer::getFile(Config);
    if (!Buffer)
      return inputError("cannot read '" + Config + "'");
    std::string Problem;
    auto Parsed = parseConfigurationWithDiags(
        (*Buffer)->getMemBufferRef(), [&](const llvm::SMDiagnostic &D) {
          if (Problem.empty())
            Problem = std::to_string(D.getLineNo()) + ":" +
                      std::to_string(D.getColumnNo() + 1) + ": " +
                      D.getMessage().str();
        });
    if (!Parsed)
      return inputError("malformed configuration '" + Config + "'" +
                        (Problem.empty() ? "" : ":" + Problem));
    if (!Parsed->InheritParentConfig.value_or(false))
      return llvm::Error::success();
  }
  return llvm::Error::success();
}

llvm::Error verifyConfiguration(const RunOptions &Opts,
                                llvm::ArrayRef<std::string> Files) {
  std::set<std::string> ConfigFiles;
  for (const std::string &File : Files)
    if (llvm::Error E = verifyConfigFiles(File, ConfigFiles))
      return E;
  std::vector<std::string> Known = registeredChecks();
  auto Provider = makeOptionsProvider(Opts);
  if (!Provider)
    return Provider.takeError();
  ChecksAndOptions All = getAllChecksAndOptions(false, false);
  // Configuration files differ per directory: check each distinct one once.
  std::set<std::string> Seen;
  for (const std::string &File : Files) {
    for (const auto &[Options, Source] : (*Provider)->getRawOptions(File)) {
      if (!Seen.insert(Source + (Options.Checks ? *Options.Checks : "")).second)
        continue;
      if (Options.Checks)
        for (const std::string &U : unknownChecks(*Options.Checks, Known))
          return inputError("unknown check '" + U + "' in " + Source);
      for (const auto &Option : Options.CheckOptions) {
        llvm::StringRef Key = Option.getKey();
        if (Key.starts_with("rdma-") && !All.Options.contains(Key))
          return inputError("unknown option '" + Key + "' in " + Source);
        if (Key == "ApiWrappers" || Key.ends_with(".ApiWrappers"))
          if (auto Parsed = parseApiWrappers(Option.getValue().Value,
                                             Rules::embedded());
              !Parsed)
            return inputError(llvm::toString(Parsed.takeError()) + " in " +
                              Source);
      }
    }
  }
  return checkSomethingEnabled(Opts, Files, **Provider, Known);
}

//===-- Running -----------------------------------------------------------===//

/// Every file the unit read, with the hash of the content clang saw: a
/// file edited during the analysis must not be cached with the old result.
static std::vector<InputFile> inputsOf(CompilerInstance &CI) {
  SourceManager &SM = CI.getSourceManager();
  std::vector<InputFile> Inputs;
  for (auto It = SM.fileinfo_begin(), End = SM.fileinfo_end(); It != End; ++It) {
    llvm::SmallString<256> Path(It->first.getName());
    CI.getFileManager().makeAbsolutePath(Path);
    llvm::sys::path::remove_dots(Path, false);
    std::optional<llvm::StringRef> Data = It->second->getBufferDataIfLoaded();
    Inputs.push_back({std::string(Path), Data ? contentHash(*Data) : ""});
  }
  llvm::sort(Inputs, [](const InputFile &A, const InputFile &B) {
    return A.Path < B.Path;
  });
  return Inputs;
}

namespace {
/// clang-tidy's frontend action (see clang-tidy's runClangTidy), one unit
/// at a time so each thread has its own context.
class TidyActionFactory : public FrontendActionFactory {
public:
  TidyActionFactory(ClangTidyContext &Context,
                    llvm::IntrusiveRefCntPtr<llvm::vfs::OverlayFileSystem> FS,
                    std::vector<InputFile> &Inputs)
      : Consumers(Context, std::move(FS)), Inputs(Inputs) {}

  std::unique_ptr<FrontendAction> create() override {
    return std::make_unique<Action>(Consumers, Inputs);
  }
  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation,
                     FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCH,
                     DiagnosticConsumer *Diags) override {
    // clang-tidy defines __clang_analyzer__; so must we, for identical results.
    Invocation->getPreprocessorOpts().SetUpStaticAnalyzer = true;
    // No "N warnings generated." lines: compiler warnings are not findings.
    Invocation->getDiagnosticOpts().ShowCarets = false;
    return FrontendActionFactory::runInvocation(Invocation, Files, PCH, Diags);
  }

private:
  class Action : public ASTFrontendAction {
  public:
    Action(ClangTidyASTConsumerFactory &F, std::vector<InputFile> &Inputs)
        : F(F), Inputs(Inputs) {}
    std::unique_ptr<ASTConsumer> CreateASTConsumer(CompilerInstance &CI,
                                                   llvm::StringRef File) override {
      return F.createASTConsumer(CI, File);
    }
    void EndSourceFileAction() override {
      Inputs = inputsOf(getCompilerInstance());
    }

  private:
    ClangTidyASTConsumerFactory &F;
    std::vector<InputFile> &Inputs;
  };
  ClangTidyASTConsumerFactory Consumers;
  std::vector<InputFile> &Inputs;
};

bool isCompilerDiagnostic(const ClangTidyError &E) {
  return llvm::StringRef(E.DiagnosticName).starts_with("clang-diagnostic-");
}

/// "ulplint: 37/193 units, 12 findings, 0:41 elapsed, ETA 2:13", rewritten
/// in place on a terminal as units finish.
class Progress {
public:
  Progress(size_t Total, bool Enabled)
      : Total(Total), Enabled(Enabled), Start(Clock::now()) {}
  ~Progress() {
    if (Enabled && Width)
      llvm::errs() << "\r" << std::string(Width, ' ') << "\r";
  }
  /// Clears the line so other output starts at column 0; the next unit
  /// redraws it.
  void clear() {
    std::lock_guard<std::mutex> G(Lock);
    if (Enabled && Width)
      llvm::errs() << "\r" << std::string(Width, ' ') << "\r";
    Width = 0;
  }
  void unitDone(size_t NewFindings) {
    std::lock_guard<std::mutex> G(Lock);
    ++Done;
    Findings += NewFindings;
    auto Now = Clock::now();
    // At most ten redraws a second, and always the last one.
    if (!Enabled || (Done < Total && Now - LastDraw < std::chrono::milliseconds(100)))
      return;
    LastDraw = Now;
    draw(std::chrono::duration<double>(Now - Start).count());
  }

private:
  using Clock = std::chrono::steady_clock;
  static std::string minutes(double Seconds) {
    unsigned S = static_cast<unsigned>(Seconds + 0.5);
    return std::to_string(S / 60) + (S % 60 < 10 ? ":0" : ":") +
           std::to_string(S % 60);
  }
  void draw(double Elapsed) {
    std::string Line = llvm::formatv("ulplint: {0}/{1} units, {2} findings, {3} elapsed",
                                     Done, Total, Findings, minutes(Elapsed));
    if (Done < Total)
      Line += ", ETA " + minutes(Elapsed / Done * (Total - Done));
    size_t Pad = Width > Line.size() ? Width - Line.size() : 0;
    Width = std::max(Width, Line.size());
    llvm::errs() << "\r" << Line << std::string(Pad, ' ');
  }

  std::mutex Lock;
  size_t Total, Done = 0, Findings = 0, Width = 0;
  bool Enabled;
  Clock::time_point Start, LastDraw;
};
} // namespace

/// "file:line:col: message" for a compiler error.
static std::string describeError(const ClangTidyError &E) {
  std::string Where = E.Message.FilePath;
  if (Where.empty())
    return E.Message.Message;
  llvm::SmallString<256> Path(Where);
  if (llvm::sys::path::is_relative(Path) && !E.BuildDirectory.empty()) {
    Path = E.BuildDirectory;
    llvm::sys::path::append(Path, Where);
  }
  if (auto Buffer = llvm::MemoryBuffer::getFile(Path)) {
    llvm::StringRef Before =
        (*Buffer)->getBuffer().take_front(E.Message.FileOffset);
    size_t LineStart = Before.rfind('\n');
    unsigned Column = Before.size() -
                      (LineStart == llvm::StringRef::npos ? 0 : LineStart + 1) +
                      1;
    Where += ":" + std::to_string(Before.count('\n') + 1) + ":" +
             std::to_string(Column);
  }
  return Where + ": " + E.Message.Message;
}

namespace {
/// The database of one final command.
class OneCommandDatabase : public CompilationDatabase {
public:
  explicit OneCommandDatabase(CompileCommand Cmd) : Cmd(std::move(Cmd)) {}
  std::vector<CompileCommand> getCompileCommands(llvm::StringRef) const override {
    return {Cmd};
  }

private:
  CompileCommand Cmd;
};
} // namespace

UnitResult analyzeUnit(const CompileCommand &Cmd, const RunOptions &Opts,
                       std::vector<InputFile> &Inputs) {
  OneCommandDatabase DB(Cmd);
  UnitResult Result;
  Result.File = Cmd.Filename;
  // A physical file system of its own: ClangTool changes the working
  // directory per command, and the process-wide one is shared by threads.
  auto FS = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(
      llvm::vfs::createPhysicalFileSystem());
  auto Provider = makeOptionsProvider(Opts, FS);
  if (!Provider) {
    Result.ParseErrors.push_back(llvm::toString(Provider.takeError()));
    return Result;
  }
  ClangTidyContext Context(std::move(*Provider), false, false, false);
  ClangTool Tool(DB, {Cmd.Filename}, std::make_shared<PCHContainerOperations>(),
                 FS);
  // The command is final (effectiveCommand): the cache key and
  // --print-commands show exactly what clang parses.
  Tool.clearArgumentsAdjusters();
  Tool.appendArgumentsAdjuster(
      [&Cmd](const CommandLineArguments &, llvm::StringRef) {
        return Cmd.CommandLine;
      });

  ClangTidyDiagnosticConsumer Consumer(Context, nullptr, true, false);
  auto DiagOpts = std::make_unique<DiagnosticOptions>();
  DiagnosticsEngine DE(DiagnosticIDs::create(), *DiagOpts, &Consumer, false);
  Context.setDiagnosticsEngine(std::move(DiagOpts), &DE);
  Tool.setDiagnosticConsumer(&Consumer);
  Tool.setPrintErrorMessage(false);

  TidyActionFactory Factory(Context, FS, Inputs);
  int Status;
  {
    FactScope Scope(&Result.Facts);
    SiteScope Sites(Opts.CollectSites ? &Result.Sites : nullptr);
    Status = Tool.run(&Factory);
  }

  for (ClangTidyError &E : Consumer.take()) {
    if (!isCompilerDiagnostic(E)) {
      Result.Findings.push_back(std::move(E));
      continue;
    }
    if (E.DiagLevel == ClangTidyError::Error)
      Result.ParseErrors.push_back(describeError(E));
  }
  if (Status != 0 && Result.ParseErrors.empty())
    Result.ParseErrors.push_back("the compiler could not process this file");
  return Result;
}

/// The configuration the checks see for \p File, as text for the cache key.
static std::string effectiveConfig(const RunOptions &Opts, llvm::StringRef File) {
  auto Provider = makeOptionsProvider(Opts);
  if (!Provider) {
    llvm::consumeError(Provider.takeError()); // analyzeUnit reports it
    return "";
  }
  // The line filter is global, not part of the file's options.
  return configurationAsText((*Provider)->getOptions(File)) + "\nLineFilter: " +
         Opts.LineFilter;
}

/// Why \p File cannot be a unit's source, if it cannot: clang would say
/// "no input files", or pages of errors for binary data.
static std::optional<std::string> unusableSource(llvm::StringRef File) {
  llvm::sys::fs::file_status St;
  if (std::error_code EC = llvm::sys::fs::status(File, St))
    return EC == std::errc::no_such_file_or_directory ? "no such file"
                                                      : EC.message();
  if (llvm::sys::fs::is_directory(St))
    return "it is a directory";
  uint64_t Size = std::min<uint64_t>(St.getSize(), 64 << 10);
  if (Size == 0)
    return std::nullopt;
  auto Head = llvm::MemoryBuffer::getFileSlice(File, Size, 0);
  if (!Head)
    return "cannot read it: " + Head.getError().message();
  size_t Nul = (*Head)->getBuffer().find('\0');
  if (Nul != llvm::StringRef::npos)
    return "not C source: binary data (a NUL byte at offset " +
           std::to_string(Nul) + ")";
  return std::nullopt;
}

/// The unit's result from the cache if it is there and current, else from
/// an analysis in a worker process, which then goes into the cache.
static UnitResult analyzeOrReuse(const CompilationDatabase &DB,
                                 const std::string &File,
                                 const RunOptions &Opts, Prescanner *Prescan,
                                 bool &Reused) {
  if (std::optional<std::string> Why = unusableSource(File)) {
    UnitResult Result;
    Result.File = File;
    Result.ParseErrors.push_back(*Why);
    return Result;
  }
  CompileCommand Cmd = effectiveCommand(DB, File, Opts);
  Cmd.Filename = File;
  if (Prescan && !Prescan->mayHoldRdma(Cmd)) {
    UnitResult Result;
    Result.File = File;
    Result.Skipped = NoRdmaCode.str();
    return Result;
  }
  std::string Key;
  // Registration sites (`ulplint report`) are not part of cache entries.
  ResultCache *Cache = Opts.CollectSites ? nullptr : Opts.Cache;
  if (Cache) {
    Key = unitKey(File, Cmd.Directory, Cmd.CommandLine,
                  effectiveConfig(Opts, File));
    if (std::optional<UnitResult> Hit = Cache->lookup(Key)) {
      Reused = true;
      return std::move(*Hit);
    }
  }
  UnitResult Result = analyzeIsolated(Cmd, Opts);
  // A unit that does not parse may lack a header that appears later.
  if (Cache && Result.ParseErrors.empty() && !Result.Inputs.empty())
    Cache->store(Key, Result, Result.Inputs);
  return Result;
}

unsigned reportBrokenUnits(llvm::ArrayRef<UnitResult> Units,
                           llvm::StringRef Tool) {
  unsigned Broken = 0;
  for (const UnitResult &U : Units) {
    if (U.ParseErrors.empty())
      continue;
    ++Broken;
    size_t More = U.ParseErrors.size() - 1;
    llvm::WithColor::error(llvm::errs(), Tool)
        << U.File << ": not analysed: " << U.ParseErrors.front()
        << (More ? " (and " + std::to_string(More) + " more errors)" : "")
        << "\n";
    if (!U.CrashLog.empty())
      llvm::errs() << U.CrashLog << (U.CrashLog.back() == '\n' ? "" : "\n");
  }
  return Broken;
}

bool isConditionOf(const ConditionalFinding &C, const ClangTidyError &E) {
  return E.DiagnosticName == C.Check && E.Message.FilePath == C.File &&
         E.Message.FileOffset == C.Offset &&
         (C.Message.empty() || E.Message.Message == C.Message);
}

void settleConditions(std::vector<UnitResult> &Units) {
  std::set<std::string> Facts;
  for (const UnitResult &U : Units)
    Facts.insert(U.Facts.Facts.begin(), U.Facts.Facts.end());
  for (UnitResult &U : Units)
    for (const ConditionalFinding &C : U.Facts.Conditions) {
      bool Holds =
          llvm::all_of(C.Require, [&](const std::string &F) { return Facts.count(F); }) &&
          llvm::none_of(C.Unless, [&](const std::string &F) { return Facts.count(F); });
      if (Holds)
        continue;
      // The conditional finding itself, not another finding of the check
      // at the same place.
      llvm::erase_if(U.Findings,
                     [&](const ClangTidyError &E) { return isConditionOf(C, E); });
    }
}

std::vector<UnitResult> analyze(const CompilationDatabase &DB,
                                llvm::ArrayRef<std::string> Files,
                                const RunOptions &Opts, RunStats &Stats) {
  std::vector<UnitResult> Results(Files.size());
  std::vector<char> Reused(Files.size(), false), Done(Files.size(), false);
  Progress Bar(Files.size(), Opts.Progress);
  std::mutex ReleaseLock;
  size_t Released = 0; // units handed to OnUnitDone, in input order
  auto Release = [&](size_t I) {
    std::lock_guard<std::mutex> G(ReleaseLock);
    Done[I] = true;
    for (; Released < Files.size() && Done[Released]; ++Released) {
      Bar.clear();
      Opts.OnUnitDone(Results[Released]);
    }
  };
  std::optional<Prescanner> Prescan;
  if (Opts.SkipNonRdma)
    Prescan.emplace();
  auto Run = [&](size_t I) {
    bool FromCache = false;
    Results[I] = analyzeOrReuse(DB, Files[I], Opts,
                                Prescan ? &*Prescan : nullptr, FromCache);
    Reused[I] = FromCache;
    if (Opts.OnUnitDone)
      Release(I);
    Bar.unitDone(Results[I].Findings.size());
  };
  unsigned Jobs = Opts.Jobs ? Opts.Jobs
                            : llvm::hardware_concurrency().compute_thread_count();
  if (Jobs <= 1 || Files.size() <= 1) {
    for (size_t I = 0; I < Files.size(); ++I)
      Run(I);
  } else {
    llvm::DefaultThreadPool Pool(llvm::hardware_concurrency(Jobs));
    for (size_t I = 0; I < Files.size(); ++I)
      Pool.async([&, I] { Run(I); });
    Pool.wait();
  }
  removeWorkerFiles();
  for (size_t I = 0; I < Files.size(); ++I)
    ++(!Results[I].Skipped.empty() ? Stats.Skipped
       : Reused[I]                 ? Stats.FromCache
                                   : Stats.Analysed);
  return Results;
}

std::string skippedSummary(llvm::ArrayRef<UnitResult> Units) {
  size_t Skipped = llvm::count_if(
      Units, [](const UnitResult &U) { return U.Skipped == NoRdmaCode; });
  if (!Skipped)
    return "";
  return ", " + std::to_string(Skipped) + " skipped (" + NoRdmaCode.str() + ")";
}

} // namespace ulplint::tool
