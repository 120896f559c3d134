//===- WorkRequests.cpp - Work requests, posts and queue pairs ------------===//

#include "WorkRequests.h"
#include "Program.h"
#include "Sites.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMap.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Debug.h"
#include <deque>
#include <map>
#include <set>

using namespace clang;

#define DEBUG_TYPE "ulplint-wr"

namespace ulplint {

/// For developers: each unit's posts, chains and per-request cost, on stderr.
static llvm::cl::opt<bool> DumpWorkRequests(
    "dump-work-requests", llvm::cl::Hidden,
    llvm::cl::desc("Print the work-request model of each unit"));

std::string WrKey::str() const {
  if (Api)
    return Fn->getName().str() + "::" + Api->Name;
  return Storage.str();
}

bool WrSlot::isRegistration() const {
  return mayBe(Opcode::RegMr) || mayBe(Opcode::LocalInv) || mayBe(Opcode::BindMw);
}

unsigned PostSite::entries() const {
  unsigned N = 0;
  for (const WrSlot &S : Chain)
    N += S.Count;
  return N;
}

std::vector<const FieldStore *> slotStores(const TuAnalysis &A, const WrSlot &S,
                                           FieldRole Role) {
  std::vector<const FieldStore *> Found;
  for (const FieldStore &FS : A.stores()) {
    if (FS.Role != Role || FS.Struct->Role != StructRole::SendWr)
      continue;
    for (const auto &[L, F] : S.Names)
      if (A.sameStorage(FS.Object, FS.Fn, L, F)) {
        Found.push_back(&FS);
        break;
      }
  }
  return Found;
}

// A named namespace: unity builds put every engine file in one unit.
namespace wrmodel {

//===-- Helpers over the AST ----------------------------------------------===//

const FunctionDecl *definitionInUnit(const TuAnalysis &A, const FunctionDecl *F) {
  if (!F)
    return nullptr;
  F = F->getDefinition();
  return F && llvm::is_contained(A.functions(), F) ? F : nullptr;
}

/// `*p = x` (or `p[0] = x`) inside a function: the pointer written through.
struct DerefStores : RecursiveASTVisitor<DerefStores> {
  std::vector<std::pair<const ParmVarDecl *, const BinaryOperator *>> Found;
  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (BO->getOpcode() != BO_Assign)
      return true;
    const auto *UO = dyn_cast<UnaryOperator>(stripExpr(BO->getLHS()));
    if (!UO || UO->getOpcode() != UO_Deref)
      return true;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(UO->getSubExpr())))
      if (const auto *P = dyn_cast<ParmVarDecl>(DRE->getDecl()))
        Found.push_back({P, BO});
    return true;
  }
};

/// Calls of a unit's own functions (the modelled API excluded).
std::vector<const CallExpr *> helperCalls(const TuAnalysis &A,
                                          const FunctionDecl *Caller) {
  std::vector<const CallExpr *> Out;
  for (const FunctionDecl *F : A.functions())
    for (const CallExpr *CE : A.callsTo(Caller, F))
      Out.push_back(CE);
  return Out;
}

/// The element count of the array \p L's last step indexes, if constant.
std::optional<unsigned> arraySize(const Location &L) {
  if (L.Steps.empty() || L.Steps.back().Field || !L.Root)
    return std::nullopt;
  QualType T = L.Root->getType();
  for (size_t I = 0; I + 1 < L.Steps.size(); ++I) {
    T = T.getCanonicalType();
    if (const auto *PT = T->getAs<PointerType>())
      T = PT->getPointeeType();
    else if (const auto *AT = T->getAsArrayTypeUnsafe())
      T = AT->getElementType();
    if (L.Steps[I].Field)
      T = L.Steps[I].Field->getType();
  }
  if (const auto *CAT = dyn_cast<ConstantArrayType>(T.getCanonicalType()))
    return static_cast<unsigned>(CAT->getSize().getZExtValue());
  return std::nullopt;
}

//===-- Loops -------------------------------------------------------------===//

/// How many times a loop runs, when the code says: `for (i = 0; i < 3;
/// i++)`, `while (done < len && i < SEGS)`. \p Name is the bound as written.
struct TripCount {
  unsigned N = 1;
  std::string Name;
};

/// Does the statement reap completions or wait (a loop around it is the
/// I/O loop, not a loop over one request's parts)?
struct WaitFinder : RecursiveASTVisitor<WaitFinder> {
  explicit WaitFinder(const TuAnalysis &A) : A(A) {}
  bool VisitCallExpr(CallExpr *CE) {
    if (const FunctionModel *M = A.modelOf(CE))
      Found |= M->E == Effect::CqPoll || M->E == Effect::WaitCompletion ||
               M->E == Effect::WaitCompletionTimeout;
    return !Found;
  }
  const TuAnalysis &A;
  bool Found = false;
};

class Loops {
public:
  explicit Loops(const TuAnalysis &A) : A(A) {}

  /// Product of the trip counts of the per-request loops around \p S.
  TripCount around(const Stmt *S, const FunctionDecl *F) const {
    TripCount Total;
    const ParentMap &PM = A.flow(F).parents();
    const Stmt *Child = S;
    for (const Stmt *P = PM.getParent(S); P; Child = P, P = PM.getParent(P)) {
      const Stmt *Body = nullptr;
      const Expr *Cond = nullptr;
      if (const auto *FS = dyn_cast<ForStmt>(P)) {
        Body = FS->getBody();
        Cond = FS->getCond();
      } else if (const auto *WS = dyn_cast<WhileStmt>(P)) {
        Body = WS->getBody();
        Cond = WS->getCond();
      } else if (const auto *DS = dyn_cast<DoStmt>(P)) {
        Body = DS->getBody();
        Cond = DS->getCond();
      }
      if (!Body || Child != Body)
        continue;
      WaitFinder W(A);
      W.TraverseStmt(const_cast<Stmt *>(Body));
      if (W.Found)
        break; // the I/O loop: one request per iteration
      if (sweepsRequests(Cond, Body))
        continue; // another request (or connection) per iteration
      if (std::optional<TripCount> T = trips(Cond, P, F)) {
        Total.N *= T->N;
        Total.Name = Total.Name.empty() ? T->Name : Total.Name + "*" + T->Name;
      }
    }
    return Total;
  }

private:
  /// `for (i = 0; i < N; i++) post_inv(c, &c->ios[i])`: the loop walks a
  /// table of ULP objects kept by the connection (the struct holding the
  /// QP) or in a global: teardown, a timeout reaper, a broadcast to every
  /// client. Each iteration is another request, not another part of one;
  /// a request's own parts live in the request (`req->frags[i]`).
  bool sweepsRequests(const Expr *Cond, const Stmt *Body) const {
    if (!Cond)
      return false;
    struct Vars : RecursiveASTVisitor<Vars> {
      llvm::SmallPtrSet<const VarDecl *, 2> Found;
      bool VisitDeclRefExpr(DeclRefExpr *DRE) {
        if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
          Found.insert(VD);
        return true;
      }
    } Index;
    Index.TraverseStmt(const_cast<Expr *>(Cond));
    struct Tables : RecursiveASTVisitor<Tables> {
      Tables(const TuAnalysis &A, const Vars &Index) : A(A), Index(Index) {}
      bool VisitArraySubscriptExpr(ArraySubscriptExpr *AS) {
        const auto *I = dyn_cast<DeclRefExpr>(stripExpr(AS->getIdx()));
        if (!I || !Index.Found.count(dyn_cast<VarDecl>(I->getDecl())))
          return true;
        Found |= ulpObject(AS->getType()) && A.ownedByConnection(AS->getBase());
        return !Found;
      }
      /// A struct of the ULP (not a verbs struct), or a pointer to one.
      bool ulpObject(QualType T) const {
        if (const auto *P = T->getAs<PointerType>())
          T = P->getPointeeType();
        const RecordDecl *RD = T->getAsRecordDecl();
        return RD && !A.structOf(T) && !A.isConnectionPointer(
                                           A.context().getPointerType(T));
      }
      const TuAnalysis &A;
      const Vars &Index;
      bool Found = false;
    } T(A, Index);
    T.TraverseStmt(const_cast<Stmt *>(Body));
    return T.Found;
  }

  /// `i < K`, `K > i`, `i <= K - 1`: K when i starts at 0 and counts up.
  std::optional<TripCount> trips(const Expr *Cond, const Stmt *Loop,
                                 const FunctionDecl *F) const {
    if (!Cond)
      return std::nullopt;
    Cond = stripExpr(Cond);
    if (const auto *BO = dyn_cast<BinaryOperator>(Cond)) {
      if (BO->getOpcode() == BO_LAnd) {
        std::optional<TripCount> L = trips(BO->getLHS(), Loop, F);
        std::optional<TripCount> R = trips(BO->getRHS(), Loop, F);
        if (L && R)
          return L->N <= R->N ? L : R;
        return L ? L : R;
      }
      const Expr *Var = nullptr, *Bound = nullptr;
      int Adjust = 0;
      switch (BO->getOpcode()) {
      case BO_LT: Var = BO->getLHS(); Bound = BO->getRHS(); break;
      case BO_LE: Var = BO->getLHS(); Bound = BO->getRHS(); Adjust = 1; break;
      case BO_GT: Var = BO->getRHS(); Bound = BO->getLHS(); break;
      case BO_GE: Var = BO->getRHS(); Bound = BO->getLHS(); Adjust = 1; break;
      default: return std::nullopt;
      }
      const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(Var));
      if (!DRE || !isa<VarDecl>(DRE->getDecl()))
        return std::nullopt;
      std::optional<int64_t> K = A.values(F).constant(Bound);
      if (!K || *K + Adjust <= 0 || *K + Adjust > 4096)
        return std::nullopt;
      TripCount T;
      T.N = static_cast<unsigned>(*K + Adjust);
      T.Name = sourceText(A.context(), Bound);
      return T;
    }
    return std::nullopt;
  }

  const TuAnalysis &A;
};

