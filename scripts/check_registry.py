#!/usr/bin/env python3
"""Every registered rdma-* check has all of its touch points, and they agree.

A check lives in seven places: its class (checks/<Class>Check.{h,cpp}), the
checks library (checks/CMakeLists.txt), the module registration
(checks/RdmaTidyModule.cpp), the catalog entry (rules/catalog.yaml), its doc
page (docs/checks/<name>.md), its lit tests (testsuite/checks/<name>[-*].c, run
both by ulplint and by the plugin) and its README row. The catalog, the doc
page and the README give its severity; they must say the same thing, and
`ulplint --list-checks` must list exactly the catalog (it reads the catalog,
so this proves the embedded rules are current).

    check_registry.py [--root DIR] [--ulplint BIN] [--plugin SO --clang-tidy BIN]

Prints one line per problem and exits 1 if there is any; scripts/
add_new_check.py writes every touch point this verifies.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml


def class_name(check):
    """rdma-mr-leak -> MrLeakCheck (the clang-tidy convention)."""
    words = check[len("rdma-"):].split("-")
    return "".join(w[:1].upper() + w[1:] for w in words) + "Check"


def read(root, rel):
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def catalog(root):
    with open(os.path.join(root, "rules", "catalog.yaml"), encoding="utf-8") as f:
        return {c["name"]: c for c in yaml.safe_load(f)["checks"]}


def registered(root):
    """name -> class, from the module's registerCheck<Class>("name") calls."""
    text = read(root, "checks/RdmaTidyModule.cpp") or ""
    pairs = re.findall(r'registerCheck<(\w+)>\(\s*"([^"]+)"\)', text)
    return {name: cls for cls, name in pairs}


def readme_rows(root):
    """name -> severity, from README's check table."""
    rows = {}
    for line in (read(root, "README.md") or "").splitlines():
        m = re.match(r"\| \[(rdma-[\w-]+)\]\(docs/checks/\1\.md\) \| (\w+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def doc_severity(root, name):
    text = read(root, "docs/checks/%s.md" % name)
    if text is None:
        return None
    m = re.search(r"^\*\*Severity:\*\* (\w+)", text, re.M)
    return m.group(1) if m else "?"


def test_problems(root, name):
    """The check has lit tests named for it, run by ulplint and by the plugin."""
    tests = [f for f in sorted(os.listdir(os.path.join(root, "testsuite", "checks")))
             if f.endswith(".c") and re.fullmatch(r"%s(-[\w-]+)?\.c" % re.escape(name), f)]
    if not tests:
        return ["%s: no lit test testsuite/checks/%s*.c" % (name, name)]
    runs = "\n".join(read(root, "testsuite/checks/" + t) for t in tests)
    problems = []
    for mode, plugin in (("ulplint", False), ("plugin", True)):
        line = r"RUN: %%check_ulplint(?: --[\w=,-]+)* %%s [\w,-]*\b%s\b" % re.escape(name)
        hits = [l for l in re.findall(line + ".*", runs)
                if ("--mode=plugin" in l) == plugin]
        if not hits:
            problems.append("%s: none of its lit tests runs it in %s mode" % (name, mode))
    return problems


def check_static(root):
    """Problems found in the source tree alone."""
    problems = []
    cat = catalog(root)
    reg = registered(root)
    rows = readme_rows(root)
    cmake = read(root, "checks/CMakeLists.txt") or ""
    for name in sorted(set(cat) | set(reg)):
        if name not in cat:
            problems.append("%s: registered but has no entry in rules/catalog.yaml" % name)
            continue
        if name not in reg:
            problems.append("%s: in rules/catalog.yaml but not registered in checks/RdmaTidyModule.cpp" % name)
        entry = cat[name]
        cls = reg.get(name, class_name(name))
        if cls != class_name(name):
            problems.append("%s: registered as %s, expected %s" % (name, cls, class_name(name)))
        for ext in ("h", "cpp"):
            if read(root, "checks/%s.%s" % (cls, ext)) is None:
                problems.append("%s: checks/%s.%s is missing" % (name, cls, ext))
        if not re.search(r"^\s*%s\.cpp\s*\)?\s*$" % re.escape(cls), cmake, re.M):
            problems.append("%s: checks/%s.cpp is not in checks/CMakeLists.txt" % (name, cls))
        doc = "docs/checks/%s.md" % name
        if entry.get("doc") != doc:
            problems.append("%s: catalog doc is %r, expected %r" % (name, entry.get("doc"), doc))
        severity = entry.get("severity")
        page = doc_severity(root, name)
        if page is None:
            problems.append("%s: %s is missing" % (name, doc))
        elif page != severity:
            problems.append("%s: %s says severity %s, the catalog %s" % (name, doc, page, severity))
        if name not in rows:
            problems.append("%s: no row in README.md's check table" % name)
        elif rows[name] != severity:
            problems.append("%s: README.md says severity %s, the catalog %s" % (name, rows[name], severity))
        problems += test_problems(root, name)
    for name in sorted(set(rows) - set(cat)):
        problems.append("%s: README.md lists a check the catalog does not have" % name)
    return problems


def listed(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return out


def check_binaries(root, args):
    """Problems in what the built ulplint and plugin register."""
    problems = []
    cat = catalog(root)
    if args.ulplint:
        out = listed([args.ulplint, "--list-checks"])
        got = dict(re.findall(r"^(rdma-[\w-]+) \[(\w+)\]", out, re.M))
        for name in sorted(set(cat) | set(got)):
            if name not in got:
                problems.append("%s: ulplint --list-checks does not list it" % name)
            elif name not in cat:
                problems.append("%s: ulplint lists a check the catalog does not have" % name)
            elif got[name] != cat[name]["severity"]:
                problems.append("%s: ulplint says severity %s, the catalog %s"
                                % (name, got[name], cat[name]["severity"]))
    if args.plugin:
        out = listed([args.clang_tidy, "--load=" + args.plugin,
                      "--checks=-*,rdma-*", "--list-checks"])
        got = set(re.findall(r"^\s+(rdma-[\w-]+)\s*$", out, re.M))
        for name in sorted(set(cat) ^ got):
            where = "the plugin does not register it" if name in cat else \
                "the plugin registers a check the catalog does not have"
            problems.append("%s: %s" % (name, where))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--root", default=here, help="source tree (default: this one)")
    ap.add_argument("--ulplint", help="built ulplint to compare with the catalog")
    ap.add_argument("--plugin", help="built libulplint-tidy.so to compare")
    ap.add_argument("--clang-tidy", default="clang-tidy-22")
    args = ap.parse_args()
    problems = check_static(args.root) + check_binaries(args.root, args)
    for p in problems:
        print("check_registry: " + p)
    if not problems:
        print("check_registry: %d checks, every touch point present and consistent"
              % len(catalog(args.root)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
