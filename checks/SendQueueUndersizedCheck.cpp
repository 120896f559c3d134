//===- SendQueueUndersizedCheck.cpp - rdma-send-queue-undersized ----------===//

#include "SendQueueUndersizedCheck.h"
#include "engine/Program.h"
#include "engine/WorkRequests.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/Decl.h"
#include <map>

using namespace clang;

namespace ulplint {

/// `max_send_wr = a*X + b`: room for `a` work requests per request, with X
/// the requests in flight, and `b` spare entries. A depth that is a named
/// constant (`NBDR_SLOTS + 1`) has a known value as well.
struct SendQueueUndersizedCheck::Capacity {
  int64_t PerRequest = 0;
  int64_t Spare = 0;
  std::string Depth;
  std::optional<int64_t> DepthValue;
  /// No depth at all: a plain number of entries.
  std::optional<int64_t> Total;
};

using Capacity = SendQueueUndersizedCheck::Capacity;

namespace {

std::optional<Capacity> capacityOf(const Linear &V) {
  // Sized from the device's limit or by the core: nothing to compare.
  if (V.Opaque || V.UsesCoreSizing || V.ReadsDeviceLimit)
    return std::nullopt;
  Capacity C;
  C.Spare = V.Const;
  std::vector<const LinearTerm *> Unknown, Named;
  for (const LinearTerm &T : V.Terms) {
    if (!T.Factors.empty() || T.Limit || T.Coef <= 0)
      return std::nullopt; // `factor * depth` with a factor we cannot read
    (T.Value ? Named : Unknown).push_back(&T);
  }
  if (!Unknown.empty()) {
    // Several depths (`credits + 2 * max_mrs`): a request may use each.
    for (const LinearTerm *T : Unknown) {
      C.PerRequest += T->Coef;
      C.Depth += (C.Depth.empty() ? "" : " + ") + T->Symbol;
    }
    for (const LinearTerm *T : Named)
      C.Spare += T->Coef * *T->Value;
    return C;
  }
  if (Named.size() == 1) {
    C.PerRequest = Named.front()->Coef;
    C.Depth = Named.front()->Symbol;
    C.DepthValue = Named.front()->Value;
    C.Total = V.value();
    return C;
  }
  C.Total = V.value();
  return C;
}

/// The request a work request on the stack belongs to: a ULP object its
/// posting function is given (`tqs_detach(struct tqs *t, struct tqs_slot
/// *s)`: the slot, not the connection that holds the QP).
std::vector<const RecordDecl *> requestParams(const TuAnalysis &A,
                                              const WrSlot &S) {
  std::vector<const RecordDecl *> Out;
  for (const auto &[L, F] : S.Names)
    for (const ParmVarDecl *P : F ? F->parameters() : ArrayRef<ParmVarDecl *>())
      if (const auto *PT = P->getType()->getAs<PointerType>())
        if (const RecordDecl *RD = PT->getPointeeType()->getAsRecordDecl())
          if (!A.structOf(P->getType()) && !A.holdsConnection(RD))
            Out.push_back(RD);
  return Out;
}

/// The size of a constant array of \p Request: a global table or a field
/// anywhere in the unit, or only a field of \p In when given (`struct
/// tqs_slot slots[TQS_SLOTS]` in the connection that holds the QP).
std::optional<int64_t> arrayOf(const TuAnalysis &A, const RecordDecl *Request,
                               const RecordDecl *In = nullptr) {
  auto ArrayOfRequests = [&](QualType FT) -> std::optional<int64_t> {
    if (const auto *CAT = dyn_cast<ConstantArrayType>(FT.getCanonicalType()))
      if (const RecordDecl *E = CAT->getElementType()->getAsRecordDecl())
        if (E->getCanonicalDecl() == Request->getCanonicalDecl())
          return CAT->getSize().getSExtValue();
    return std::nullopt;
  };
  for (const Decl *D : A.context().getTranslationUnitDecl()->decls()) {
    if (const auto *VD = dyn_cast<VarDecl>(D); VD && !In)
      if (auto N = ArrayOfRequests(VD->getType()))
        return N;
    if (const auto *RD = dyn_cast<RecordDecl>(D))
      if (RD->isThisDeclarationADefinition() &&
          (!In || RD->getCanonicalDecl() == In->getCanonicalDecl()))
        for (const FieldDecl *FD : RD->fields())
          if (auto N = ArrayOfRequests(FD->getType()))
            return N;
  }
  return std::nullopt;
}

/// The number of requests that can be in flight when the code bounds it
/// with an array: the slots live in `slots[64]`, or the request struct is
/// kept in `struct dfsc_call calls[128]`.
std::optional<int64_t> requestArrayBound(const TuAnalysis &A,
                                         const QpCreation &Q,
                                         const RequestCost &Cost) {
  for (const auto &[S, N] : Cost.Slots) {
    const SlotKey &K = S->Key.Storage;
    // An array on the way to the work request (not the WR array itself).
    QualType T;
    if (const ValueDecl *VD = K.variable())
      T = VD->getType();
    auto Path = K.path();
    for (size_t I = 0; I + 1 < Path.size(); ++I) {
      if (Path[I].Field) {
        T = Path[I].Field->getType();
        continue;
      }
      if (T.isNull())
        break;
      if (const auto *CAT = dyn_cast<ConstantArrayType>(T.getCanonicalType()))
        return CAT->getSize().getSExtValue();
      break;
    }
    // An array of the request struct itself, anywhere in the unit; for a
    // request given to the posting function, in the connection.
    if (const RecordDecl *Request = K.record()) {
      if (std::optional<int64_t> N = arrayOf(A, Request))
        return N;
      continue;
    }
    if (const RecordDecl *Conn = Q.QpKey.record())
      for (const RecordDecl *Request : requestParams(A, *S))
        if (std::optional<int64_t> N = arrayOf(A, Request, Conn))
          return N;
  }
  return std::nullopt;
}

std::string drainText(const CallExpr *Drain) {
  const FunctionDecl *F = Drain ? Drain->getDirectCallee() : nullptr;
  return F ? F->getName().str() + "()" : "ib_drain_qp()";
}

} // namespace

void SendQueueUndersizedCheck::checkUnit(const TuAnalysis &A) {
  const WorkRequests &W = WorkRequests::of(A);
  for (const QpCreation &Q : W.creations()) {
    if (Q.CoreManaged)
      continue;
    checkReceiveDrain(A, W, Q);
    auto Store = Q.Caps.find(FieldRole::MaxSendWr);
    std::optional<Linear> Size = capValue(A, Q, FieldRole::MaxSendWr);
    if (Store == Q.Caps.end() || !Size)
      continue;
    std::optional<Capacity> Cap = capacityOf(*Size);
    if (!Cap)
      continue;
    RequestCost Cost = W.requestCost(Q);
    SourceLocation At = Store->second->Spelling->getBeginLoc();
    if (Cost.Total && checkLocal(A, W, Q, *Size, *Cap, Cost, At))
      continue;
    if (Cost.Gated && !Cost.Total)
      continue; // this unit's posts keep within the queue themselves
    checkProgram(A, W, Q, *Size, *Cap);
  }
}

/// Reports what this unit's own posts prove; true when it reported.
bool SendQueueUndersizedCheck::checkLocal(const TuAnalysis &A,
                                          const WorkRequests &W,
                                          const QpCreation &Q,
                                          const Linear &Size,
                                          const Capacity &Cap,
                                          const RequestCost &Cost,
                                          SourceLocation At) {
  int64_t C = Cost.Total;
  std::string Posts = std::to_string(C) + " WR" + (C == 1 ? "" : "s") + " (" +
                      WorkRequests::describe(Cost) + ")";
  const CallExpr *Drain = W.sendDrain(Q);
  // With a bound on the requests in flight, compare entries.
  std::optional<int64_t> Requests =
      Cap.Total ? requestArrayBound(A, Q, Cost) : std::nullopt;
  if (Cap.Total && Requests) {
    int64_t Needed = C * *Requests;
    if (Needed > *Cap.Total) {
      report(A, At,
             "each request posts up to " + Posts + " and up to " +
                 std::to_string(*Requests) +
                 " requests can be in flight, " + std::to_string(Needed) +
                 " entries, but max_send_wr is " + Size.str() +
                 "; the send queue overflows and posts fail");
      notePosts(A, Cost);
      return true;
    }
    if (Drain && Needed == *Cap.Total) {
      reportDrain(A, At, Size.str() + ", exactly the " + std::to_string(Needed) +
                             " entries of " + std::to_string(*Requests) +
                             " requests in flight", Drain);
      return true;
    }
    return false;
  }
  // `max_send_wr = SQ_DEPTH` alone counts entries, not requests: without a
  // bound on the requests in flight there is nothing to compare with.
  bool BareConstant = Cap.Total && Cap.PerRequest == 1 && Cap.Spare == 0;
  if (!Cap.PerRequest || BareConstant)
    return false;
  if (C > Cap.PerRequest) {
    report(A, At,
           "each request posts up to " + Posts + " but max_send_wr is " +
               Size.str() + "; with " + Cap.Depth +
               " requests in flight the send queue overflows and posts fail");
    notePosts(A, Cost);
    return true;
  }
  if (Drain && C == Cap.PerRequest && Cap.Spare <= 0) {
    reportDrain(A, At,
                Size.str() + ", exactly the " + std::to_string(C) +
                    " per request for " + Cap.Depth + " requests",
                Drain);
    return true;
  }
  return false;
}

/// The posts are in other files of the ULP: what they export decides.
void SendQueueUndersizedCheck::checkProgram(const TuAnalysis &A,
                                            const WorkRequests &W,
                                            const QpCreation &Q,
                                            const Linear &Size,
                                            const Capacity &Cap) {
  if (!Cap.PerRequest || !Q.QpKey.isShared() || Cap.Total)
    return;
  std::string Qp = Q.QpKey.str();
  unsigned Room = static_cast<unsigned>(Cap.PerRequest);
  reportIfProgram(
      A, Q.Call->Call->getBeginLoc(),
      "max_send_wr is " + Size.str() + ", room for " + std::to_string(Room) +
          " work request" + (Room == 1 ? "" : "s") +
          " per request, but other files of this ULP post more per request "
          "on this QP; with " + Cap.Depth +
          " requests in flight the send queue overflows and posts fail",
      {WorkRequests::costFact(Qp, Room + 1)}, {});
  const CallExpr *Drain = W.sendDrain(Q);
  if (Drain && Cap.Spare <= 0)
    reportIfProgram(
        A, Drain->getBeginLoc(),
        "the send queue of this QP (max_send_wr " + Size.str() +
            ") is filled by the " + std::to_string(Room) +
            " work requests per request other files of this ULP post, and "
            "leaves no entry for " + drainText(Drain) +
            ": on a full queue it cannot post its drain work request, warns "
            "and returns without draining",
        {WorkRequests::costFact(Qp, Room)}, {WorkRequests::costFact(Qp, Room + 1)});
}

void SendQueueUndersizedCheck::reportDrain(const TuAnalysis &A,
                                           SourceLocation At,
                                           const std::string &What,
                                           const CallExpr *Drain) {
  report(A, At,
         "max_send_wr is " + What + ", and leaves no entry for " +
             drainText(Drain) +
             ": on a full send queue it cannot post its drain work request, "
             "warns and returns without draining, and the QP is destroyed "
             "with work requests in flight");
  note(A, Drain->getBeginLoc(), "drained here");
}

/// Do \p X and \p Y count the same, named constants taken at their value
/// (`conn->depth + OS_EXTRA` with OS_EXTRA 0 is `conn->depth`)?
static bool sameCount(const Linear &X, const Linear &Y) {
  auto Folded = [](const Linear &L) {
    std::map<std::string, int64_t> Terms;
    int64_t Const = L.Const;
    for (const LinearTerm &T : L.Terms) {
      if (T.Value)
        Const += T.Coef * *T.Value;
      else
        Terms[T.Symbol] += T.Coef;
    }
    for (auto It = Terms.begin(); It != Terms.end();)
      It = It->second ? std::next(It) : Terms.erase(It);
    return std::make_pair(Const, Terms);
  };
  return Folded(X) == Folded(Y);
}

/// ib_drain_qp() / ib_drain_rq() post a receive too: a receive queue
/// exactly as deep as the receives kept posted has no room for it.
void SendQueueUndersizedCheck::checkReceiveDrain(const TuAnalysis &A,
                                                 const WorkRequests &W,
                                                 const QpCreation &Q) {
  const CallExpr *Drain = W.recvDrain(Q);
  auto Store = Q.Caps.find(FieldRole::MaxRecvWr);
  if (!Drain || Store == Q.Caps.end())
    return;
  std::optional<Linear> Size = capValue(A, Q, FieldRole::MaxRecvWr);
  std::optional<Linear> Posted = W.postedReceives(Q);
  if (!Size || !Posted || Size->Opaque || Posted->Opaque)
    return;
  if (!sameCount(*Size, *Posted))
    return;
  report(A, Store->second->Spelling->getBeginLoc(),
         "max_recv_wr is " + Size->str() +
             ", exactly the receives kept posted, and leaves no entry for " +
             drainText(Drain) +
             ": on a full receive queue it cannot post its drain work "
             "request, warns and returns without draining");
  note(A, Drain->getBeginLoc(), "drained here");
}

void SendQueueUndersizedCheck::notePosts(const TuAnalysis &A,
                                         const RequestCost &Cost) {
  for (const auto &[S, N] : Cost.Slots)
    if (S->Loc.isValid())
      note(A, S->Loc, "work request built here");
}

} // namespace ulplint
