//===- Program.cpp - The program a unit belongs to -------------------------===//

#include "Program.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Basic/FileManager.h"
#include "clang/Basic/SourceManager.h"
#include "llvm/Support/Path.h"

using namespace clang;

namespace ulplint {

namespace {
/// `if (<not InfiniBand>) return/goto ...;`, or inside a device-selection
/// loop `if (<not InfiniBand>) continue;`: that device is never used.
class IWarpGuardFinder : public RecursiveASTVisitor<IWarpGuardFinder> {
public:
  explicit IWarpGuardFinder(const TuAnalysis &A) : A(A) {}
  const Stmt *Found = nullptr;

  bool VisitIfStmt(IfStmt *If) {
    if (!Found && leaves(If->getThen()) && refusesIWarp(If->getCond(), false))
      Found = If;
    return !Found;
  }

private:
  static bool leaves(const Stmt *S) {
    if (const auto *CS = dyn_cast_or_null<CompoundStmt>(S))
      S = CS->body_empty() ? nullptr : CS->body_back();
    return isa_and_nonnull<ReturnStmt>(S) || isa_and_nonnull<GotoStmt>(S) ||
           isa_and_nonnull<ContinueStmt>(S);
  }
  /// True when \p Cond holds on iWARP devices (and is meant to).
  bool refusesIWarp(const Expr *Cond, bool Negated) const {
    Cond = stripExpr(Cond);
    if (const auto *UO = dyn_cast<UnaryOperator>(Cond))
      if (UO->getOpcode() == UO_LNot)
        return refusesIWarp(UO->getSubExpr(), !Negated);
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (BO->getOpcode() == BO_LOr && !Negated)
        return refusesIWarp(BO->getLHS(), false) ||
               refusesIWarp(BO->getRHS(), false);
      if (BO->getOpcode() == BO_And)
        return Negated && testsIbOnlyCapability(BO);
      bool Ne = BO->getOpcode() == BO_NE, Eq = BO->getOpcode() == BO_EQ;
      if (!Ne && !Eq)
        return false;
      for (const Expr *Side : {BO->getLHS(), BO->getRHS()})
        if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Side))) {
          StringRef Name = DRE->getDecl()->getName();
          if (A.rules().isIbConstant(Name))
            return Ne != Negated;
          if (A.rules().isTransportConstant(Name))
            return Eq != Negated;
        }
      return false;
    }
    if (const auto *CE = dyn_cast<CallExpr>(Cond))
      if (const FunctionModel *M = A.modelOf(CE)) {
        if (M->E == Effect::TransportQuery)
          return !Negated;
        if (M->E == Effect::TransportQueryIb)
          return Negated;
      }
    return false;
  }
  /// `caps & IBV_ODP_SUPPORT_IMPLICIT`: false on every iWARP device.
  bool testsIbOnlyCapability(const BinaryOperator *And) const {
    for (const Expr *Side : {And->getLHS(), And->getRHS()})
      if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Side)))
        if (A.rules().isIbOnlyCapability(DRE->getDecl()->getName()))
          return true;
    return false;
  }
  const TuAnalysis &A;
};
} // namespace

Program::Program(const TuAnalysis &A) {
  const SourceManager &SM = A.sources();
  if (OptionalFileEntryRef Main = SM.getFileEntryRefForID(SM.getMainFileID())) {
    // The same directory however the database spells the file.
    SmallString<256> Path(Main->getName());
    SM.getFileManager().makeAbsolutePath(Path);
    llvm::sys::path::remove_dots(Path, /*remove_dot_dot=*/true);
    Key = llvm::sys::path::parent_path(Path).str();
  }
  IWarpGuardFinder Finder(A);
  for (const FunctionDecl *FD : A.functions()) {
    Finder.TraverseStmt(FD->getBody());
    if (Finder.Found)
      break;
  }
  IWarpGuard = Finder.Found;
  if (IWarpGuard)
    exportFact(fact(FactKind::RefusesIwarp));
}

const Program &Program::of(const TuAnalysis &A) { return A.cached<Program>(); }

void Program::exportFact(StringRef Fact) const {
  if (UnitFacts *Sink = currentFacts())
    Sink->Facts.push_back(Fact.str());
}

} // namespace ulplint
