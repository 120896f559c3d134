//===- Rules.cpp - Parse the embedded rules/ YAML -------------------------===//

#include "Rules.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/YAMLTraits.h"

namespace ulplint {
namespace {

struct EmbeddedRuleFile {
  const char *Path;
  const char *Text;
};
#include "EmbeddedRules.inc"

// Raw YAML shapes, mapped 1:1 from the files.
struct RawFunction {
  std::string Name;
  std::vector<std::string> Match;
  std::string Effect = "none";
  std::string Opcode;
  bool Core = false;
  std::map<std::string, unsigned> Args;
  std::vector<std::string> ImplicitAccess;
  std::string Returns;
};
struct RawStruct {
  std::string Name, Role, Base;
  std::map<std::string, std::string> Fields;
};
struct RawDomainFile {
  std::string Domain;
  std::map<std::string, std::map<std::string, std::string>> Flags;
  std::map<std::string, std::string> Opcodes;
  std::map<std::string, std::string> CompletionOpcodes;
  std::vector<std::string> TransportConstants;
  std::vector<std::string> IbConstants;
  std::vector<std::string> IbOnlyCapabilities;
  std::vector<std::string> ListTakeMacros, ListWalkMacros, ListMoveCalls;
  std::vector<std::string> ReleaseCallbackWords;
  std::map<std::string, std::string> CreditTakeCalls;
  std::map<std::string, int64_t> PortableCaps;
  std::map<std::string, std::string> Migration;
  std::vector<std::string> ConnectionTypes;
  std::map<std::string, std::string> Fixits;
  std::optional<CacheRewrite> Cache;
  std::string RwMrPool;
  std::string CoreFiles;
  std::vector<RawStruct> Structs;
  std::vector<RawFunction> Functions;
};
struct RawCatalog {
  std::vector<RuleInfo> Checks;
};

} // namespace
} // namespace ulplint

LLVM_YAML_IS_SEQUENCE_VECTOR(ulplint::RawFunction)
LLVM_YAML_IS_SEQUENCE_VECTOR(ulplint::RawStruct)
LLVM_YAML_IS_SEQUENCE_VECTOR(ulplint::RuleInfo)
LLVM_YAML_IS_SEQUENCE_VECTOR(ulplint::UlpPattern)

