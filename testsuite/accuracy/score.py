#!/usr/bin/env python3
"""Scores ulplint on the accuracy corpus: precision and recall per check.

  score.py --ulplint BUILD/tool/ulplint [--floor floor.json] [--json out.json]
           [--details] [--only PATTERN] [-j N]

Every top-level .c file of userspace/ and kernel/ is one program, every
subdirectory one multi-file program (README.md). Each program is analysed
on its own, with every rdma-* check, through a compile database of its
files. Findings are matched with the BUG annotations of their function (or
file, or program, for BUG(file) and BUG(program)); a finding left over is a
false positive, an annotation left over a false negative.

With --floor, exits 1 when a check's precision or recall is below the floor,
or when it has fewer BUG or OK annotations than the floor records; exits 2
when ulplint fails on a program (a crash or an unparsable file is never
scored as "no findings").
"""
import argparse
import collections
import concurrent.futures
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
USER_FLAGS = ["-std=gnu11", "-D_GNU_SOURCE"]


def kernel_flags(corpus):
    """The kernel stand-in headers next to the corpus (testsuite/Inputs)."""
    include = os.path.join(os.path.dirname(corpus), "Inputs", "kernel", "include")
    return ["-nostdinc", "-D__KERNEL__", "-I" + include]


# `rdma-x, rdma-y`: the checks an annotation names.
CHECK_LIST = r"(rdma-[a-z0-9-]+(?:\s*,\s*rdma-[a-z0-9-]+)*)"
ANNOTATION = re.compile(r"\b(BUG|OK)(?:\((file|program)\))?:\s*" + CHECK_LIST)


# `NOT-ANNOTATED: rdma-x -- why` in a program's header: its author did not
# annotate that check, so its findings there are neither right nor wrong.
# The list may go on over the next lines of a block or line comment.
NOT_ANNOTATED = re.compile(
    r"\bNOT-ANNOTATED:\s*(rdma-[a-z0-9-]+(?:\s*,(?:\s|\*|//)*rdma-[a-z0-9-]+)*)")


def split_checks(checks):
    return re.split(r"\s*,(?:\s|\*|//)*", checks.strip())


def programs(root):
    """(name, domain, [files]) for every program of the corpus."""
    out = []
    for domain in ("userspace", "kernel"):
        base = os.path.join(root, domain)
        if not os.path.isdir(base):
            continue
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            path = os.path.realpath(path)
            if entry.endswith(".c"):
                out.append((domain + "/" + entry, domain, [path]))
            elif os.path.isdir(path):
                files = sorted(os.path.join(path, f) for f in os.listdir(path)
                               if f.endswith(".c"))
                if files:
                    out.append((domain + "/" + entry, domain, files))
    return out


