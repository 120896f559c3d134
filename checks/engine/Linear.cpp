//===- Linear.cpp - Queue sizes as a*X + b over named quantities ----------===//

#include "Linear.h"
#include "Analysis.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Lex/Lexer.h"

using namespace clang;

namespace ulplint {

std::optional<int64_t> Linear::value() const {
  if (Opaque)
    return std::nullopt;
  int64_t V = Const;
  for (const LinearTerm &T : Terms) {
    if (!T.Value)
      return std::nullopt;
    V += T.Coef * *T.Value;
  }
  return V;
}

bool Linear::hasUnknownTerms() const {
  return llvm::any_of(Terms, [](const LinearTerm &T) { return !T.Value; });
}

std::string Linear::str() const {
  std::string S;
  for (const LinearTerm &T : Terms) {
    if (!S.empty())
      S += T.Coef < 0 ? "-" : "+";
    else if (T.Coef < 0)
      S += "-";
    int64_t Abs = T.Coef < 0 ? -T.Coef : T.Coef;
    // A named constant reads as written (`+DEMO_EXTRA`); a quantity keeps
    // its coefficient (`1*c->depth`).
    if (T.Value && Abs == 1)
      S += T.Symbol;
    else
      S += std::to_string(Abs) + "*" + T.Symbol;
  }
  if (Const || S.empty()) {
    if (!S.empty())
      S += Const < 0 ? "-" : "+";
    else if (Const < 0)
      S += "-";
    S += std::to_string(Const < 0 ? -Const : Const);
  }
  if (Opaque)
    S += " (partly unknown)";
  return S;
}

namespace {

/// Text of \p E as written, or as Clang prints it when it is macro inside.
std::string exprText(const ASTContext &Ctx, const Expr *E) {
  std::string Text = sourceText(Ctx, E);
  if (!Text.empty())
    return Text;
  llvm::raw_string_ostream OS(Text);
  E->printPretty(OS, nullptr, Ctx.getPrintingPolicy());
  return Text;
}

/// Does \p E read a device limit (ib_device_attr.max_qp_wr, ...)?
class LimitFinder : public RecursiveASTVisitor<LimitFinder> {
public:
  explicit LimitFinder(const TuAnalysis &A) : A(A) {}
  bool Found = false;
  bool VisitMemberExpr(MemberExpr *ME) {
    if (auto FS = A.classifyMember(ME))
      if (isDeviceLimit(FS->Role))
        Found = true;
    return !Found;
  }

private:
  const TuAnalysis &A;
};

class LinearEval {
public:
  LinearEval(const TuAnalysis &A, const FunctionDecl *Fn)
      : A(A), Fn(Fn), Ctx(A.context()) {}

  Linear eval(const Expr *E, unsigned Depth) {
    Linear R = evalInner(E, Depth);
    LimitFinder LF(A);
    LF.TraverseStmt(const_cast<Expr *>(E));
    R.ReadsDeviceLimit |= LF.Found;
    return R;
  }

private:
  Linear evalInner(const Expr *E, unsigned Depth) {
    if (std::optional<Linear> Named = namedConstant(E))
      return *Named;
    E = stripExpr(E);
    if (!E || Depth > 12)
      return opaque(E);
    // Sums and products keep the named constants inside them as terms:
    // `NBDR_SLOTS + 1` is one entry per slot plus one, not 65.
    if (const auto *BO = dyn_cast<BinaryOperator>(E))
      if (BO->isAdditiveOp() || BO->getOpcode() == BO_Mul ||
          BO->getOpcode() == BO_Comma)
        return binary(BO, Depth);
    if (auto C = A.values(Fn).constant(E)) {
      Linear L;
      L.Const = *C;
      return L;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(E))
      return binary(BO, Depth);
    if (const auto *CO = dyn_cast<ConditionalOperator>(E)) {
      Linear T = eval(CO->getTrueExpr(), Depth + 1);
      Linear F = eval(CO->getFalseExpr(), Depth + 1);
      if (T.str() == F.str())
        return T;
      return opaque(E, T, F);
    }
    if (const auto *CE = dyn_cast<CallExpr>(E))
      return call(CE, Depth);
    if (std::optional<Location> L = locationOf(E))
      return location(E, *L, Depth);
    return opaque(E);
  }