namespace llvm::yaml {
using namespace ulplint;

template <typename V> struct CustomMappingTraits<std::map<std::string, V>> {
  static void inputOne(IO &Io, StringRef Key, std::map<std::string, V> &M) {
    Io.mapRequired(Key.str().c_str(), M[Key.str()]);
  }
  static void output(IO &Io, std::map<std::string, V> &M) {
    for (auto &[K, Val] : M)
      Io.mapRequired(K.c_str(), Val);
  }
};

template <> struct MappingTraits<RawFunction> {
  static void mapping(IO &Io, RawFunction &F) {
    Io.mapRequired("name", F.Name);
    Io.mapOptional("match", F.Match);
    Io.mapRequired("effect", F.Effect);
    Io.mapOptional("opcode", F.Opcode);
    Io.mapOptional("core", F.Core);
    Io.mapOptional("args", F.Args);
    Io.mapOptional("implicit_access", F.ImplicitAccess);
    Io.mapOptional("returns", F.Returns);
  }
};
template <> struct MappingTraits<RawStruct> {
  static void mapping(IO &Io, RawStruct &S) {
    Io.mapRequired("name", S.Name);
    Io.mapRequired("role", S.Role);
    Io.mapOptional("base", S.Base);
    Io.mapRequired("fields", S.Fields);
  }
};
template <> struct MappingTraits<RawDomainFile> {
  static void mapping(IO &Io, RawDomainFile &D) {
    Io.mapRequired("domain", D.Domain);
    Io.mapOptional("flags", D.Flags);
    Io.mapOptional("opcodes", D.Opcodes);
    Io.mapOptional("completion_opcodes", D.CompletionOpcodes);
    Io.mapOptional("transport_constants", D.TransportConstants);
    Io.mapOptional("ib_constants", D.IbConstants);
    Io.mapOptional("ib_only_capabilities", D.IbOnlyCapabilities);
    Io.mapOptional("list_take_macros", D.ListTakeMacros);
    Io.mapOptional("list_walk_macros", D.ListWalkMacros);
    Io.mapOptional("list_move_calls", D.ListMoveCalls);
    Io.mapOptional("release_callback_words", D.ReleaseCallbackWords);
    Io.mapOptional("portable_caps", D.PortableCaps);
    Io.mapOptional("migration", D.Migration);
    Io.mapOptional("connection_types", D.ConnectionTypes);
    Io.mapOptional("credit_take_calls", D.CreditTakeCalls);
    Io.mapOptional("fixits", D.Fixits);
    Io.mapOptional("cache_rewrite", D.Cache);
    Io.mapOptional("rw_mr_pool", D.RwMrPool);
    Io.mapOptional("core_files", D.CoreFiles);
    Io.mapOptional("structs", D.Structs);
    Io.mapRequired("functions", D.Functions);
  }
};
template <> struct MappingTraits<CacheRewrite> {
  static void mapping(IO &Io, CacheRewrite &C) {
    Io.mapRequired("register", C.Register);
    Io.mapRequired("deregister", C.Deregister);
    Io.mapRequired("handle_type", C.HandleType);
    Io.mapRequired("cache_type", C.CacheType);
    Io.mapRequired("new_handle_type", C.NewHandleType);
    Io.mapRequired("get", C.Get);
    Io.mapRequired("put", C.Put);
  }
};
template <> struct MappingTraits<RuleInfo> {
  static void mapping(IO &Io, RuleInfo &R) {
    Io.mapRequired("name", R.Name);
    Io.mapRequired("severity", R.Severity);
    Io.mapRequired("category", R.Category);
    Io.mapRequired("summary", R.Summary);
    Io.mapRequired("rationale", R.Rationale);
    Io.mapRequired("fix", R.Fix);
    Io.mapRequired("doc", R.Doc);
  }
  static std::string validate(IO &, RuleInfo &R) {
    if (R.Severity != "error" && R.Severity != "warning" && R.Severity != "note")
      return "severity of " + R.Name + " must be error, warning or note";
    return "";
  }
};
template <> struct MappingTraits<RawCatalog> {
  static void mapping(IO &Io, RawCatalog &C) {
    Io.mapRequired("checks", C.Checks);
  }
};
template <> struct MappingTraits<UlpPattern> {
  static void mapping(IO &Io, UlpPattern &U) {
    Io.mapRequired("name", U.Name);
    Io.mapRequired("path", U.Path);
  }
};
template <> struct MappingTraits<UlpMap> {
  static void mapping(IO &Io, UlpMap &M) {
    Io.mapOptional("ulps", M.Ulps);
    Io.mapOptional("effort", M.Effort);
    Io.mapOptional("effort_scale", M.EffortScale);
  }
};
template <> struct MappingTraits<CompileFlagRules> {
  static void mapping(IO &Io, CompileFlagRules &F) {
    Io.mapOptional("drop", F.Drop);
    Io.mapOptional("drop_prefix", F.DropPrefix);
    Io.mapOptional("drop_with_value", F.DropWithValue);
    Io.mapOptional("add", F.Add);
  }
};
} // namespace llvm::yaml

