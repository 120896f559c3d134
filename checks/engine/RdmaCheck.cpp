//===- RdmaCheck.cpp - Base class of every rdma-* check -------------------===//

#include "RdmaCheck.h"
#include "Facts.h"
#include "Program.h"
#include "Lifecycle.h"
#include "WorkRequests.h"
#include <set>
#include "clang/AST/ASTContext.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "llvm/ADT/StringExtras.h"

using namespace clang;
using namespace clang::ast_matchers;

namespace ulplint {

// The RDMA core and the providers implement the verbs; checks about how a
// ULP should use them do not apply there (rules/api/*.yaml, core_files).
RdmaCheck::RdmaCheck(StringRef Name, tidy::ClangTidyContext *Context)
    : ClangTidyCheck(Name, Context),
      CoreFiles(Options.getLocalOrGlobal("CoreFiles",
                                         Rules::embedded().coreFiles())),
      CoreFilesRegex(CoreFiles),
      ApiWrappers(Options.getLocalOrGlobal("ApiWrappers", "")),
      CacheDir(Options.getLocalOrGlobal("CacheDir", "")), TidyContext(Context) {
  if (auto Parsed = parseApiWrappers(ApiWrappers, Rules::embedded()); !Parsed)
    configurationDiag(llvm::toString(Parsed.takeError()));
}

void RdmaCheck::storeOptions(tidy::ClangTidyOptions::OptionMap &Opts) {
  Options.store(Opts, "CoreFiles", CoreFiles);
  Options.store(Opts, "ApiWrappers", ApiWrappers);
  Options.store(Opts, "CacheDir", CacheDir);
}

void RdmaCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(translationUnitDecl().bind("tu"), this);
}

/// In a host of one unit (the clang-tidy plugin): every fact of the program
/// a ulplint run recorded for the other units, and this unit's own; null
/// under ulplint, which settles conditions itself. Computed by the first
/// check of the unit, before anything is cached.
static const std::set<std::string> *programKnown(const TuAnalysis &A,
                                                 StringRef BuildDir,
                                                 StringRef CacheDir) {
  static thread_local const TuAnalysis *For = nullptr;
  static thread_local std::optional<std::set<std::string>> Known;
  if (currentFacts())
    return nullptr;
  if (For != &A) {
    For = &A;
    Known.reset();
    const SourceManager &SM = A.sources();
    OptionalFileEntryRef Main = SM.getFileEntryRefForID(SM.getMainFileID());
    UnitFacts Own;
    {
      FactScope Scope(&Own);
      Program::of(A);
      Lifecycle::of(A);
      WorkRequests::of(A);
    }
    // Without a ulplint run's facts of the other units, this unit is the
    // whole program as far as the host can tell.
    Known.emplace(Own.Facts.begin(), Own.Facts.end());
    if (ProgramFactsProvider P = programFactsProvider(); P && Main)
      if (auto Others = P(Main->getName(), BuildDir, CacheDir))
        Known->insert(Others->begin(), Others->end());
  }
  return Known ? &*Known : nullptr;
}

void RdmaCheck::check(const MatchFinder::MatchResult &Result) {
  ASTContext &Ctx = *Result.Context;
  if (ulpOnly() && !CoreFiles.empty()) {
    const SourceManager &SM = Ctx.getSourceManager();
    if (OptionalFileEntryRef Main = SM.getFileEntryRefForID(SM.getMainFileID()))
      if (CoreFilesRegex.match(Main->getName()))
        return;
  }
  const TuAnalysis &A = TuAnalysis::get(Ctx, ApiWrappers);
  Known = programKnown(A, TidyContext->getCurrentBuildDirectory(), CacheDir);
  Program::of(A); // tells the program what this unit knows of it, once
  checkUnit(A);
}

DiagnosticBuilder RdmaCheck::report(const TuAnalysis &A, SourceLocation Loc,
                                    StringRef Message) {
  return diag(userLoc(A.sources(), Loc), Message);
}