  Linear binary(const BinaryOperator *BO, unsigned Depth) {
    BinaryOperatorKind Op = BO->getOpcode();
    if (Op == BO_Comma)
      return eval(BO->getRHS(), Depth + 1);
    if (Op != BO_Add && Op != BO_Sub && Op != BO_Mul)
      return opaque(BO, eval(BO->getLHS(), Depth + 1),
                    eval(BO->getRHS(), Depth + 1));
    Linear L = eval(BO->getLHS(), Depth + 1);
    Linear R = eval(BO->getRHS(), Depth + 1);
    if (Op == BO_Add || Op == BO_Sub)
      return add(L, R, Op == BO_Sub ? -1 : 1);
    if (isNumber(L))
      return scale(R, L.Const);
    if (isNumber(R))
      return scale(L, R.Const);
    // A named constant times a quantity is a factor (`FACTOR * depth`); of
    // two named constants the larger is the depth (`3 * SLOTS`).
    std::optional<int64_t> LV = L.value(), RV = R.value();
    if (LV && (!RV || *LV <= *RV))
      return scale(R, *LV);
    if (RV)
      return scale(L, *RV);
    // Two quantities: keep the product as one named term.
    Linear P = merged(L, R);
    LinearTerm T;
    T.Symbol = exprText(Ctx, BO);
    T.E = BO;
    T.Factors = {exprText(Ctx, BO->getLHS()), exprText(Ctx, BO->getRHS())};
    P.Terms.assign(1, T);
    P.Const = 0;
    P.Opaque = L.Opaque || R.Opaque;
    return P;
  }

  Linear call(const CallExpr *CE, unsigned Depth) {
    Linear L = opaque(CE);
    if (const FunctionModel *M = A.modelOf(CE)) {
      L.UsesCoreSizing = M->E == Effect::RwMaxSendWr;
      L.FromHelperFactor = M->E == Effect::RwMrFactor;
      L.Opaque = false;
      return L;
    }
    if (std::optional<Linear> R = helperResult(CE, Depth))
      return *R;
    return L;
  }

  /// `sq_size(q)` with `return WRS_PER_REQ * q->depth + 1;`: a helper of the
  /// unit whose every return is the same sum, its parameters read as the
  /// caller's arguments (`q->depth` through `sq_size(c->q)` is `c->q->depth`).
  std::optional<Linear> helperResult(const CallExpr *CE, unsigned Depth) {
    const FunctionDecl *Callee = CE->getDirectCallee();
    Callee = Callee ? Callee->getDefinition() : nullptr;
    if (!Callee || Callee == Fn || Depth > 8 ||
        !llvm::is_contained(A.functions(), Callee))
      return std::nullopt;
    std::optional<Linear> Common;
    for (const Expr *R : returnValues(Callee)) {
      Linear V = LinearEval(A, Callee).eval(R, Depth + 1);
      if (V.Opaque || (Common && Common->str() != V.str()))
        return std::nullopt;
      Common = V;
    }
    if (!Common)
      return std::nullopt;
    for (LinearTerm &T : Common->Terms) {
      if (T.Value)
        continue;
      if (!renameParameters(T, CE))
        return std::nullopt;
    }
    return Common;
  }

  /// Rewrites a term the callee names through a parameter (`q->depth`) in
  /// the caller's words; false when the argument is not a plain name.
  bool renameParameters(LinearTerm &T, const CallExpr *CE) {
    std::optional<Location> L = T.E ? locationOf(T.E) : std::nullopt;
    if (!L)
      return false;
    const auto *P = dyn_cast_or_null<ParmVarDecl>(L->Root);
    if (!P)
      return !isa_and_nonnull<VarDecl>(L->Root) ||
             cast<VarDecl>(L->Root)->hasGlobalStorage();
    unsigned Index = P->getFunctionScopeIndex();
    if (Index >= CE->getNumArgs())
      return false;
    const Expr *Arg = stripExpr(CE->getArg(Index));
    if (!isa<DeclRefExpr>(Arg) && !isa<MemberExpr>(Arg))
      return false;
    std::string Name = P->getName().str();
    if (!StringRef(T.Symbol).starts_with(Name))
      return false;
    T.Symbol = exprText(Ctx, Arg) + T.Symbol.substr(Name.size());
    for (std::string &F : T.Factors)
      if (StringRef(F).starts_with(Name))
        F = exprText(Ctx, Arg) + F.substr(Name.size());
    return true;
  }

  Linear location(const Expr *E, const Location &L, unsigned Depth) {
    const FunctionFlow &Flow = A.flow(Fn);
    Location R = Flow.resolve(L);
    const auto *VD = dyn_cast_or_null<VarDecl>(R.Root);
    if (R.Steps.empty() && VD && VD->isLocalVarDecl())
      return local(E, R, Depth);
    if (R.Steps.empty() && isa_and_nonnull<ParmVarDecl>(R.Root))
      return parameter(E, cast<ParmVarDecl>(R.Root), Depth);
    return term(E);
  }