//===-- Chains ------------------------------------------------------------===//

/// The call that bound a helper's parameters, and the context of its caller.
struct Frame {
  const CallExpr *Call = nullptr;
  const FunctionDecl *Caller = nullptr;
  const Frame *Up = nullptr;
};

/// A work request while chains are built: its names, each under the
/// binding of the helper call it was reached through.
struct Node {
  WrSlot S;
  llvm::SmallVector<const Frame *, 2> Ctx; // parallel to S.Names
  /// Where it was appended to a tail-pointer chain (statement, binding).
  std::set<std::pair<const Stmt *, const Frame *>> Appends;
  unsigned AppendCount = 0;
  bool SelfLinked = false;
  /// Set on the one node roots() returns for a chain built through a tail
  /// pointer: the whole chain, every append posted.
  std::shared_ptr<std::vector<Node>> TailChain;

  void name(const Location &L, const FunctionDecl *F, const Frame *C) {
    S.Names.push_back({L, F});
    Ctx.push_back(C);
  }
};

/// A stored value of a work-request field, with the binding to evaluate it
/// under.
struct Bound {
  const FieldStore *Store = nullptr;
  const Frame *Ctx = nullptr;
};

/// A value written into a work request's `next` (a FieldStore or a write
/// through a tail pointer).
struct Link {
  const Expr *Value;
  const FunctionDecl *Fn;
  const Frame *Ctx;
};

/// What following one post found besides its chain.
struct Trace {
  bool Complete = true;
  bool Core = false;
  bool CoreSignals = false;
};

/// Builds the chains of work requests posts may submit.
class ChainBuilder {
public:
  explicit ChainBuilder(const TuAnalysis &A) : A(A), Loop(A) {}

  /// The work requests \p E (a pointer to one, in \p F) may name. Appends
  /// to a tail-pointer chain come back as separate nodes, all posted.
  void roots(const Expr *E, const FunctionDecl *F, const Frame *Ctx,
             unsigned Depth, std::vector<Node> &Out, Trace &T) {
    E = stripExpr(E);
    if (!E || Depth > 8) {
      T.Complete = false;
      return;
    }
    if (E->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                 Expr::NPC_ValueDependentIsNotNull))
      return; // no work request on this path
    if (const auto *CO = dyn_cast<ConditionalOperator>(E)) {
      roots(CO->getTrueExpr(), F, Ctx, Depth + 1, Out, T);
      roots(CO->getFalseExpr(), F, Ctx, Depth + 1, Out, T);
      return;
    }
    if (const auto *CE = dyn_cast<CallExpr>(E)) {
      fromCall(CE, F, Ctx, Depth, Out, T);
      return;
    }
    std::optional<Location> L = locationOf(E);
    if (!L) {
      T.Complete = false;
      return;
    }
    // A pointer variable: what its definitions point at (resolve() would
    // confuse `wr = &x` with `wr = c->first`).
    if (const auto *DRE = dyn_cast<DeclRefExpr>(E))
      if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl());
          VD && VD->getType()->isPointerType()) {
        pointerVariable(VD, *L, E, F, Ctx, Depth, Out, T);
        return;
      }
    Location R = A.flow(F).resolve(*L);
    if (E->getType()->isArrayType()) {
      R.Steps.push_back({nullptr}); // `req->wr` decays to &req->wr[0]
      Out.emplace_back().name(R, F, Ctx);
      return;
    }
    const auto *UO = dyn_cast<UnaryOperator>(E);
    bool AddrOf = UO && UO->getOpcode() == UO_AddrOf;
    if (!AddrOf && E->getType()->isPointerType()) {
      T.Complete = false; // a pointer kept in a struct field
      return;
    }
    Out.emplace_back().name(R, F, Ctx);
  }

  /// The longest chain starting at \p Root.
  std::vector<Node> follow(Node Root, Trace &T, std::set<WrKey> Seen,
                           unsigned Depth) {
    describe(Root);
    std::vector<Node> Chain;
    if (Depth > 16 || !Seen.insert(Root.S.Key).second) {
      T.Complete = false;
      return Chain;
    }
    std::vector<Node> Best;
    for (const Link &Next : links(Root)) {
      std::vector<Node> Alternatives;
      roots(Next.Value, Next.Fn, Next.Ctx, 0, Alternatives, T);
      for (Node &Alt : Alternatives) {
        describe(Alt);
        if (Alt.S.Key == Root.S.Key) {
          Root.SelfLinked = true; // wr[i].next = &wr[i + 1]
          continue;
        }
        std::vector<Node> Rest = follow(Alt, T, Seen, Depth + 1);
        if (entries(Rest) > entries(Best))
          Best = std::move(Rest);
      }
    }
    count(Root);
    Chain.push_back(std::move(Root));
    for (Node &N : Best)
      Chain.push_back(std::move(N));
    return Chain;
  }

  /// Opcodes, signaling and identity of a work request.
  void describe(Node &N) {
    WrSlot &S = N.S;
    S.Key = WrKey();
    for (const auto &[L, F] : S.Names) {
      SlotKey K = SlotKey::of(A.flow(F).resolve(L), F);
      if (K.isShared()) {
        S.Key.Storage = K;
        break;
      }
    }
    if (!S.Key.Storage.valid()) {
      const auto &[L, F] = S.Names.front();
      S.Key.Storage = SlotKey::of(A.flow(F).resolve(L), F);
    }
    S.Ops.clear();
    S.Loc = SourceLocation();
    for (const Bound &Op : stores(N, FieldRole::Opcode)) {
      for (Opcode O : opcodesOf(A, *Op.Store))
        if (!S.mayBe(O))
          S.Ops.push_back(O);
      if (S.Loc.isInvalid())
        S.Loc = Op.Store->Spelling->getBeginLoc();
    }
    S.Signal = signalOf(N);
  }

  /// Stores with \p Role into the work request \p N names: in any function
  /// naming the same storage, and in helpers the storage is passed to
  /// (`dif_build_reg(&c->data_reg, ...)` sets `reg->wr.opcode`).
  std::vector<Bound> stores(const Node &N, FieldRole Role) {
    std::vector<Bound> Found;
    std::set<const FieldStore *> Seen;
    for (const auto &[L, F, Ctx] : allNames(N)) {
      for (const FieldStore &FS : A.stores()) {
        if (FS.Role != Role || FS.Struct->Role != StructRole::SendWr ||
            Seen.count(&FS) || !A.sameStorage(FS.Object, FS.Fn, L, F))
          continue;
        Seen.insert(&FS);
        Found.push_back({&FS, FS.Fn == F ? Ctx : nullptr});
      }
    }
    return Found;
  }

  /// Signaling seen from the post: the value send_flags has when the post
  /// runs, when the posting function names the work request itself.
  void signalAtPost(WrSlot &S, const PostSite &P) {
    for (const auto &[L, F] : S.Names) {
      if (F != P.Fn)
        continue;
      std::optional<Location> Flags = A.member(L, FieldRole::SendFlags);
      if (!Flags)
        continue;
      FlagSet V = A.values(F).flagsAt(*Flags, P.Call->Call);
      S.Signal = classify(V);
      return;
    }
  }

  /// The handles a registration work request registers, binds or
  /// invalidates (`reg_wr.mr = req->mr`, `inv.ex.invalidate_rkey =
  /// req->mr->rkey`).
  std::vector<SlotKey> handles(const Node &N) {
    std::vector<SlotKey> Out;
    for (FieldRole R : {FieldRole::RegMr, FieldRole::BindMw, FieldRole::InvalidateRkey})
      for (const Bound &B : stores(N, R)) {
        const FieldStore &FS = *B.Store;
        std::optional<Location> L = FS.Value ? locationOf(FS.Value) : std::nullopt;
        if (!L)
          continue;
        Location H = A.flow(FS.Fn).resolve(*L);
        if (R == FieldRole::InvalidateRkey && !H.Steps.empty())
          H = H.prefix(H.Steps.size() - 1); // `mr->rkey` names the MR
        Out.push_back(SlotKey::of(H, FS.Fn));
      }
    return Out;
  }

  static unsigned entries(const std::vector<Node> &Chain) {
    unsigned N = 0;
    for (const Node &X : Chain)
      N += X.S.Count;
    return N;
  }

  /// Entries a work request takes in one post: the elements of an array
  /// linked to each other, or the appends a tail-pointer chain makes.
  void count(Node &N) {
    std::optional<unsigned> Size;
    for (const auto &[L, F] : N.S.Names)
      if ((Size = arraySize(A.flow(F).resolve(L))))
        break;
    unsigned C = 1;
    if (Size && N.SelfLinked)
      C = *Size;
    if (Size && N.AppendCount > C)
      C = std::min(*Size, N.AppendCount);
    N.S.Count = C;
  }

  /// Appends of a tail-pointer chain headed by \p Head become one chain:
  /// every appended work request is posted, each followed through its links.
  std::vector<Node> appendedChain(std::vector<Node> Appended, Trace &T) {
    std::vector<Node> Chain;
    std::set<WrKey> Seen;
    for (Node &N : Appended) {
      describe(N);
      auto Same = llvm::find_if(Chain, [&](const Node &C) { return C.S.Key == N.S.Key; });
      if (Same != Chain.end()) {
        Same->Appends.insert(N.Appends.begin(), N.Appends.end());
        continue;
      }
      Chain.push_back(std::move(N));
    }
    for (Node &N : Chain)
      N.AppendCount = appendCount(N);
    std::vector<Node> Out;
    for (Node &N : Chain) {
      if (llvm::any_of(Out, [&](const Node &O) { return O.S.Key == N.S.Key; }))
        continue;
      for (Node &X : follow(N, T, {}, 0))
        if (llvm::none_of(Out, [&](const Node &O) { return O.S.Key == X.S.Key; }))
          Out.push_back(std::move(X));
    }
    return Out;
  }

  uint64_t signaledBit() const { return A.flagBit(Flag::Signaled); }

  WrSlot::SignalKind classify(const FlagSet &V) const {
    uint64_t Bit = signaledBit();
    bool Some = false, All = true, Known = true;
    for (const FlagAlt &Alt : V.Alts) {
      if (Alt.Known & Bit)
        Some = true;
      else if (Alt.Maybe & Bit)
        Known = false;
      else
        All = false;
    }
    if (!Known)
      return Some ? WrSlot::Sometimes : WrSlot::Unknown;
    if (!Some)
      return WrSlot::Never;
    return All ? WrSlot::Always : WrSlot::Sometimes;
  }

  const Loops &loops() const { return Loop; }

