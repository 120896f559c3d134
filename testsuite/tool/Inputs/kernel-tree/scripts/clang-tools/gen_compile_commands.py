#!/usr/bin/env python3
"""A stand-in for the kernel's scripts/clang-tools/gen_compile_commands.py:
the same options (-d DIR, -o FILE) and the same reading of Kbuild's .cmd
files (savedcmd_ lines), for testsuite/tool/kernel.test."""
import argparse
import json
import os
import re

LINE = re.compile(r"^(saved)?cmd_[^ ]*\.o := (.* )([^ ]*\.c) *(;|$)")

p = argparse.ArgumentParser()
p.add_argument("-d", "--directory", default=".")
p.add_argument("-o", "--output", default="compile_commands.json")
a = p.parse_args()
root = os.path.abspath(".")
entries = []
for dirpath, _, names in sorted(os.walk(a.directory)):
    for name in sorted(n for n in names if n.endswith(".o.cmd")):
        with open(os.path.join(dirpath, name)) as f:
            m = LINE.match(f.readline())
        if m:
            src = os.path.normpath(os.path.join(root, m.group(3)))
            entries.append({"directory": root, "file": src,
                            "command": m.group(2) + m.group(3),
                            "output": os.path.join(dirpath, name[1:-4])})
with open(a.output, "w") as f:
    json.dump(entries, f, indent=2)
