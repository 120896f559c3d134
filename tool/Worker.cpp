//===- Worker.cpp - Each unit in a process of its own ---------------------===//

#include "Worker.h"
#include "Cache.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/thread.h"
#include <atomic>
#include <csignal>
#include <mutex>
#include <pthread.h>
#include <unistd.h>

using clang::tooling::CompileCommand;
namespace json = llvm::json;

namespace ulplint::tool {

//===-- Requests and responses --------------------------------------------===//

namespace {
json::Value requestToJson(const CompileCommand &Cmd, const RunOptions &O,
                          llvm::StringRef Response) {
  return json::Object{{"file", Cmd.Filename},     {"directory", Cmd.Directory},
                      {"arguments", Cmd.CommandLine}, {"checks", O.Checks},
                      {"config", O.Config},       {"configFile", O.ConfigFile},
                      {"headerFilter", O.HeaderFilter},
                      {"lineFilter", O.LineFilter},
                      {"collectSites", O.CollectSites},
                      {"stackMiB", O.StackMiB},   {"response", Response}};
}

bool requestFromJson(const json::Value &V, CompileCommand &Cmd, RunOptions &O,
                     std::string &Response, json::Path P) {
  json::ObjectMapper M(V, P);
  return M && M.map("file", Cmd.Filename) && M.map("directory", Cmd.Directory) &&
         M.map("arguments", Cmd.CommandLine) && M.map("checks", O.Checks) &&
         M.map("config", O.Config) && M.map("configFile", O.ConfigFile) &&
         M.map("headerFilter", O.HeaderFilter) &&
         M.map("lineFilter", O.LineFilter) &&
         M.map("collectSites", O.CollectSites) && M.map("stackMiB", O.StackMiB) &&
         M.map("response", Response);
}

json::Value siteToJson(const SiteRecord &S) {
  return json::Object{{"kind", S.Kind},         {"role", S.Role},
                      {"api", S.Api},           {"target", S.Target},
                      {"function", S.Function}, {"file", S.File},
                      {"line", S.Line},         {"column", S.Column},
                      {"datapath", S.Datapath}, {"fixable", S.Fixable},
                      {"excerpt", S.Excerpt},   {"excerptLine", S.ExcerptLine}};
}

bool siteFromJson(const json::Value &V, SiteRecord &S, json::Path P) {
  json::ObjectMapper M(V, P);
  return M && M.map("kind", S.Kind) && M.map("role", S.Role) &&
         M.map("api", S.Api) && M.map("target", S.Target) &&
         M.map("function", S.Function) && M.map("file", S.File) &&
         M.map("line", S.Line) && M.map("column", S.Column) &&
         M.map("datapath", S.Datapath) && M.map("fixable", S.Fixable) &&
         M.map("excerpt", S.Excerpt) && M.map("excerptLine", S.ExcerptLine);
}

json::Value responseToJson(const UnitResult &U) {
  json::Array Inputs, Sites;
  for (const InputFile &F : U.Inputs)
    Inputs.push_back(json::Array{F.Path, F.Hash});
  for (const SiteRecord &S : U.Sites.Sites)
    Sites.push_back(siteToJson(S));
  return json::Object{{"result", unitToJson(U)},
                      {"inputs", std::move(Inputs)},
                      {"sites", std::move(Sites)}};
}

bool responseFromJson(const json::Value &V, UnitResult &U, json::Path P) {
  const json::Object *O = V.getAsObject();
  const json::Value *Result = O ? O->get("result") : nullptr;
  const json::Array *Inputs = O ? O->getArray("inputs") : nullptr;
  const json::Array *Sites = O ? O->getArray("sites") : nullptr;
  if (!Result || !Inputs || !Sites) {
    P.report("expected result, inputs and sites");
    return false;
  }
  if (!unitFromJson(*Result, U, P.field("result")))
    return false;
  for (size_t I = 0; I < Inputs->size(); ++I) {
    std::vector<std::string> Pair;
    if (!json::fromJSON((*Inputs)[I], Pair, P.field("inputs").index(I)) ||
        Pair.size() != 2)
      return false;
    U.Inputs.push_back({Pair[0], Pair[1]});
  }
  for (size_t I = 0; I < Sites->size(); ++I) {
    SiteRecord S;
    if (!siteFromJson((*Sites)[I], S, P.field("sites").index(I)))
      return false;
    U.Sites.Sites.push_back(std::move(S));
  }
  return true;
}
} // namespace

//===-- The run's side ----------------------------------------------------===//

namespace {
std::string WorkerExe;
std::once_flag RunDirOnce;
std::string RunDir; // the run's directory for worker files
std::atomic<unsigned> NextUnit{0};
std::mutex StderrLock;

llvm::Expected<std::string> runDirectory() {
  std::call_once(RunDirOnce, [] {
    llvm::SmallString<256> Dir;
    if (!llvm::sys::fs::createUniqueDirectory("ulplint-units", Dir))
      RunDir = std::string(Dir);
  });
  if (RunDir.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "cannot create a temporary directory for "
                                   "the analysis workers");
  return RunDir;
}

/// Where a crash happened, from the pretty stack trace of its log: the
/// parser's current token if it was parsing, else the innermost entry
/// (which check ran on what).
std::string crashLocation(llvm::StringRef Log) {
  llvm::StringRef Dump = Log.split("Stack dump:\n").second;
  llvm::SmallVector<llvm::StringRef, 64> Lines;
  Dump.split(Lines, '\n');
  std::string Innermost;
  for (llvm::StringRef L : Lines) {
    auto [Number, Entry] = L.split(".\t");
    if (Entry.empty() || Number.empty() ||
        !llvm::all_of(Number, llvm::isDigit))
      break; // the frames follow the entries
    if (Entry.starts_with("Program arguments"))
      continue;
    if (Entry.contains("current parser token"))
      return " at " + Entry.trim().str();
    Innermost = " at " + Entry.trim().str();
  }
  return Innermost;
}

/// The last line of \p Log that says something.
llvm::StringRef lastLine(llvm::StringRef Log) {
  Log = Log.rtrim();
  return Log.substr(Log.rfind('\n') + 1);
}

/// The unit that a worker could not analyse, with the reason.
UnitResult crashed(const CompileCommand &Cmd, const RunOptions &Opts, int Rc,
                   llvm::StringRef ErrMsg, llvm::StringRef Log) {
  UnitResult U;
  U.File = Cmd.Filename;
  bool Overflow = Log.contains("ulplint: stack overflow\n");
  std::string What;
  if (Overflow)
    What = "stack overflow: the code nests too deeply for the " +
           std::to_string(Opts.StackMiB) + " MiB stack (" + ErrMsg.str() + ")";
  else if (Rc == -2)
    What = ErrMsg.str();
  else
    What = "the analysis worker exited with status " + std::to_string(Rc) +
           (Log.empty() ? "" : ": " + lastLine(Log).str());
  U.ParseErrors.push_back(Rc == -1 ? "cannot start its analysis: " + ErrMsg.str()
                                   : "ulplint crashed: " + What +
                                         crashLocation(Log));
  // Frames of an overflow repeat the recursion: the reason says it all.
  if (!Overflow && Rc != -1)
    U.CrashLog = Log.take_front(8192).str();
  return U;
}
} // namespace

void setWorkerExecutable(std::string Path) { WorkerExe = std::move(Path); }

void removeWorkerFiles() {
  if (!RunDir.empty())
    llvm::sys::fs::remove_directories(RunDir);
}

UnitResult analyzeIsolated(const CompileCommand &Cmd, const RunOptions &Opts) {
  auto Dir = runDirectory();
  if (!Dir)
    return crashed(Cmd, Opts, -1, llvm::toString(Dir.takeError()), "");
  llvm::SmallString<256> Base(*Dir);
  llvm::sys::path::append(Base, "unit-" + std::to_string(NextUnit++));
  std::string Request = (Base + ".json").str(), Response = (Base + ".out").str(),
              Log = (Base + ".err").str();
  {
    std::error_code EC;
    llvm::raw_fd_ostream OS(Request, EC);
    if (!EC)
      OS << requestToJson(Cmd, Opts, Response);
    OS.close();
    if (EC || OS.has_error()) {
      OS.clear_error();
      return crashed(Cmd, Opts, -1, "cannot write '" + Request + "'", "");
    }
  }
  std::string Arg = "--unit-worker=" + Request, ErrMsg;
  std::optional<llvm::StringRef> Redirects[] = {llvm::StringRef(""),
                                                llvm::StringRef(""),
                                                llvm::StringRef(Log)};
  int Rc = llvm::sys::ExecuteAndWait(WorkerExe, {WorkerExe, Arg}, std::nullopt,
                                     Redirects, 0, 0, &ErrMsg);
  auto LogText = llvm::MemoryBuffer::getFile(Log);
  llvm::StringRef LogRef = LogText ? (*LogText)->getBuffer() : "";
  UnitResult U;
  bool Ok = false;
  if (Rc == 0)
    if (auto Out = llvm::MemoryBuffer::getFile(Response)) {
      llvm::Expected<json::Value> V = json::parse((*Out)->getBuffer());
      json::Path::Root R("worker response");
      Ok = V && responseFromJson(*V, U, R);
      if (!V)
        llvm::consumeError(V.takeError());
      if (!Ok)
        llvm::consumeError(R.getError());
    }
  if (!Ok)
    U = crashed(Cmd, Opts, Rc == 0 ? 1 : Rc, ErrMsg, LogRef);
  else if (!LogRef.empty()) { // e.g. clang-tidy's notes on configuration files
    std::lock_guard<std::mutex> G(StderrLock);
    llvm::errs() << LogRef;
  }
  for (const std::string &F : {Request, Response, Log})
    llvm::sys::fs::remove(F);
  return U;
}

//===-- The worker's side -------------------------------------------------===//

namespace {
/// The lowest address of the analysis thread's stack (its guard page is
/// just below), for telling a stack overflow from other crashes.
std::atomic<uintptr_t> StackLow{0};
struct sigaction LLVMSegvAction;

/// Says "stack overflow" when the fault is at the stack's end, then hands
/// the signal to LLVM's handler, which prints the stack dump and lets the
/// process die of it.
void onSegv(int Sig, siginfo_t *Info, void *Ctx) {
  uintptr_t Addr = reinterpret_cast<uintptr_t>(Info->si_addr);
  uintptr_t Low = StackLow;
  if (Low && Addr < Low + (64 << 10) && Addr + (1 << 20) >= Low) {
    static const char Msg[] = "ulplint: stack overflow\n";
    (void)!::write(2, Msg, sizeof Msg - 1);
  }
  sigaction(SIGSEGV, &LLVMSegvAction, nullptr);
  if (LLVMSegvAction.sa_flags & SA_SIGINFO)
    LLVMSegvAction.sa_sigaction(Sig, Info, Ctx);
  else if (LLVMSegvAction.sa_handler != SIG_DFL &&
           LLVMSegvAction.sa_handler != SIG_IGN)
    LLVMSegvAction.sa_handler(Sig);
  // Returning faults again, now with the default action.
}

/// Runs \p Fn on a thread with \p MiB of stack and an alternate signal
/// stack, on which the crash handlers can still run after an overflow.
void runOnBigStack(unsigned MiB, llvm::function_ref<void()> Fn) {
  struct sigaction A = {};
  A.sa_sigaction = onSegv;
  A.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&A.sa_mask);
  sigaction(SIGSEGV, &A, &LLVMSegvAction);
  llvm::thread T(std::optional<unsigned>(MiB << 20), [&] {
    std::vector<char> Alt(256 << 10);
    stack_t S = {};
    S.ss_sp = Alt.data();
    S.ss_size = Alt.size();
    sigaltstack(&S, nullptr);
    pthread_attr_t Attr;
    if (!pthread_getattr_np(pthread_self(), &Attr)) {
      void *Addr;
      size_t Size;
      if (!pthread_attr_getstack(&Attr, &Addr, &Size))
        StackLow = reinterpret_cast<uintptr_t>(Addr);
      pthread_attr_destroy(&Attr);
    }
    Fn();
    S.ss_flags = SS_DISABLE;
    sigaltstack(&S, nullptr);
  });
  T.join();
}
} // namespace

