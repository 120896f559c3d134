#!/usr/bin/env python3
"""scaling.py: how ulplint's cost grows with one dimension of a unit at a time.

Not a test: a measurement for docs/performance.md (issue 13). For each
dimension it generates userspace verbs C units that differ only in that
dimension, runs `ulplint FILE -- -std=gnu11` on each (all rdma-* checks, no
cache, one at a time) and prints CPU time against size, then the exponent k
of time ~ size^k fitted by least squares on log-log. The fixed cost (process
start, parsing <infiniband/verbs.h>) is measured on the same unit at size 0
and subtracted first, so k describes the analysis that grows with the
dimension; the raw fit is printed too.

Dimensions:
  functions  independent functions, each registering, posting and freeing
  handles    MRs held at once by one function, freed on an error path
  wr-chain   work requests linked into one chain and posted once
  branches   conditional `send_flags |= ...` before one post
  loops      loops that each post a work request built inside them
  callers    callers of one posting helper, each passing its own flags
  fields     MR fields of one context struct, set up and torn down

  testsuite/bench/scaling.py [--build BUILD] [--dims a,b] [--sizes 25,50,...]
                             [--timeout S] [--json OUT]
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEADER = """#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>
"""


def gen_functions(n):
    out = [HEADER]
    for i in range(n):
        out.append(f"""
int op{i}(struct ibv_pd *pd, struct ibv_qp *qp, void *buf, size_t len)
{{
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
  if (!mr)
    return -1;
  struct ibv_sge sge = {{ .addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey }};
  struct ibv_send_wr wr = {{ .wr_id = {i}, .sg_list = &sge, .num_sge = 1,
                            .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }};
  struct ibv_send_wr *bad;
  int rc = ibv_post_send(qp, &wr, &bad);
  ibv_dereg_mr(mr);
  return rc;
}}
""")
    return "".join(out)


def gen_handles(n):
    regs, frees = [], []
    for i in range(n):
        regs.append(f"""  struct ibv_mr *mr{i} = ibv_reg_mr(pd, buf + {i} * 64, 64,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr{i})
    goto out{i};
""")
        frees.append(f"out{i + 1}:\n  ibv_dereg_mr(mr{i});\n")
    body = "".join(regs) + "  return 0;\n" + "".join(reversed(frees)) + "out0:\n  return -1;\n"
    return HEADER + f"""
int setup(struct ibv_pd *pd, char *buf)
{{
{body}}}
"""


def gen_wr_chain(n):
    lines = [f"  struct ibv_send_wr wr[{max(n, 1)}];", f"  struct ibv_sge sge[{max(n, 1)}];",
             "  memset(wr, 0, sizeof(wr));"]
    for i in range(n):
        lines.append(f"  sge[{i}].addr = (uintptr_t)buf + {i} * 64; sge[{i}].length = 64;"
                     f" sge[{i}].lkey = mr->lkey;")
        lines.append(f"  wr[{i}].wr_id = {i}; wr[{i}].sg_list = &sge[{i}]; wr[{i}].num_sge = 1;")
        lines.append(f"  wr[{i}].opcode = IBV_WR_RDMA_WRITE; wr[{i}].wr.rdma.rkey = rkey;")
        if i + 1 < n:
            lines.append(f"  wr[{i}].next = &wr[{i + 1}];")
        else:
            lines.append(f"  wr[{i}].next = NULL; wr[{i}].send_flags = IBV_SEND_SIGNALED;")
    post = "  struct ibv_send_wr *bad;\n  return ibv_post_send(qp, &wr[0], &bad);\n" if n else "  return 0;\n"
    return HEADER + """