  /// A local: the one value every reaching definition gives it.
  Linear local(const Expr *Use, const Location &L, unsigned Depth) {
    std::optional<Linear> Common;
    for (const Def *D : A.flow(Fn).reaching(L, Use)) {
      if (!D || D->K != Def::Assign || !D->Value)
        return term(Use);
      Linear V = eval(D->Value, Depth + 1);
      if (Common && Common->str() != V.str())
        return opaque(Use, *Common, V);
      Common = V;
    }
    return Common ? *Common : term(Use);
  }

  /// A parameter: the constant every caller in this unit passes, if any.
  Linear parameter(const Expr *Use, const ParmVarDecl *P, unsigned Depth) {
    std::optional<int64_t> Value;
    unsigned Index = P->getFunctionScopeIndex();
    auto Callers = A.callersOf(Fn);
    if (Callers.empty() || !Fn->isStatic())
      return term(Use); // callers elsewhere may pass anything
    for (const auto &[CE, Caller] : Callers) {
      if (Index >= CE->getNumArgs())
        return term(Use);
      Linear Arg = LinearEval(A, Caller).eval(CE->getArg(Index), Depth + 1);
      std::optional<int64_t> V = Arg.value();
      if (!V || (Value && *Value != *V))
        return term(Use);
      Value = V;
    }
    Linear C;
    C.Const = *Value;
    return C;
  }

  Linear term(const Expr *E) {
    Linear L;
    LinearTerm T;
    T.Symbol = exprText(Ctx, E);
    T.E = E;
    LimitFinder LF(A);
    LF.TraverseStmt(const_cast<Expr *>(E));
    T.Limit = LF.Found;
    L.Terms.push_back(T);
    return L;
  }

  static bool isNumber(const Linear &L) {
    return !L.Opaque && L.Terms.empty();
  }

  /// `NBDR_SLOTS` (`#define NBDR_SLOTS 64`, possibly parenthesized) or an
  /// enumerator: a term with a known value.
  std::optional<Linear> namedConstant(const Expr *E) {
    const SourceManager &SM = Ctx.getSourceManager();
    for (const Expr *Cur = E; Cur;) {
      std::string Name;
      std::optional<int64_t> Value;
      if (const auto *DRE = dyn_cast<DeclRefExpr>(Cur)) {
        if (const auto *ECD = dyn_cast<EnumConstantDecl>(DRE->getDecl())) {
          Name = ECD->getName().str();
          Value = ECD->getInitVal().getExtValue();
        }
      } else if (isa<IntegerLiteral>(Cur->IgnoreParenImpCasts()) &&
                 Cur->getBeginLoc().isMacroID()) {
        SourceLocation B = Cur->getBeginLoc(), End = Cur->getEndLoc();
        // The immediate expansion ends right after the last token.
        unsigned Len = Lexer::MeasureTokenLength(SM.getSpellingLoc(End), SM,
                                                 Ctx.getLangOpts());
        if (SM.isAtStartOfImmediateMacroExpansion(B) && End.isMacroID() &&
            SM.isAtEndOfImmediateMacroExpansion(End.getLocWithOffset(Len)) &&
            SM.getImmediateExpansionRange(B).getBegin() ==
                SM.getImmediateExpansionRange(End).getBegin()) {
          Name = Lexer::getImmediateMacroName(B, SM, Ctx.getLangOpts()).str();
          Value = A.values(Fn).constant(Cur);
        }
      }
      if (!Name.empty() && Value) {
        Linear L;
        LinearTerm T;
        T.Symbol = Name;
        T.E = E;
        T.Value = Value;
        L.Terms.push_back(T);
        return L;
      }
      if (const auto *PE = dyn_cast<ParenExpr>(Cur))
        Cur = PE->getSubExpr();
      else if (const auto *CE = dyn_cast<CastExpr>(Cur))
        Cur = CE->getSubExpr();
      else
        break;
    }
    return std::nullopt;
  }

  Linear opaque(const Expr *E, const Linear &X = Linear(),
                const Linear &Y = Linear()) {
    Linear L = merged(X, Y);
    L.Const = 0;
    L.Terms.clear();
    L.Opaque = true;
    if (E) {
      LinearTerm T;
      T.Symbol = exprText(Ctx, E);
      T.E = E;
      L.Terms.push_back(T);
    }
    return L;
  }

  static Linear merged(const Linear &X, const Linear &Y) {
    Linear L;
    L.ReadsDeviceLimit = X.ReadsDeviceLimit || Y.ReadsDeviceLimit;
    L.UsesCoreSizing = X.UsesCoreSizing || Y.UsesCoreSizing;
    L.FromHelperFactor = X.FromHelperFactor || Y.FromHelperFactor;
    return L;
  }

