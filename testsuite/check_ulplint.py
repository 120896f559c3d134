#!/usr/bin/env python3
"""Runs rdma-* checks on one test file and checks findings and fixes.

In the spirit of clang-tidy's check_clang_tidy.py:

  %check_ulplint [--mode=ulplint|plugin] [--kernel] [--check-suffixes=A,B]
                 [--no-compile-fixed] <source> <checks> <temp file>
                 [-- <extra ulplint args> [-- <compiler args>]]

The source is copied to <temp file> with its CHECK lines blanked (line
numbers stay), the checks run on the copy with --fix (ulplint) or -fix
(clang-tidy-22 --load=<plugin>), then:
  * findings are matched with FileCheck against CHECK-MESSAGES[-SUFFIX]
    lines, and any other warning fails the test;
  * the fixed file is matched against CHECK-FIXES[-SUFFIX] lines;
  * the fixed file must still compile (clang-22 -fsyntax-only).
--kernel compiles against the kernel stand-in headers (-nostdinc -D__KERNEL__).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, **kw)


def fail(msg, output=""):
    sys.stderr.write("check_ulplint: %s\n%s\n" % (msg, output))
    sys.exit(1)


def main():
    argv = sys.argv[1:]
    extra_groups = []
    if "--" in argv:
        i = argv.index("--")
        rest = argv[i + 1:]
        argv = argv[:i]
        if "--" in rest:
            j = rest.index("--")
            extra_groups = [rest[:j], rest[j + 1:]]
        else:
            extra_groups = [rest, []]
    else:
        extra_groups = [[], []]
    tool_args, compile_args = extra_groups

    p = argparse.ArgumentParser()
    p.add_argument("--ulplint", required=True)
    p.add_argument("--plugin", required=True)
    p.add_argument("--clang", required=True)
    p.add_argument("--clang-tidy", required=True)
    p.add_argument("--kernel-include", required=True)
    p.add_argument("--mode", choices=["ulplint", "plugin"], default="ulplint")
    p.add_argument("--kernel", action="store_true")
    p.add_argument("--check-suffixes", default="")
    p.add_argument("--no-compile-fixed", action="store_true")
    p.add_argument("source")
    p.add_argument("checks")
    p.add_argument("temp")
    a = p.parse_args(argv)

    suffixes = [s for s in a.check_suffixes.split(",") if s] or [""]
    msg_prefixes = ["CHECK-MESSAGES" + ("-" + s if s else "") for s in suffixes]
    fix_prefixes = ["CHECK-FIXES" + ("-" + s if s else "") for s in suffixes]

    ext = os.path.splitext(a.source)[1]
    temp = a.temp + ext
    with open(a.source) as f:
        text = f.read()
    has_fixes = any(pre + ":" in text for pre in fix_prefixes)
    has_msgs = any(pre + ":" in text for pre in msg_prefixes)
    # Blank the check lines (keep the line count, as check_clang_tidy does).
    cleaned = re.sub(r"//\s*CHECK-[A-Z0-9-]+:[^\n]*", "//", text)
    cleaned = re.sub(r"//\s*RUN:[^\n]*", "//", cleaned)
    os.makedirs(os.path.dirname(os.path.abspath(temp)), exist_ok=True)
    with open(temp, "w") as f:
        f.write(cleaned)

    if a.kernel:
        compile_args = ["-nostdinc", "-D__KERNEL__", "-I" + a.kernel_include,
                        "-Wno-unused-function"] + compile_args
    if ext in (".cpp", ".cc"):
        compile_args = ["-std=c++17"] + compile_args
    else:
        compile_args = ["-std=gnu11"] + compile_args

    checks = "-*," + a.checks
    if a.mode == "ulplint":
        cmd = [a.ulplint, "--quiet", "--fix", "--checks=" + checks] + tool_args + \
              [temp, "--"] + compile_args
        ok_codes = (0, 1)
    else:
        cmd = [a.clang_tidy, "--load=" + a.plugin, "--checks=" + checks,
               "-fix", "--quiet"] + tool_args + [temp, "--"] + compile_args
        ok_codes = (0,)
    res = run(cmd)
    if res.returncode not in ok_codes:
        fail("%s exited with %d:\n%s" % (cmd[0], res.returncode, " ".join(map(shlex.quote, cmd))),
             res.stdout)
    lines = [l for l in res.stdout.splitlines() if re.search(r": (warning|error|note): ", l)]
    # ulplint streams a unit's certain findings first and the ones the
    # program's facts settle after the run; clang-tidy sorts by place. Each
    # finding with its notes goes in place order, as clang-tidy prints them.
    blocks = []
    for l in lines:
        if re.search(r": note: ", l) and blocks:
            blocks[-1].append(l)
        else:
            blocks.append([l])
    def place(block):
        m = re.match(r"(.*?):(\d+):(\d+): ", block[0])
        return (m.group(1), int(m.group(2)), int(m.group(3))) if m else ("", 0, 0)
    blocks.sort(key=place)
    messages = "\n".join(l for b in blocks for l in b) + "\n"
    # ulplint prints the catalog's severity, clang-tidy "warning" for every
    # finding: CHECK-MESSAGES serve both modes, so findings read "warning".
    messages = re.sub(r": (error|note): (.*\[rdma-[a-z-]+\])$", r": warning: \2",
                      messages, flags=re.M)
    with open(temp + ".msg", "w") as f:
        f.write(messages)

    if has_msgs:
        for pre in msg_prefixes:
            r = run(["FileCheck", "-input-file=" + temp + ".msg", a.source,
                     "-check-prefix=" + pre, "-implicit-check-not={{warning|error}}:"])
            if r.returncode:
                fail("findings do not match %s" % pre, r.stdout + "\n--- findings:\n" + messages)
    elif re.search(r": (warning|error): ", messages):
        fail("unexpected findings (the test has no CHECK-MESSAGES)", messages)

    if has_fixes:
        for pre in fix_prefixes:
            r = run(["FileCheck", "-input-file=" + temp, a.source,
                     "-check-prefix=" + pre, "-strict-whitespace"])
            if r.returncode:
                with open(temp) as f:
                    fixed = f.read()
                fail("fixed file does not match %s" % pre, r.stdout + "\n--- fixed file:\n" + fixed)

    if not a.no_compile_fixed:
        r = run([a.clang, "-fsyntax-only", "-Wno-everything"] + compile_args + [temp])
        if r.returncode:
            fail("the fixed file does not compile", r.stdout)


if __name__ == "__main__":
    main()