namespace ulplint {

static constexpr std::pair<Effect, llvm::StringLiteral> EffectNames[] = {
    {Effect::None, "none"},
    {Effect::MrRegister, "mr.register"},
    {Effect::MrReregister, "mr.reregister"},
    {Effect::MrDeregister, "mr.deregister"},
    {Effect::MrAlloc, "mr.alloc"},
    {Effect::MrMap, "mr.map"},
    {Effect::MrPoolInit, "mr.pool_init"},
    {Effect::MrPoolGet, "mr.pool_get"},
    {Effect::MrPoolPut, "mr.pool_put"},
    {Effect::MrPoolDestroy, "mr.pool_destroy"},
    {Effect::MwAlloc, "mw.alloc"},
    {Effect::MwDealloc, "mw.dealloc"},
    {Effect::MwBind, "mw.bind"},
    {Effect::RkeyRotate, "rkey.rotate"},
    {Effect::RkeyIncrement, "rkey.increment"},
    {Effect::PdAlloc, "pd.alloc"},
    {Effect::PostSend, "post.send"},
    {Effect::PostRecv, "post.recv"},
    {Effect::PostCm, "post.cm"},
    {Effect::WrxStart, "wrx.start"},
    {Effect::WrxOp, "wrx.op"},
    {Effect::WrxSge, "wrx.sge"},
    {Effect::WrxComplete, "wrx.complete"},
    {Effect::WrxAbort, "wrx.abort"},
    {Effect::QpCreate, "qp.create"},
    {Effect::QpDrain, "qp.drain"},
    {Effect::QpDrainSq, "qp.drain_sq"},
    {Effect::QpDrainRq, "qp.drain_rq"},
    {Effect::DeviceQuery, "device.query"},
    {Effect::TransportQuery, "transport.query"},
    {Effect::TransportQueryIb, "transport.query_ib"},
    {Effect::DmaMap, "dma.map"},
    {Effect::DmaUnmap, "dma.unmap"},
    {Effect::BufferAlloc, "buffer.alloc"},
    {Effect::BufferFree, "buffer.free"},
    {Effect::ContainerRecycle, "container.recycle"},
    {Effect::WaitCompletion, "wait.completion"},
    {Effect::WaitCompletionTimeout, "wait.completion_timeout"},
    {Effect::CqPoll, "cq.poll"},
    {Effect::RwInit, "rw.init"},
    {Effect::RwWrs, "rw.wrs"},
    {Effect::RwPost, "rw.post"},
    {Effect::RwDestroy, "rw.destroy"},
    {Effect::RwMrFactor, "rw.mr_factor"},
    {Effect::RwMaxSendWr, "rw.max_send_wr"},
    {Effect::CoreAccessFlags, "core.access_flags"},
    {Effect::CoreRegInit, "core.reg_init"},
    {Effect::CoreRegRelease, "core.reg_release"},
    {Effect::CoreMrGet, "core.mr_get"},
    {Effect::CoreMrPut, "core.mr_put"},
    {Effect::WcReadFlags, "wc.read_flags"},
    {Effect::WcReadInvalidatedRkey, "wc.read_invalidated_rkey"},
    {Effect::WcReadOpcode, "wc.read_opcode"},
    {Effect::MemoryZero, "memory.zero"},
    {Effect::ErrorPointerTest, "ptr.error_test"},
    {Effect::ErrorPointerValue, "ptr.error_value"},
    {Effect::CounterRead, "counter.read"},
    {Effect::CounterSet, "counter.set"},
    {Effect::CounterAdd, "counter.add"},
    {Effect::CounterSub, "counter.sub"},
};

static constexpr std::pair<Opcode, llvm::StringLiteral> OpcodeNames[] = {
    {Opcode::Unknown, "unknown"},
    {Opcode::Send, "send"},
    {Opcode::SendWithInv, "send_with_inv"},
    {Opcode::RdmaWrite, "rdma_write"},
    {Opcode::RdmaRead, "rdma_read"},
    {Opcode::RdmaReadWithInv, "rdma_read_with_inv"},
    {Opcode::Atomic, "atomic"},
    {Opcode::LocalInv, "local_inv"},
    {Opcode::BindMw, "bind_mw"},
    {Opcode::RegMr, "reg_mr"},
    {Opcode::Other, "other"},
};

static constexpr std::pair<StructRole, llvm::StringLiteral> StructRoleNames[] = {
#define STRUCT_ROLE(Id, Name) {StructRole::Id, Name},
#include "Vocabulary.def"
};
static constexpr std::pair<FieldRole, llvm::StringLiteral> FieldRoleNames[] = {
#define FIELD_ROLE(Id, Name) {FieldRole::Id, Name},
#include "Vocabulary.def"
};
static constexpr std::pair<ArgRole, llvm::StringLiteral> ArgRoleNames[] = {
#define ARG_ROLE(Id, Name) {ArgRole::Id, Name},
#include "Vocabulary.def"
};
struct FlagSpelling {
  Flag F;
  llvm::StringLiteral Family, Name;
};
static constexpr FlagSpelling FlagNames[] = {
#define FLAG(Id, Family, Name) {Flag::Id, Family, Name},
#include "Vocabulary.def"
};
static constexpr std::pair<MigrationKey, llvm::StringLiteral> MigrationNames[] = {
    {MigrationKey::Expose, "expose"},
    {MigrationKey::DataTransfer, "data_transfer"},
    {MigrationKey::Local, "local"},
    {MigrationKey::QueueSizing, "queue_sizing"},
    {MigrationKey::RemoteInvalidation, "remote_invalidation"},
    {MigrationKey::DatapathRegistration, "datapath_registration"},
    {MigrationKey::TransportFlags, "transport_flags"},
    {MigrationKey::QueueFactor, "queue_factor"},
    {MigrationKey::QueueFactorNote, "queue_factor_note"},
    {MigrationKey::GlobalRkey, "global_rkey"},
};
static constexpr std::pair<FixTemplate, llvm::StringLiteral> FixTemplateNames[] = {
    {FixTemplate::RotateKey, "rotate_key"},
    {FixTemplate::NewWindowKey, "new_window_key"},
};

template <typename T, size_t N>
static llvm::StringRef nameIn(const std::pair<T, llvm::StringLiteral> (&Table)[N],
                              T Value) {
  for (const auto &[V, Name] : Table)
    if (V == Value)
      return Name;
  llvm_unreachable("vocabulary entry without a name");
}

llvm::StringRef structRoleName(StructRole R) { return nameIn(StructRoleNames, R); }
llvm::StringRef fieldRoleName(FieldRole R) { return nameIn(FieldRoleNames, R); }
llvm::StringRef argRoleName(ArgRole R) { return nameIn(ArgRoleNames, R); }
llvm::StringRef migrationKeyName(MigrationKey K) { return nameIn(MigrationNames, K); }

bool isDeviceLimit(FieldRole R) {
  return R == FieldRole::LimitWr || R == FieldRole::LimitSge ||
         R == FieldRole::LimitSgeRd || R == FieldRole::LimitRecvSge;
}

static std::optional<Flag> flagNamed(llvm::StringRef Family, llvm::StringRef Name) {
  for (const FlagSpelling &F : FlagNames)
    if (F.Family == Family && F.Name == Name)
      return F.F;
  return std::nullopt;
}

llvm::StringRef effectName(Effect E) {
  for (const auto &[Value, Name] : EffectNames)
    if (Value == E)
      return Name;
  llvm_unreachable("effect without a name");
}

llvm::StringRef opcodeName(Opcode O) {
  for (const auto &[Value, Name] : OpcodeNames)
    if (Value == O)
      return Name;
  llvm_unreachable("opcode without a name");
}

template <typename T, size_t N>
static std::optional<T>
lookupName(const std::pair<T, llvm::StringLiteral> (&Table)[N],
           llvm::StringRef Name) {
  for (const auto &[Value, Spelling] : Table)
    if (Spelling == Name)
      return Value;
  return std::nullopt;
}

std::optional<unsigned> FunctionModel::arg(ArgRole Role) const {
  auto It = Args.find(Role);
  if (It == Args.end())
    return std::nullopt;
  return It->second;
}

struct RulesBuilder {
  Rules &R;
  std::string File;