def blank_comments_and_strings(text):
    """The text with comments, strings and character literals blanked, line
    structure kept, so braces can be counted."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_regions(text):
    """[(first_line, last_line)] of the top-level brace blocks that follow a
    `)`: function bodies, whatever the brace style."""
    clean = blank_comments_and_strings(text)
    regions = []
    depth, line, start, last_token = 0, 1, None, ""
    for c in clean:
        if c == "\n":
            line += 1
            continue
        if c == "{":
            if depth == 0 and last_token == ")":
                start = line
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and start is not None:
                regions.append((start, line))
                start = None
        if not c.isspace() and depth == 0:
            last_token = c
    return regions


def region_of(regions, line):
    for r in regions:
        if r[0] <= line <= r[1]:
            return r
    return None


class Program:
    def __init__(self, name, domain, files):
        self.name, self.domain, self.files = name, domain, files
        self.regions = {}
        self.bugs = []  # (check, scope, file, line)
        self.oks = []   # (check, file, line)
        self.unannotated = set()
        for f in files + self.headers():
            text = open(f, encoding="utf-8").read()
            self.regions[f] = function_regions(text)
            for checks in NOT_ANNOTATED.findall(text):
                self.unannotated.update(split_checks(checks))
            for no, src in enumerate(text.split("\n"), 1):
                for kind, scope, checks in ANNOTATION.findall(src):
                    for check in split_checks(checks):
                        if kind == "BUG":
                            self.bugs.append((check, scope or "function", f, no))
                        else:
                            self.oks.append((check, f, no))

    def headers(self):
        if len(self.files) < 2:
            return []
        d = os.path.dirname(self.files[0])
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".h"))

    def region(self, f, line):
        return region_of(self.regions.get(f, []), line)


def run_ulplint(ulplint, prog, workdir, corpus):
    flags = kernel_flags(corpus) if prog.domain == "kernel" else USER_FLAGS
    db = [{"directory": os.path.dirname(f), "file": f,
           "arguments": ["clang-22"] + flags + ["-c", f]}
          for f in prog.files]
    d = os.path.join(workdir, prog.name.replace("/", "_"))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "compile_commands.json"), "w") as out:
        json.dump(db, out)
    result = os.path.join(d, "findings.json")
    cmd = [ulplint, "-p", d, "--no-cache", "--quiet", "-j", "1",
           "--checks=rdma-*", "--format=json", "-o", result]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not os.path.exists(result):
        return None, "exit %d: %s" % (proc.returncode, proc.stderr.strip()[-2000:])
    data = json.load(open(result))
    if data.get("errors"):
        return None, "errors: %s" % data["errors"]
    findings = []
    for f in data["findings"]:
        path = f["file"] if os.path.isabs(f["file"]) else os.path.join(os.getcwd(), f["file"])
        findings.append((f["check"], os.path.realpath(path), f["line"], f["message"]))
    # Functions whose analysis hit a budget: findings there may be missing.
    for i in data.get("incomplete", []):
        findings.append(("incomplete", i["file"], i["line"], i["function"]))
    return findings, None


def score(prog, findings):
    """Per check: TP, FP, FN and the unmatched items, for one program."""
    out = collections.defaultdict(lambda: {"tp": 0, "fp": [], "fn": []})
    checks = {b[0] for b in prog.bugs} | {f[0] for f in findings}
    for check in checks - prog.unannotated:
        left = [f for f in findings if f[0] == check]
        bugs = [b for b in prog.bugs if b[0] == check]
        unmatched = []
        # Function-scoped annotations first, then file, then program.
        for scope in ("function", "file", "program"):
            for b in [b for b in bugs if b[1] == scope]:
                _, _, bf, bl = b
                want = prog.region(bf, bl)
                match = None
                for f in left:
                    if scope == "program":
                        match = f
                    elif f[1] != bf:
                        continue
                    elif scope == "file" or prog.region(f[1], f[2]) == want:
                        match = f
                    if match:
                        break
                if match:
                    left.remove(match)
                    out[check]["tp"] += 1
                else:
                    unmatched.append(b)
        out[check]["fp"] = left
        out[check]["fn"] = unmatched
    return out


def fired_near_misses(prog, findings):
    fired = []
    for check, f, line in prog.oks:
        want = prog.region(f, line)
        if any(x[0] == check and x[1] == f and prog.region(x[1], x[2]) == want
               for x in findings):
            fired.append((check, f, line))
    return fired


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ulplint", required=True)
    p.add_argument("--corpus", default=HERE, help="the corpus (testsuite/accuracy)")
    p.add_argument("--floor", help="fail below these numbers (floor.json)")
    p.add_argument("--json", help="write the scores here")
    p.add_argument("--raise-floor", metavar="FLOOR",
                   help="raise the floors in FLOOR to today's numbers (never lowers one)")
    p.add_argument("--details", action="store_true",
                   help="list every false positive and false negative")
    p.add_argument("--only", help="programs matching this glob (userspace/*mw*)")
    p.add_argument("-j", type=int, default=os.cpu_count())
    a = p.parse_args()
    a.corpus = os.path.realpath(a.corpus)

    progs = [Program(*x) for x in programs(a.corpus)]
    if a.only:
        progs = [x for x in progs if fnmatch.fnmatch(x.name, a.only)]
    if not progs:
        print("score: no programs in %s" % a.corpus, file=sys.stderr)
        return 2
    totals = collections.defaultdict(lambda: collections.Counter())
    details, failures, fired, incomplete = [], [], [], []
    with tempfile.TemporaryDirectory() as work, \
            concurrent.futures.ThreadPoolExecutor(a.j) as pool:
        jobs = {prog: pool.submit(run_ulplint, a.ulplint, prog, work, a.corpus)
                for prog in progs}
        for prog in progs:
            findings, error = jobs[prog].result()
            if error:
                failures.append("%s: %s" % (prog.name, error))
                continue
            for f in [f for f in findings if f[0] == "incomplete"]:
                incomplete.append("incomplete %s: %s" % (prog.name, f[3]))
            findings = [f for f in findings if f[0] != "incomplete"]
            for check, r in score(prog, findings).items():
                t = totals[check]
                t["tp"] += r["tp"]
                t["fp"] += len(r["fp"])
                t["fn"] += len(r["fn"])
                for f in r["fp"]:
                    details.append("FP %s %s:%d %s" % (check, os.path.relpath(f[1], a.corpus), f[2], f[3]))
                for b in r["fn"]:
                    details.append("FN %s %s:%d (%s)" % (check, os.path.relpath(b[2], a.corpus), b[3], b[1]))
            for b in prog.bugs:
                totals[b[0]]["bugs"] += 1
            for o in prog.oks:
                totals[o[0]]["oks"] += 1
            for o in fired_near_misses(prog, findings):
                totals[o[0]]["fired"] += 1
                fired.append("near-miss fired %s %s:%d" % (o[0], os.path.relpath(o[1], a.corpus), o[2]))

    if failures:
        for f in failures:
            print("score: ulplint failed on " + f, file=sys.stderr)
        return 2

    def ratio(n, d):
        return n / d if d else 1.0

    rows = {}
    print("%-35s %4s %4s %4s %4s %4s %6s %6s %5s" %
          ("check", "BUG", "OK", "TP", "FP", "FN", "prec", "recall", "fired"))
    all_ = collections.Counter()
    for check in sorted(totals):
        t = totals[check]
        all_.update(t)
        prec, rec = ratio(t["tp"], t["tp"] + t["fp"]), ratio(t["tp"], t["tp"] + t["fn"])
        rows[check] = {"bugs": t["bugs"], "oks": t["oks"], "tp": t["tp"], "fp": t["fp"],
                       "fn": t["fn"], "fired": t["fired"],
                       "precision": round(prec, 3), "recall": round(rec, 3)}
        print("%-35s %4d %4d %4d %4d %4d %6.2f %6.2f %5d" %
              (check, t["bugs"], t["oks"], t["tp"], t["fp"], t["fn"], prec, rec, t["fired"]))
    prec = ratio(all_["tp"], all_["tp"] + all_["fp"])
    rec = ratio(all_["tp"], all_["tp"] + all_["fn"])
    print("%-35s %4d %4d %4d %4d %4d %6.2f %6.2f %5d" %
          ("all", all_["bugs"], all_["oks"], all_["tp"], all_["fp"], all_["fn"], prec, rec, all_["fired"]))
    print("programs: %d (analysis incomplete in %d functions of %d programs)" %
          (len(progs), len(incomplete), len({i.split(":")[0] for i in incomplete})))
    if a.details:
        for line in sorted(details) + sorted(fired) + sorted(incomplete):
            print(line)
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"programs": len(progs), "checks": rows,
                       "all": {"precision": round(prec, 3), "recall": round(rec, 3)}},
                      out, indent=2, sort_keys=True)

    if a.raise_floor:
        floor = json.load(open(a.raise_floor)) if os.path.exists(a.raise_floor) else {}
        checks = floor.setdefault("checks", {})
        for check, r in rows.items():
            f = checks.setdefault(check, {})
            for key in ("precision", "recall", "bugs", "oks"):
                f[key] = max(f.get(key, 0), r[key])
        floor["programs"] = max(floor.get("programs", 0), len(progs))
        with open(a.raise_floor, "w") as out:
            json.dump(floor, out, indent=2, sort_keys=True)
            out.write("\n")

    if a.floor:
        floor = json.load(open(a.floor))
        low = []
        for check, f in sorted(floor.get("checks", {}).items()):
            r = rows.get(check)
            if not r:
                low.append("%s: no annotations or findings at all" % check)
                continue
            for key in ("precision", "recall"):
                if r[key] + 1e-9 < f.get(key, 0):
                    low.append("%s: %s %.3f below the floor %.3f" % (check, key, r[key], f[key]))
            for key in ("bugs", "oks"):
                if r[key] < f.get(key, 0):
                    low.append("%s: %d %s annotations, the floor has %d" % (check, r[key], key, f[key]))
        if floor.get("programs", 0) > len(progs):
            low.append("%d programs, the floor has %d" % (len(progs), floor["programs"]))
        for line in low:
            print("score: " + line, file=sys.stderr)
        if low:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
