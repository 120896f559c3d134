#!/usr/bin/env bash
# Builds the image of the Containerfile in a clean Debian root (its COPY and
# RUN steps) and uses the packages installed there:
# ulplint on the bundled example, the clang-tidy plugin, the man pages, and
# the regcore example program built with pkg-config and with CMake against
# the installed files and run on simverbs (testsuite/tool/packages.test).
#
#   packaging/test-install.sh DEB_DIR WORK_DIR
#
# The root is Debian 12 minbase made by debootstrap once and kept in
# ULPLINT_TEST_ROOTFS (default ~/.cache/ulplint/rootfs-bookworm); each run
# works on an overlay of it in WORK_DIR, inside a private mount namespace,
# so the kept root stays clean. apt-get installs the packages and resolves
# their dependencies from Debian's archive (the LLVM 22 runtime from
# bookworm-security); downloads are kept in ~/.cache/ulplint/apt-archives
# for the next run.
# The build and source trees are not visible in the root. Needs root,
# unshare, overlayfs and debootstrap.
set -euo pipefail

debs=$(realpath "$1")
work=$(realpath -m "$2")
here=$(cd "$(dirname "$0")" && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ulplint
rootfs=${ULPLINT_TEST_ROOTFS:-$cache/rootfs-bookworm}
archives=$cache/apt-archives
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

make_rootfs() {
  local tmp=$rootfs.tmp.$$
  rm -rf "$tmp"
  mkdir -p "$(dirname "$rootfs")"
  echo "test-install: debootstrap --variant=minbase bookworm ($mirror)" >&2
  debootstrap --variant=minbase bookworm "$tmp" "$mirror" >&2
  # bookworm, its updates and security (where LLVM 22 is)
  rm -f "$tmp/etc/apt/sources.list"
  cat > "$tmp/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  rm -rf "$tmp/var/cache/apt/archives/"*.deb
  mv "$tmp" "$rootfs"
}

[ -d "$rootfs/usr/bin" ] || make_rootfs
rm -rf "$work"
mkdir -p "$work"/{upper,ovl,root} "$archives/partial"
cp /etc/resolv.conf "$work/resolv.conf"

# Everything below runs in a private mount namespace: the mounts go with it.
# The Containerfile's RUN instructions, continuation lines joined.
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$here/../Containerfile" |
  sed -n 's/^RUN //p' > "$work/run.sh"
[ -s "$work/run.sh" ] || { echo "test-install: no RUN in the Containerfile" >&2; exit 2; }

exec unshare -m --propagation private bash -s "$rootfs" "$work" "$debs" "$here" "$archives" <<'INNER'
set -euo pipefail
rootfs=$1 work=$2 debs=$3 here=$4 archives=$5
root=$work/root
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$work/upper,workdir=$work/ovl" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
# Packages downloaded by earlier runs, copied in (not shared: apt locks its
# archive directory, and another test run may be installing).
cp -l "$archives"/*.deb "$root/var/cache/apt/archives/" 2>/dev/null ||
  cp "$archives"/*.deb "$root/var/cache/apt/archives/" 2>/dev/null || true
cp "$work/resolv.conf" "$root/etc/resolv.conf"
mkdir -p "$root/tmp/t" "$root/tmp/debs"
cp "$debs"/*.deb "$root/tmp/debs/"        # the Containerfile's COPY
cp -r "$here/example" "$root/tmp/t/regcore-example"
cp "$here/check-installed.sh" "$root/tmp/t/"
# A clean environment in the root: nothing of the caller's (TMPDIR...).
in_root() {
  chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}
echo "test-install: RUN $(cat "$work/run.sh")" >&2
in_root bash -e -c "$(cat "$work/run.sh")" >&2
# A compiler, CMake and pkg-config for the regcore example.
in_root apt-get update -qq >&2
in_root apt-get install -y -qq --no-install-recommends g++ cmake pkg-config >&2
cp -n "$root"/var/cache/apt/archives/*.deb "$archives/" 2>/dev/null || true
in_root bash /tmp/t/check-installed.sh "$(realpath "$here/..")" "$debs"
INNER