  llvm::Error fail(const llvm::Twine &Msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   File + ": " + Msg);
  }

  template <typename T> llvm::Error read(llvm::StringRef Text, T &Out) {
    std::string Diag;
    llvm::yaml::Input In(Text, nullptr, [](const llvm::SMDiagnostic &D,
                                           void *Ctx) {
      *static_cast<std::string *>(Ctx) = D.getMessage().str() + " at line " +
                                         std::to_string(D.getLineNo());
    }, &Diag);
    In >> Out;
    if (In.error())
      return fail(Diag.empty() ? "malformed YAML" : Diag);
    return llvm::Error::success();
  }

  llvm::Error addDomainFile(llvm::StringRef Text) {
    RawDomainFile Raw;
    if (auto E = read(Text, Raw))
      return E;
    std::optional<Domain> D =
        llvm::StringSwitch<std::optional<Domain>>(Raw.Domain)
            .Case("userspace", Domain::Userspace)
            .Case("kernel", Domain::Kernel)
            .Case("regcore", Domain::Regcore)
            .Default(std::nullopt);
    if (!D)
      return fail("unknown domain '" + Raw.Domain + "'");
    DomainModel &DM = R.Domains[static_cast<size_t>(*D)];
    DM.D = *D;
    DM.TransportConstants = Raw.TransportConstants;
    DM.IbConstants = Raw.IbConstants;
    DM.IbOnlyCapabilities = Raw.IbOnlyCapabilities;
    DM.ListTakeMacros = Raw.ListTakeMacros;
    DM.ListWalkMacros = Raw.ListWalkMacros;
    DM.ListMoveCalls = Raw.ListMoveCalls;
    DM.ReleaseCallbackWords = Raw.ReleaseCallbackWords;
    DM.ConnectionTypes = Raw.ConnectionTypes;
    for (auto &[Name, Amount] : Raw.CreditTakeCalls) {
      unsigned Arg = 0;
      if (Amount == "one")
        DM.CreditTakeCalls[Name] = std::nullopt;
      else if (!llvm::StringRef(Amount).getAsInteger(10, Arg))
        DM.CreditTakeCalls[Name] = Arg;
      else
        return fail("credit_take_calls: '" + Name + ": " + Amount +
                    "' is neither `one` nor an argument index");
    }
    for (auto &[Family, Flags] : Raw.Flags)
      for (auto &[Name, Enumerator] : Flags) {
        std::optional<Flag> F = flagNamed(Family, Name);
        if (!F)
          return fail("unknown flag '" + Family + "." + Name + "'");
        DM.Flags[*F] = Enumerator;
        R.FlagIndex[Enumerator] = *F;
      }
    for (auto &[Cap, Value] : Raw.PortableCaps) {
      std::optional<FieldRole> Role = lookupName(FieldRoleNames, Cap);
      if (!Role)
        return fail("unknown capacity '" + Cap + "' in portable_caps");
      DM.PortableCaps[*Role] = Value;
    }
    for (auto &[Key, Text] : Raw.Fixits) {
      std::optional<FixTemplate> K = lookupName(FixTemplateNames, Key);
      if (!K)
        return fail("unknown fix-it template '" + Key + "'");
      DM.Fixits[*K] = Text;
    }
    DM.Cache = Raw.Cache;
    DM.RwMrPool = Raw.RwMrPool;
    DM.CoreFiles = Raw.CoreFiles;
    if (!DM.CoreFiles.empty())
      if (std::string Error; !llvm::Regex(DM.CoreFiles).isValid(Error))
        return fail("core_files: " + Error);
    for (auto &[Key, Text] : Raw.Migration) {
      std::optional<MigrationKey> K = lookupName(MigrationNames, Key);
      if (!K)
        return fail("unknown migration key '" + Key + "'");
      DM.Migration[*K] = Text;
    }
    for (auto &[Enumerator, Name] : Raw.Opcodes) {
      std::optional<Opcode> Op = lookupName(OpcodeNames, Name);
      if (!Op)
        return fail("unknown opcode '" + Name + "' for " + Enumerator);
      DM.Opcodes[Enumerator] = Name;
      R.OpcodeIndex[Enumerator] = *Op;
    }
    for (auto &[Enumerator, Name] : Raw.CompletionOpcodes) {
      std::optional<Opcode> Op = lookupName(OpcodeNames, Name);
      if (!Op)
        return fail("unknown opcode '" + Name + "' for " + Enumerator);
      DM.CompletionOpcodes[Enumerator] = *Op;
    }
    for (RawStruct &S : Raw.Structs)
      if (auto E = addStruct(*D, S))
        return E;
    for (RawFunction &F : Raw.Functions)
      if (auto E = addFunction(*D, F))
        return E;
    return llvm::Error::success();
  }

