//===- RemoteAccessOverbroadCheck.cpp - rdma-remote-access-overbroad ------===//

#include "RemoteAccessOverbroadCheck.h"
#include "engine/Lifecycle.h"
#include "engine/Program.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "llvm/ADT/StringSet.h"

using namespace clang;

namespace ulplint {

static void exportDefinitions(const TuAnalysis &A);

void RemoteAccessOverbroadCheck::checkUnit(const TuAnalysis &A) {
  if (!A.flagBit(Flag::LocalWrite))
    return;
  for (const AccessSite &S : AccessSites::of(A).All) {
    if (S.K != AccessSite::Registration && S.K != AccessSite::FastReg)
      continue;
    // A registration helper is judged at each call, with the MR and the
    // rights that caller passes.
    // Implicit ODP with remote rights is the whole address space: one
    // finding, whether or not the key leaves.
    if (checkImplicitOdp(A, S))
      continue;
    std::vector<AccessSite> AtCalls = siteAtCalls(A, S);
    if (AtCalls.empty())
      checkUnusedRights(A, S);
    for (const AccessSite &At : AtCalls)
      checkUnusedRights(A, At);
  }
  exportLeavingKeys(A);
  exportDefinitions(A);
  checkGlobalRkey(A);
}

static uint64_t remoteBits(const TuAnalysis &A) {
  return A.flagBit(Flag::RemoteWrite) | A.flagBit(Flag::RemoteRead) |
         A.flagBit(Flag::RemoteAtomic);
}

/// The struct whose field holds the MR (`c->ack_mr` -> struct repl_conn),
/// after aliases; null for an MR in a variable.
static const RecordDecl *holder(const TuAnalysis &A, const Location &Region,
                                const FunctionDecl *Fn) {
  Location R = A.flow(Fn).resolve(Region);
  if (R.Steps.empty() || !R.Steps.back().Field)
    return nullptr;
  return R.Steps.back().Field->getParent();
}

/// Program facts about an MR field are keyed by the file that defines its
/// struct: units that share that definition belong to one program.
static std::string fieldSubject(const TuAnalysis &A, const FieldDecl *F) {
  const SourceManager &SM = A.sources();
  SourceLocation At = SM.getExpansionLoc(F->getParent()->getLocation());
  return (SM.getFilename(At) + "#" + F->getParent()->getName() + "." +
          F->getName())
      .str();
}

/// Code outside this file that handles \p RD. Functions declared here but
/// defined elsewhere that take or return a pointer to it (`struct smbc_mr
/// *smbc_get_ready_mr(struct smbc_conn *)`, `int repl_ship(struct repl_conn
/// *c, ...)`) are named in \p Undefined: they see its fields, so its
/// definition is shared. Returns whether a function callers elsewhere may
/// call returns a pointer to it (`struct sdx_mr *sdx_register_mr(...)` hands
/// the registered MR to the SMB client, which sends its key): a struct of a
/// header is then handled by callers that may not belong to the program; a
/// struct this file defines is an opaque handle to them
/// (`blk_target_create()`).
static bool handledElsewhere(const TuAnalysis &A, const RecordDecl *RD,
                             std::vector<std::string> &Undefined) {
  auto Names = [&](QualType T) {
    const auto *P = T->getAs<PointerType>();
    return P && P->getPointeeType()->getAsRecordDecl() == RD;
  };
  const SourceManager &SM = A.sources();
  bool Returned = false;
  llvm::StringSet<> Seen;
  for (const Decl *D : A.context().getTranslationUnitDecl()->decls()) {
    const auto *FD = dyn_cast<FunctionDecl>(D);
    if (!FD || SM.isInSystemHeader(SM.getExpansionLoc(FD->getLocation())))
      continue;
    if (FD->isDefined()) {
      if (FD->isThisDeclarationADefinition() && FD->isExternallyVisible() &&
          Names(FD->getReturnType()))
        Returned = true;
      continue;
    }
    if ((Names(FD->getReturnType()) ||
         llvm::any_of(FD->parameters(),
                      [&](const ParmVarDecl *P) { return Names(P->getType()); })) &&
        Seen.insert(FD->getName()).second)
      Undefined.push_back(FD->getName().str());
  }
  return Returned;
}

/// A pointer to a struct with an MR field (`struct repl_conn *`).
static bool namesMrHolder(const TuAnalysis &A, QualType T) {
  const auto *P = T->getAs<PointerType>();
  const RecordDecl *RD = P ? P->getPointeeType()->getAsRecordDecl() : nullptr;
  if (!RD || !RD->getDefinition())
    return false;
  return llvm::any_of(RD->getDefinition()->fields(), [&](const FieldDecl *F) {
    bool Window = false;
    return isHandleType(A, F->getType(), &Window) && !Window;
  });
}

/// Tells the program which external functions handling MR holders this
/// unit defines: a registration elsewhere that such a function handles is
/// judged by the program only when it defines them all.
static void exportDefinitions(const TuAnalysis &A) {
  const SourceManager &SM = A.sources();
  for (const Decl *D : A.context().getTranslationUnitDecl()->decls()) {
    const auto *FD = dyn_cast<FunctionDecl>(D);
    if (!FD || !FD->isThisDeclarationADefinition() ||
        !FD->isExternallyVisible() ||
        !SM.isInMainFile(SM.getExpansionLoc(FD->getLocation())))
      continue;
    if (namesMrHolder(A, FD->getReturnType()) ||
        llvm::any_of(FD->parameters(), [&](const ParmVarDecl *P) {
          return namesMrHolder(A, P->getType());
        }))
      Program::of(A).exportFact(factKey(FactKind::Defines, FD->getName()));
  }
}

enum class Reach {
  Function, // a local: only this function names the MR
  Unit,     // a static, or a struct only this file defines and handles
  Program,  // a struct of a project header handled by functions of other
            // files: the program tells whether they send the key
  Unknown,  // the caller's MR, or a struct code elsewhere handles
};

/// How far the MR stored in \p Region can be named. A struct of a project
/// header that functions declared here but defined elsewhere handle is
/// judged by the program only if it defines them: \p Outside names them.
static Reach reachOf(const TuAnalysis &A, const Location &Region,
                     const FunctionDecl *Fn,
                     std::vector<std::string> *Outside = nullptr) {
  Location R = A.flow(Fn).resolve(Region);
  if (isa<ParmVarDecl>(R.Root) && R.Steps.empty())
    return Reach::Unknown; // the caller has the MR too
  if (SlotKey::of(R, Fn).isLocal())
    return Reach::Function;
  const auto *VD = dyn_cast<VarDecl>(R.Root);
  if (VD && VD->hasGlobalStorage() && R.Steps.empty())
    return VD->isExternallyVisible() ? Reach::Unknown : Reach::Unit;
  const RecordDecl *RD = holder(A, Region, Fn);
  if (!RD)
    return Reach::Unknown;
  const SourceManager &SM = A.sources();
  SourceLocation Def = SM.getExpansionLoc(RD->getLocation());
  if (SM.isInSystemHeader(Def))
    return Reach::Unknown;
  std::vector<std::string> Undefined;
  bool Returned = handledElsewhere(A, RD, Undefined);
  if (SM.isInMainFile(Def))
    return Undefined.empty() ? Reach::Unit : Reach::Unknown;
  // Returned to callers that may be anywhere; or no function names the
  // files that handle it, and those may lie outside the files we analyse.
  if (Returned || Undefined.empty())
    return Reach::Unknown;
  if (Outside)
    *Outside = std::move(Undefined);
  return Reach::Program;
}

namespace {
/// Struct fields holding an MR handle, as named in one function.
class MrFieldFinder : public RecursiveASTVisitor<MrFieldFinder> {
public:
  MrFieldFinder(const TuAnalysis &A, const FunctionDecl *Fn,
                std::vector<TuAnalysis::Use> &Out)
      : A(A), Fn(Fn), Out(Out) {}
  bool VisitMemberExpr(MemberExpr *ME) {
    bool Window = false;
    if (isa<FieldDecl>(ME->getMemberDecl()) &&
        isHandleType(A, ME->getType(), &Window) && !Window)
      Out.push_back({ME, Fn});
    return true;
  }

private:
  const TuAnalysis &A;
  const FunctionDecl *Fn;
  std::vector<TuAnalysis::Use> &Out;
};
} // namespace

static std::vector<TuAnalysis::Use> mrFieldUses(const TuAnalysis &A,
                                                const FunctionDecl *Fn) {
  std::vector<TuAnalysis::Use> Out;
  MrFieldFinder(A, Fn, Out).TraverseStmt(Fn->getBody());
  return Out;
}

/// Tells the program which MR fields of shared structs may hand their key
/// to a peer from this unit: a registration in another file is judged by
/// them.
void RemoteAccessOverbroadCheck::exportLeavingKeys(const TuAnalysis &A) {
  const SourceManager &SM = A.sources();
  llvm::DenseSet<const FieldDecl *> Seen;
  for (const FunctionDecl *Fn : A.functions())
    for (const TuAnalysis::Use &U : mrFieldUses(A, Fn)) {
      const auto *ME = cast<MemberExpr>(U.E);
      const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl());
      if (!F || !Seen.insert(F).second ||
          SM.isInMainFile(SM.getExpansionLoc(F->getParent()->getLocation())))
        continue;
      std::optional<Location> L = locationOf(ME);
      if (L && rkeyMayLeave(A, *L, Fn))
        Program::of(A).exportFact(
            factKey(FactKind::RkeyLeaves, fieldSubject(A, F)));
    }
}