private:
  struct FullName {
    Location L;
    const FunctionDecl *F;
    const Frame *Ctx;
  };

  /// The names of \p N, plus the parameters of helpers it is passed to.
  std::vector<FullName> allNames(const Node &N) {
    std::vector<FullName> Names;
    for (size_t I = 0; I < N.S.Names.size(); ++I)
      Names.push_back({N.S.Names[I].first, N.S.Names[I].second, N.Ctx[I]});
    for (size_t I = 0; I < Names.size() && Names.size() < 24; ++I) {
      FullName Cur = Names[I];
      SlotKey K = SlotKey::of(A.flow(Cur.F).resolve(Cur.L), Cur.F);
      for (const auto &[CE, Caller] : passes(K, Cur.F)) {
        const FunctionDecl *Callee = definitionInUnit(A, CE->getDirectCallee());
        for (unsigned J = 0; Callee && J < CE->getNumArgs() &&
                             J < Callee->getNumParams(); ++J) {
          const ParmVarDecl *P = Callee->getParamDecl(J);
          if (!P->getType()->isPointerType())
            continue;
          std::optional<Location> Arg = locationOf(CE->getArg(J));
          if (!Arg)
            continue;
          SlotKey ArgKey = SlotKey::of(A.flow(Caller).resolve(*Arg), Caller);
          if (!K.isWithin(ArgKey))
            continue;
          Location InCallee;
          InCallee.Root = P;
          auto Rest = K.path().drop_front(ArgKey.path().size());
          InCallee.Steps.append(Rest.begin(), Rest.end());
          const Frame *Ctx = frame(CE, Caller, Caller == Cur.F ? Cur.Ctx : nullptr);
          bool Known = llvm::any_of(Names, [&](const FullName &O) {
            return O.F == Callee && O.L == InCallee && O.Ctx == Ctx;
          });
          if (!Known)
            Names.push_back({InCallee, Callee, Ctx});
        }
      }
    }
    return Names;
  }

  /// Calls that may pass storage \p K (or what contains it) to a helper.
  std::vector<std::pair<const CallExpr *, const FunctionDecl *>>
  passes(const SlotKey &K, const FunctionDecl *F) {
    std::vector<std::pair<const CallExpr *, const FunctionDecl *>> Out;
    for (const FunctionDecl *G : A.functions()) {
      if (!K.isShared() && G != F)
        continue;
      for (const CallExpr *CE : helperCalls(A, G))
        Out.push_back({CE, G});
    }
    return Out;
  }

  /// What is stored into the work request's `next`: FieldStores, and writes
  /// through a tail pointer that points at it (`*prev = wr; prev =
  /// &wr->next`).
  std::vector<Link> links(const Node &N) {
    std::vector<Link> Out;
    for (const Bound &B : stores(N, FieldRole::Next))
      if (B.Store->Value)
        Out.push_back({B.Store->Value, B.Store->Fn, B.Ctx});
    for (const auto &[L, F, Ctx] : allNames(N)) {
      std::optional<Location> Next = A.member(L, FieldRole::Next);
      if (!Next)
        continue;
      Location R = A.flow(F).resolve(*Next);
      for (const Def &D : A.flow(F).defs()) {
        if (D.K != Def::Assign || !D.Value || D.Target != R)
          continue;
        const auto *BO = dyn_cast<BinaryOperator>(D.S);
        const auto *UO = BO ? dyn_cast<UnaryOperator>(stripExpr(BO->getLHS())) : nullptr;
        if (UO && UO->getOpcode() == UO_Deref)
          Out.push_back({D.Value, F, Ctx});
      }
    }
    return Out;
  }

  /// A pointer variable: the work requests it may point at.
  void pointerVariable(const VarDecl *VD, const Location &R, const Expr *Use,
                       const FunctionDecl *F, const Frame *Ctx, unsigned Depth,
                       std::vector<Node> &Out, Trace &T) {
    const FunctionFlow &Flow = A.flow(F);
    bool Tail = isChainHead(VD, F);
    llvm::SmallVector<const Def *, 4> Defs;
    if (Tail) {
      // Every append writes the head or a `next` it leads to: all count.
      for (const Def &D : Flow.defs())
        if (D.Target == R)
          Defs.push_back(&D);
      if (isa<ParmVarDecl>(VD))
        Defs.push_back(nullptr);
    } else {
      Defs = Flow.reaching(R, Use);
    }
    std::vector<Node> Appended;
    for (const Def *D : Defs) {
      if (D && D->K == Def::Assign) {
        if (!D->Value)
          continue;
        std::vector<Node> Found;
        roots(D->Value, F, Ctx, Depth + 1, Found, T);
        for (Node &N : Found) {
          N.Appends.insert({D->S, Ctx});
          (Tail ? Appended : Out).push_back(std::move(N));
        }
        continue;
      }
      if (D && D->K == Def::Unknown) {
        // Declared without a value, or its address handed to a helper
        // that appends to it (followed below).
        if (!isa<DeclStmt>(D->S) && !(Tail && isa<CallExpr>(D->S)))
          T.Complete = false;
        continue;
      }
      if (D) {
        T.Complete = false;
        continue;
      }
      if (const auto *P = dyn_cast<ParmVarDecl>(VD))
        fromParameter(P, R, F, Ctx, Depth, Out, T);
    }
    if (!Tail)
      return;
    appendsInHelpers(VD, F, Ctx, Depth, Appended, T);
    for (Node &N : appendedChainNodes(std::move(Appended), T))
      Out.push_back(std::move(N));
  }

  /// The appends of a tail chain as one alternative that stands for the
  /// whole chain.
  std::vector<Node> appendedChainNodes(std::vector<Node> Appended, Trace &T) {
    if (Appended.empty())
      return {};
    auto Chain = std::make_shared<std::vector<Node>>(
        appendedChain(std::move(Appended), T));
    Node Whole = Chain->front();
    Whole.TailChain = std::move(Chain);
    return {Whole};
  }