DiagnosticBuilder RdmaCheck::reportUnless(const TuAnalysis &A,
                                          SourceLocation Loc,
                                          StringRef Message,
                                          StringRef UnlessFact) {
  SourceLocation At = userLoc(A.sources(), Loc);
  if (UnitFacts *Sink = currentFacts())
    Sink->Conditions.push_back({getID().str(), A.sources().getFilename(At).str(),
                                A.sources().getFileOffset(At), Message.str(), {},
                                {UnlessFact.str()}});
  // Settled by the program's facts: an ignored diagnostic drops its notes.
  if (Known && Known->count(UnlessFact.str()))
    return diag(At, Message, DiagnosticIDs::Ignored);
  return diag(At, Message);
}

std::optional<DiagnosticBuilder>
RdmaCheck::reportIfProgram(const TuAnalysis &A, SourceLocation Loc,
                           StringRef Message, std::vector<std::string> Require,
                           std::vector<std::string> Unless) {
  UnitFacts *Sink = currentFacts();
  if (!Sink && Known) {
    bool Holds =
        llvm::all_of(Require, [&](const std::string &F) { return Known->count(F); }) &&
        llvm::none_of(Unless, [&](const std::string &F) { return Known->count(F); });
    if (!Holds)
      return std::nullopt;
    return diag(userLoc(A.sources(), Loc), Message);
  }
  if (!Sink)
    return std::nullopt;
  SourceLocation At = userLoc(A.sources(), Loc);
  Sink->Conditions.push_back({getID().str(), A.sources().getFilename(At).str(),
                              A.sources().getFileOffset(At), Message.str(),
                              std::move(Require), std::move(Unless)});
  return diag(At, Message);
}

DiagnosticBuilder RdmaCheck::note(const TuAnalysis &A, SourceLocation Loc,
                                  StringRef Message) {
  return diag(userLoc(A.sources(), Loc), Message, DiagnosticIDs::Note);
}

static bool needsParens(const Expr *E) {
  E = E->IgnoreImpCasts();
  if (const auto *BO = dyn_cast<BinaryOperator>(E))
    return BO->getOpcode() > BO_Or; // &&, ||, ?:, assignments, comma
  return isa<ConditionalOperator>(E) || isa<BinaryConditionalOperator>(E);
}

/// Text that is one operand whatever surrounds it: an identifier (a macro
/// or enumerator), a number, a call or a parenthesized expression.
static bool isAtom(StringRef Text) {
  Text = Text.trim();
  if (Text.empty())
    return false;
  if (llvm::all_of(Text, [](char C) { return llvm::isAlnum(C) || C == '_'; }))
    return true;
  if (!Text.ends_with(")"))
    return false;
  // The closing parenthesis must match the first opening one.
  size_t Open = Text.find('(');
  if (Open != 0 && !llvm::all_of(Text.take_front(Open), [](char C) {
        return llvm::isAlnum(C) || C == '_';
      }))
    return false;
  int Depth = 0;
  for (size_t I = Open; I < Text.size(); ++I) {
    Depth += Text[I] == '(' ? 1 : Text[I] == ')' ? -1 : 0;
    if (Depth == 0 && I + 1 < Text.size())
      return false;
  }
  return true;
}

std::string prependFlag(const ASTContext &Ctx, const Expr *E, StringRef Flag) {
  std::string Text = sourceText(Ctx, E);
  if (isAtom(Text) || !needsParens(E))
    return (Flag + " | " + Text).str();
  return (Flag + " | (" + Text + ")").str();
}

std::optional<FixItHint> addFlagFix(const ASTContext &Ctx, const Expr *E,
                                    StringRef Flag) {
  if (Flag.empty())
    return std::nullopt;
  CharSourceRange Range = userRange(Ctx, E);
  if (Range.isInvalid() || sourceText(Ctx, E).empty())
    return std::nullopt;
  return FixItHint::CreateReplacement(Range, prependFlag(Ctx, E, Flag));
}

} // namespace ulplint