/// Rights a registration grants for certain on some path.
static uint64_t grantedRemote(const TuAnalysis &A, const AccessSite &S) {
  uint64_t Granted = 0;
  for (const FlagAlt &Alt : S.Value.Alts)
    if (Alt.exact())
      Granted |= Alt.Known & remoteBits(A);
  // On iWARP an RDMA READ's sink needs REMOTE_WRITE: the READ request
  // carries its key to the responder, which places the data with it.
  if ((Granted & A.flagBit(Flag::RemoteWrite)) &&
      isReadSink(A, *S.Region, S.RegionFn, S.Fn))
    Granted &= ~A.flagBit(Flag::RemoteWrite);
  return Granted;
}

void RemoteAccessOverbroadCheck::checkUnusedRights(const TuAnalysis &A,
                                                   const AccessSite &S) {
  if (!S.Region)
    return;
  uint64_t Granted = grantedRemote(A, S);
  if (!Granted)
    return;
  std::vector<std::string> Outside;
  Reach Where = reachOf(A, *S.Region, S.RegionFn, &Outside);
  if (Where == Reach::Unknown || rkeyMayLeave(A, *S.Region, S.RegionFn))
    return;
  std::string Rights = "'" + S.What + "' grants " + accessNames(A, S.D, Granted);
  if (Where != Reach::Program) {
    report(A, S.Loc,
           Rights + " but the MR's rkey never leaves this " +
               (Where == Reach::Function ? "function" : "translation unit") +
               "; no peer can use these rights, drop them");
    return;
  }
  const FieldDecl *F = A.flow(S.RegionFn).resolve(*S.Region).Steps.back().Field;
  // Functions that handle the struct elsewhere must be the program's own:
  // then their units' facts tell whether they send the key.
  std::vector<std::string> Require;
  for (const std::string &Name : Outside)
    Require.push_back(factKey(FactKind::Defines, Name));
  reportIfProgram(A, S.Loc,
                  Rights + " but no file of the program hands the MR's rkey "
                           "to a peer; no peer can use these rights, drop them",
                  std::move(Require),
                  {factKey(FactKind::RkeyLeaves, fieldSubject(A, F))});
}

