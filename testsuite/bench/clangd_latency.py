#!/usr/bin/env python3
"""Benchmark (not a test): time from didOpen to the first publishDiagnostics
in ulplint-clangd, with every rdma-* check on, for the largest file of each
version of the bundled example (or the files given).

  testsuite/bench/clangd_latency.py [--build build] [--runs 5] [--json out.json] [files...]

Each run starts a fresh server in a temporary copy of the file's directory
(compile_flags.txt and a .clangd enabling rdma-* with FastCheckFilter None),
so the preamble is built cold, as when a file is first opened.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def latency(server, path, runs):
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, "src")
            shutil.copytree(os.path.dirname(path), d)
            with open(os.path.join(d, "compile_flags.txt"), "w") as f:
                f.write("-std=gnu11\n-I.\n-I%s\n" % os.path.join(SRC, "regcore", "include"))
            with open(os.path.join(d, ".clangd"), "w") as f:
                f.write("Diagnostics:\n  ClangTidy:\n    Add: rdma-*\n    FastCheckFilter: None\n")
            out = subprocess.run(
                [sys.executable, os.path.join(SRC, "testsuite", "lsp", "lsp_client.py"),
                 server, os.path.join(d, os.path.basename(path)), "--print-latency",
                 "--", "--log=error", "--background-index=false"],
                stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
            line = [l for l in out.splitlines() if l.startswith("latency:")][0]
            times.append(float(line.split()[1]))
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(SRC, "build"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    server = os.path.join(a.build, "tool", "ulplint-clangd")
    files = a.files or [max(
        (os.path.join(SRC, "testsuite", "example", v, f)
         for f in os.listdir(os.path.join(SRC, "testsuite", "example", v))
         if f.endswith(".c")), key=os.path.getsize)
        for v in ("handmade", "regcore")]
    results = []
    print("%-60s %8s %8s %8s" % ("file", "median", "min", "max"))
    for f in files:
        t = latency(server, os.path.abspath(f), a.runs)
        results.append({"file": os.path.relpath(f, SRC), "runs": t,
                        "median_s": statistics.median(t)})
        print("%-60s %7.3fs %7.3fs %7.3fs" % (os.path.relpath(f, SRC),
                                             statistics.median(t), min(t), max(t)))
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"clangd_didopen_to_diagnostics": results}, out, indent=2)


if __name__ == "__main__":
    main()
