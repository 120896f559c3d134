#!/bin/sh
# tiny_fs.sh DIR SEED -- CMD...
#
# Runs CMD in DIR on a full disk: DIR becomes a 64 KiB tmpfs holding a copy
# of the directory SEED, the rest of its space taken by a filler file. The
# mount lives in a private mount namespace and disappears with CMD; DIR's
# files (the filler removed) are copied to DIR.after for the test to check.
# Exits with CMD's status. Needs root and unshare(1): lit's `tmpfs` feature.
set -eu
if [ -z "${TINY_FS_INSIDE:-}" ]; then
  TINY_FS_INSIDE=1 exec unshare -m --propagation private sh "$0" "$@"
fi
dir=$1 seed=$2
shift 3
mkdir -p "$dir"
mount -t tmpfs -o size=64k tmpfs "$dir"
cp -a "$seed"/. "$dir"/
dd if=/dev/zero of="$dir/.fill" bs=1k 2>/dev/null || true
status=0
(cd "$dir" && "$@") || status=$?
rm -f "$dir/.fill"
rm -rf "$dir.after"
mkdir -p "$dir.after"
cp -a "$dir"/. "$dir.after"/
exit "$status"
