#!/usr/bin/env python3
"""Create a new rdma-* check with every touch point, like clang-tidy's own.

    scripts/add_new_check.py rdma-foo-bar "One sentence: what it finds." \
        [--severity warning] [--category correctness] [--root DIR]

Writes checks/FooBarCheck.{h,cpp} (a working example that reports each
registration with remote rights, to be replaced by the real analysis),
adds the source to checks/CMakeLists.txt and the registration to
checks/RdmaTidyModule.cpp, appends a catalog entry to rules/catalog.yaml,
writes docs/checks/rdma-foo-bar.md and testsuite/checks/rdma-foo-bar.c
(run by ulplint and by the plugin) and adds the README row. Then
scripts/check_registry.py verifies the tree. Every file is written to a
temporary file and renamed over the old one.
"""
import argparse
import os
import re
import sys
import tempfile

SEVERITIES = ("error", "warning", "note")
CATEGORIES = ("correctness", "security", "portability", "resource",
              "performance", "migration")


def class_name(check):
    words = check[len("rdma-"):].split("-")
    return "".join(w[:1].upper() + w[1:] for w in words) + "Check"


def write(path, text):
    """Replace \\p path atomically: a crash leaves the old file or the new."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".add_new_check.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if os.path.exists(path):
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def header(name, cls, summary):
    guard = "ULPLINT_CHECKS_%s_H" % cls.upper()
    first = "//===- %s.h - %s " % (cls, name)
    first += "-" * max(3, 80 - len(first) - len("*- C++ -*-===//")) + "*- C++ -*-===//"
    return """%s

#ifndef %s
#define %s

#include "engine/RdmaCheck.h"

namespace ulplint {

/// %s
/// Docs: docs/checks/%s.md
class %s : public RdmaCheck {
public:
  using RdmaCheck::RdmaCheck;

protected:
  void checkUnit(const TuAnalysis &A) override;
  bool ulpOnly() const override { return true; }
};

} // namespace ulplint

#endif
""" % (first, guard, guard, summary, name, cls)


def source(name, cls):
    first = "//===- %s.cpp - %s " % (cls, name)
    first += "-" * max(3, 80 - len(first) - len("===//")) + "===//"
    return """%s

#include "%s.h"
#include "engine/Sites.h"

namespace ulplint {

// The example the scaffold starts from: each registration that asks for
// remote rights. Replace it with the analysis; the engine's models
// (AccessSites, Lifecycle, WorkRequests, Linear) are shared by every check.
void %s::checkUnit(const TuAnalysis &A) {
  uint64_t Remote = A.flagBit(Flag::RemoteRead) | A.flagBit(Flag::RemoteWrite);
  for (const AccessSite &S : AccessSites::of(A).All) {
    if (S.K != AccessSite::Registration)
      continue;
    bool Grants = llvm::any_of(S.Value.Alts, [&](const FlagAlt &F) {
      return F.Known & Remote;
    });
    if (Grants)
      report(A, S.Loc, "'" + S.What + "' grants remote access here");
  }
}

} // namespace ulplint
""" % (first, cls, cls)


def lit_test(name):
    return """// RUN: %%check_ulplint %%s %s %%t
// RUN: %%check_ulplint --mode=plugin %%s %s %%t.plugin

// A server that exposes one buffer to its peer and keeps a private staging
// buffer: the exposed registration is reported, the local one is not.

#include <infiniband/verbs.h>
#include <stdlib.h>

struct srv {
  struct ibv_pd *pd;
  struct ibv_mr *exposed;
  struct ibv_mr *staging;
  char *buf, *stage;
};

