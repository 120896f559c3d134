#!/usr/bin/env python3
"""Mutation fuzzing of ulplint, the clang-tidy plugin and --fix.

    testsuite/fuzz/fuzz.py [--build build] [--mutants 3000] [--seed 1]
                           [--batch 25] [--jobs 1] [--keep DIR] [--json FILE]

Takes the test inputs (testsuite/checks/*.c, testsuite/accuracy/**/*.c),
mutates them (token and line edits, identifier and number swaps, deep
nesting, truncation, binary bytes) and, batch by batch:

  * runs ulplint on the batch's compile database (JSON output);
  * runs clang-tidy-22 with libulplint-tidy.so on the same files;
  * runs ulplint --fix on a copy and checks every file against an
    independent application of the fixes ulplint reported.

It counts crashes of ulplint's own code (the driver dying, or a worker or
the plugin crashing with a frame in ulplint's binaries), crashes inside
clang (stack overflows of the parser and the like, which ulplint must
survive), hangs, corrupted files (a fixed file that is not the original
with the reported fixes applied, or a temporary file left behind), and
fixes that break a file that compiled. Not in the default test run: it
takes minutes. docs/reliability.md has the counts of a real run.
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL_INCLUDE = os.path.join(ROOT, "testsuite", "Inputs", "kernel", "include")
USER_FLAGS = ["-std=gnu11", "-D_GNU_SOURCE", "-I" + os.path.join(ROOT, "regcore", "include"),
              "-I" + os.path.join(ROOT, "testsuite", "checks", "Inputs")]
KERNEL_FLAGS = ["-std=gnu11", "-nostdinc", "-D__KERNEL__", "-I" + KERNEL_INCLUDE,
                "-Wno-unused-function"]
TIMEOUT = 600  # seconds per tool run on a batch

#===-- Inputs and mutations ------------------------------------------------===#


def seeds():
    """(name, text, flags) of every test input."""
    paths = sorted(p for p in _walk(os.path.join(ROOT, "testsuite", "checks")) if p.endswith(".c"))
    paths += sorted(p for p in _walk(os.path.join(ROOT, "testsuite", "accuracy")) if p.endswith(".c"))
    out = []
    for p in paths:
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        kernel = "--kernel" in text.split("\n", 1)[0] or "/kernel/" in p
        flags = (KERNEL_FLAGS if kernel else USER_FLAGS) + _run_line_flags(text)
        out.append((os.path.relpath(p, ROOT), text, flags))
    return out


def _run_line_flags(text):
    """Compiler flags of the first RUN line (after its second '--')."""
    m = re.search(r"RUN:[^\n]*? -- [^\n]*?-- ([^\n]*)", text)
    return m.group(1).split() if m else []


def _walk(top):
    for d, _, files in os.walk(top):
        if "/Inputs" in d:
            continue
        for f in files:
            yield os.path.join(d, f)


TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|0x[0-9a-fA-F]+|\d+|->|<<|>>|&&|\|\||[^\sA-Za-z0-9_]")
IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
NUMBER = re.compile(r"\b(0x[0-9a-fA-F]+|\d+)\b")
EDGE_NUMBERS = ["0", "1", "-1", "2", "4096", "0x7fffffff", "0xffffffff", "4294967296",
                "0xffffffffffffffff", "1 << 31", "-2147483648", "65536", "9999999999999999999999"]
PUNCT = ["{", "}", "(", ")", ";", ",", "*", "&", "->", ".", "[", "]", "=", "|", "#", "\"", "'",
         "/*", "*/", "\\", "?", ":"]


def _tokens(text):
    return [m.span() for m in TOKEN.finditer(text)]


def delete_token(rng, text, pool):
    spans = _tokens(text)
    if not spans:
        return text
    a, b = rng.choice(spans)
    return text[:a] + text[b:]


def delete_range(rng, text, pool):
    if len(text) < 2:
        return text
    a = rng.randrange(len(text))
    return text[:a] + text[a + rng.randint(1, 200):]


def insert_punct(rng, text, pool):
    a = rng.randrange(len(text) + 1)
    return text[:a] + rng.choice(PUNCT) + text[a:]


def swap_identifier(rng, text, pool):
    spans = [m.span() for m in IDENT.finditer(text)]
    if not spans:
        return text
    a, b = rng.choice(spans)
    return text[:a] + rng.choice(pool) + text[b:]


def swap_number(rng, text, pool):
    spans = [m.span() for m in NUMBER.finditer(text)]
    if not spans:
        return text
    a, b = rng.choice(spans)
    return text[:a] + rng.choice(EDGE_NUMBERS) + text[b:]


def duplicate_line(rng, text, pool):
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines) + 1), lines[i])
    return "\n".join(lines)


def delete_line(rng, text, pool):
    lines = text.split("\n")
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def swap_lines(rng, text, pool):
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def truncate(rng, text, pool):
    return text[:rng.randrange(len(text) + 1)]


def binary_bytes(rng, text, pool):
    a = rng.randrange(len(text) + 1)
    junk = "".join(chr(rng.choice([0, 1, 0x7f, 0xdc80, 0xdcff, 0xdcc3])) for _ in range(rng.randint(1, 8)))
    return text[:a] + junk + text[a:]


def deep_nesting(rng, text, pool):
    """Parentheses, blocks or else-if links around a statement."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    n = rng.choice([50, 200, 1000, 3000])
    kind = rng.randrange(3)
    if kind == 0:
        lines.insert(i, "int fuzz_nest_%d = %s1%s;" % (i, "(" * n, ")" * n))
    elif kind == 1:
        lines.insert(i, "void fuzz_block_%d(void) { %s ; %s }" % (i, "{" * n, "}" * n))
    else:
        chain = "".join(" else if (x == %d) return %d;" % (k, k) for k in range(n))
        lines.insert(i, "int fuzz_chain_%d(int x) { if (x < 0) return -1;%s return 0; }" % (i, chain))
    return "\n".join(lines)