  llvm::Error addStruct(Domain D, RawStruct &S) {
    std::optional<StructRole> Role = lookupName(StructRoleNames, S.Role);
    if (!Role)
      return fail("unknown struct role '" + S.Role + "' for " + S.Name);
    StructModel M{S.Name, D, *Role, S.Base, {}};
    for (auto &[Path, FieldName] : S.Fields) {
      std::optional<FieldRole> F = lookupName(FieldRoleNames, FieldName);
      if (!F)
        return fail("unknown field role '" + FieldName + "' for " + S.Name +
                    "." + Path);
      M.Fields[Path] = *F;
    }
    R.StructIndex[S.Name] = R.Structs.size();
    R.Structs.push_back(std::move(M));
    return llvm::Error::success();
  }

  llvm::Error addFunction(Domain D, RawFunction &F) {
    std::optional<Effect> E = lookupName(EffectNames, F.Effect);
    if (!E)
      return fail("unknown effect '" + F.Effect + "' for " + F.Name);
    FunctionModel M;
    M.Name = F.Name;
    M.D = D;
    M.E = *E;
    M.CoreManaged = F.Core;
    for (auto &[Name, Index] : F.Args) {
      std::optional<ArgRole> Role = lookupName(ArgRoleNames, Name);
      if (!Role)
        return fail("unknown argument role '" + Name + "' for " + F.Name);
      M.Args[*Role] = Index;
    }
    for (const std::string &Name : F.ImplicitAccess) {
      std::optional<Flag> Bit = flagNamed("access", Name);
      if (!Bit)
        return fail("unknown access flag '" + Name + "' for " + F.Name);
      M.ImplicitAccess.push_back(*Bit);
    }
    if (!F.Returns.empty()) {
      M.Returns = lookupName(StructRoleNames, F.Returns);
      if (!M.Returns)
        return fail("unknown result role '" + F.Returns + "' for " + F.Name);
    }
    if (!F.Opcode.empty()) {
      std::optional<Opcode> Op = lookupName(OpcodeNames, F.Opcode);
      if (!Op)
        return fail("unknown opcode '" + F.Opcode + "' for " + F.Name);
      M.Op = *Op;
    }
    // The same name may be modelled by two domains (rdma_create_qp exists in
    // the kernel and in librdmacm); the first wins, and both must agree.
    size_t Index = R.Functions.size();
    R.Functions.push_back(std::move(M));
    R.FunctionIndex.try_emplace(F.Name, Index);
    for (const std::string &Alias : F.Match)
      R.FunctionIndex.try_emplace(Alias, Index);
    return llvm::Error::success();
  }
};