private:
  /// A pointer whose address is taken to link work requests behind it:
  /// `prev = &first` or `tail = &head` passed to a helper.
  bool isChainHead(const VarDecl *VD, const FunctionDecl *F) {
    auto IsAddr = [&](const Expr *E) {
      const auto *UO = dyn_cast_or_null<UnaryOperator>(stripExpr(E));
      if (!UO || UO->getOpcode() != UO_AddrOf)
        return false;
      const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(UO->getSubExpr()));
      return DRE && DRE->getDecl() == VD;
    };
    for (const Def &D : A.flow(F).defs())
      if (D.K == Def::Assign && IsAddr(D.Value))
        return true;
    for (const CallExpr *CE : helperCalls(A, F))
      for (const Expr *Arg : CE->arguments())
        if (IsAddr(Arg))
          return true;
    return false;
  }

  /// `tail = add_bind(..., tail)`: helpers that write through a tail
  /// pointer leading to \p Head append to its chain.
  void appendsInHelpers(const VarDecl *Head, const FunctionDecl *F,
                        const Frame *Ctx, unsigned Depth,
                        std::vector<Node> &Appended, Trace &T) {
    // Locals holding &Head (or a `next` behind it): the tail pointers.
    std::set<const ValueDecl *> Tails;
    for (const Def &D : A.flow(F).defs()) {
      const auto *UO = dyn_cast_or_null<UnaryOperator>(stripExpr(D.Value));
      if (D.K == Def::Assign && D.Target.Steps.empty() && UO &&
          UO->getOpcode() == UO_AddrOf)
        Tails.insert(D.Target.Root);
    }
    for (const CallExpr *CE : helperCalls(A, F)) {
      const FunctionDecl *Callee = definitionInUnit(A, CE->getDirectCallee());
      if (!Callee)
        continue;
      for (unsigned I = 0; I < CE->getNumArgs() && I < Callee->getNumParams(); ++I) {
        const Expr *Arg = stripExpr(CE->getArg(I));
        const ValueDecl *Passed = nullptr;
        if (const auto *UO = dyn_cast<UnaryOperator>(Arg);
            UO && UO->getOpcode() == UO_AddrOf)
          if (const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(UO->getSubExpr())))
            Passed = DRE->getDecl() == Head ? Head : nullptr;
        if (const auto *DRE = dyn_cast<DeclRefExpr>(Arg))
          if (Tails.count(DRE->getDecl()))
            Passed = DRE->getDecl();
        if (!Passed)
          continue;
        const Frame *Bind = frame(CE, F, Ctx);
        DerefStores Writes;
        Writes.TraverseStmt(Callee->getBody());
        for (const auto &[P, BO] : Writes.Found) {
          if (P != Callee->getParamDecl(I))
            continue;
          std::vector<Node> Found;
          roots(BO->getRHS(), Callee, Bind, Depth + 1, Found, T);
          for (Node &N : Found) {
            N.Appends.insert({BO, Bind});
            Appended.push_back(std::move(N));
          }
        }
      }
    }
  }

  /// Appends counted per site and binding, times the loops around them.
  unsigned appendCount(const Node &N) {
    unsigned Total = 0;
    for (const auto &[S, Ctx] : N.Appends) {
      if (!S)
        continue;
      const FunctionDecl *F = Ctx ? definitionInUnit(A, Ctx->Call->getDirectCallee())
                                  : functionOf(S);
      Total += F ? Loop.around(S, F).N : 1;
    }
    return Total;
  }

  const FunctionDecl *functionOf(const Stmt *S) {
    const SourceManager &SM = A.sources();
    for (const FunctionDecl *F : A.functions())
      if (F->getBody() &&
          SM.isPointWithin(S->getBeginLoc(), F->getBody()->getBeginLoc(),
                           F->getBody()->getEndLoc()))
        return F;
    return nullptr;
  }

  /// A helper's parameter: what the binding call passes, or what every
  /// caller in this unit passes; with no caller, the parameter names the
  /// work request itself (callers elsewhere may chain more).
  void fromParameter(const ParmVarDecl *P, const Location &R,
                     const FunctionDecl *F, const Frame *Ctx, unsigned Depth,
                     std::vector<Node> &Out, Trace &T) {
    unsigned Index = P->getFunctionScopeIndex();
    if (Ctx && Ctx->Call->getDirectCallee() &&
        Ctx->Call->getDirectCallee()->getCanonicalDecl() == F->getCanonicalDecl()) {
      size_t Before = Out.size();
      if (Index < Ctx->Call->getNumArgs())
        roots(Ctx->Call->getArg(Index), Ctx->Caller, Ctx->Up, Depth + 1, Out, T);
      nameParameter(Out, Before, R, F, Ctx);
      return;
    }
    auto Callers = A.callersOf(F);
    if (Callers.empty()) {
      Out.emplace_back().name(R, F, Ctx);
      T.Complete = false;
      return;
    }
    for (const auto &[CE, Caller] : Callers)
      if (Index < CE->getNumArgs()) {
        size_t Before = Out.size();
        const Frame *Bind = frame(CE, Caller, nullptr);
        roots(CE->getArg(Index), Caller, Bind, Depth + 1, Out, T);
        nameParameter(Out, Before, R, F, Bind);
      }
    if (!F->isStatic())
      T.Complete = false;
  }

  /// The work requests a caller passes are also named by the parameter
  /// (`first->next = &wr` in nvme-rdma's post helper links the caller's
  /// `req->mr ? &req->reg_wr.wr : NULL`, which no location names).
  static void nameParameter(std::vector<Node> &Out, size_t Before,
                            const Location &R, const FunctionDecl *F,
                            const Frame *Bind) {
    for (size_t I = Before; I < Out.size(); ++I) {
      Node &N = Out[I];
      if (N.TailChain)
        continue;
      bool Known = false;
      for (size_t J = 0; J < N.S.Names.size(); ++J)
        Known |= N.S.Names[J].second == F && N.S.Names[J].first == R &&
                 N.Ctx[J] == Bind;
      if (!Known)
        N.name(R, F, Bind);
    }
  }

  /// `first = rdma_rw_ctx_wrs(...)`, `first = build_chain(req)`.
  void fromCall(const CallExpr *CE, const FunctionDecl *F, const Frame *Ctx,
                unsigned Depth, std::vector<Node> &Out, Trace &T) {
    if (const FunctionModel *M = A.modelOf(CE)) {
      if (M->E != Effect::RwWrs) {
        T.Complete = false;
        return;
      }
      T.Core = T.CoreSignals = true;
      if (std::optional<unsigned> I = M->arg(ArgRole::ChainWr);
          I && *I < CE->getNumArgs())
        roots(CE->getArg(*I), F, Ctx, Depth + 1, Out, T);
      return;
    }
    const FunctionDecl *Callee = definitionInUnit(A, CE->getDirectCallee());
    if (!Callee) {
      T.Complete = false;
      return;
    }
    const Frame *Bind = frame(CE, F, Ctx);
    for (const Expr *V : returnValues(Callee))
      roots(V, Callee, Bind, Depth + 1, Out, T);
  }

  const Frame *frame(const CallExpr *CE, const FunctionDecl *Caller,
                     const Frame *Up) {
    for (const Frame &Fr : Frames)
      if (Fr.Call == CE && Fr.Caller == Caller && Fr.Up == Up)
        return &Fr;
    Frames.push_back({CE, Caller, Up});
    return &Frames.back();
  }

  WrSlot::SignalKind signalOf(Node &N) {
    std::vector<Bound> Flags = stores(N, FieldRole::SendFlags);
    if (Flags.empty() || !signaledBit())
      return WrSlot::Unknown;
    FlagSet All;
    const FieldStore *Deciding = nullptr;
    for (const Bound &B : Flags) {
      const FieldStore *FS = B.Store;
      FlagSet V = A.values(FS->Fn).flagsAfter(A.flow(FS->Fn).resolve(FS->Target),
                                              FS->At);
      // The store that may signal is where the decision is made (`|=
      // SIGNALED` in the post loop, not `= 0` in a setup helper).
      if (!Deciding && llvm::any_of(V.Alts, [&](const FlagAlt &Alt) {
            return Alt.Known & signaledBit();
          }))
        Deciding = FS;
      N.S.Flags = FS;
      All.add(V);
    }
    if (Deciding)
      N.S.Flags = Deciding;
    return classify(All);
  }

  const TuAnalysis &A;
  Loops Loop;
  std::deque<Frame> Frames;
};

//===-- Posts -------------------------------------------------------------===//

/// Storage a QP expression names, through the callers' arguments when it is
/// a helper's parameter.
SlotKey qpKeyOf(const TuAnalysis &A, const Expr *Qp, const FunctionDecl *F,
                unsigned Depth = 0) {
  std::optional<Location> L = Qp ? locationOf(Qp) : std::nullopt;
  if (!L)
    return SlotKey();
  Location R = A.flow(F).resolve(*L);
  const auto *P = dyn_cast_or_null<ParmVarDecl>(R.Root);
  if (P && R.Steps.empty() && Depth < 3) {
    SlotKey Common;
    for (const auto &[CE, Caller] : A.callersOf(F)) {
      unsigned I = P->getFunctionScopeIndex();
      if (I >= CE->getNumArgs())
        return SlotKey();
      SlotKey K = qpKeyOf(A, CE->getArg(I), Caller, Depth + 1);
      if (!K.valid() || (Common.valid() && K != Common))
        return SlotKey();
      Common = K;
    }
    return Common;
  }
  return SlotKey::of(R, F);
}

/// `id->qp` for an rdma_cm_id expression: the QP rdma_create_qp() stores.
SlotKey cmQpKey(const TuAnalysis &A, const Expr *Id, const FunctionDecl *F) {
  if (!Id)
    return SlotKey();
  const Expr *E = stripExpr(Id);
  QualType T = E->getType();
  // rdma_create_ep(&id, ...): the id is what the argument points at.
  while (T->isPointerType() && T->getPointeeType()->isPointerType())
    T = T->getPointeeType();
  const RecordType *RT = T->isPointerType()
                             ? T->getPointeeType()->getAs<RecordType>()
                             : nullptr;
  std::optional<Location> L = locationOf(E);
  if (!RT || !L || !RT->getDecl()->getDefinition())
    return SlotKey();
  for (const FieldDecl *FD : RT->getDecl()->getDefinition()->fields())
    if (FD->getName() == "qp") {
      Location Q = A.flow(F).resolve(*L);
      Q.Steps.push_back({FD});
      return SlotKey::of(Q, F);
    }
  return SlotKey();
}

/// What the extended API posts between ibv_wr_start and ibv_wr_complete.
void addExtendedPosts(const TuAnalysis &A, const Loops &Loop,
                      std::vector<PostSite> &Posts) {
  uint64_t Bit = A.flagBit(Flag::Signaled);
  for (const ApiCall &Complete : A.calls()) {
    if (Complete.Model->E != Effect::WrxComplete)
      continue;
    PostSite P;
    P.Call = &Complete;
    P.Fn = Complete.Caller;
    P.Qp = Complete.arg(ArgRole::Qp);
    const FunctionFlow &Flow = A.flow(P.Fn);
    for (const ApiCall &Op : A.calls()) {
      if (Op.Caller != P.Fn || Op.Model->E != Effect::WrxOp ||
          !Flow.reachableFrom(Op.Call, Complete.Call))
        continue;
      WrSlot S;
      S.Key.Fn = P.Fn;
      S.Key.Api = Op.Model;
      S.Key.Site = Op.Call;
      S.Ops.push_back(Op.Model->Op);
      S.Loc = Op.Call->getBeginLoc();
      S.Count = Loop.around(Op.Call, P.Fn).N;
      // wr_flags on the extended QP when this op is built: the value the
      // stores reaching it give (an if/else sets it on both branches).
      WrSlot::SignalKind Signal = WrSlot::Unknown;
      bool Some = false, All = true, Any = false;
      for (const FieldStore &FS : A.stores()) {
        if (FS.Fn != P.Fn || FS.Role != FieldRole::SendFlags ||
            FS.Struct->Role != StructRole::QpEx)
          continue;
        Location Target = Flow.resolve(FS.Target);
        auto Reaching = Flow.reaching(Target, Op.Call);
        if (!llvm::is_contained(Reaching, nullptr) || Reaching.size() > 1) {
          for (const Def *D : Reaching) {
            if (!D || D->S != FS.At)
              continue;
            FlagSet V = A.values(FS.Fn).flagsAfter(Target, FS.At);
            for (const FlagAlt &Alt : V.Alts) {
              Any = true;
              Some |= Alt.mayHave(Bit);
              All &= bool(Alt.Known & Bit);
              if ((Alt.Known & Bit) && !S.Flags)
                S.Flags = &FS; // where the signaling decision is made
            }
          }
        }
      }
      if (Any)
        Signal = All ? WrSlot::Always : Some ? WrSlot::Sometimes : WrSlot::Never;
      S.Signal = Signal;
      P.Chain.push_back(std::move(S));
    }
    Posts.push_back(std::move(P));
  }
}

