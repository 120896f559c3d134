#!/usr/bin/env python3
"""per_flag_db.py DIR SOURCE FLAG...: one copy of SOURCE per flag in DIR
(flag-1.c, flag-2.c, ...), each compiled by `gcc FLAG -c` in DIR's
compile_commands.json: a unit per flag."""
import json
import os
import shutil
import sys

out, source, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
os.makedirs(out, exist_ok=True)
entries = []
for i, flag in enumerate(flags, 1):
    name = "flag-%d.c" % i
    shutil.copy(source, os.path.join(out, name))
    entries.append({"directory": out, "file": name,
                    "arguments": ["gcc"] + flag.split(" ") + ["-c", name]})
with open(os.path.join(out, "compile_commands.json"), "w") as f:
    json.dump(entries, f, indent=1)
