//===- WorkRequests.cpp - Work requests, posts and queue pairs ------------===//

#include "WorkRequests.h"
#include "Program.h"
#include "Sites.h"
#include "clang/AST/ASTContext.h"
#include "llvm/Support/Debug.h"
#include <map>
#include <set>

using namespace clang;

#define DEBUG_TYPE "ulplint-wr"

namespace ulplint {

std::string WrKey::str() const {
  if (Api)
    return Fn->getName().str() + "::" + Api->Name;
  return Storage.str();
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

namespace {

using Name = std::pair<Location, const FunctionDecl *>;

/// Builds the chains of work requests posts may submit.
class ChainBuilder {
public:
  explicit ChainBuilder(const TuAnalysis &A) : A(A) {}

  /// The alternatives for the work request an expression names.
  void roots(const Expr *E, const FunctionDecl *F, unsigned Depth,
             std::vector<WrSlot> &Out, bool &Complete) {
    E = stripExpr(E);
    if (!E || Depth > 6) {
      Complete = false;
      return;
    }
    if (E->isNullPointerConstant(const_cast<ASTContext &>(A.context()),
                                 Expr::NPC_ValueDependentIsNotNull))
      return; // no work request on this path
    if (const auto *CO = dyn_cast<ConditionalOperator>(E)) {
      roots(CO->getTrueExpr(), F, Depth + 1, Out, Complete);
      roots(CO->getFalseExpr(), F, Depth + 1, Out, Complete);
      return;
    }
    std::optional<Location> L = locationOf(E);
    if (!L) {
      Complete = false;
      return;
    }
    Location R = A.flow(F).resolve(*L);
    const auto *VD = dyn_cast_or_null<VarDecl>(R.Root);
    bool PointerVar = R.Steps.empty() && VD && VD->getType()->isPointerType() &&
                      !isa<UnaryOperator>(E);
    if (!PointerVar) {
      WrSlot S;
      S.Names.push_back({R, F});
      Out.push_back(std::move(S));
      return;
    }
    // A pointer variable: the work requests it may point at.
    for (const Def *D : A.flow(F).reaching(R, E)) {
      if (D && D->K == Def::Assign && D->Value) {
        roots(D->Value, F, Depth + 1, Out, Complete);
        continue;
      }
      const auto *P = dyn_cast<ParmVarDecl>(VD);
      if (D || !P) {
        Complete = false;
        continue;
      }
      // A helper's parameter: what its callers in this unit pass.
      size_t Before = Out.size();
      if (!fromCallers(F, P, Depth, Out, Complete))
        Complete = false;
      for (size_t I = Before; I < Out.size(); ++I)
        Out[I].Names.push_back({R, F});
    }
  }

  /// The longest chain starting at \p Slot.
  std::vector<WrSlot> follow(WrSlot Slot, bool &Complete,
                             std::set<WrKey> &Seen, unsigned Depth) {
    describe(Slot);
    std::vector<WrSlot> Chain;
    if (Depth > 16 || !Seen.insert(Slot.Key).second) {
      Complete = false;
      return Chain;
    }
    std::vector<WrSlot> Best;
    for (const FieldStore *Next : stores(Slot, FieldRole::Next)) {
      if (!Next->Value)
        continue;
      std::vector<WrSlot> Alternatives;
      roots(Next->Value, Next->Fn, 0, Alternatives, Complete);
      for (WrSlot &Alt : Alternatives) {
        std::set<WrKey> Branch = Seen;
        std::vector<WrSlot> Rest = follow(Alt, Complete, Branch, Depth + 1);
        if (Rest.size() > Best.size())
          Best = std::move(Rest);
      }
    }
    Chain.push_back(std::move(Slot));
    Chain.insert(Chain.end(), Best.begin(), Best.end());
    return Chain;
  }

  /// Opcodes, signaling and identity of a slot.
  void describe(WrSlot &S) {
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
    for (const FieldStore *Op : stores(S, FieldRole::Opcode)) {
      for (Opcode O : opcodesOf(A, *Op))
        if (!S.mayBe(O))
          S.Ops.push_back(O);
      if (S.Loc.isInvalid())
        S.Loc = Op->Spelling->getBeginLoc();
    }
    S.Signal = signalOf(S);
  }

  std::vector<const FieldStore *> stores(const WrSlot &S, FieldRole Role) {
    return slotStores(A, S, Role);
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

private:
  uint64_t signaledBit() const {
    return A.flagBit(Flag::Signaled);
  }

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

  bool fromCallers(const FunctionDecl *F, const ParmVarDecl *P, unsigned Depth,
                   std::vector<WrSlot> &Out, bool &Complete) {
    bool Any = false;
    for (const FunctionDecl *Caller : A.functions())
      for (const CallExpr *CE : A.callsTo(Caller, F)) {
        unsigned Index = P->getFunctionScopeIndex();
        if (Index < CE->getNumArgs()) {
          roots(CE->getArg(Index), Caller, Depth + 1, Out, Complete);
          Any = true;
        }
      }
    return Any && F->isStatic();
  }

  WrSlot::SignalKind signalOf(WrSlot &S) {
    std::vector<const FieldStore *> Flags = stores(S, FieldRole::SendFlags);
    if (Flags.empty() || !signaledBit())
      return WrSlot::Unknown;
    FlagSet All;
    for (const FieldStore *FS : Flags) {
      S.Flags = FS;
      All.add(A.values(FS->Fn).flagsAfter(A.flow(FS->Fn).resolve(FS->Target),
                                          FS->At));
    }
    return classify(All);
  }

  const TuAnalysis &A;
};

/// What the extended API posts between ibv_wr_start and ibv_wr_complete.
void addExtendedPosts(const TuAnalysis &A, std::vector<PostSite> &Posts) {
  uint64_t Bit = A.flagBit(Flag::Signaled);
  for (const ApiCall &Complete : A.calls()) {
    if (Complete.Model->E != Effect::WrxComplete)
      continue;
    PostSite P;
    P.Call = &Complete;
    P.Fn = Complete.Caller;
    P.Qp = Complete.arg(ArgRole::Qp);
    // wr_flags stored on the extended QP in this function decide signaling.
    WrSlot::SignalKind Signal = WrSlot::Unknown;
    for (const FieldStore &FS : A.stores())
      if (FS.Fn == P.Fn && FS.Role == FieldRole::SendFlags &&
          FS.Struct->Role == StructRole::QpEx) {
        FlagSet V = A.values(FS.Fn).flagsAfter(A.flow(FS.Fn).resolve(FS.Target),
                                               FS.At);
        bool Some = llvm::any_of(V.Alts, [&](const FlagAlt &F) {
          return F.mayHave(Bit);
        });
        Signal = Some ? WrSlot::Sometimes : WrSlot::Never;
      }
    for (const ApiCall &Op : A.calls()) {
      if (Op.Caller != P.Fn || Op.Model->E != Effect::WrxOp)
        continue;
      WrSlot S;
      S.Key.Fn = P.Fn;
      S.Key.Api = Op.Model;
      S.Ops.push_back(Op.Model->Op);
      S.Signal = Signal;
      S.Loc = Op.Call->getBeginLoc();
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
  S.Ops.push_back(C.Model->Op);
  S.Loc = C.Call->getBeginLoc();
  if (const Expr *Flags = C.arg(ArgRole::SendFlags)) {
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
        E = stripExpr(D->Value);
  }
  for (const ApiCall &C : A.calls())
    if (C.Call == E && C.Model->E == Effect::RwWrs)
      return &C;
  return nullptr;
}

} // namespace

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
      if (C.Model->E == Effect::RwPost) {
        P.CoreManaged = true;
        P.CoreSignals = !C.arg(ArgRole::Cqe) ||
                        !C.arg(ArgRole::Cqe)->isNullPointerConstant(
                            const_cast<ASTContext &>(A.context()),
                            Expr::NPC_ValueDependentIsNotNull);
        Wr = C.arg(ArgRole::ChainWr);
      } else if (const ApiCall *Core = coreChain(A, Wr, C.Caller)) {
        P.CoreManaged = true;
        Wr = Core->arg(ArgRole::ChainWr);
        P.CoreSignals = true;
      }
      if (Wr) {
        std::vector<WrSlot> Roots;
        Chains.roots(Wr, C.Caller, 0, Roots, P.Complete);
        for (WrSlot &Root : Roots) {
          std::set<WrKey> Seen;
          std::vector<WrSlot> Chain = Chains.follow(Root, P.Complete, Seen, 0);
          if (Chain.size() > P.Chain.size())
            P.Chain = std::move(Chain);
        }
        for (WrSlot &S : P.Chain)
          Chains.signalAtPost(S, P);
      }
      Posts.push_back(std::move(P));
      break;
    }
    case Effect::PostCm:
      Posts.push_back(cmPost(A, C));
      break;
    case Effect::QpDrain:
      ++Drains;
      break;
    default:
      break;
    }
  }
  addExtendedPosts(A, Posts);
  exportFacts();
  LLVM_DEBUG(dump(llvm::dbgs()));

  for (const ApiCall &C : A.calls()) {
    if (C.Model->E != Effect::QpCreate)
      continue;
    QpCreation Q;
    Q.Call = &C;
    Q.Fn = C.Caller;
    Q.CoreManaged = C.Model->CoreManaged;
    std::optional<Location> Attr;
    if (const Expr *E = C.arg(ArgRole::Attr))
      Attr = locationOf(E);
    for (const FieldStore &FS : A.stores()) {
      if (!Attr || FS.Struct->Role != StructRole::QpInitAttr ||
          !A.sameStorage(FS.Object, FS.Fn, *Attr, C.Caller))
        continue;
      // The store in the creating function wins over ones elsewhere.
      const FieldStore *&Slot = Q.Caps[FS.Role];
      if (!Slot || FS.Fn == C.Caller)
        Slot = &FS;
    }
    for (FieldRole Role : {FieldRole::SqSigAll, FieldRole::SqSigType}) {
      auto It = Q.Caps.find(Role);
      if (It == Q.Caps.end())
        continue;
      Q.SignalStore = It->second;
      std::optional<int64_t> V = A.values(It->second->Fn).constant(It->second->Value);
      if (!V)
        continue;
      if (Role == FieldRole::SqSigAll)
        Q.SignalAll = *V != 0;
      else
        Q.SignalAll = A.enumValue(A.rules().flagName(Domain::Kernel, Flag::SignalAll)) == V;
    }
    Creations.push_back(std::move(Q));
  }
}

static bool isRegistration(const WrSlot &S) {
  return S.mayBe(Opcode::RegMr) || S.mayBe(Opcode::LocalInv) ||
         S.mayBe(Opcode::BindMw);
}

bool WorkRequests::postsRegistrations() const {
  for (const PostSite &P : Posts)
    for (const WrSlot &S : P.Chain)
      if (isRegistration(S))
        return true;
  return false;
}

bool WorkRequests::mayRequestCompletion() const {
  for (const PostSite &P : Posts) {
    if (P.CoreSignals || !P.Complete)
      return true;
    for (const WrSlot &S : P.Chain)
      if (S.Signal != WrSlot::Never)
        return true;
  }
  return false;
}

/// What other files of the ULP may need to know about this one's posts.
void WorkRequests::exportFacts() const {
  if (Posts.empty())
    return;
  std::string Ulp = Program::of(A).key();
  Program::of(A).exportFact(factKey(FactKind::Posts, Ulp));
  if (postsRegistrations())
    Program::of(A).exportFact(factKey(FactKind::PostsRegistration, Ulp));
  if (mayRequestCompletion())
    Program::of(A).exportFact(factKey(FactKind::Signals, Ulp));
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
    OS << "post in " << P.Fn->getName() << (P.Complete ? "" : " (incomplete)")
       << (P.CoreManaged ? " (core)" : "") << ":";
    for (const WrSlot &S : P.Chain)
      OS << " [" << S.Key.str() << " " << describe({&S}) << " sig=" << S.Signal
         << "]";
    OS << "\n";
  }
  OS << "per-I/O: " << describe(perIoSlots()) << " drains=" << Drains << "\n";
}

