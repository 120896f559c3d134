//===- Files.cpp - Writing outputs and sources without losing them --------===//

#include "Files.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include <fcntl.h>
#include <unistd.h>

namespace fs = llvm::sys::fs;

namespace ulplint::tool {

namespace {
llvm::Error writeError(llvm::StringRef Path, std::error_code EC,
                       const llvm::Twine &Context = "") {
  return llvm::createStringError(
      EC, "cannot write '" + Path + "': " +
              (Context.isTriviallyEmpty() ? "" : Context + ": ") + EC.message());
}

/// Streams \p Write into \p FD; the stream's first error, if any.
std::error_code writeToFD(int FD,
                          llvm::function_ref<void(llvm::raw_ostream &)> Write) {
  llvm::raw_fd_ostream OS(FD, /*shouldClose=*/false);
  Write(OS);
  OS.flush();
  std::error_code EC = OS.error();
  OS.clear_error(); // reported by the caller, not by LLVM at destruction
  return EC;
}

std::error_code syncFD(int FD) {
  return ::fsync(FD) ? std::error_code(errno, std::generic_category())
                     : std::error_code();
}

/// After a rename the directory entry must reach the disk too.
void syncDirectory(llvm::StringRef Dir) {
  int FD = ::open(Dir.empty() ? "." : Dir.str().c_str(), O_RDONLY | O_DIRECTORY);
  if (FD < 0)
    return;
  ::fsync(FD);
  ::close(FD);
}

/// pwrite all of \p Data at \p Offset.
std::error_code writeAt(int FD, llvm::StringRef Data, off_t Offset) {
  while (!Data.empty()) {
    ssize_t N = ::pwrite(FD, Data.data(), Data.size(), Offset);
    if (N < 0 && errno == EINTR)
      continue;
    if (N <= 0)
      return std::error_code(N < 0 ? errno : EIO, std::generic_category());
    Data = Data.drop_front(N);
    Offset += N;
  }
  return {};
}

/// "./.name.ulplint-tmp-KIND-%%%%%%" next to \p Target.
std::string tempModel(llvm::StringRef Target, llvm::StringRef Kind) {
  llvm::SmallString<256> Model(llvm::sys::path::parent_path(Target));
  llvm::sys::path::append(Model, "." + llvm::sys::path::filename(Target) +
                                     TempFileMarker + Kind + "-%%%%%%");
  return std::string(Model);
}

/// Outputs that are not regular files: devices, pipes, "-".
llvm::Error writeDirectly(llvm::StringRef Path,
                          llvm::function_ref<void(llvm::raw_ostream &)> Write) {
  std::error_code EC;
  llvm::raw_fd_ostream OS(Path, EC, fs::OF_None);
  if (EC)
    return writeError(Path, EC);
  Write(OS);
  OS.close();
  EC = OS.error();
  OS.clear_error();
  return EC ? writeError(Path, EC) : llvm::Error::success();
}

/// An existing file ulplint must not replace: no write permission, or
/// read-only for everyone (root may write anything, but should not).
llvm::Error checkWritable(llvm::StringRef Path, const fs::file_status &St) {
  if (std::error_code EC = fs::access(Path, fs::AccessMode::Write))
    return writeError(Path, EC);
  const fs::perms AnyWrite =
      fs::owner_write | fs::group_write | fs::others_write;
  if ((St.permissions() & AnyWrite) == fs::no_perms) {
    std::string Mode;
    llvm::raw_string_ostream(Mode) << llvm::format("%04o", St.permissions());
    return llvm::createStringError(
        std::make_error_code(std::errc::permission_denied),
        "cannot write '" + Path + "': the file is read-only (mode " + Mode + ")");
  }
  return llvm::Error::success();
}

/// A complete temporary file renamed over \p Target: readers see the old
/// content or the new, never a part.
llvm::Error replaceAtomically(llvm::StringRef Target, const fs::file_status *Old,
                              llvm::function_ref<void(llvm::raw_ostream &)> Write,
                              WriteOptions Opts) {
  auto Temp = fs::TempFile::create(tempModel(Target, "new"));
  if (!Temp) {
    std::error_code EC = llvm::errorToErrorCode(Temp.takeError());
    llvm::StringRef Dir = llvm::sys::path::parent_path(Target);
    return writeError(Target, EC,
                      "cannot create a temporary file in '" +
                          (Dir.empty() ? llvm::StringRef(".") : Dir) + "'");
  }
  std::error_code EC = writeToFD(Temp->FD, Write);
  if (!EC && Old) {
    EC = fs::setPermissions(Temp->FD, Old->permissions());
    // Keeps the owner when ulplint runs as root; harmless otherwise.
    (void)!::fchown(Temp->FD, Old->getUser(), Old->getGroup());
  }
  if (!EC && Opts.Durable)
    EC = syncFD(Temp->FD);
  if (EC) {
    llvm::consumeError(Temp->discard());
    return writeError(Target, EC);
  }
  if (llvm::Error E = Temp->keep(Target))
    return writeError(Target, llvm::errorToErrorCode(std::move(E)));
  if (Opts.Durable)
    syncDirectory(llvm::sys::path::parent_path(Target));
  return llvm::Error::success();
}

/// A file with several hard links is rewritten in place so that every link
/// sees the new content. Its old content is first saved next to it (kept
/// if ulplint dies mid-write), space is reserved, and a failed write puts
/// the old content back.
llvm::Error rewriteInPlace(llvm::StringRef Target,
                           llvm::function_ref<void(llvm::raw_ostream &)> Write) {
  std::string New;
  {
    llvm::raw_string_ostream OS(New);
    Write(OS);
  }
  auto Old = llvm::MemoryBuffer::getFile(Target, false, false);
  if (!Old)
    return writeError(Target, Old.getError(), "cannot read it");
  int BackupFD;
  llvm::SmallString<256> Backup;
  if (std::error_code EC =
          fs::createUniqueFile(tempModel(Target, "old"), BackupFD, Backup))
    return writeError(Target, EC, "cannot save its old content");
  std::error_code EC = writeAt(BackupFD, (*Old)->getBuffer(), 0);
  if (!EC)
    EC = syncFD(BackupFD);
  ::close(BackupFD);
  if (EC) {
    fs::remove(Backup);
    return writeError(Target, EC, "cannot save its old content");
  }
  int FD = ::open(Target.str().c_str(), O_WRONLY);
  if (FD < 0) {
    EC = std::error_code(errno, std::generic_category());
    fs::remove(Backup);
    return writeError(Target, EC);
  }
  if (int Err = ::posix_fallocate(FD, 0, std::max<off_t>(New.size(), 1));
      Err && Err != EOPNOTSUPP && Err != EINVAL)
    EC = std::error_code(Err, std::generic_category());
  if (!EC)
    EC = writeAt(FD, New, 0);
  if (!EC && ::ftruncate(FD, New.size()))
    EC = std::error_code(errno, std::generic_category());
  if (!EC)
    EC = syncFD(FD);
  bool Restored = !EC;
  if (EC) // the old content fits: it was there before
    Restored = !writeAt(FD, (*Old)->getBuffer(), 0) &&
               !::ftruncate(FD, (*Old)->getBufferSize()) && !syncFD(FD);
  ::close(FD);
  if (Restored)
    fs::remove(Backup);
  if (!EC)
    return llvm::Error::success();
  return writeError(Target, EC,
                    Restored ? "" : "its old content is in '" + Backup + "'");
}
} // namespace

llvm::Error writeFileSafely(llvm::StringRef Path,
                            llvm::function_ref<void(llvm::raw_ostream &)> Write,
                            WriteOptions Opts) {
  if (Path == "-") {
    Write(llvm::outs());
    return flushStandardOutput();
  }
  // A symbolic link stays; the file it names gets the new content.
  llvm::SmallString<256> Target(Path);
  bool IsLink = false;
  if (!fs::is_symlink_file(Path, IsLink) && IsLink &&
      fs::real_path(Path, Target))
    return writeDirectly(Path, Write); // dangling: nothing to lose
  fs::file_status St;
  if (fs::status(Target, St))
    return replaceAtomically(Target, nullptr, Write, Opts);
  if (!fs::is_regular_file(St))
    return writeDirectly(Target, Write);
  if (Opts.RespectReadOnly)
    if (llvm::Error E = checkWritable(Target, St))
      return E;
  if (St.getLinkCount() > 1)
    return rewriteInPlace(Target, Write);
  return replaceAtomically(Target, &St, Write, Opts);
}

llvm::Error flushStandardOutput() {
  llvm::outs().flush();
  std::error_code EC = llvm::outs().error();
  if (!EC)
    return llvm::Error::success();
  llvm::outs().clear_error();
  return llvm::createStringError(EC, "cannot write to standard output: " +
                                         EC.message());
}

} // namespace ulplint::tool
