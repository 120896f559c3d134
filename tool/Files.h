//===- Files.h - Writing outputs and sources without losing them -*- C++ -*-===//
//
// Every file ulplint writes (fixed sources, -o, baselines, exported fixes,
// reports, cache entries) goes through writeFileSafely: a full disk, an I/O
// error or a kill during the write leaves the old content in place, and the
// caller gets an error to report with exit status 2.
//
//===----------------------------------------------------------------------===//

#ifndef ULPLINT_TOOL_FILES_H
#define ULPLINT_TOOL_FILES_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace ulplint::tool {

struct WriteOptions {
  /// fsync the data before it replaces the old file (outputs and sources;
  /// cache entries are checked when read and skip it).
  bool Durable = true;
  /// Refuse to replace a file without write permission, as an editor
  /// would, even where renaming over it is allowed.
  bool RespectReadOnly = true;
};

/// Writes what \p Write produces to \p Path. A regular file is replaced by
/// renaming a complete temporary file from the same directory over it,
/// keeping its mode and owner; a symbolic link keeps pointing at the file it
/// names, which gets the content; a file with several hard links is
/// rewritten in place, after its old content is saved next to it, so every
/// link sees the new content. Devices and pipes (/dev/stdout, /dev/null)
/// and "-" (standard output) are written directly.
llvm::Error writeFileSafely(llvm::StringRef Path,
                            llvm::function_ref<void(llvm::raw_ostream &)> Write,
                            WriteOptions Opts = {});

/// Flushes standard output; an error when it failed (a full disk, a closed
/// pipe). Clears the stream's error so LLVM does not abort at exit.
llvm::Error flushStandardOutput();

/// The prefix of ulplint's temporary files, which the cache sweeps when a
/// killed process left them behind.
inline constexpr llvm::StringLiteral TempFileMarker = ".ulplint-tmp-";

} // namespace ulplint::tool

#endif
