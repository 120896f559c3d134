#!/usr/bin/env python3
"""Writes the .clangd of docs/editors.md (the ```yaml block that starts with
"# .clangd for ulplint-clangd") to OUT; with --rules, also checks that its
CompileFlags.Remove covers every GCC-only flag rules/compile-flags.yaml
drops (not the -Werror and dependency-file flags clangd handles itself)."""
import re
import sys

import yaml

page, out = sys.argv[1], sys.argv[2]
m = re.search(r"```yaml\n(# \.clangd for ulplint-clangd.*?)```", open(page).read(), re.S)
if not m:
    sys.exit("extract_clangd: no .clangd block in " + page)
open(out, "w").write(m.group(1))
if len(sys.argv) > 4 and sys.argv[3] == "--rules":
    rules = yaml.safe_load(open(sys.argv[4]))
    remove = yaml.safe_load(m.group(1))["CompileFlags"]["Remove"]
    def covered(flag, is_prefix):
        for p in remove:
            if p.endswith("*") and flag.startswith(p[:-1]):
                return True
            if not is_prefix and p == flag:
                return True
        return False
    skip = lambda f: f.startswith(("-Werror", "-M", "-Wp,-M"))
    missing = [f for f in rules["drop"] if not skip(f) and not covered(f, False)]
    missing += [f + "*" for f in rules["drop_prefix"] if not skip(f) and not covered(f, True)]
    print("flags ulplint drops that .clangd keeps: %s" % missing)
