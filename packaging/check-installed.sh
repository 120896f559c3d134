#!/usr/bin/env bash
# Runs inside the clean root of test-install.sh, on installed files only.
set -uo pipefail
step() { echo "== $*"; }
cd /tmp/t

step "packages"
dpkg-query -W -f='${Package} ${Version} ${Status}\n' ulplint libregcore0 libregcore-dev

step "ulplint --version"
ulplint --version

step "ulplint on the bundled example"
ex=/usr/share/doc/ulplint/example/handmade
mkdir -p db
python3 - "$ex" > db/compile_commands.json <<'PY'
import json, os, sys
ex = sys.argv[1]
print(json.dumps([{"directory": ex, "file": os.path.join(ex, f),
                   "arguments": ["cc", "-std=gnu11", "-I" + ex, "-c", f]}
                  for f in sorted(os.listdir(ex)) if f.endswith(".c")]))
PY
ulplint -p db --no-cache -j1 --source-root=/usr/share/doc/ulplint/example
echo "ulplint exit status $?"

step "clang-tidy-22 with the plugin"
plugin=$(ls /usr/lib/*/ulplint/libulplint-tidy.so)
echo "plugin $plugin"
clang-tidy-22 --load="$plugin" --checks='-*,rdma-access-flags-invalid' --quiet -p db "$ex/initiator.c" 2>/dev/null
echo "clang-tidy exit status $?"

step "man pages"
for m in man1/ulplint.1.gz man1/ulplint-clangd.1.gz man3/regcore.3.gz; do
  zcat "/usr/share/man/$m" | grep -m1 '^\.TH'
done

step "ulplint-kernel"
ulplint-kernel --help | head -1

step "regcore example with pkg-config"
pkg-config --cflags --libs regcore-sim
cc -Wall -Werror regcore-example/regcore_read.c $(pkg-config --cflags --libs regcore-sim) -o regcore_read_pc &&
  ./regcore_read_pc iwarp && ./regcore_read_pc mlx5

step "regcore example with CMake"
cmake -S regcore-example -B cmake-build >/dev/null && cmake --build cmake-build >/dev/null &&
  cmake-build/regcore_read mlx4

step "libregcore.so exports"
nm -D --defined-only /usr/lib/*/libregcore.so.0 | awk '{print $3}' | grep -vc '^regcore_'
# Every function regcore.h declares, and nothing else, is exported.
diff <(nm -D --defined-only /usr/lib/*/libregcore.so.0 | awk '{print $3}' |
         sed -n 's/^\(regcore_[a-z0-9_]*\).*/\1/p' | sort -u) \
     <(grep -oE '\bregcore_[a-z0-9_]+ *\(' /usr/include/regcore/regcore.h |
         tr -d ' (' | sort -u) && echo "same as regcore.h"

step "the build and source trees"
# $1, $2: where the source and build trees are on the host.
for d in "$@"; do [ -e "$d" ] && echo "visible: $d"; done
echo "checked ${#}"
exit 0
