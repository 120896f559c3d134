//===- Slots.cpp - The identity of tracked storage ------------------------===//

#include "Slots.h"
#include "clang/AST/Decl.h"
#include "llvm/ADT/STLExtras.h"

using namespace clang;

namespace ulplint {

/// The index of the first field step of the object reached by the last
/// pointer hop: `req->conn->msg.mr` is the `msg.mr` of some struct ulp_conn,
/// `reqs[i].mr` (reqs a pointer) the `mr` of some request, and the `mr` of
/// a request recovered from `wc->wr_id` the `mr` of some request too.
static std::optional<size_t> sharedStart(const Location &L) {
  QualType T = L.Root->getType();
  bool ThroughPointer = T->isPointerType() || T->isReferenceType() ||
                        isa<ParmVarDecl>(L.Root);
  std::optional<size_t> Start;
  for (size_t I = 0; I < L.Steps.size(); ++I) {
    T = T.getCanonicalType();
    if (L.Steps[I].Field) {
      if (ThroughPointer)
        Start = I;
      T = L.Steps[I].Field->getType();
      // `(struct req *)(uintptr_t)wc->wr_id`: an integer that carries a
      // pointer names some object of the type it is cast to.
      ThroughPointer = T->isPointerType() ||
                       (T->isIntegerType() && I + 1 < L.Steps.size() &&
                        L.Steps[I + 1].Field);
      continue;
    }
    // An element of an array of structs is some struct of that type, as a
    // pointer to it would name it: `q->reqs[i].mw` is the `mw` of some
    // request, the same storage as `r->mw` in a helper given &q->reqs[i].
    if (const auto *PT = T->getAs<PointerType>())
      T = PT->getPointeeType();
    else if (const auto *AT = T->getAsArrayTypeUnsafe())
      T = AT->getElementType();
    ThroughPointer = true;
  }
  return Start;
}

SlotKey SlotKey::of(const Location &L, const FunctionDecl *Fn) {
  SlotKey K;
  if (!L.Root)
    return K;
  std::optional<size_t> Start = sharedStart(L);
  const RecordDecl *RD =
      Start ? L.Steps[*Start].Field->getParent() : nullptr;
  // Anonymous structs have no name other units could share, unless a
  // typedef gives them one (`typedef struct { .. } uct_memh_t;`).
  if (RD && (!RD->getName().empty() || RD->getTypedefNameForAnonDecl())) {
    K.S = Scope::Field;
    K.Base = RD->getCanonicalDecl();
    K.Path.append(L.Steps.begin() + *Start, L.Steps.end());
    return K;
  }
  // A global's storage, through an anonymous struct too (`static struct {
  // ... struct ibv_mr *mr; } cache[N]`: cache[i].mr is one global table).
  const auto *VD = dyn_cast<VarDecl>(L.Root);
  K.S = VD && VD->hasGlobalStorage() ? Scope::Global : Scope::Local;
  K.Fn = K.S == Scope::Local ? Fn : nullptr;
  K.Base = L.Root;
  K.Path = L.Steps;
  return K;
}

bool SlotKey::isElement() const {
  return llvm::any_of(Path, [](const Location::Step &S) { return !S.Field; });
}

const RecordDecl *SlotKey::record() const {
  return S == Scope::Field ? cast<RecordDecl>(Base) : nullptr;
}

const ValueDecl *SlotKey::variable() const {
  return S == Scope::Local || S == Scope::Global ? cast<ValueDecl>(Base) : nullptr;
}

bool SlotKey::isWithin(const SlotKey &C) const {
  if (S != C.S || Fn != C.Fn || Base != C.Base || Path.size() < C.Path.size())
    return false;
  return std::equal(C.Path.begin(), C.Path.end(), Path.begin());
}

bool SlotKey::isFieldOf(const RecordDecl *RD) const {
  return S == Scope::Field && RD && Base == RD->getCanonicalDecl();
}

std::string recordName(const RecordDecl *RD) {
  if (RD->getName().empty())
    if (const TypedefNameDecl *TD = RD->getTypedefNameForAnonDecl())
      return TD->getName().str();
  return RD->getName().str();
}

static std::string pathText(llvm::ArrayRef<Location::Step> Steps) {
  Location L;
  L.Steps.append(Steps.begin(), Steps.end());
  return L.fieldPath();
}

std::string SlotKey::str() const {
  switch (S) {
  case Scope::None:
    return "";
  case Scope::Field:
    return recordName(cast<RecordDecl>(Base)) + "." + pathText(Path);
  case Scope::Global: {
    std::string P = pathText(Path);
    return "::" + cast<NamedDecl>(Base)->getName().str() + (P.empty() ? "" : "." + P);
  }
  case Scope::Local: {
    Location L;
    L.Root = cast<ValueDecl>(Base);
    L.Steps = Path;
    return Fn->getName().str() + "::" + L.str();
  }
  }
  return "";
}

/// Orders declarations by where they are written, so that sets of slots
/// iterate the same way in every run.
static bool declBefore(const Decl *A, const Decl *B) {
  if (A == B || !A || !B)
    return !A && B;
  unsigned LA = A->getLocation().getRawEncoding();
  unsigned LB = B->getLocation().getRawEncoding();
  if (LA != LB)
    return LA < LB;
  return std::less<const Decl *>()(A, B);
}

bool SlotKey::operator<(const SlotKey &O) const {
  if (S != O.S)
    return S < O.S;
  if (Fn != O.Fn)
    return declBefore(Fn, O.Fn);
  if (Base != O.Base)
    return declBefore(Base, O.Base);
  if (Path.size() != O.Path.size())
    return Path.size() < O.Path.size();
  for (size_t I = 0; I < Path.size(); ++I)
    if (Path[I].Field != O.Path[I].Field)
      return declBefore(Path[I].Field, O.Path[I].Field);
  return false;
}

} // namespace ulplint
