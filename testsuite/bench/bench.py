#!/usr/bin/env python3
"""bench.py: ulplint against the parsing floor (clang-22 -fsyntax-only).

Not a test: a measurement for docs/performance.md. For each compile
database it

  1. asks ulplint for the exact command it parses each unit with
     (`ulplint --print-commands`) and runs `clang-22` with it, one unit at a
     time: total CPU time (user + system) and each unit's peak RSS;
  2. runs `ulplint -j1 --no-cache`: CPU time, wall time, peak RSS (the whole
     run, so an upper bound of any one unit's peak);
  3. runs `ulplint -j2` with a fresh cache directory (wall time at -j2, and
     the cold-cache run), then again (the warm-cache run);
  4. runs ulplint on each unit alone (`-j1 --no-cache FILE`): its CPU time
     against the same unit's clang time gives each unit's ratio to its own
     parse, and the worst unit is reported next to the totals (a total can
     hide one pathological unit); with --per-unit, also each unit's peak
     RSS. --no-unit-times skips this pass.

It prints a table and writes the numbers as JSON. The default databases are
the bundled example (BUILD/example/handmade) and the Linux corpus
(~/.cache/rdma-corpus/linux-6.12, see shared/corpus/linux) when present;
--corpus-root DIR adds every subdirectory of DIR that has a
compile_commands.json (the shared corpora: linux-6.12, tgt, fio, qperf,
dpdk, perftest).

  testsuite/bench/bench.py [--build BUILD] [--db DIR ...] [--corpus-root DIR]
                           [--json OUT] [--repeat N] [--per-unit]
                           [--no-unit-times]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_measured(argv, cwd=None):
    """Runs argv; returns (exit code, wall s, cpu s, peak RSS MiB) of it."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    cpu = usage.ru_utime + usage.ru_stime
    return proc.returncode, wall, cpu, usage.ru_maxrss / 1024.0, stderr


def print_commands(ulplint, db):
    out = subprocess.run([ulplint, "-p", db, "--print-commands"], check=True,
                         stdout=subprocess.PIPE).stdout
    return json.loads(out)


def clang_pass(clang, commands):
    """clang -fsyntax-only on every unit with ulplint's command."""
    cpu, wall, peaks, unit_cpu, failed = 0.0, 0.0, {}, {}, []
    for unit in commands:
        argv = [clang] + unit["arguments"][1:]
        rc, w, c, rss, err = run_measured(argv, cwd=unit["directory"])
        cpu += c
        wall += w
        peaks[unit["file"]] = rss
        unit_cpu[unit["file"]] = c
        if rc != 0:
            failed.append(unit["file"])
    return {"cpu_s": cpu, "wall_s": wall, "unit_cpu_s": unit_cpu,
            "unit_peak_rss_mib": peaks,
            "max_unit_peak_rss_mib": max(peaks.values()), "failed": failed}


def ulplint_run(ulplint, db, *extra):
    argv = [ulplint, "-p", db, "--quiet", "-o", os.devnull] + list(extra)
    rc, wall, cpu, rss, err = run_measured(argv)
    if rc not in (0, 1):
        sys.exit("bench: %s exited with %d:\n%s" % (" ".join(argv), rc,
                                                     err.decode(errors="replace")))
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss}


def ulplint_per_unit(ulplint, db, commands):
    """Each unit alone: {file: {"cpu_s", "wall_s", "peak_rss_mib"}}."""
    out = {}
    for unit in commands:
        out[unit["file"]] = ulplint_run(ulplint, db, "--no-cache", "-j1",
                                        unit["file"])
    return out