def macro_redefinition(rng, text, pool):
    name = rng.choice(pool)
    return "#define %s %s\n" % (name, rng.choice(pool + EDGE_NUMBERS)) + text


MUTATORS = [delete_token, delete_range, insert_punct, swap_identifier, swap_number,
            duplicate_line, delete_line, swap_lines, truncate, binary_bytes, deep_nesting,
            macro_redefinition]


def mutate(rng, text, pool):
    for _ in range(rng.choice([1, 1, 2, 3])):
        text = rng.choice(MUTATORS)(rng, text, pool)
    return text

#===-- Running the tools ---------------------------------------------------===#


def run(cmd, cwd=None, timeout=TIMEOUT):
    """(returncode or 'timeout', stdout+stderr)."""
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"").decode("utf-8", "replace")


def write_batch(d, mutants):
    os.makedirs(d)
    db = []
    for name, text, flags in mutants:
        with open(os.path.join(d, name), "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        db.append({"directory": d, "file": name, "arguments": ["clang-22"] + flags + ["-c", name]})
    with open(os.path.join(d, "compile_commands.json"), "w") as f:
        json.dump(db, f)


def own_frames(log, binaries):
    """Stack frames of a crash log that are in ulplint's binaries."""
    return [l for l in log.split("\n") if re.match(r"\s*#\d+ ", l) and any(b in l for b in binaries)]


def crash_logs(stderr):
    """{file: (reason, log)} of the units ulplint reports as crashed."""
    out, current = {}, None
    for line in stderr.split("\n"):
        m = re.match(r".*error: (.*): not analysed: (ulplint crashed: .*)$", line)
        if m:
            current = m.group(1)
            out[current] = [m.group(2), ""]
        elif current and not line.startswith("ulplint:"):
            out[current][1] += line + "\n"
        else:
            current = None
    return {k: tuple(v) for k, v in out.items()}


def expected_fixed(original, fixes):
    """The original with the reported fixes applied as ulplint applies them:
    finding by finding, a replacement another finding already brought
    skipped, a finding dropped whole when one of its replacements conflicts
    with one applied."""
    applied = set()
    for reps in fixes:
        new = set(reps) - applied
        if any(_conflict(r, a) for r in new for a in applied):
            continue
        applied |= new
    data = original.encode("utf-8", "surrogateescape")
    for off, length, text in sorted(applied, reverse=True):
        data = data[:off] + text.encode("utf-8", "surrogateescape") + data[off + length:]
    return data


def _conflict(r, a):
    """Overlapping ranges; an insertion strictly inside a range; two
    insertions at one offset (their order would be arbitrary)."""
    (o1, l1, _), (o2, l2, _) = r, a
    if l1 == 0 and l2 == 0:
        return o1 == o2
    if l1 == 0:
        return o2 < o1 < o2 + l2
    if l2 == 0:
        return o1 < o2 < o1 + l1
    return o1 < o2 + l2 and o2 < o1 + l1


class Counts(dict):
    def add(self, key, n=1):
        self[key] = self.get(key, 0) + n


def check_ulplint(a, d, names, counts, problems):
    rc, out = run([a.ulplint, "-p", d, "--no-cache", "-j%d" % a.jobs, "--quiet", "--format=json",
                   "-o", os.path.join(d, "out.json")] + a.ulplint_arg)
    if rc == "timeout" or rc not in (0, 1, 2):
        counts.add("ulplint: driver crashes or hangs")
        problems.append(("ulplint driver", rc, d, out[-4000:]))
        return None
    with open(os.path.join(d, "out.json")) as f:
        result = json.load(f)
    broken = {e["file"] for e in result["errors"]}
    crashed = {e["file"] for e in result["errors"] if e["message"].startswith("ulplint crashed")}
    counts.add("units analysed", len(names) - len(broken))
    counts.add("units not analysed: compiler errors", len(broken - crashed))
    for name, (reason, log) in crash_logs(out).items():
        mine = own_frames(log, ["/tool/ulplint", "ulplint::"])
        if mine or ("stack overflow" in reason and "current parser token" not in reason):
            counts.add("ulplint: crashes in ulplint's code")
            problems.append(("ulplint own crash", reason, os.path.join(d, name), "\n".join(mine[:10])))
        else:
            counts.add("ulplint: crashes inside clang, survived")
            problems.append(("clang crash (isolated)", reason, os.path.join(d, name), ""))
    return result


def check_plugin(a, d, names, counts, problems):
    """clang-tidy on the whole batch; a crash is narrowed down file by file."""
    base = [a.clang_tidy, "--load=" + a.plugin, "--checks=-*,rdma-*", "--quiet", "-p", d]
    rc, out = run(base + names, cwd=d)
    if rc != "timeout" and rc >= 0 and rc < 128:
        return
    for name in names:
        rc, out = run(base + [name], cwd=d)
        if rc != "timeout" and 0 <= rc < 128:
            continue
        mine = own_frames(out, ["libulplint-tidy.so"])
        key = "plugin: crashes in ulplint's code" if mine or rc == "timeout" else \
              "plugin: crashes inside clang (clang-tidy has no isolation)"
        counts.add(key)
        problems.append((key, rc, os.path.join(d, name), "\n".join(mine[:10]) or out[-1500:]))


def fixes_by_file(result, root):
    """{file: [[(offset, length, text), ...] per finding]} of parsed units."""
    broken = {e["file"] for e in result["errors"]}
    out = {}
    for f in result["findings"]:
        if f["file"] in broken or not f["fixes"]:
            continue
        reps = [(x["offset"], x["length"], x["replacement"]) for x in f["fixes"]]
        for file in {x["file"] for x in f["fixes"]}:
            out.setdefault(file, []).append([r for r, x in zip(reps, f["fixes"]) if x["file"] == file])
    return out


def check_fix(a, d, names, mutants, result, counts, problems):
    fd = d + "-fix"
    shutil.copytree(d, fd)
    with open(os.path.join(fd, "compile_commands.json")) as f:
        db = json.load(f)
    for e in db:
        e["directory"] = fd
    with open(os.path.join(fd, "compile_commands.json"), "w") as f:
        json.dump(db, f)
    rc, out = run([a.ulplint, "-p", fd, "--no-cache", "-j%d" % a.jobs, "--quiet", "--fix",
                   "--format=json", "-o", os.path.join(fd, "fix.json"), "--source-root=" + fd]
                  + a.ulplint_arg)
    if rc == "timeout" or rc not in (0, 1, 2):
        counts.add("--fix: driver crashes or hangs")
        problems.append(("--fix driver", rc, fd, out[-4000:]))
        return
    with open(os.path.join(fd, "fix.json")) as f:
        fixes = fixes_by_file(json.load(f), fd)
    errored = {e["file"] for e in result["errors"]}
    for name, text, flags in mutants:
        with open(os.path.join(fd, name), "rb") as f:
            actual = f.read()
        want = expected_fixed(text, fixes.get(name, []))
        if actual != want:
            counts.add("--fix: corrupted files")
            problems.append(("corrupted by --fix", name, fd, "%d bytes, expected %d" % (len(actual), len(want))))
        elif name in fixes and name not in errored:
            counts.add("--fix: files fixed")
            crc, cout = run(["clang-22", "-fsyntax-only"] + flags + [name], cwd=fd, timeout=120)
            if crc != 0:
                counts.add("--fix: fixed files that no longer compile (the checks' fixes)")
                problems.append(("fix breaks compilation", name, fd, cout[-1500:]))
    if any(".ulplint-tmp-" in n for n in os.listdir(fd)):
        counts.add("--fix: temporary files left")
        problems.append(("temporary file left", "", fd, ""))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--mutants", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--keep", help="copy the batches with problems here")
    p.add_argument("--ulplint-arg", action="append", default=[],
                   help="extra ulplint option, e.g. --unit-stack-size=8 (clang's "
                        "stack) to see crashes inside clang isolated")
    p.add_argument("--json", help="write the counts here")
    a = p.parse_args()
    a.ulplint = os.path.join(a.build, "tool", "ulplint")
    a.plugin = os.path.join(a.build, "tool", "libulplint-tidy.so")
    a.clang_tidy = shutil.which("clang-tidy-22") or "clang-tidy-22"
    # Stack dumps name functions only with the symbolizer.
    os.environ["PATH"] = "/usr/lib/llvm-22/bin" + os.pathsep + os.environ.get("PATH", "")

    rng = random.Random(a.seed)
    inputs = seeds()
    pool = sorted({w for _, t, _ in inputs for w in IDENT.findall(t)})
    counts, problems = Counts(), []
    work = tempfile.mkdtemp(prefix="ulplint-fuzz-")
    done = 0
    while done < a.mutants:
        n = min(a.batch, a.mutants - done)
        mutants = []
        for i in range(n):
            src, text, flags = rng.choice(inputs)
            mutants.append(("m%05d.c" % (done + i), mutate(rng, text, pool), flags))
        d = os.path.join(work, "batch-%05d" % done)
        write_batch(d, mutants)
        names = [m[0] for m in mutants]
        before = len(problems)
        result = check_ulplint(a, d, names, counts, problems)
        check_plugin(a, d, names, counts, problems)
        if result is not None:
            check_fix(a, d, names, mutants, result, counts, problems)
        if a.keep and len(problems) > before:
            shutil.copytree(d, os.path.join(a.keep, os.path.basename(d)), dirs_exist_ok=True)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(d + "-fix", ignore_errors=True)
        done += n
        counts["mutants"] = done
        print("fuzz: %d/%d mutants, %s" % (done, a.mutants, json.dumps(counts, sort_keys=True)),
              file=sys.stderr, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for kind, what, where, detail in problems:
        print("%s: %s %s\n%s" % (kind, what, where, detail))
    print(json.dumps(counts, indent=1, sort_keys=True))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed": a.seed, "inputs": len(inputs), "counts": counts}, f, indent=1, sort_keys=True)
    own = sum(v for k, v in counts.items() if "ulplint's code" in k or "driver" in k
              or "corrupted" in k or "temporary" in k)
    return 1 if own else 0


if __name__ == "__main__":
    sys.exit(main())
