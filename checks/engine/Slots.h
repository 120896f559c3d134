//===- Slots.h - The identity of tracked storage ----------------*- C++ -*-===//
//
// A slot is storage the analyses follow across statements and functions: a
// function's local (`mr`), a global (`g_mr`), or a field of a struct reached
// through a pointer (`req->mr` in the submit path and in the completion path
// of the same request type is one slot, `nvme_rdma_request.mr`). The key is
// typed: code asks a slot for its scope, never parses its spelling.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_SLOTS_H
#define ULPLINT_ENGINE_SLOTS_H

#include "Flow.h"
#include <string>

namespace ulplint {

/// A struct's tag, or the typedef that names an anonymous one.
std::string recordName(const clang::RecordDecl *RD);

class SlotKey {
public:
  enum class Scope : uint8_t {
    None,   // no storage (a default-constructed key)
    Local,  // a variable of one function, or storage inside it
    Global, // a variable with static storage, or storage inside it
    Field,  // a field of a struct reached through a pointer
  };

  SlotKey() = default;
  /// The slot \p L (already resolved through aliases) names inside \p Fn.
  static SlotKey of(const Location &L, const clang::FunctionDecl *Fn);

  Scope scope() const { return S; }
  bool valid() const { return S != Scope::None; }
  /// Only one function can name it: facts about it stay in that function.
  bool isLocal() const { return S == Scope::Local; }
  /// Code in other functions (and other files) can reach it.
  bool isShared() const { return S == Scope::Global || S == Scope::Field; }
  /// The path goes through an array element: the slot names one of many
  /// objects (`c->s[n].mw`).
  bool isElement() const;
  /// The function a local slot belongs to.
  const clang::FunctionDecl *function() const { return Fn; }
  /// The struct a field slot's path starts in.
  const clang::RecordDecl *record() const;
  /// The variable a local or global slot starts at.
  const clang::ValueDecl *variable() const;
  /// The steps after the variable or struct.
  llvm::ArrayRef<Location::Step> path() const { return Path; }

  /// True when this slot is \p Container or lies inside it.
  bool isWithin(const SlotKey &Container) const;
  /// True when this is a field slot of struct \p RD (at any depth).
  bool isFieldOf(const clang::RecordDecl *RD) const;

  /// Readable and stable across units: "nvme_rdma_request.mr" for a field,
  /// "::g_mr" for a global, "fn::mr" for a local.
  std::string str() const;

  bool operator==(const SlotKey &O) const {
    return S == O.S && Fn == O.Fn && Base == O.Base && Path == O.Path;
  }
  bool operator!=(const SlotKey &O) const { return !(*this == O); }
  bool operator<(const SlotKey &O) const;

private:
  Scope S = Scope::None;
  const clang::FunctionDecl *Fn = nullptr; // Local
  const clang::Decl *Base = nullptr; // VarDecl (Local, Global), RecordDecl (Field)
  llvm::SmallVector<Location::Step, 4> Path; // steps after Base
};

} // namespace ulplint

#endif
