#!/usr/bin/env bash
# Regenerates docs/reports/linux-<version>.md, the migration report of the
# Linux RDMA ULPs (docs/reports.md):
#
#   scripts/linux-report.sh            # Linux 6.12
#   LINUX_VERSION=6.1 scripts/linux-report.sh
#
# Prepares the corpus with ../shared/corpus/linux/prepare.sh when its
# compile database is missing, then runs `ulplint report` from BUILD_DIR
# (default: build; scripts/bootstrap.sh builds it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=${LINUX_VERSION:-6.12}
corpus=${RDMA_CORPUS_DIR:-$HOME/.cache/rdma-corpus/linux-$version}
build=${BUILD_DIR:-$root/build}
prepare=$root/../shared/corpus/linux/prepare.sh

if [ ! -f "$corpus/compile_commands.json" ]; then
  [ -x "$prepare" ] || { echo "linux-report: no corpus at $corpus and no $prepare" >&2; exit 2; }
  LINUX_VERSION=$version "$prepare" "$corpus"
fi
mkdir -p "$root/docs/reports"
# The exact version (6.12.118, not 6.12) comes from the tree's Makefile, in
# the title and in the links, so quoted lines are the linked ones.
"$build/tool/ulplint" report -p "$corpus" --source-root="$corpus" \
  --source-url="https://elixir.bootlin.com/linux/v{version}/source/" \
  -o "$root/docs/reports/linux-$version.md"