/// rdma_post_send() and friends: one work request each.
PostSite cmPost(const TuAnalysis &A, const ApiCall &C) {
  PostSite P;
  P.Call = &C;
  P.Fn = C.Caller;
  P.Qp = C.arg(ArgRole::Id);
  WrSlot S;
  S.Key.Fn = C.Caller;
  S.Key.Api = C.Model;
  S.Key.Site = C.Call;
  S.Ops.push_back(C.Model->Op);
  S.Loc = C.Call->getBeginLoc();
  if (const Expr *Flags = C.arg(ArgRole::SendFlags)) {
    S.FlagsArg = Flags;
    uint64_t Bit = A.flagBit(Flag::Signaled);
    FlagSet V = A.values(C.Caller).flags(Flags);
    bool Some = false, All = true;
    for (const FlagAlt &Alt : V.Alts) {
      Some |= Alt.mayHave(Bit);
      All &= bool(Alt.Known & Bit);
    }
    S.Signal = All ? WrSlot::Always : Some ? WrSlot::Sometimes : WrSlot::Never;
  }
  P.Chain.push_back(std::move(S));
  return P;
}

/// The rdma_rw call a posted chain comes from, if any (`first =
/// rdma_rw_ctx_wrs(...)`, then ib_post_send(qp, first, NULL)).
const ApiCall *coreChain(const TuAnalysis &A, const Expr *Wr,
                         const FunctionDecl *F) {
  const Expr *E = stripExpr(Wr);
  if (auto L = locationOf(E)) {
    for (const Def *D : A.flow(F).reaching(A.flow(F).resolve(*L), E))
      if (D && D->K == Def::Assign && D->Value)
        if (const auto *CE = dyn_cast<CallExpr>(stripExpr(D->Value)))
          for (const ApiCall &C : A.calls())
            if (C.Call == CE && C.Model->E == Effect::RwWrs)
              return &C;
  }
  for (const ApiCall &C : A.calls())
    if (C.Call == E && C.Model->E == Effect::RwWrs)
      return &C;
  return nullptr;
}

/// The handle a registration work request registers, binds or invalidates
/// (`bd->bd_mw`, `req->mr->rkey`), or none when the code does not say.
SlotKey registeredHandle(const TuAnalysis &A, const WrSlot &S) {
  auto KeyOf = [&](const Expr *E, const FunctionDecl *F) {
    std::optional<Location> L = E ? locationOf(E) : std::nullopt;
    return L ? SlotKey::of(A.flow(F).resolve(*L), F) : SlotKey();
  };
  if (S.Key.Site) {
    for (const ApiCall &C : A.calls())
      if (C.Call == S.Key.Site)
        for (ArgRole R : {ArgRole::Mw, ArgRole::Mkey, ArgRole::InvalidateRkey})
          if (const Expr *E = C.arg(R))
            return KeyOf(E, C.Caller);
    return SlotKey();
  }
  for (FieldRole R :
       {FieldRole::RegMr, FieldRole::BindMw, FieldRole::InvalidateRkey})
    for (const FieldStore *FS : slotStores(A, S, R))
      if (FS->Value)
        return KeyOf(FS->Value, FS->Fn);
  return SlotKey();
}

/// How many times one request runs \p P: loops over the request's parts
/// around it, and helpers called several times in a row (once per MR).
unsigned repeatOf(const TuAnalysis &A, const Loops &Loop, const PostSite &P) {
  unsigned Here = Loop.around(P.Call->Call, P.Fn).N;
  unsigned FromCallers = 1;
  for (const FunctionDecl *G : A.functions()) {
    std::vector<const CallExpr *> Sites = A.callsTo(G, P.Fn);
    if (Sites.empty())
      continue;
    // Sites in a row add up; sites on alternative branches do not.
    unsigned Sum = 0, Max = 0;
    bool InRow = true;
    for (size_t I = 0; I < Sites.size(); ++I) {
      unsigned N = Loop.around(Sites[I], G).N;
      Sum += N;
      Max = std::max(Max, N);
      if (I && !A.flow(G).reachableFrom(Sites[I - 1], Sites[I]))
        InRow = false;
    }
    FromCallers = std::max(FromCallers, InRow ? Sum : Max);
  }
  return Here * FromCallers;
}

/// A branch that leaves: its last statement returns, jumps or ends the loop.
bool leaves(const Stmt *Branch) {
  const Stmt *S = lastStatement(Branch);
  return isa_and_nonnull<ReturnStmt, GotoStmt, BreakStmt, ContinueStmt>(S);
}

/// \p E is (inside) the condition of an if or a loop: its value is tested.
bool tested(const FunctionFlow &Flow, const Expr *E) {
  const Stmt *Child = E;
  for (const Stmt *P = Flow.parents().getParent(E); P;
       Child = P, P = Flow.parents().getParent(P)) {
    if (const Expr *Cond = conditionOf(P))
      return Child == Cond;
    if (!isa<Expr>(P))
      return false;
  }
  return false;
}

/// The amount a decrement of a credit counter takes: a constant, or a
/// parameter of \p Fn the call \p Site binds to one (`iface->tx_available
/// -= wqes` in the post helper, `uct_rc_iface_post(iface, desc, 2)`).
std::optional<int64_t> creditAmount(const TuAnalysis &A, const Def &D,
                                    const FunctionDecl *Fn,
                                    const CallExpr *Site,
                                    const FunctionDecl *Caller) {
  if (D.K == Def::Increment)
    return 1;
  if (D.K != Def::Compound || (D.Op != BO_SubAssign && D.Op != BO_AddAssign))
    return std::nullopt;
  if (std::optional<int64_t> K = A.values(Fn).constant(D.Value))
    return K;
  const auto *DRE = dyn_cast<DeclRefExpr>(stripExpr(D.Value));
  const auto *PV = DRE ? dyn_cast<ParmVarDecl>(DRE->getDecl()) : nullptr;
  if (!PV || !Site || PV->getFunctionScopeIndex() >= Site->getNumArgs())
    return std::nullopt;
  return A.values(Caller).constant(Site->getArg(PV->getFunctionScopeIndex()));
}

/// `if (q->sq_free < N) return -EAGAIN; ... q->sq_free -= N;` in \p Fn
/// before \p At: the test leaves when the count of free send-queue entries
/// is short, and the entries are taken between the test and \p At, after
/// \p At, or (when \p At calls the posting helper \p Callee) by the helper.
bool testsCredits(const TuAnalysis &A, const FunctionDecl *Fn, const Stmt *At,
                  unsigned Needed, const FunctionDecl *Callee = nullptr) {
  const FunctionFlow &Flow = A.flow(Fn);
  const auto *Site = dyn_cast<CallExpr>(At);
  struct Reads : RecursiveASTVisitor<Reads> {
    std::vector<Location> Found;
    bool VisitMemberExpr(MemberExpr *ME) {
      if (auto L = locationOf(ME))
        Found.push_back(*L);
      return true;
    }
  };
  struct Gates : RecursiveASTVisitor<Gates> {
    std::vector<const IfStmt *> Ifs;
    bool VisitIfStmt(IfStmt *If) {
      Ifs.push_back(If);
      return true;
    }
  } G;
  G.TraverseStmt(Fn->getBody());
  auto Enough = [&](std::optional<int64_t> Amount) {
    return Amount && *Amount >= static_cast<int64_t>(Needed);
  };
  for (const IfStmt *If : G.Ifs) {
    if (!leaves(If->getThen()) || !Flow.reachableFrom(If->getCond(), At))
      continue;
    Reads R;
    R.TraverseStmt(const_cast<Expr *>(If->getCond()));
    for (const Location &Counter : R.Found) {
      Location C = Flow.resolve(Counter);
      for (const Def &D : Flow.defs()) {
        if (Flow.resolve(D.Target) != C)
          continue;
        bool After = Flow.reachableFrom(At, D.S);
        if (!After && !(Flow.reachableFrom(If->getCond(), D.S) &&
                        Flow.reachableFrom(D.S, At)))
          continue;
        if (Enough(creditAmount(A, D, Fn, nullptr, nullptr)))
          return true;
      }
      // The helper takes them after its post: the same counter field.
      if (!Callee || !C.lastField())
        continue;
      // The caller says how many it built (`post(iface, desc, 2)`).
      for (const Def &D : A.flow(Callee).defs())
        if (D.Target.lastField() == C.lastField())
          if (std::optional<int64_t> N = creditAmount(A, D, Callee, Site, Fn);
              N && *N > 0)
            return true;
    }
  }
  return false;
}

/// `while (atomic_dec_return(&ic->i_fastreg_wrs) <= 0) atomic_inc(...)`:
/// a tested take of credits (credit_take_calls in rules/) before \p At.
bool takesCredits(const TuAnalysis &A, const FunctionDecl *Fn, const Stmt *At,
                  unsigned Needed) {
  const FunctionFlow &Flow = A.flow(Fn);
  struct Takes : RecursiveASTVisitor<Takes> {
    explicit Takes(const TuAnalysis &A) : A(A) {}
    bool VisitCallExpr(CallExpr *CE) {
      const FunctionDecl *F = CE->getDirectCallee();
      if (!F || !F->getIdentifier())
        return true;
      if (std::optional<std::optional<unsigned>> Arg =
              A.rules().creditTake(F->getName()))
        Found.push_back({CE, *Arg});
      return true;
    }
    const TuAnalysis &A;
    std::vector<std::pair<const CallExpr *, std::optional<unsigned>>> Found;
  } T(A);
  T.TraverseStmt(Fn->getBody());
  for (const auto &[Call, Arg] : T.Found) {
    if (!tested(Flow, Call) || !Flow.reachableFrom(Call, At))
      continue;
    std::optional<int64_t> Amount = 1;
    if (Arg)
      Amount = *Arg < Call->getNumArgs()
                   ? A.values(Fn).constant(Call->getArg(*Arg))
                   : std::nullopt;
    if (Amount && *Amount >= static_cast<int64_t>(Needed))
      return true;
  }
  return false;
}