  static Linear add(const Linear &X, const Linear &Y, int64_t Sign) {
    Linear L = merged(X, Y);
    L.Const = X.Const + Sign * Y.Const;
    L.Opaque = X.Opaque || Y.Opaque;
    L.Terms = X.Terms;
    for (LinearTerm T : Y.Terms) {
      T.Coef *= Sign;
      auto Same = llvm::find_if(L.Terms, [&](const LinearTerm &O) {
        return O.Symbol == T.Symbol;
      });
      if (Same != L.Terms.end())
        Same->Coef += T.Coef;
      else
        L.Terms.push_back(T);
    }
    llvm::erase_if(L.Terms, [](const LinearTerm &T) { return T.Coef == 0; });
    return L;
  }

  static Linear scale(Linear X, int64_t K) {
    X.Const *= K;
    for (LinearTerm &T : X.Terms)
      T.Coef *= K;
    return X;
  }

  const TuAnalysis &A;
  const FunctionDecl *Fn;
  const ASTContext &Ctx;
};

} // namespace

Linear evalLinear(const TuAnalysis &A, const FunctionDecl *Fn, const Expr *E) {
  return LinearEval(A, Fn).eval(E, 0);
}

static std::optional<Linear> linearOfDef(const TuAnalysis &A,
                                         const FunctionDecl *Fn,
                                         const Location &L, const Def &D,
                                         unsigned Depth);

static std::optional<Linear> linearAtImpl(const TuAnalysis &A,
                                          const FunctionDecl *Fn,
                                          const Location &L, const Stmt *At,
                                          unsigned Depth) {
  std::optional<Linear> Common;
  bool Varies = false;
  Linear Flags;
  for (const Def *D : A.flow(Fn).reaching(L, At)) {
    if (!D)
      return std::nullopt; // from outside this function
    std::optional<Linear> V = linearOfDef(A, Fn, L, *D, Depth + 1);
    if (!V)
      return std::nullopt;
    Flags.ReadsDeviceLimit |= V->ReadsDeviceLimit;
    Flags.UsesCoreSizing |= V->UsesCoreSizing;
    if (Common && Common->str() != V->str())
      Varies = true;
    if (!Common)
      Common = V;
  }
  if (!Common)
    return std::nullopt;
  if (Varies) {
    Common->Opaque = true;
    Common->ReadsDeviceLimit |= Flags.ReadsDeviceLimit;
    Common->UsesCoreSizing |= Flags.UsesCoreSizing;
  }
  return Common;
}

static std::optional<Linear> linearOfDef(const TuAnalysis &A,
                                         const FunctionDecl *Fn,
                                         const Location &L, const Def &D,
                                         unsigned Depth) {
  if (Depth > 8)
    return std::nullopt;
  switch (D.K) {
  case Def::Zero: {
    Linear Z;
    return Z;
  }
  case Def::Assign: {
    if (D.Target == L)
      return evalLinear(A, Fn, D.Value);
    const Expr *Init = stripExpr(D.Value);
    bool Braced = isa_and_nonnull<InitListExpr>(Init) ||
                  isa_and_nonnull<CompoundLiteralExpr>(Init);
    const Expr *Sub = subInitializer(
        D.Value, llvm::ArrayRef(L.Steps).drop_front(D.Target.Steps.size()));
    if (Sub && !isa<ImplicitValueInitExpr>(stripExpr(Sub)))
      return evalLinear(A, Fn, Sub);
    if (Braced)
      return Linear();
    return std::nullopt;
  }
  case Def::Compound: {
    if (D.Target != L || (D.Op != BO_AddAssign && D.Op != BO_SubAssign))
      return std::nullopt;
    std::optional<Linear> Before = linearAtImpl(A, Fn, L, D.S, Depth + 1);
    if (!Before)
      return std::nullopt;
    Linear Delta = evalLinear(A, Fn, D.Value);
    int64_t Sign = D.Op == BO_SubAssign ? -1 : 1;
    Before->Const += Sign * Delta.Const;
    for (LinearTerm T : Delta.Terms) {
      T.Coef *= Sign;
      Before->Terms.push_back(T);
    }
    Before->Opaque |= Delta.Opaque;
    Before->ReadsDeviceLimit |= Delta.ReadsDeviceLimit;
    return Before;
  }
  default:
    return std::nullopt;
  }
}

std::optional<Linear> linearAt(const TuAnalysis &A, const FunctionDecl *Fn,
                               const Location &L, const Stmt *At) {
  return linearAtImpl(A, Fn, A.flow(Fn).resolve(L), At, 0);
}

std::optional<Linear> linearAfter(const TuAnalysis &A, const FunctionDecl *Fn,
                                  const Location &L, const Stmt *At) {
  Location R = A.flow(Fn).resolve(L);
  const Def *Last = A.flow(Fn).lastDefAt(At, R);
  if (!Last)
    return std::nullopt;
  return linearOfDef(A, Fn, R, *Last, 0);
}

} // namespace ulplint
