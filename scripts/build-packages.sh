#!/usr/bin/env bash
# Builds the Debian packages of ulplint and regcore with CPack
# (cmake/Packaging.cmake): ulplint, libregcore0, libregcore-dev.
#
#   scripts/build-packages.sh [--no-build] [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR (default: build) is configured like scripts/bootstrap.sh does
# when it has no build yet, then built (--no-build: packages what is built,
# as the test suite does from inside a build); the packages go to OUT_DIR
# (default: BUILD_DIR/packages). Needs dpkg-dev (dpkg-shlibdeps computes the library
# dependencies: libllvm22, libclang-cpp22, ...). JOBS: parallel build jobs.
set -euo pipefail

build_first=1
if [ "${1:-}" = --no-build ]; then
  build_first=0
  shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$build/packages}")
export CCACHE_BASEDIR=$root

command -v dpkg-shlibdeps >/dev/null ||
  { echo "build-packages: dpkg-shlibdeps missing (apt-get install dpkg-dev)" >&2; exit 2; }
if [ "$build_first" = 1 ] && [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld \
    -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld
fi
[ -f "$build/CPackConfig.cmake" ] ||
  { echo "build-packages: '$build' is not a configured build" >&2; exit 2; }
[ "$build_first" = 0 ] || cmake --build "$build" -j "${JOBS:-$(nproc)}"
mkdir -p "$out"
# CPack stages each component with `cmake --install` under /usr, strips
# the binaries and runs dpkg-shlibdeps.
(cd "$build" && cpack -G DEB -B "$out/.cpack" >&2)
find "$out/.cpack" -maxdepth 1 -name '*.deb' -exec mv -f {} "$out/" \;
rm -rf "$out/.cpack"
ls "$out"/*.deb