/// `while (scnt - ccnt + post_list <= user_param->tx_depth) post(..)`: the
/// post (or the call of its helper) runs only under a comparison with the
/// capacity the QP was created with (perftest): the ULP keeps what is in
/// flight within the queue itself.
bool gatedByCapacity(const TuAnalysis &A, const PostSite &P, const QpCreation &Q) {
  auto Store = Q.Caps.find(FieldRole::MaxSendWr);
  if (Store == Q.Caps.end() || !Store->second->Value)
    return false;
  struct Fields : RecursiveASTVisitor<Fields> {
    std::set<const ValueDecl *> Read;
    bool VisitMemberExpr(MemberExpr *ME) {
      Read.insert(ME->getMemberDecl());
      return true;
    }
  } Capacity;
  Capacity.TraverseStmt(const_cast<Expr *>(Store->second->Value));
  if (Capacity.Read.empty())
    return false;
  struct Comparisons : RecursiveASTVisitor<Comparisons> {
    const std::set<const ValueDecl *> &Cap;
    bool Found = false;
    explicit Comparisons(const std::set<const ValueDecl *> &Cap) : Cap(Cap) {}
    bool VisitBinaryOperator(BinaryOperator *BO) {
      if (!BO->isRelationalOp())
        return true;
      Fields Sides;
      Sides.TraverseStmt(BO);
      Found |= llvm::any_of(Sides.Read, [&](const ValueDecl *D) { return Cap.count(D); });
      return !Found;
    }
  };
  auto Guarded = [&](const FunctionDecl *Fn, const Stmt *S) {
    const ParentMap &PM = A.flow(Fn).parents();
    for (const Stmt *P = PM.getParent(S), *Child = S; P; Child = P, P = PM.getParent(P)) {
      const Expr *Cond = nullptr;
      if (const auto *W = dyn_cast<WhileStmt>(P))
        Cond = W->getBody() == Child ? W->getCond() : nullptr;
      else if (const auto *F = dyn_cast<ForStmt>(P))
        Cond = F->getBody() == Child ? F->getCond() : nullptr;
      else if (const auto *If = dyn_cast<IfStmt>(P))
        Cond = If->getThen() == Child ? If->getCond() : nullptr;
      Comparisons C(Capacity.Read);
      if (Cond)
        C.TraverseStmt(const_cast<Expr *>(Cond));
      if (C.Found)
        return true;
    }
    return false;
  };
  if (Guarded(P.Fn, P.Call->Call))
    return true;
  auto Callers = A.callersOf(P.Fn);
  return !Callers.empty() && llvm::all_of(Callers, [&](const auto &C) {
    return Guarded(C.second, C.first);
  });
}

/// Posts held back until the ULP's count of free send-queue entries allows
/// them: the posting function tests or takes the credits, or every caller
/// tests them and the posting helper takes them (UCX's UCT_RC_CHECK_RES).
bool creditGated(const TuAnalysis &A, const PostSite &P) {
  unsigned Needed = P.entries();
  const Stmt *At = P.Call->Call;
  if (testsCredits(A, P.Fn, At, Needed) || takesCredits(A, P.Fn, At, Needed))
    return true;
  auto Callers = A.callersOf(P.Fn);
  return !Callers.empty() && llvm::all_of(Callers, [&](const auto &C) {
    return testsCredits(A, C.second, C.first, Needed, P.Fn) ||
           takesCredits(A, C.second, C.first, Needed);
  });
}

/// A REG_MR, BIND_MW or LOCAL_INV of a handle that lives in the struct
/// holding the QP (`a->status_mr` next to `a->qp`): done once per
/// connection, not per request.
bool connectionRegistration(const TuAnalysis &A, ChainBuilder &Chains,
                            const Node &N, const PostSite &P) {
  if (!N.S.isRegistration())
    return false;
  SlotKey Qp = qpKeyOf(A, P.Qp, P.Fn);
  std::vector<SlotKey> Handles = Chains.handles(N);
  return !Handles.empty() && llvm::all_of(Handles, [&](const SlotKey &H) {
    return (H.record() && H.record() == Qp.record()) ||
           (H.scope() == SlotKey::Scope::Global &&
            Qp.scope() == SlotKey::Scope::Global);
  });
}

} // namespace wrmodel
using namespace wrmodel;

//===-- WorkRequests ------------------------------------------------------===//

WorkRequests::WorkRequests(const TuAnalysis &A) : A(A) {
  ChainBuilder Chains(A);
  for (const ApiCall &C : A.calls()) {
    switch (C.Model->E) {
    case Effect::PostSend:
    case Effect::RwPost: {
      PostSite P;
      P.Call = &C;
      P.Fn = C.Caller;
      P.Qp = C.arg(ArgRole::Qp);
      const Expr *Wr = C.arg(ArgRole::Wr);
      Trace T;
      if (C.Model->E == Effect::RwPost) {
        P.CoreManaged = true;
        P.CoreSignals = !C.arg(ArgRole::Cqe) ||
                        !C.arg(ArgRole::Cqe)->isNullPointerConstant(
                            const_cast<ASTContext &>(A.context()),
                            Expr::NPC_ValueDependentIsNotNull);
        Wr = C.arg(ArgRole::ChainWr);
      } else if (const ApiCall *Core = coreChain(A, Wr, C.Caller)) {
        P.CoreManaged = true;
        P.CoreSignals = true;
        Wr = Core->arg(ArgRole::ChainWr);
      }
      if (Wr) {
        std::vector<Node> Roots;
        Chains.roots(Wr, C.Caller, nullptr, 0, Roots, T);
        std::vector<Node> Best;
        size_t BestAlt = 0;
        for (Node &Root : Roots) {
          std::vector<Node> Chain = Root.TailChain
                                        ? *Root.TailChain
                                        : Chains.follow(Root, T, {}, 0);
          PostSite::Alternative &Alt = P.Alternatives.emplace_back();
          // The outermost binding: a call from a caller of the posting
          // function (not a builder the posting function calls itself).
          const Frame *Top = Root.Ctx.empty() ? nullptr : Root.Ctx.front();
          while (Top && Top->Up)
            Top = Top->Up;
          if (Top && Top->Caller != P.Fn) {
            Alt.Via = Top->Call;
            Alt.ViaFn = Top->Caller;
          }
          for (const Node &N : Chain) {
            WrSlot S = N.S;
            Chains.signalAtPost(S, P);
            Alt.Chain.push_back(std::move(S));
          }
          if (ChainBuilder::entries(Chain) > ChainBuilder::entries(Best)) {
            Best = std::move(Chain);
            BestAlt = P.Alternatives.size() - 1;
          }
        }
        P.Setup = !Best.empty() &&
                  llvm::all_of(Best, [&](const Node &N) {
                    return connectionRegistration(A, Chains, N, P);
                  });
        if (!Best.empty())
          P.Chain = P.Alternatives[BestAlt].Chain;
      }
      P.Complete = T.Complete;
      P.CoreManaged |= T.Core;
      P.CoreSignals |= T.CoreSignals;
      Posts.push_back(std::move(P));
      break;
    }
    case Effect::PostCm:
      Posts.push_back(cmPost(A, C));
      break;
    case Effect::PostRecv:
      RecvPosts.push_back(&C);
      break;
    case Effect::QpDrain:
    case Effect::QpDrainSq:
    case Effect::QpDrainRq:
      ++Drains;
      DrainCalls.push_back(&C);
      break;
    default:
      break;
    }
  }
  addExtendedPosts(A, Chains.loops(), Posts);
  for (PostSite &P : Posts) {
    P.QpKey = P.Call->Model->E == Effect::PostCm
                  ? cmQpKey(A, P.Qp, P.Fn)
                  : qpKeyOf(A, P.Qp, P.Fn);
    P.Repeat = repeatOf(A, Chains.loops(), P);
    P.CreditGated = creditGated(A, P);
    // Extended-API binds of the connection's own window happen at setup.
    if (P.Call->Model->E == Effect::WrxComplete && !P.Chain.empty()) {
      bool Setup = true;
      for (const WrSlot &S : P.Chain) {
        const ApiCall *Op = nullptr;
        for (const ApiCall &C : A.calls())
          if (C.Call == S.Key.Site)
            Op = &C;
        const Expr *H = Op ? Op->arg(ArgRole::Mw) : nullptr;
        if (!H && Op)
          H = Op->arg(ArgRole::Mkey);
        std::optional<Location> L = H ? locationOf(H) : std::nullopt;
        SlotKey K = L ? SlotKey::of(A.flow(P.Fn).resolve(*L), P.Fn) : SlotKey();
        Setup &= S.isRegistration() && K.record() &&
                 K.record() == P.QpKey.record();
      }
      P.Setup = Setup;
    }
  }

  // What the unit builds, posted here or not.
  for (const FieldStore &S : A.stores())
    if (S.Role == FieldRole::Opcode && S.Value)
      for (Opcode O : opcodesOf(A, S)) {
        BuildsRegistrations |= O == Opcode::RegMr || O == Opcode::LocalInv ||
                               O == Opcode::BindMw;
        PostsRdma |= O == Opcode::RdmaRead || O == Opcode::RdmaWrite ||
                     O == Opcode::RdmaReadWithInv;
      }
  for (const ApiCall &C : A.calls()) {
    if (C.Model->CoreManaged)
      continue;
    Opcode O = C.Model->Op;
    BuildsRegistrations |= O == Opcode::RegMr || O == Opcode::LocalInv ||
                           O == Opcode::BindMw || C.Model->E == Effect::MwBind;
    PostsRdma |= O == Opcode::RdmaRead || O == Opcode::RdmaWrite;
  }

  collectCreations();
  exportFacts();
  LLVM_DEBUG(dump(llvm::dbgs()));
  if (DumpWorkRequests)
    dump(llvm::errs());
}