std::vector<const WrSlot *> WorkRequests::perIoSlots() const {
  // A request sends one message (the longest chain a post submits) and
  // needs the registrations and invalidations posted anywhere for it.
  const PostSite *Longest = nullptr;
  for (const PostSite &P : Posts)
    if (!Longest || P.Chain.size() > Longest->Chain.size())
      Longest = &P;
  std::vector<const WrSlot *> Slots;
  std::set<WrKey> Seen;
  if (Longest)
    for (const WrSlot &S : Longest->Chain)
      if (Seen.insert(S.Key).second)
        Slots.push_back(&S);
  for (const PostSite &P : Posts)
    for (const WrSlot &S : P.Chain)
      if (isRegistration(S) && Seen.insert(S.Key).second)
        Slots.push_back(&S);
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

std::string WorkRequests::describe(llvm::ArrayRef<const WrSlot *> Slots) {
  std::string Out;
  for (const WrSlot *S : Slots) {
    if (!Out.empty())
      Out += ", ";
    if (S->Ops.empty()) {
      Out += "?";
      continue;
    }
    for (size_t I = 0; I < S->Ops.size(); ++I)
      Out += (I ? "/" : "") + opcodeWord(S->Ops[I]).str();
  }
  return Out;
}

} // namespace ulplint
#undef DEBUG_TYPE
