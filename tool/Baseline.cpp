//===- Baseline.cpp - Findings already known, and which are gone ----------===//
//
// A baseline is the list of findings a project has accepted for now; CI
// fails only on findings outside it. Findings match by fingerprint (check,
// file, the finding's line with whitespace normalised, occurrence), so
// edits elsewhere in the file do not turn old findings into new ones.
//
//===----------------------------------------------------------------------===//

#include "Files.h"
#include "Output.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MemoryBuffer.h"

namespace json = llvm::json;

namespace ulplint::tool {

static llvm::Error baselineError(llvm::StringRef Path, const llvm::Twine &Msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "baseline '" + Path + "': " + Msg);
}

/// Entries of a baseline file or a JSON output: findings[].fingerprint.
static llvm::Error readJsonFindings(const json::Array &Findings,
                                    std::vector<BaselineEntry> &Out,
                                    llvm::StringRef Path) {
  for (const json::Value &V : Findings) {
    const json::Object *O = V.getAsObject();
    std::optional<llvm::StringRef> Fp = O ? O->getString("fingerprint") : std::nullopt;
    if (!Fp)
      return baselineError(Path, "a finding without a fingerprint");
    BaselineEntry B;
    B.Fingerprint = Fp->str();
    B.Check = O->getString("check").value_or("").str();
    B.File = O->getString("file").value_or("").str();
    B.Message = O->getString("message").value_or("").str();
    B.Line = O->getInteger("line").value_or(0);
    Out.push_back(std::move(B));
  }
  return llvm::Error::success();
}

/// Entries of a SARIF output: results[].partialFingerprints.
static llvm::Error readSarifResults(const json::Array &Runs,
                                    std::vector<BaselineEntry> &Out,
                                    llvm::StringRef Path) {
  for (const json::Value &Run : Runs) {
    const json::Object *R = Run.getAsObject();
    const json::Array *Results = R ? R->getArray("results") : nullptr;
    if (!Results)
      return baselineError(Path, "a SARIF run without results");
    for (const json::Value &V : *Results) {
      const json::Object *O = V.getAsObject();
      const json::Object *Fps = O ? O->getObject("partialFingerprints") : nullptr;
      std::optional<llvm::StringRef> Fp =
          Fps ? Fps->getString(FingerprintKind) : std::nullopt;
      if (!Fp)
        return baselineError(Path, "a SARIF result without a " +
                                       FingerprintKind + " fingerprint");
      BaselineEntry B;
      B.Fingerprint = Fp->str();
      B.Check = O->getString("ruleId").value_or("").str();
      if (const json::Object *M = O->getObject("message"))
        B.Message = M->getString("text").value_or("").str();
      const json::Array *Locs = O->getArray("locations");
      const json::Object *Loc = Locs && !Locs->empty() ? (*Locs)[0].getAsObject() : nullptr;
      const json::Object *Phys = Loc ? Loc->getObject("physicalLocation") : nullptr;
      if (Phys) {
        if (const json::Object *A = Phys->getObject("artifactLocation"))
          B.File = uriPathDecoded(A->getString("uri").value_or(""));
        if (const json::Object *Reg = Phys->getObject("region"))
          B.Line = Reg->getInteger("startLine").value_or(0);
      }
      Out.push_back(std::move(B));
    }
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<BaselineEntry>> readBaseline(llvm::StringRef Path) {
  auto Buffer = llvm::MemoryBuffer::getFile(Path);
  if (!Buffer)
    return baselineError(Path, "cannot read it: " + Buffer.getError().message());
  llvm::Expected<json::Value> Doc = json::parse((*Buffer)->getBuffer());
  if (!Doc)
    return baselineError(Path, "malformed JSON: " + llvm::toString(Doc.takeError()));
  std::vector<BaselineEntry> Entries;
  const json::Object *Root = Doc->getAsObject();
  if (Root && Root->getArray("findings")) {
    std::optional<llvm::StringRef> Kind = Root->getString("fingerprints");
    if (Kind && *Kind != FingerprintKind)
      return baselineError(Path, "it holds " + *Kind + " fingerprints; this "
                                 "ulplint computes " + FingerprintKind +
                                 ": write it again with --write-baseline");
    if (llvm::Error E = readJsonFindings(*Root->getArray("findings"), Entries, Path))
      return std::move(E);
    return Entries;
  }
  if (Root && Root->getArray("runs")) {
    if (llvm::Error E = readSarifResults(*Root->getArray("runs"), Entries, Path))
      return std::move(E);
    return Entries;
  }
  return baselineError(Path, "expected a baseline, or JSON or SARIF output of "
                             "ulplint");
}

llvm::Error writeBaseline(llvm::StringRef Path, llvm::ArrayRef<Finding> Findings,
                          llvm::StringRef SourceRoot,
                          llvm::ArrayRef<BaselineEntry> Kept) {
  json::Array Items;
  for (const Finding &F : Findings)
    Items.push_back(json::Object{{"check", F.Error->DiagnosticName},
                                 {"file", relativeTo(F.File, SourceRoot)},
                                 {"line", F.Line},
                                 {"message", F.Error->Message.Message},
                                 {"fingerprint", F.Fingerprint}});
  for (const BaselineEntry &B : Kept)
    Items.push_back(json::Object{{"check", B.Check},
                                 {"file", B.File},
                                 {"line", B.Line},
                                 {"message", B.Message},
                                 {"fingerprint", B.Fingerprint}});
  json::Object Root{{"tool", "ulplint"},
                    {"version", ULPLINT_VERSION},
                    {"fingerprints", FingerprintKind},
                    {"findings", std::move(Items)}};
  return writeFileSafely(Path, [&](llvm::raw_ostream &OS) {
    OS << llvm::formatv("{0:2}", json::Value(std::move(Root))) << "\n";
  });
}

std::vector<BaselineEntry>
applyBaseline(llvm::MutableArrayRef<Finding> Findings,
              llvm::ArrayRef<BaselineEntry> Baseline,
              const llvm::StringSet<> &NotAnalysed,
              std::vector<BaselineEntry> &Unverified) {
  llvm::StringSet<> Known, Present;
  for (const BaselineEntry &B : Baseline)
    Known.insert(B.Fingerprint);
  for (Finding &F : Findings) {
    F.BaselineState = Known.contains(F.Fingerprint) ? "unchanged" : "new";
    Present.insert(F.Fingerprint);
  }
  std::vector<BaselineEntry> Fixed;
  for (const BaselineEntry &B : Baseline)
    if (!Present.contains(B.Fingerprint))
      (NotAnalysed.contains(B.File) ? Unverified : Fixed).push_back(B);
  return Fixed;
}

} // namespace ulplint::tool