llvm::Expected<std::unique_ptr<Rules>>
Rules::parse(llvm::ArrayRef<std::pair<std::string, std::string>> NamedFiles) {
  auto R = std::make_unique<Rules>();
  R->Domains.resize(3);
  for (const auto &[Path, Text] : NamedFiles) {
    RulesBuilder B{*R, Path};
    llvm::StringRef Name(Path);
    llvm::Error E = llvm::Error::success();
    if (Name.ends_with("catalog.yaml")) {
      RawCatalog C;
      E = B.read(Text, C);
      for (RuleInfo &Info : C.Checks)
        R->Catalog.push_back(std::move(Info));
    } else if (Name.ends_with("compile-flags.yaml")) {
      E = B.read(Text, R->Flags);
    } else if (Name.ends_with("ulps.yaml")) {
      E = B.read(Text, R->Ulps);
    } else {
      E = B.addDomainFile(Text);
    }
    if (E)
      return std::move(E);
  }
  return std::move(R);
}

llvm::Expected<std::vector<UlpPattern>>
Rules::parseUlpList(llvm::StringRef Text) {
  std::vector<UlpPattern> Out;
  llvm::yaml::Input In(Text);
  In >> Out;
  if (In.error())
    return llvm::createStringError(In.error(),
                                   "expected a YAML list of {name, path}");
  return Out;
}

const Rules &Rules::embedded() {
  static const Rules *Instance = [] {
    std::vector<std::pair<std::string, std::string>> Files;
    for (const EmbeddedRuleFile &F : EmbeddedRuleFiles)
      Files.emplace_back(F.Path, F.Text);
    auto Parsed = parse(Files);
    if (!Parsed)
      llvm::report_fatal_error(llvm::Twine("ulplint: embedded rules: ") +
                               llvm::toString(Parsed.takeError()));
    return Parsed->release();
  }();
  return *Instance;
}

const FunctionModel *Rules::function(llvm::StringRef Name) const {
  auto It = FunctionIndex.find(Name);
  return It == FunctionIndex.end() ? nullptr : &Functions[It->second];
}

const StructModel *Rules::structure(llvm::StringRef RecordName) const {
  auto It = StructIndex.find(RecordName);
  return It == StructIndex.end() ? nullptr : &Structs[It->second];
}

const StructModel *Rules::structure(Domain D, StructRole R) const {
  for (const StructModel &S : Structs)
    if (S.D == D && S.Role == R)
      return &S;
  return nullptr;
}

llvm::StringRef StructModel::pathOf(FieldRole R) const {
  for (const auto &[Path, Role] : Fields)
    if (Role == R)
      return Path;
  return {};
}

const DomainModel &Rules::domain(Domain D) const {
  return Domains[static_cast<size_t>(D)];
}

std::optional<Opcode> Rules::opcodeOf(llvm::StringRef Enumerator) const {
  auto It = OpcodeIndex.find(Enumerator);
  if (It == OpcodeIndex.end())
    return std::nullopt;
  return It->second;
}