int runUnitWorker(llvm::StringRef RequestPath) {
  CompileCommand Cmd;
  RunOptions Opts;
  std::string Response;
  auto Buffer = llvm::MemoryBuffer::getFile(RequestPath);
  llvm::Expected<json::Value> V =
      Buffer ? json::parse((*Buffer)->getBuffer())
             : llvm::Expected<json::Value>(llvm::errorCodeToError(Buffer.getError()));
  json::Path::Root R("worker request");
  if (!V || !requestFromJson(*V, Cmd, Opts, Response, R)) {
    llvm::errs() << "ulplint: unusable worker request '" << RequestPath
                 << "': " << (V ? llvm::toString(R.getError())
                                : llvm::toString(V.takeError()))
                 << "\n";
    return 2;
  }
  UnitResult U;
  std::vector<InputFile> Inputs;
  runOnBigStack(Opts.StackMiB, [&] { U = analyzeUnit(Cmd, Opts, Inputs); });
  U.Inputs = std::move(Inputs);
  std::error_code EC;
  llvm::raw_fd_ostream OS(Response, EC);
  if (!EC)
    OS << responseToJson(U);
  OS.close();
  EC = EC ? EC : OS.error();
  OS.clear_error();
  if (EC) {
    llvm::errs() << "ulplint: cannot write '" << Response << "': " << EC.message()
                 << "\n";
    return 2;
  }
  return 0;
}

} // namespace ulplint::tool