def measure(ulplint, clang, db, per_unit, unit_times=True):
    commands = print_commands(ulplint, db)
    result = {"database": db, "units": len(commands)}
    result["clang"] = clang_pass(clang, commands)
    result["ulplint_j1"] = ulplint_run(ulplint, db, "--no-cache", "-j1")
    cache = tempfile.mkdtemp(prefix="ulplint-bench-cache-")
    try:
        result["ulplint_j2_cold"] = ulplint_run(ulplint, db, "-j2",
                                                "--cache-dir=" + cache)
        result["ulplint_j2_warm"] = ulplint_run(ulplint, db, "-j2",
                                                "--cache-dir=" + cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if per_unit or unit_times:
        units = ulplint_per_unit(ulplint, db, commands)
        result["ulplint_unit_cpu_s"] = {f: u["cpu_s"] for f, u in units.items()}
        if per_unit:
            result["ulplint_unit_peak_rss_mib"] = {
                f: u["peak_rss_mib"] for f, u in units.items()}
    return result


def worst_unit(r):
    """(file, ratio, ulplint CPU s, clang CPU s) of the unit with the highest
    ulplint/clang CPU ratio, or None without per-unit times. A unit whose
    parse took under 10 ms is compared with 10 ms (timer resolution)."""
    times = r.get("ulplint_unit_cpu_s")
    if not times:
        return None
    parse = r["clang"]["unit_cpu_s"]
    rows = [(f, t / max(parse[f], 0.01), t, parse[f]) for f, t in times.items()
            if f in parse]
    return max(rows, key=lambda x: x[1]) if rows else None


def ratios(r):
    clang, j1 = r["clang"], r["ulplint_j1"]
    cold, warm = r["ulplint_j2_cold"], r["ulplint_j2_warm"]
    out = {
        "cpu_vs_clang": j1["cpu_s"] / clang["cpu_s"],
        "j1_peak_rss_vs_clang_max_unit": j1["peak_rss_mib"] / clang["max_unit_peak_rss_mib"],
        "j2_speedup": j1["wall_s"] / cold["wall_s"],
        "warm_vs_cold": warm["wall_s"] / cold["wall_s"],
    }
    worst = worst_unit(r)
    if worst:
        out["worst_unit"] = worst[0]
        out["worst_unit_vs_its_parse"] = worst[1]
        out["worst_unit_cpu_s"] = worst[2]
        out["worst_unit_parse_cpu_s"] = worst[3]
    if "ulplint_unit_peak_rss_mib" in r:
        per = [r["ulplint_unit_peak_rss_mib"][f] / clang["unit_peak_rss_mib"][f]
               for f in clang["unit_peak_rss_mib"]]
        out["unit_peak_rss_vs_clang_max"] = max(per)
        out["unit_peak_rss_vs_clang_median"] = sorted(per)[len(per) // 2]
    return out


def machine():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {"nproc": os.cpu_count(), "cpu": model,
            "ram_gib": round(mem_kib / 1024 / 1024, 1),
            "kernel": platform.release(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def print_table(results):
    rows = [("database", "units", "clang CPU s", "ulplint -j1 CPU s", "CPU ratio",
             "worst unit ratio", "-j1 wall s", "-j2 wall s", "-j2 speedup",
             "clang max unit RSS MiB", "ulplint -j1 RSS MiB", "RSS ratio", "warm s",
             "warm/cold")]
    for r in results:
        q = r["ratios"]
        worst = ("%.1f" % q["worst_unit_vs_its_parse"]
                 if "worst_unit_vs_its_parse" in q else "-")
        rows.append((os.path.basename(r["database"].rstrip("/")), str(r["units"]),
                     "%.1f" % r["clang"]["cpu_s"], "%.1f" % r["ulplint_j1"]["cpu_s"],
                     "%.2f" % q["cpu_vs_clang"], worst,
                     "%.1f" % r["ulplint_j1"]["wall_s"],
                     "%.1f" % r["ulplint_j2_cold"]["wall_s"], "%.2f" % q["j2_speedup"],
                     "%.0f" % r["clang"]["max_unit_peak_rss_mib"],
                     "%.0f" % r["ulplint_j1"]["peak_rss_mib"],
                     "%.2f" % q["j1_peak_rss_vs_clang_max_unit"],
                     "%.2f" % r["ulplint_j2_warm"]["wall_s"], "%.3f" % q["warm_vs_cold"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    for r in results:
        q = r["ratios"]
        if "worst_unit" in q:
            print("%s: worst unit %s: %.2f s against its parse %.2f s (%.1fx)" % (
                os.path.basename(r["database"].rstrip("/")),
                os.path.relpath(q["worst_unit"], r["database"]),
                q["worst_unit_cpu_s"], q["worst_unit_parse_cpu_s"],
                q["worst_unit_vs_its_parse"]))
        if "unit_peak_rss_vs_clang_max" in r["ratios"]:
            print("%s: per-unit peak RSS vs clang: max %.2f, median %.2f" % (
                os.path.basename(r["database"].rstrip("/")),
                r["ratios"]["unit_peak_rss_vs_clang_max"],
                r["ratios"]["unit_peak_rss_vs_clang_median"]))
        if r["clang"]["failed"]:
            print("%s: clang failed on %d unit(s): %s" % (
                r["database"], len(r["clang"]["failed"]), ", ".join(r["clang"]["failed"][:5])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="ulplint's build directory (default: build/)")
    ap.add_argument("--clang", default=shutil.which("clang-22") or "clang-22")
    ap.add_argument("--db", action="append",
                    help="a compile database directory (repeatable)")
    ap.add_argument("--json", default="bench-results.json",
                    help="where to write the numbers (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each database this many times")
    ap.add_argument("--per-unit", action="store_true",
                    help="also report each unit's peak RSS (from the per-unit pass)")
    ap.add_argument("--no-unit-times", action="store_true",
                    help="skip the per-unit pass (no worst-unit ratio)")
    ap.add_argument("--corpus-root",
                    help="add every subdirectory holding a compile_commands.json")
    args = ap.parse_args()

    ulplint = os.path.join(args.build, "tool", "ulplint")
    dbs = list(args.db or [])
    if args.corpus_root:
        for name in sorted(os.listdir(args.corpus_root)):
            d = os.path.join(args.corpus_root, name)
            if os.path.isfile(os.path.join(d, "compile_commands.json")):
                dbs.append(d)
    if not dbs:
        dbs = [os.path.join(args.build, "example", "handmade")]
        corpus = os.path.expanduser("~/.cache/rdma-corpus/linux-6.12")
        if os.path.exists(os.path.join(corpus, "compile_commands.json")):
            dbs.append(corpus)

    report = {"machine": machine(), "ulplint": ulplint, "clang": args.clang,
              "load_before": os.getloadavg(), "results": []}
    for db in dbs:
        for i in range(args.repeat):
            print("bench: %s (run %d of %d)" % (db, i + 1, args.repeat),
                  file=sys.stderr)
            r = measure(ulplint, args.clang, os.path.abspath(db), args.per_unit,
                        not args.no_unit_times)
            r["run"] = i + 1
            r["ratios"] = ratios(r)
            report["results"].append(r)
    report["load_after"] = os.getloadavg()
    print_table(report["results"])
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print("bench: wrote %s" % args.json, file=sys.stderr)


if __name__ == "__main__":
    main()
