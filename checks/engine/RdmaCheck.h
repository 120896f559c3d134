//===- RdmaCheck.h - Base class of every rdma-* check -----------*- C++ -*-===//
//
// Checks do not register AST matchers of their own: each one reads the shared
// TuAnalysis once per translation unit and reports from it.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_RDMACHECK_H
#define ULPLINT_ENGINE_RDMACHECK_H

#include "Analysis.h"
#include "clang-tidy/ClangTidyCheck.h"
#include "llvm/Support/Regex.h"
#include <set>

namespace ulplint {

class RdmaCheck : public clang::tidy::ClangTidyCheck {
public:
  RdmaCheck(llvm::StringRef Name, clang::tidy::ClangTidyContext *Context);

  void registerMatchers(clang::ast_matchers::MatchFinder *Finder) final;
  void check(const clang::ast_matchers::MatchFinder::MatchResult &Result) final;
  void storeOptions(clang::tidy::ClangTidyOptions::OptionMap &Opts) override;

protected:
  /// Report findings for one translation unit.
  virtual void checkUnit(const TuAnalysis &A) = 0;
  /// Checks that judge ULP code, not the RDMA core or providers, return true;
  /// they stay silent in files matching the CoreFiles option.
  virtual bool ulpOnly() const { return false; }

  /// A warning at the place the user wrote \p Loc.
  clang::DiagnosticBuilder report(const TuAnalysis &A, clang::SourceLocation Loc,
                                  llvm::StringRef Message);
  clang::DiagnosticBuilder note(const TuAnalysis &A, clang::SourceLocation Loc,
                                llvm::StringRef Message);
  /// A warning that ulplint drops if any unit of the program exports
  /// \p UnlessFact (see Facts.h); the plugin keeps it.
  clang::DiagnosticBuilder reportUnless(const TuAnalysis &A,
                                        clang::SourceLocation Loc,
                                        llvm::StringRef Message,
                                        llvm::StringRef UnlessFact);
  /// A warning that only the whole program can confirm: ulplint keeps it when
  /// other units export every fact in \p Require and none in \p Unless; the
  /// plugin, seeing one unit, does not report it (returns nullopt).
  std::optional<clang::DiagnosticBuilder>
  reportIfProgram(const TuAnalysis &A, clang::SourceLocation Loc,
                  llvm::StringRef Message, std::vector<std::string> Require,
                  std::vector<std::string> Unless);

private:
  std::string CoreFiles;
  llvm::Regex CoreFilesRegex;
  std::string ApiWrappers;
  std::string CacheDir; // a ulplint cache with the program's facts
  clang::tidy::ClangTidyContext *TidyContext;
  /// The program's facts in a host of one unit after a ulplint run.
  const std::set<std::string> *Known = nullptr;
};

/// `Flag | <expr>` insertion text that keeps precedence right.
std::string prependFlag(const clang::ASTContext &Ctx, const clang::Expr *E,
                        llvm::StringRef Flag);
/// A fix-it inserting \p Flag into the flags expression \p E, or an empty
/// hint when \p E is not the user's own contiguous text.
std::optional<clang::FixItHint> addFlagFix(const clang::ASTContext &Ctx,
                                           const clang::Expr *E,
                                           llvm::StringRef Flag);

} // namespace ulplint

#endif