int post_chain(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint32_t rkey)
{
""" + "\n".join(lines) + "\n" + post + "}\n"


def gen_branches(n):
    conds = "".join(f"  if (opts & (1u << {i % 32}) && level > {i})\n"
                    f"    wr.send_flags |= {'IBV_SEND_INLINE' if i % 2 else 'IBV_SEND_FENCE'};\n"
                    for i in range(n))
    return HEADER + f"""
int post(struct ibv_qp *qp, struct ibv_sge *sge, unsigned opts, int level)
{{
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
{conds}  return ibv_post_send(qp, &wr, &bad);
}}
"""


def gen_loops(n):
    loops = "".join(f"""  for (int i = 0; i < count; i++) {{
    wr.wr_id = i + {i};
    wr.send_flags = 0;
    if (i % signal == 0)
      wr.send_flags |= IBV_SEND_SIGNALED;
    if (ibv_post_send(qp, &wr, &bad))
      return -{i + 1};
  }}
""" for i in range(n))
    return HEADER + f"""
int run(struct ibv_qp *qp, struct ibv_sge *sge, int count, int signal)
{{
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
{loops}  return 0;
}}
"""


def gen_callers(n):
    callers = "".join(f"""
int caller{i}(struct ibv_qp *qp, struct ibv_sge *sge)
{{
  return post_one(qp, sge, {'IBV_SEND_SIGNALED' if i % 2 else '0'}, {i});
}}
""" for i in range(n))
    return HEADER + """
static int post_one(struct ibv_qp *qp, struct ibv_sge *sge, unsigned flags, int id)
{
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = id;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = flags;
  return ibv_post_send(qp, &wr, &bad);
}
""" + callers


def gen_fields(n):
    fields = "".join(f"  struct ibv_mr *mr{i};\n  char buf{i}[64];\n" for i in range(n))
    setup = "".join(f"""  c->mr{i} = ibv_reg_mr(pd, c->buf{i}, sizeof(c->buf{i}), IBV_ACCESS_LOCAL_WRITE);
  if (!c->mr{i})
    return -1;
""" for i in range(n))
    teardown = "".join(f"  if (c->mr{i})\n    ibv_dereg_mr(c->mr{i});\n" for i in range(n))
    return HEADER + f"""
struct ctx {{
  int dummy;
{fields}}};

int ctx_setup(struct ctx *c, struct ibv_pd *pd)
{{
{setup}  return 0;
}}

void ctx_teardown(struct ctx *c)
{{
{teardown}}}
"""


DIMENSIONS = {
    "functions": gen_functions,
    "handles": gen_handles,
    "wr-chain": gen_wr_chain,
    "branches": gen_branches,
    "loops": gen_loops,
    "callers": gen_callers,
    "fields": gen_fields,
}


def measure(ulplint, path, timeout):
    """(CPU s, wall s) of one ulplint run, its unit worker included; CPU is
    None after a timeout (the whole process group is killed) or when the unit
    was not analysed."""
    argv = [ulplint, "--no-cache", "--quiet", "-o", os.devnull, path, "--", "-std=gnu11"]
    before = os.times()
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, time.monotonic() - start
    wall = time.monotonic() - start
    if proc.returncode not in (0, 1):
        # Not analysed (a crash, out of memory): reported, not timed.
        first = err.decode(errors="replace").strip().splitlines()[:2]
        print("scaling: %s: exit %d: %s" % (os.path.basename(path), proc.returncode,
                                            " / ".join(first)[:300]), file=sys.stderr)
        return None, wall
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
          (after.children_system - before.children_system)
    return cpu, wall


def fit(points):
    """Least-squares slope of log(t) on log(n) over points with t > 0."""
    pts = [(math.log(n), math.log(t)) for n, t in points if n > 0 and t and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ulplint", help="the binary (default: BUILD/tool/ulplint)")
    ap.add_argument("--dims", default=",".join(DIMENSIONS),
                    help="comma-separated dimensions (default: all)")
    ap.add_argument("--sizes", default="25,50,100,200,400",
                    help="sizes of each dimension (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per unit; the fastest counts (default: 1)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds before a run counts as too slow (default: 300)")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--keep", help="write the generated units into this directory")
    args = ap.parse_args()

    ulplint = args.ulplint or os.path.join(args.build, "tool", "ulplint")
    sizes = [int(s) for s in args.sizes.split(",")]
    work = args.keep or tempfile.mkdtemp(prefix="ulplint-scaling-")
    os.makedirs(work, exist_ok=True)
    results = {}
    print("%-10s %6s %10s %10s %8s" % ("dimension", "size", "lines", "CPU s", "-base s"))
    for dim in args.dims.split(","):
        gen = DIMENSIONS[dim]
        rows = []
        base = None
        for n in [0] + sizes:
            path = os.path.join(work, "%s-%d.c" % (dim, n))
            with open(path, "w") as f:
                f.write(gen(n))
            with open(path) as f:
                lines = sum(1 for _ in f)
            best = None
            for _ in range(args.repeat):
                cpu, wall = measure(ulplint, path, args.timeout)
                if cpu is None:
                    best = None
                    break
                best = cpu if best is None else min(best, cpu)
            if n == 0:
                base = best or 0.0
                print("%-10s %6d %10d %10.3f %8s" % (dim, n, lines, best or 0, "(base)"))
                continue
            net = None if best is None else max(best - base, 0.0)
            rows.append({"size": n, "lines": lines, "cpu_s": best, "net_cpu_s": net})
            print("%-10s %6d %10d %10s %8s" % (
                dim, n, lines, "failed" if best is None else "%.3f" % best,
                "-" if net is None else "%.3f" % net), flush=True)
            if best is None:
                break  # timed out or not analysed: larger sizes would too
        k_net = fit([(r["size"], r["net_cpu_s"]) for r in rows if r["net_cpu_s"]])
        k_raw = fit([(r["size"], r["cpu_s"]) for r in rows if r["cpu_s"]])
        results[dim] = {"base_cpu_s": base, "rows": rows, "exponent": k_net,
                        "exponent_raw": k_raw}
        print("%-10s exponent %s (raw, with the fixed cost: %s)" % (
            dim, "n/a" if k_net is None else "%.2f" % k_net,
            "n/a" if k_raw is None else "%.2f" % k_raw), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ulplint": ulplint, "sizes": sizes, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
