//===- AccessFlagsTransportCheck.h - rdma-access-flags-transport -*- C++ -*-===//

#ifndef ULPLINT_CHECKS_ACCESSFLAGSTRANSPORTCHECK_H
#define ULPLINT_CHECKS_ACCESSFLAGSTRANSPORTCHECK_H

#include "engine/RdmaCheck.h"
#include "engine/Sites.h"

namespace ulplint {

/// Access flags chosen by inline transport tests, and RDMA READ sinks
/// without REMOTE_WRITE where the code may run on iWARP.
/// Docs: docs/checks/rdma-access-flags-transport.md
class AccessFlagsTransportCheck : public RdmaCheck {
public:
  AccessFlagsTransportCheck(llvm::StringRef Name,
                            clang::tidy::ClangTidyContext *Context);
  void storeOptions(clang::tidy::ClangTidyOptions::OptionMap &Opts) override;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }

private:
  void checkTransportTests(const TuAnalysis &A,
                           llvm::ArrayRef<AccessSite> Sites);
  void checkReadSinks(const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites);
  void exportSinkRights(const TuAnalysis &A, llvm::ArrayRef<AccessSite> Sites);
  void reportSinkElsewhere(const TuAnalysis &A, const ReadSink &Sink,
                           llvm::StringRef Refuses);
  /// Set to false for ULPs that only ever run on InfiniBand or RoCE.
  bool AssumeIWarp;
};

} // namespace ulplint

#endif