static bool isAllOnes(std::optional<int64_t> V, const Expr *E,
                      const ASTContext &Ctx) {
  if (!V)
    return false;
  unsigned Width = Ctx.getTypeSize(E->getType());
  uint64_t Mask = Width >= 64 ? ~uint64_t(0) : ((uint64_t(1) << Width) - 1);
  return (static_cast<uint64_t>(*V) & Mask) == Mask;
}

bool RemoteAccessOverbroadCheck::checkImplicitOdp(const TuAnalysis &A,
                                                  const AccessSite &S) {
  if (S.K != AccessSite::Registration)
    return false;
  const Expr *Addr = S.Call->arg(ArgRole::Addr);
  const Expr *Length = S.Call->arg(ArgRole::Length);
  if (!Addr || !Length)
    return false;
  ValueEval VE = A.values(S.Fn);
  const ASTContext &Ctx = A.context();
  bool ZeroAddr = Addr->isNullPointerConstant(
                      const_cast<ASTContext &>(Ctx),
                      Expr::NPC_ValueDependentIsNotNull) != Expr::NPCK_NotNull;
  if (!ZeroAddr || !isAllOnes(VE.constant(Length), Length, Ctx))
    return false;
  uint64_t OnDemand = A.flagBit(Flag::OnDemand);
  uint64_t Remote = remoteBits(A);
  for (const FlagAlt &Alt : S.Value.Alts) {
    if (!(Alt.Known & OnDemand) || !(Alt.Known & Remote))
      continue;
    report(A, S.Loc,
           "implicit ODP registration of the whole address space grants " +
               accessNames(A, S.D, Alt.Known & Remote) +
               "; any peer holding the rkey can reach all of the process's "
               "memory, register the buffers the peer needs instead");
    return true;
  }
  return false;
}

void RemoteAccessOverbroadCheck::checkGlobalRkey(const TuAnalysis &A) {
  StringRef Name = A.rules().flagName(Domain::Kernel, Flag::UnsafeGlobalRkey);
  const auto &Migration = A.rules().domain(Domain::Kernel).Migration;
  auto It = Migration.find(MigrationKey::GlobalRkey);
  std::string Advice = It == Migration.end() ? std::string() : It->second;
  std::optional<int64_t> Bit = A.enumValue(Name);
  if (!Bit || !*Bit)
    return;
  for (const ApiCall &C : A.calls()) {
    const Expr *Flags = C.Model->E == Effect::PdAlloc ? C.arg(ArgRole::Flags) : nullptr;
    if (!Flags)
      continue;
    FlagSet V = A.values(C.Caller).flags(Flags);
    for (const FlagAlt &Alt : V.Alts)
      if (Alt.Known & static_cast<uint64_t>(*Bit)) {
        report(A, Flags->IgnoreParenImpCasts()->getBeginLoc(),
               Name.str() + " gives any peer that learns the PD's global "
                            "rkey remote read and write access to all of "
                            "memory; " + Advice);
        break;
      }
  }
}

} // namespace ulplint