std::optional<Flag> Rules::flagOf(llvm::StringRef Enumerator) const {
  auto It = FlagIndex.find(Enumerator);
  if (It == FlagIndex.end())
    return std::nullopt;
  return It->second;
}

llvm::StringRef Rules::flagName(Domain D, Flag F) const {
  const auto &Flags = domain(D).Flags;
  auto It = Flags.find(F);
  return It == Flags.end() ? llvm::StringRef() : It->second;
}

std::optional<Opcode> Rules::completionOpcodeOf(llvm::StringRef Enumerator) const {
  for (const DomainModel &D : Domains) {
    auto It = D.CompletionOpcodes.find(Enumerator.str());
    if (It != D.CompletionOpcodes.end())
      return It->second;
  }
  return std::nullopt;
}

llvm::StringRef Rules::opcodeEnumerator(Domain D, Opcode Op) const {
  for (const auto &[Enumerator, Name] : domain(D).Opcodes)
    if (Name == opcodeName(Op))
      return Enumerator;
  return {};
}

std::string Rules::coreFiles() const {
  std::string Out;
  for (const DomainModel &D : Domains)
    if (!D.CoreFiles.empty())
      Out += (Out.empty() ? "" : "|") + D.CoreFiles;
  return Out;
}

std::string expandTemplate(
    llvm::StringRef Template,
    llvm::ArrayRef<std::pair<llvm::StringRef, std::string>> Values) {
  std::string Out;
  while (!Template.empty()) {
    size_t Open = Template.find('{');
    size_t Close = Open == llvm::StringRef::npos ? Open : Template.find('}', Open);
    if (Close == llvm::StringRef::npos) {
      Out += Template;
      break;
    }
    Out += Template.take_front(Open);
    llvm::StringRef Name = Template.slice(Open + 1, Close);
    auto It = llvm::find_if(Values, [&](const auto &V) { return V.first == Name; });
    Out += It != Values.end() ? It->second : ("{" + Name + "}").str();
    Template = Template.drop_front(Close + 1);
  }
  return Out;
}

bool Rules::isTransportConstant(llvm::StringRef Enumerator) const {
  for (const DomainModel &D : Domains)
    if (llvm::is_contained(D.TransportConstants, Enumerator))
      return true;
  return false;
}

ListUse Rules::listMacro(llvm::StringRef Macro) const {
  for (const DomainModel &D : Domains) {
    if (llvm::is_contained(D.ListTakeMacros, Macro))
      return ListUse::Take;
    if (llvm::is_contained(D.ListWalkMacros, Macro))
      return ListUse::Walk;
  }
  return ListUse::None;
}

bool Rules::isListMove(llvm::StringRef Callee) const {
  for (const DomainModel &D : Domains)
    if (llvm::is_contained(D.ListMoveCalls, Callee))
      return true;
  return false;
}

std::optional<std::optional<unsigned>>
Rules::creditTake(llvm::StringRef Callee) const {
  for (const DomainModel &D : Domains) {
    auto It = D.CreditTakeCalls.find(Callee.str());
    if (It != D.CreditTakeCalls.end())
      return It->second;
  }
  return std::nullopt;
}

bool Rules::isReleaseCallback(llvm::StringRef Field) const {
  llvm::SmallVector<llvm::StringRef, 4> Words;
  Field.split(Words, '_', -1, /*KeepEmpty=*/false);
  for (const DomainModel &D : Domains)
    for (llvm::StringRef W : Words)
      if (llvm::is_contained(D.ReleaseCallbackWords, W.lower()))
        return true;
  return false;
}

bool Rules::isIbConstant(llvm::StringRef Enumerator) const {
  for (const DomainModel &D : Domains)
    if (llvm::is_contained(D.IbConstants, Enumerator))
      return true;
  return false;
}

bool Rules::isIbOnlyCapability(llvm::StringRef Enumerator) const {
  for (const DomainModel &D : Domains)
    if (llvm::is_contained(D.IbOnlyCapabilities, Enumerator))
      return true;
  return false;
}

const RuleInfo *Rules::rule(llvm::StringRef CheckName) const {
  for (const RuleInfo &R : Catalog)
    if (R.Name == CheckName)
      return &R;
  return nullptr;
}

} // namespace ulplint