/// Storage assigned from a QP's storage (`t->qp = t->cm_id->qp`) or from a
/// conversion of it (`c->qpx = ibv_qp_to_qp_ex(c->qp)`) names it too.
static void addQpAliases(const TuAnalysis &A, std::vector<SlotKey> &Names) {
  for (int Round = 0; Round < 3; ++Round) {
    size_t Before = Names.size();
    for (const FunctionDecl *F : A.functions()) {
      const FunctionFlow &Flow = A.flow(F);
      for (const Def &D : Flow.defs()) {
        if (D.K != Def::Assign || !D.Value)
          continue;
        const Expr *V = stripExpr(D.Value);
        if (const auto *CE = dyn_cast<CallExpr>(V))
          V = CE->getNumArgs() && !A.modelOf(CE) && CE->getType()->isPointerType()
                  ? stripExpr(CE->getArg(0))
                  : nullptr;
        std::optional<Location> L = V ? locationOf(V) : std::nullopt;
        if (!L || !V->getType()->isPointerType())
          continue;
        SlotKey From = SlotKey::of(Flow.resolve(*L), F);
        if (!llvm::is_contained(Names, From))
          continue;
        SlotKey To = SlotKey::of(Flow.resolve(D.Target), F);
        if (To.valid() && !llvm::is_contained(Names, To))
          Names.push_back(To);
      }
    }
    if (Names.size() == Before)
      return;
  }
}

void WorkRequests::collectCreations() {
  for (const ApiCall &C : A.calls()) {
    if (C.Model->E != Effect::QpCreate)
      continue;
    QpCreation Q;
    Q.Call = &C;
    Q.Fn = C.Caller;
    Q.CoreManaged = C.Model->CoreManaged;
    const FunctionFlow &Flow = A.flow(C.Caller);
    std::optional<Location> Attr;
    if (const Expr *E = C.arg(ArgRole::Attr))
      Attr = locationOf(E);
    for (const FieldStore &FS : A.stores()) {
      if (!Attr || FS.Struct->Role != StructRole::QpInitAttr ||
          !A.sameStorage(FS.Object, FS.Fn, *Attr, C.Caller))
        continue;
      // The store that reaches the creation wins over ones elsewhere (one
      // attribute struct may serve two creations in a row).
      const FieldStore *&Slot = Q.Caps[FS.Role];
      bool Reaches = FS.Fn == C.Caller &&
                     llvm::any_of(Flow.reaching(Flow.resolve(FS.Target), C.Call),
                                  [&](const Def *D) { return D && D->S == FS.At; });
      bool SlotReaches =
          Slot && Slot->Fn == C.Caller &&
          llvm::any_of(Flow.reaching(Flow.resolve(Slot->Target), C.Call),
                       [&](const Def *D) { return D && D->S == Slot->At; });
      if (!Slot || (Reaches && !SlotReaches) || (!SlotReaches && FS.Fn == C.Caller))
        Slot = &FS;
    }
    for (FieldRole Role : {FieldRole::SqSigAll, FieldRole::SqSigType}) {
      auto It = Q.Caps.find(Role);
      if (It == Q.Caps.end())
        continue;
      Q.SignalStore = It->second;
      std::optional<int64_t> V = A.values(It->second->Fn).constant(It->second->Value);
      if (!V && !It->second->Value)
        V = 0; // zeroed
      if (!V)
        continue;
      if (Role == FieldRole::SqSigAll)
        Q.SignalAll = *V != 0;
      else
        Q.SignalAll = A.enumValue(A.rules().flagName(Domain::Kernel, Flag::SignalAll)) == V;
    }
    // Userspace: a zeroed ibv_qp_init_attr leaves sq_sig_all 0, "requested
    // only"; the kernel's zero is IB_SIGNAL_ALL_WR.
    if (!Q.SignalStore && Attr && A.domain() == Domain::Userspace &&
        Q.Caps.count(FieldRole::MaxSendWr)) {
      std::optional<Location> Sig = A.member(*Attr, FieldRole::SqSigAll);
      if (Sig) {
        auto Reaching = Flow.reaching(Flow.resolve(*Sig), C.Call);
        bool Zeroed = !Reaching.empty() && llvm::all_of(Reaching, [&](const Def *D) {
          if (!D)
            return false;
          if (D->K == Def::Zero)
            return true;
          const Expr *Init = D->Value ? stripExpr(D->Value) : nullptr;
          return D->K == Def::Assign && D->Target != Flow.resolve(*Sig) &&
                 (isa_and_nonnull<InitListExpr>(Init) ||
                  isa_and_nonnull<CompoundLiteralExpr>(Init));
        });
        if (Zeroed)
          Q.SignalAll = false;
      }
    }
    // The QP's storage: what the call returns into, or the cm_id's qp.
    if (C.Model->Returns == StructRole::Qp || C.Model->arg(ArgRole::Out))
      if (std::optional<Location> R = A.resultOf(C.Call))
        Q.QpKey = SlotKey::of(Flow.resolve(*R), C.Caller);
    if (!Q.QpKey.valid())
      Q.QpKey = cmQpKey(A, C.arg(ArgRole::Id), C.Caller);
    if (Q.QpKey.valid()) {
      Q.QpNames.push_back(Q.QpKey);
      addQpAliases(A, Q.QpNames);
      // Other files of the ULP name the QP by the ULP's own field rather
      // than the cm_id's (`conn->qp = conn->cm_id->qp`).
      for (const SlotKey &K : Q.QpNames)
        if (K.record() && K != Q.QpKey && Q.QpKey.record() &&
            Q.QpKey.record()->getName() == "rdma_cm_id") {
          Q.QpKey = K;
          break;
        }
    }
    Creations.push_back(std::move(Q));
  }
}

const QpCreation *WorkRequests::creationOf(const SlotKey &Key) const {
  for (const QpCreation &Q : Creations)
    if (Key.valid() && Q.holds(Key))
      return &Q;
  return nullptr;
}

const QpCreation *WorkRequests::creationFor(const PostSite &P) const {
  if (const QpCreation *Q = creationOf(P.QpKey))
    return Q;
  // One QP in the unit: posts on storage it cannot tie (a parameter) are
  // on it, unless they name another QP's storage.
  if (Creations.size() == 1 &&
      (!P.QpKey.valid() || P.QpKey.scope() == SlotKey::Scope::Local ||
       !P.QpKey.record() || P.QpKey.record() == Creations.front().QpKey.record()))
    return &Creations.front();
  // rdma_create_qp(queue->cm_id, ...) and posts on queue->qp: the struct
  // that holds the cm_id keeps its QP next to it (`queue->qp =
  // queue->cm_id->qp`, possibly in another file).
  if (Creations.size() == 1 && P.QpKey.record()) {
    const QpCreation &Q = Creations.front();
    const RecordDecl *Cm = Q.QpKey.record();
    const Expr *Id = Q.Call->arg(ArgRole::Id);
    std::optional<Location> L = Id ? locationOf(stripExpr(Id)) : std::nullopt;
    if (Cm && Cm->getName() == "rdma_cm_id" && L) {
      SlotKey IdKey = SlotKey::of(A.flow(Q.Fn).resolve(*L), Q.Fn);
      if (IdKey.record() == P.QpKey.record())
        return &Q;
    }
  }
  return nullptr;
}

std::vector<const PostSite *> WorkRequests::postsOn(const QpCreation &Q) const {
  std::vector<const PostSite *> Out;
  for (const PostSite &P : Posts)
    if (creationFor(P) == &Q)
      Out.push_back(&P);
  return Out;
}

RequestCost WorkRequests::requestCost(const QpCreation &Q) const {
  std::vector<const PostSite *> On = postsOn(Q);
  size_t Before = On.size();
  llvm::erase_if(On, [&](const PostSite *P) {
    return wrmodel::gatedByCapacity(A, *P, Q);
  });
  RequestCost Cost = requestCost(On);
  Cost.Gated |= On.size() != Before;
  return Cost;
}

RequestCost
WorkRequests::requestCost(llvm::ArrayRef<const PostSite *> On) const {
  // A request sends one message (the longest chain a post submits) and
  // needs the registrations and invalidations posted anywhere for it.
  RequestCost Cost;
  auto Counted = [&](const PostSite &P) {
    if (P.Setup)
      return false;
    if (P.CreditGated) {
      Cost.Gated = true;
      return false;
    }
    return true;
  };
  // The message is the longest chain that moves data; registrations
  // alone are counted below with the rest.
  auto Moves = [](const PostSite &P) {
    return llvm::any_of(P.Chain, [](const WrSlot &S) { return !S.isRegistration(); });
  };
  const PostSite *Longest = nullptr;
  for (const PostSite *P : On)
    if (Counted(*P) &&
        (!Longest || std::make_pair(Moves(*P), P->entries() * P->Repeat) >
                         std::make_pair(Moves(*Longest),
                                        Longest->entries() * Longest->Repeat)))
      Longest = P;
  std::set<WrKey> Seen;
  std::set<std::pair<Opcode, SlotKey>> Registered;
  auto Add = [&](const WrSlot &S, unsigned Repeat) {
    if (!Seen.insert(S.Key).second)
      return;
    // The resend path binds the same window again: one registration.
    SlotKey H = S.isRegistration() && !S.Ops.empty()
                    ? wrmodel::registeredHandle(A, S)
                    : SlotKey();
    if (H.isShared() && !Registered.insert({S.Ops.front(), H}).second)
      return;
    Cost.Slots.push_back({&S, S.Count * Repeat});
    Cost.Total += S.Count * Repeat;
  };
  if (Longest)
    for (const WrSlot &S : Longest->Chain)
      Add(S, Longest->Repeat);
  for (const PostSite *P : On)
    if (Counted(*P))
      for (const WrSlot &S : P->Chain)
        if (S.isRegistration())
          Add(S, P->Repeat);
  return Cost;
}