int srv_setup(struct srv *s, size_t len) {
  s->buf = malloc(len);
  s->stage = malloc(len);
  if (!s->buf || !s->stage)
    return -1;
  s->exposed = ibv_reg_mr(s->pd, s->buf, len,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  // CHECK-MESSAGES: :[[@LINE-2]]:16: warning: 'ibv_reg_mr' grants remote access here [%s]
  if (!s->exposed)
    return -1;
  // Near miss: local access only.
  s->staging = ibv_reg_mr(s->pd, s->stage, len, IBV_ACCESS_LOCAL_WRITE);
  return s->staging ? 0 : -1;
}
""" % (name, name, name)


def doc_page(name, severity, category, summary):
    return """# %s

**Severity:** %s · **Category:** %s

%s

## What is reported

Each registration (`ibv_reg_mr()` and its variants) whose access flags
include remote rights. This is the example the check was created from;
describe the real analysis here.

## Example

```c
mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
// warning: 'ibv_reg_mr' grants remote access here
```

## Fix

Say what the user changes, and the core-managed API (rdma_rw, regcore)
that makes the finding impossible.

## Options

Global options shared by every rdma-* check: `ApiWrappers` and
`CoreFiles`; see the [user guide](../user-guide.md#options).
""" % (name, severity, category, summary)


def catalog_entry(name, severity, category, summary):
    return """  - name: %s
    severity: %s
    category: %s
    summary: %s
    rationale: |
      Why the pattern is a bug, with the specification or kernel code that
      says so.
    fix: |
      What the user changes; the fix-it, when the check offers one.
    doc: docs/checks/%s.md
""" % (name, severity, category, summary, name)


def add_to_cmake(text, cls):
    """Keep the checks' sources in the library, before the module."""
    if re.search(r"^\s*%s\.cpp\b" % cls, text, re.M):
        return text
    return re.sub(r"^(\s*)RdmaTidyModule\.cpp\)",
                  r"\g<1>%s.cpp\n\g<1>RdmaTidyModule.cpp)" % cls, text,
                  count=1, flags=re.M)


def add_to_module(text, name, cls):
    includes = re.findall(r'^#include "(\w+Check)\.h"$', text, re.M)
    if cls not in includes:
        later = [i for i in includes if i > cls]
        anchor = ('#include "%s.h"' % later[0]) if later else \
            '#include "clang-tidy/ClangTidyModule.h"'
        text = text.replace(anchor, '#include "%s.h"\n%s' % (cls, anchor), 1)
    registration = '    F.registerCheck<%s>("%s");\n' % (cls, name)
    if registration not in text:
        text = re.sub(r"(\n  \}\n\};)", "\n" + registration.rstrip("\n") + r"\1",
                      text, count=1)
    return text


def add_to_readme(text, name, severity, summary):
    row = "| [%s](docs/checks/%s.md) | %s | %s |" % (name, name, severity,
                                                    summary.rstrip("."))
    if "| [%s](" % name in text:
        return text
    lines = text.split("\n")
    last = max(i for i, l in enumerate(lines) if l.startswith("| [rdma-"))
    lines.insert(last + 1, row)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", help="rdma-<words>, lower case, '-' separated")
    ap.add_argument("summary", help="one sentence: what the check finds")
    ap.add_argument("--severity", default="warning", choices=SEVERITIES)
    ap.add_argument("--category", default="correctness", choices=CATEGORIES)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--root", default=here, help="source tree (default: this one)")
    args = ap.parse_args()

    if not re.fullmatch(r"rdma-[a-z0-9]+(-[a-z0-9]+)*", args.name):
        ap.error("the name must look like rdma-foo-bar")
    summary = args.summary.strip()
    if not summary.endswith("."):
        summary += "."
    root, name, cls = args.root, args.name, class_name(args.name)
    paths = {
        "h": os.path.join(root, "checks", cls + ".h"),
        "cpp": os.path.join(root, "checks", cls + ".cpp"),
        "doc": os.path.join(root, "docs", "checks", name + ".md"),
        "test": os.path.join(root, "testsuite", "checks", name + ".c"),
    }
    catalog_path = os.path.join(root, "rules", "catalog.yaml")
    catalog = read(catalog_path)
    if re.search(r"^  - name: %s$" % re.escape(name), catalog, re.M) or \
            any(os.path.exists(p) for p in paths.values()):
        print("add_new_check: %s already exists" % name, file=sys.stderr)
        return 1

    write(paths["h"], header(name, cls, summary))
    write(paths["cpp"], source(name, cls))
    write(paths["doc"], doc_page(name, args.severity, args.category, summary))
    write(paths["test"], lit_test(name))
    write(catalog_path, catalog.rstrip("\n") + "\n" +
          catalog_entry(name, args.severity, args.category, summary))
    for rel, edit in (("checks/CMakeLists.txt", lambda t: add_to_cmake(t, cls)),
                      ("checks/RdmaTidyModule.cpp",
                       lambda t: add_to_module(t, name, cls)),
                      ("README.md",
                       lambda t: add_to_readme(t, name, args.severity, summary))):
        path = os.path.join(root, rel)
        write(path, edit(read(path)))
    print("add_new_check: created %s (%s). Write its rationale and fix in "
          "rules/catalog.yaml and %s, replace the example analysis, then "
          "build and run testsuite/checks/%s.c"
          % (name, cls, os.path.relpath(paths["doc"], root), name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
