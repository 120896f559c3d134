//===- Rules.h - The embedded rule catalog and API models -------*- C++ -*-===//
//
// Knowledge lives in rules/*.yaml; this is the typed view of it. The
// vocabulary (effects, opcodes, roles) is code because the analyses interpret
// it; which function, enumerator or field has which meaning is data.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_ENGINE_RULES_H
#define ULPLINT_ENGINE_RULES_H

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ulplint {

enum class Domain { Userspace, Kernel, Regcore };

/// The vocabulary of the API models (Vocabulary.def).
enum class StructRole {
#define STRUCT_ROLE(Id, Name) Id,
#include "Vocabulary.def"
};
enum class FieldRole {
#define FIELD_ROLE(Id, Name) Id,
#include "Vocabulary.def"
};
enum class ArgRole {
#define ARG_ROLE(Id, Name) Id,
#include "Vocabulary.def"
};
enum class Flag {
#define FLAG(Id, Family, Name) Id,
#include "Vocabulary.def"
};
/// What replaces hand-written registration, by the role of the code
/// (rules/api/*.yaml, `migration`).
enum class MigrationKey {
  Expose,
  DataTransfer,
  Local,
  QueueSizing,
  RemoteInvalidation,
  DatapathRegistration,
  TransportFlags,  // access rights chosen by inline transport tests
  QueueFactor,     // a queue depth multiplied by a hand-made factor
  QueueFactorNote,
  GlobalRkey,      // IB_PD_UNSAFE_GLOBAL_RKEY
};
/// How code uses a linked list (rules/api/*.yaml, `list_*_macros`).
enum class ListUse { None, Take, Walk };
/// Fix-it templates (rules/api/*.yaml, `fixits`); placeholders in braces.
enum class FixTemplate {
  RotateKey,    // {mr}: rotate a fast-registration MR's key
  NewWindowKey, // {mw}: the next key of a memory window
};

/// rdma-registration-in-datapath's rewrite into a registration cache
/// (rules/api/*.yaml, `cache_rewrite`).
struct CacheRewrite {
  std::string Register, Deregister; // the calls rewritten
  std::string HandleType;           // record the handle points to
  std::string CacheType;            // record of the cache the new calls need
  std::string NewHandleType;
  std::string Get, Put;             // templates: {core} {addr} {length} {access} {handle}
};

/// Replaces each `{name}` in \p Template by its value in \p Values.
std::string expandTemplate(
    llvm::StringRef Template,
    llvm::ArrayRef<std::pair<llvm::StringRef, std::string>> Values);

llvm::StringRef structRoleName(StructRole R);
llvm::StringRef fieldRoleName(FieldRole R);
llvm::StringRef argRoleName(ArgRole R);
llvm::StringRef migrationKeyName(MigrationKey K);
/// A field that holds a device limit (max_qp_wr, max_sge, ...).
bool isDeviceLimit(FieldRole R);

/// What a call does. Names in the YAML: see effectName().
enum class Effect {
  None,
  MrRegister,    // returns an MR valid at once with the given access
  MrReregister,  // changes an MR's access
  MrDeregister,
  MrAlloc,       // allocates a fast-registration MR (no rights until REG_MR)
  MrMap,         // maps pages into an allocated MR
  MrPoolInit,
  MrPoolGet,
  MrPoolPut,
  MrPoolDestroy,
  MwAlloc,
  MwDealloc,
  MwBind,        // ibv_bind_mw: type-1 window bind through the QP
  RkeyRotate,    // ib_update_fast_reg_key
  RkeyIncrement, // ib_inc_rkey / ibv_inc_rkey
  PdAlloc,
  PostSend,
  PostRecv,
  PostCm,        // librdmacm rdma_post_* helpers: build and post one WR
  WrxStart,
  WrxOp,
  WrxSge,
  WrxComplete,
  WrxAbort,
  QpCreate,
  QpDrain,        // ib_drain_qp: one WR through each of the SQ and RQ
  QpDrainSq,      // ib_drain_sq: one WR through the send queue
  QpDrainRq,      // ib_drain_rq: one WR through the receive queue
  DeviceQuery,
  TransportQuery,   // true on iWARP (rdma_protocol_iwarp)
  TransportQueryIb, // true on InfiniBand/RoCE only (rdma_protocol_ib)
  DmaMap,
  DmaUnmap,
  BufferAlloc,      // malloc(), kzalloc(): fresh memory, no handles in it yet
  BufferFree,
  ContainerRecycle, // list_add(&req->node, &free_list)
  WaitCompletion,
  WaitCompletionTimeout, // 0 when the wait gave up
  CqPoll,           // ibv_poll_cq, ib_poll_cq: reaps completions (the data path)
  RwInit,
  RwWrs,
  RwPost,
  RwDestroy,
  RwMrFactor,
  RwMaxSendWr,
  CoreAccessFlags,
  CoreRegInit,
  CoreRegRelease,
  CoreMrGet,
  CoreMrPut,
  WcReadFlags,      // ibv_wc_read_wc_flags(): the current completion's flags
  WcReadInvalidatedRkey,
  WcReadOpcode,
  MemoryZero,       // memset(&x, 0, ...)
  ErrorPointerTest, // IS_ERR(p): true on the failure branch
  ErrorPointerValue, // PTR_ERR(p): reads the error code, keeps nothing
  CounterRead,      // atomic_read(&c): reads an integer, changes nothing
  CounterSet,       // atomic_set(&c, v)
  CounterAdd,       // atomic_inc(&c), atomic_add(n, &c): moves it up
  CounterSub,       // atomic_dec(&c), atomic_sub(n, &c): moves it down
};

/// What a work request does, independent of the API's spelling.
enum class Opcode {
  Unknown,
  Send,
  SendWithInv,
  RdmaWrite,
  RdmaRead,
  RdmaReadWithInv,
  Atomic,
  LocalInv,
  BindMw,
  RegMr,
  Other,
};

llvm::StringRef effectName(Effect E);
llvm::StringRef opcodeName(Opcode O);

struct FunctionModel {
  std::string Name;
  Domain D = Domain::Userspace;
  Effect E = Effect::None;
  Opcode Op = Opcode::Unknown;
  bool CoreManaged = false;
  std::map<ArgRole, unsigned> Args; // role -> argument index
  std::vector<Flag> ImplicitAccess; // access flags the call adds by itself
  std::optional<StructRole> Returns;

  std::optional<unsigned> arg(ArgRole Role) const;
};

struct StructModel {
  std::string Name;
  Domain D = Domain::Userspace;
  StructRole Role = StructRole::Mr;
  std::string Base; // embedded base member, e.g. "wr" in ib_reg_wr
  std::map<std::string, FieldRole> Fields; // dotted path -> role

  /// The dotted path of the field with \p R ("ex.invalidate_rkey"), or empty.
  llvm::StringRef pathOf(FieldRole R) const;
};

/// One API surface (userspace verbs, kernel verbs, regcore).
struct DomainModel {
  Domain D = Domain::Userspace;
  /// The enumerator that spells each flag in this API.
  std::map<Flag, std::string> Flags;
  std::map<std::string, std::string> Opcodes; // enumerator -> opcode name
  std::map<std::string, Opcode> CompletionOpcodes; // IB_WC_LOCAL_INV -> LocalInv
  std::vector<std::string> TransportConstants;
  std::vector<std::string> IbConstants;
  /// Capability bits only InfiniBand/RoCE devices have (ODP).
  std::vector<std::string> IbOnlyCapabilities;
  /// Macros that take an entry off a linked list (list_first_entry), and
  /// macros that walk one (list_for_each_entry).
  std::vector<std::string> ListTakeMacros, ListWalkMacros;
  /// Calls that move a whole list onto another (`list_splice_init`).
  std::vector<std::string> ListMoveCalls;
  /// Words that name a release in a function-pointer field
  /// (`page_release`, `ops->free`): calling it hands its object back.
  std::vector<std::string> ReleaseCallbackWords;
  /// Calls that take send-queue credits and report whether there were
  /// enough (`atomic_dec_return`), with the argument that says how many
  /// (none: one).
  std::map<std::string, std::optional<unsigned>> CreditTakeCalls;
  std::map<FieldRole, int64_t> PortableCaps;
  /// What replaces hand-written registration (see rules/api/*.yaml,
  /// `migration`).
  std::map<MigrationKey, std::string> Migration;
  /// Record names of connection-lifetime objects (QP, CQ, PD, cm_id, ...).
  std::vector<std::string> ConnectionTypes;
  std::map<FixTemplate, std::string> Fixits;
  std::optional<CacheRewrite> Cache;
  /// The ib_qp field rdma_rw takes its MRs from ("rdma_mrs").
  std::string RwMrPool;
  /// Files that implement this API (a regular expression on the path).
  std::string CoreFiles;
};

struct RuleInfo {
  std::string Name;
  std::string Severity; // error | warning | note
  std::string Category;
  std::string Summary;
  std::string Rationale;
  std::string Fix;
  std::string Doc;
};

struct CompileFlagRules {
  std::vector<std::string> Drop;
  std::vector<std::string> DropPrefix;
  std::vector<std::string> DropWithValue;
  std::vector<std::string> Add;
};

/// The parsed rules/ directory. Immutable and shared by all threads.
/// A ULP the migration report names (rules/ulps.yaml).
struct UlpPattern {
  std::string Name;
  std::string Path; // extended regex on the path relative to the source root
};
struct UlpMap {
  std::vector<UlpPattern> Ulps;
  std::map<std::string, unsigned> Effort; // site kind -> points
  std::map<std::string, unsigned> EffortScale; // small, medium
};

class Rules {
public:
  /// The rules embedded at build time. Aborts with a message if the embedded
  /// YAML is malformed (a build defect the test suite catches).
  static const Rules &embedded();
  /// Parses rule files from memory; used by embedded() and by tests of
  /// malformed input.
  static llvm::Expected<std::unique_ptr<Rules>>
  parse(llvm::ArrayRef<std::pair<std::string, std::string>> NamedFiles);

  /// A YAML list of {name, path} ULP patterns (`ulplint report --ulp-map`).
  static llvm::Expected<std::vector<UlpPattern>>
  parseUlpList(llvm::StringRef Text);

  const FunctionModel *function(llvm::StringRef Name) const;
  const StructModel *structure(llvm::StringRef RecordName) const;
  /// The first struct of \p D with role \p R (ib_wc for Wc in the kernel).
  const StructModel *structure(Domain D, StructRole R) const;
  const DomainModel &domain(Domain D) const;
  /// Semantic opcode of a WR opcode enumerator of any domain.
  std::optional<Opcode> opcodeOf(llvm::StringRef Enumerator) const;
  /// The flag an enumerator such as IBV_ACCESS_LOCAL_WRITE spells.
  std::optional<Flag> flagOf(llvm::StringRef Enumerator) const;
  /// Spelling of a flag in a domain, e.g. (Kernel, LocalWrite) ->
  /// IB_ACCESS_LOCAL_WRITE.
  llvm::StringRef flagName(Domain D, Flag F) const;
  /// What completed, for a completion opcode enumerator (IB_WC_LOCAL_INV).
  std::optional<Opcode> completionOpcodeOf(llvm::StringRef Enumerator) const;
  /// The enumerator that spells \p Op in \p D (IB_WR_REG_MR), or empty.
  llvm::StringRef opcodeEnumerator(Domain D, Opcode Op) const;
  /// The CoreFiles of every API, as one regular expression.
  std::string coreFiles() const;
  bool isTransportConstant(llvm::StringRef Enumerator) const;
  bool isIbConstant(llvm::StringRef Enumerator) const;
  /// What the list macro \p Macro does to the list it is given.
  ListUse listMacro(llvm::StringRef Macro) const;
  /// Does \p Callee move a whole list onto another (`list_splice_init`)?
  bool isListMove(llvm::StringRef Callee) const;
  /// Does a function-pointer field of this name release what it is given
  /// (one of its `_`-separated words is a release_callback_words entry)?
  bool isReleaseCallback(llvm::StringRef Field) const;
  /// For a call that takes credits from a counter (credit_take_calls): the
  /// argument with the amount, or none when it takes one. Not such a call:
  /// nullopt.
  std::optional<std::optional<unsigned>> creditTake(llvm::StringRef Callee) const;
  bool isIbOnlyCapability(llvm::StringRef Enumerator) const;

  const std::vector<RuleInfo> &catalog() const { return Catalog; }
  const RuleInfo *rule(llvm::StringRef CheckName) const;
  const CompileFlagRules &compileFlags() const { return Flags; }
  const UlpMap &ulps() const { return Ulps; }
  const std::vector<FunctionModel> &functions() const { return Functions; }

private:
  std::vector<FunctionModel> Functions;
  llvm::StringMap<size_t> FunctionIndex; // name or match alias -> Functions
  std::vector<StructModel> Structs;
  llvm::StringMap<size_t> StructIndex;
  std::vector<DomainModel> Domains; // indexed by Domain
  llvm::StringMap<Opcode> OpcodeIndex;
  llvm::StringMap<Flag> FlagIndex;
  std::vector<RuleInfo> Catalog;
  CompileFlagRules Flags;
  UlpMap Ulps;

  friend struct RulesBuilder;
};

} // namespace ulplint

#endif