const CallExpr *WorkRequests::drainOf(const QpCreation &Q, bool Send) const {
  for (const ApiCall *C : DrainCalls) {
    Effect E = C->Model->E;
    if (E == (Send ? Effect::QpDrainRq : Effect::QpDrainSq))
      continue;
    SlotKey K = qpKeyOf(A, C->arg(ArgRole::Qp), C->Caller);
    if (creationOf(K) == &Q || (Creations.size() == 1 && !creationOf(K)))
      return C->Call;
  }
  return nullptr;
}

const CallExpr *WorkRequests::sendDrain(const QpCreation &Q) const {
  return drainOf(Q, true);
}

const CallExpr *WorkRequests::recvDrain(const QpCreation &Q) const {
  return drainOf(Q, false);
}

/// The bound of the innermost counting loop (`for (i = 0; i < depth; i++)`)
/// around \p At in \p Fn, or around a call of \p Fn (a post helper called
/// from the refill loop), \p Depth helpers up.
static std::optional<Linear> loopCountAround(const TuAnalysis &A,
                                             const FunctionDecl *Fn,
                                             const Stmt *At, unsigned Depth) {
  const ParentMap &PM = A.flow(Fn).parents();
  for (const Stmt *P = PM.getParent(At); P; P = PM.getParent(P)) {
    const auto *FS = dyn_cast<ForStmt>(P);
    if (!FS || !FS->getCond())
      continue;
    const auto *BO = dyn_cast<BinaryOperator>(stripExpr(FS->getCond()));
    if (!BO || BO->getOpcode() != BO_LT)
      continue;
    Linear Bound = evalLinear(A, Fn, BO->getRHS());
    if (!Bound.Opaque)
      return Bound;
  }
  if (Depth == 0)
    return std::nullopt;
  for (const auto &[CE, Caller] : A.callersOf(Fn))
    if (std::optional<Linear> Bound = loopCountAround(A, Caller, CE, Depth - 1))
      return Bound;
  return std::nullopt;
}

std::optional<Linear> WorkRequests::postedReceives(const QpCreation &Q) const {
  // The refill loop at setup: `for (i = 0; i < depth; i++) post_recv(...)`,
  // the post directly in it or in a helper it calls.
  for (const ApiCall *C : RecvPosts) {
    SlotKey K = qpKeyOf(A, C->arg(ArgRole::Qp), C->Caller);
    if (creationOf(K) != &Q && !(Creations.size() == 1 && !creationOf(K)))
      continue;
    if (std::optional<Linear> Bound = loopCountAround(A, C->Caller, C->Call, 2))
      return Bound;
  }
  return std::nullopt;
}

bool WorkRequests::postsRegistrations() const {
  for (const PostSite &P : Posts)
    for (const WrSlot &S : P.Chain)
      if (S.isRegistration())
        return true;
  return false;
}

bool PostSite::asksForCompletion() const {
  return CoreSignals || !Complete ||
         llvm::any_of(Chain, [](const WrSlot &S) { return S.Signal != WrSlot::Never; });
}

bool WorkRequests::mayRequestCompletion() const {
  return llvm::any_of(Posts, [](const PostSite &P) { return P.asksForCompletion(); });
}

std::string WorkRequests::costFact(StringRef Qp, unsigned N) {
  return factKey(FactKind::SendQueueCost, (Qp + ">=" + std::to_string(N)).str());
}
std::string WorkRequests::signalsFact(StringRef Qp) {
  return factKey(FactKind::SignalsOn, Qp);
}
std::string WorkRequests::postsFact(StringRef Qp) {
  return factKey(FactKind::PostsOn, Qp);
}

/// What other files of the ULP may need to know about this one's posts.
void WorkRequests::exportFacts() const {
  const Program &Prog = Program::of(A);
  if (BuildsRegistrations)
    Prog.exportFact(factKey(FactKind::PostsRegistration, Prog.key()));
  if (PostsRdma)
    Prog.exportFact(factKey(FactKind::PostsRdma, Prog.key()));
  if (Posts.empty())
    return;
  std::string Ulp = Prog.key();
  Prog.exportFact(factKey(FactKind::Posts, Ulp));
  if (postsRegistrations())
    Prog.exportFact(factKey(FactKind::PostsRegistration, Ulp));
  if (mayRequestCompletion())
    Prog.exportFact(factKey(FactKind::Signals, Ulp));
  // Per QP: what one request posts, and whether anything there signals.
  std::map<std::string, std::vector<const PostSite *>> ByQp;
  for (const PostSite &P : Posts) {
    std::string Key = P.QpKey.isShared() ? P.QpKey.str() : "*";
    if (const QpCreation *Q = creationFor(P))
      Key = Q->QpKey.str();
    ByQp[Key].push_back(&P);
  }
  for (const auto &[Qp, On] : ByQp) {
    Prog.exportFact(postsFact(Qp));
    if (llvm::any_of(On, [](const PostSite *P) { return P->asksForCompletion(); }))
      Prog.exportFact(signalsFact(Qp));
    RequestCost Cost = requestCost(On);
    for (unsigned N = 1; N <= Cost.Total && N <= 64; ++N)
      Prog.exportFact(costFact(Qp, N));
  }
}

std::optional<Linear> capValue(const TuAnalysis &A, const QpCreation &Q,
                               FieldRole Role) {
  auto It = Q.Caps.find(Role);
  if (It == Q.Caps.end())
    return std::nullopt;
  const FieldStore *S = It->second;
  if (S->Fn == Q.Fn)
    if (auto V = linearAt(A, Q.Fn, S->Target, Q.Call->Call))
      return V;
  // Set in another function: the value after its last store there.
  const FunctionFlow &Flow = A.flow(S->Fn);
  const FieldStore *Last = S;
  for (const FieldStore &O : A.stores())
    if (O.Fn == S->Fn && O.Role == S->Role &&
        Flow.resolve(O.Target) == Flow.resolve(S->Target) &&
        Flow.reachableFrom(Last->At, O.At) && !Flow.reachableFrom(O.At, Last->At))
      Last = &O;
  return linearAfter(A, Last->Fn, Last->Target, Last->At);
}

const WorkRequests &WorkRequests::of(const TuAnalysis &A) {
  return A.cached<WorkRequests>();
}

void WorkRequests::dump(llvm::raw_ostream &OS) const {
  for (const PostSite &P : Posts) {
    OS << "post in " << P.Fn->getName() << " on " << P.QpKey.str()
       << (P.Complete ? "" : " (incomplete)") << (P.CoreManaged ? " (core)" : "")
       << (P.Setup ? " (setup)" : "") << (P.CreditGated ? " (gated)" : "");
    if (P.Repeat != 1)
      OS << " x" << P.Repeat;
    OS << ":";
    for (const WrSlot &S : P.Chain) {
      OS << " [" << S.Key.str() << " " << describe({&S}) << " sig=" << S.Signal;
      if (S.Count != 1)
        OS << " x" << S.Count;
      OS << "]";
    }
    OS << "\n";
  }
  for (const QpCreation &Q : Creations) {
    OS << "qp " << Q.QpKey.str() << " (";
    for (const SlotKey &K : Q.QpNames)
      OS << K.str() << " ";
    OS << ")";
    if (auto V = capValue(A, Q, FieldRole::MaxSendWr))
      OS << " max_send_wr=" << V->str();
    if (Q.SignalAll)
      OS << (*Q.SignalAll ? " signal-all" : " signal-requested");
    RequestCost Cost = requestCost(Q);
    OS << " per-request: " << describe(Cost) << " = " << Cost.Total
       << (Cost.Gated ? " (gated posts left out)" : "") << "\n";
  }
  OS << "per-I/O: " << describe(perIoSlots()) << " drains=" << Drains << "\n";
}

std::vector<const WrSlot *> WorkRequests::perIoSlots() const {
  std::vector<const PostSite *> All;
  for (const PostSite &P : Posts)
    All.push_back(&P);
  std::vector<const WrSlot *> Slots;
  for (const auto &[S, N] : requestCost(All).Slots)
    Slots.push_back(S);
  return Slots;
}

static StringRef opcodeWord(Opcode O) {
  switch (O) {
  case Opcode::Send: return "SEND";
  case Opcode::SendWithInv: return "SEND_WITH_INV";
  case Opcode::RdmaWrite: return "RDMA_WRITE";
  case Opcode::RdmaRead: return "RDMA_READ";
  case Opcode::RdmaReadWithInv: return "RDMA_READ_WITH_INV";
  case Opcode::Atomic: return "ATOMIC";
  case Opcode::LocalInv: return "LOCAL_INV";
  case Opcode::BindMw: return "BIND_MW";
  case Opcode::RegMr: return "REG_MR";
  case Opcode::Other: return "other";
  case Opcode::Unknown: break;
  }
  return "?";
}

static std::string slotWord(const WrSlot &S) {
  if (S.Ops.empty())
    return "?";
  std::string Out;
  for (size_t I = 0; I < S.Ops.size(); ++I)
    Out += (I ? "/" : "") + opcodeWord(S.Ops[I]).str();
  return Out;
}

std::string WorkRequests::describe(llvm::ArrayRef<const WrSlot *> Slots) {
  std::string Out;
  for (const WrSlot *S : Slots)
    Out += (Out.empty() ? "" : ", ") + slotWord(*S);
  return Out;
}

std::string WorkRequests::describe(const RequestCost &Cost) {
  std::string Out;
  for (const auto &[S, N] : Cost.Slots)
    Out += (Out.empty() ? "" : ", ") +
           (N > 1 ? std::to_string(N) + " x " : std::string()) + slotWord(*S);
  return Out;
}

} // namespace ulplint
#undef DEBUG_TYPE
