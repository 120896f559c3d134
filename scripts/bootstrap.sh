#!/usr/bin/env bash
# ulplint's setup: install what the build needs (Debian 12, apt-get), build
# everything, then run one job.
#
#   scripts/bootstrap.sh example   build, then run ulplint on the bundled
#                                  example ULP (testsuite/example/handmade),
#                                  and both of its versions on simverbs
#   scripts/bootstrap.sh test      build, then run the whole test suite
#
# Environment: BUILD_DIR (default: build), JOBS (default: all cores),
# SKIP_APT=1 to never call apt-get.
set -euo pipefail

job=${1:-}
case "$job" in
  example|test) ;;
  *) echo "usage: $0 example|test" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
# ccache hits across clones in different directories.
export CCACHE_BASEDIR=$root

# Every package a build or a test uses, installed here and nowhere else.
packages=(
  cmake ninja-build ccache python3 python3-jsonschema
  clang-22 lld-22 llvm-22-dev llvm-22-tools libclang-22-dev libclang-cpp22-dev
  clang-tidy-22 libibverbs-dev librdmacm-dev
  chromium   # the HTML report is tested in headless Chromium
  strace     # fault injection in the I/O tests (strace -e inject)
  libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc   # clangd's exported targets
  libclang-rt-22-dev   # ThreadSanitizer runtime: regcore's shared-core stress test
  libucx-dev           # UCX's registration cache, regcore_bench's reference
  dpkg-dev debootstrap   # .deb packages (dpkg-shlibdeps) and their clean-root install test
  python3-yaml           # the GitHub Action, CI docs and check-registry tests
  make gcc               # the stand-in kernel tree of the kernel workflow test
  lua5.4                 # the Neovim setups of docs/editors.md, against a stub API
)

install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${SKIP_APT:-0}" = 1 ]; then
    echo "bootstrap: missing packages and SKIP_APT=1: ${missing[*]}" >&2
    exit 1
  fi
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

configure_and_build() {
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
      -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld \
      -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld \
      -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld
  fi
  cmake --build "$build" -j "$jobs"
}

install_packages
configure_and_build

case "$job" in
  example)
    # Findings are the point of the example: exit status 1 is success here.
    status=0
    "$build/tool/ulplint" -p "$build/example/handmade" || status=$?
    [ "$status" -le 1 ] || exit "$status"
    # The same bugs at run time, and the regcore version without them.
    echo "== testsuite/example/handmade on simverbs (mlx5 profile, a post fails at I/O 4)"
    "$build/example/bin/blkdemo-handmade" --profile=mlx5 --ios=6 --fail-post=4 || true
    echo "== testsuite/example/regcore on simverbs (same run)"
    "$build/example/bin/blkdemo-regcore" --profile=mlx5 --ios=6 --fail-post=4 || true
    ;;
  test)
    cmake --build "$build" --target check
    ;;
esac
