#!/usr/bin/env python3
"""Dry run of a composite GitHub Action (action.yml) on this machine.

  run_action.py ACTION_DIR --schema github-action.json [--input NAME=VALUE ...]
                [--sarif-schema SCHEMA] [--path DIR]

Validates action.yml against the schema, then runs its steps as the runner
does: inputs from their defaults and --input, ${{ }} expressions in `if`,
`env`, `run` and `with` evaluated (inputs, steps.<id>.outputs, always(),
success(), failure(), ==, !=, &&, ||, !), `run` steps with
`bash --noprofile --norc -eo pipefail` and GITHUB_OUTPUT / GITHUB_ACTION_PATH
set, step outputs read back. `uses` steps are not run: the call is printed
with its inputs, and for github/codeql-action/upload-sarif the SARIF file
must exist and be valid SARIF 2.1.0 (--sarif-schema). Prints one line per
step; exits 1 when the job fails, as the runner would mark it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import yaml


class Context:
    def __init__(self, inputs):
        self.inputs = inputs
        self.steps = {}
        self.failed = False

    def value(self, ref):
        parts = ref.split(".")
        if parts[0] == "inputs":
            return self.inputs.get(parts[1], "")
        if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
            return self.steps.get(parts[1], {}).get(parts[3], "")
        raise SystemExit("run_action: unsupported expression context '%s'" % ref)

    def evaluate(self, expr):
        """A GitHub expression, for the operators actions use."""
        tokens = re.findall(r"'(?:[^']|'')*'|&&|\|\||==|!=|!|\(|\)|[A-Za-z_][\w.-]*(?:\(\))?", expr)
        out = []
        for t in tokens:
            if t.startswith("'"):
                out.append(repr(t[1:-1].replace("''", "'")))
            elif t in ("&&", "||"):
                out.append(" and " if t == "&&" else " or ")
            elif t in ("==", "!=", "(", ")"):
                out.append(" %s " % t)
            elif t == "!":
                out.append(" not ")
            elif t == "always()":
                out.append("True")
            elif t == "success()":
                out.append(repr(not self.failed))
            elif t == "failure()":
                out.append(repr(self.failed))
            elif t in ("true", "false"):
                out.append(repr(t == "true"))
            else:
                out.append(repr(self.value(t)))
        return eval("".join(out), {"__builtins__": {}})

    def substitute(self, text):
        return re.sub(r"\$\{\{\s*(.*?)\s*\}\}", lambda m: str(self.evaluate(m.group(1))), text)


def condition(ctx, step):
    cond = step.get("if")
    if cond is None:
        return not ctx.failed
    cond = str(cond).strip()
    if cond.startswith("${{"):
        cond = cond[3:-2]
    # As the runner: a condition without a status function implies success().
    if not re.search(r"\b(always|success|failure|cancelled)\(\)", cond):
        cond = "success() && (%s)" % cond
    return bool(ctx.evaluate(cond))


def run_step(ctx, step, action_dir, path, out_file):
    env = dict(os.environ)
    env["PATH"] = path + os.pathsep + env["PATH"]
    env["GITHUB_ACTION_PATH"] = action_dir
    env["GITHUB_OUTPUT"] = out_file
    open(out_file, "w").close()
    for k, v in (step.get("env") or {}).items():
        env[k] = ctx.substitute(str(v))
    script = ctx.substitute(step["run"])
    if step.get("shell") != "bash":
        raise SystemExit("run_action: step '%s' needs shell: bash" % step.get("name"))
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(script)
    try:
        return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", f.name],
                              env=env).returncode
    finally:
        os.unlink(f.name)


def read_outputs(out_file):
    outputs = {}
    for line in open(out_file):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            outputs[k] = v
    return outputs


def uses_step(ctx, step, sarif_schema):
    with_ = {k: ctx.substitute(str(v)) for k, v in (step.get("with") or {}).items()}
    print("uses %s with %s" % (step["uses"], json.dumps(with_, sort_keys=True)))
    if step["uses"].startswith("github/codeql-action/upload-sarif@"):
        path = with_.get("sarif_file", "")
        if not os.path.isfile(path):
            print("upload-sarif: no file '%s'" % path)
            return 1
        if sarif_schema:
            jsonschema.Draft4Validator(json.load(open(sarif_schema))).validate(json.load(open(path)))
            print("upload-sarif: %s is valid SARIF" % path)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action_dir")
    p.add_argument("--schema", required=True)
    p.add_argument("--sarif-schema")
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--path", default="", help="prepended to PATH (where ulplint is)")
    a = p.parse_args()
    action_dir = os.path.abspath(a.action_dir)
    action = yaml.safe_load(open(os.path.join(action_dir, "action.yml")))
    jsonschema.Draft7Validator(json.load(open(a.schema))).validate(action)
    print("action.yml: valid")
    if action["runs"]["using"] != "composite":
        raise SystemExit("run_action: not a composite action")
    inputs = {k: str(v.get("default", "")) for k, v in action.get("inputs", {}).items()}
    for kv in a.input:
        k, v = kv.split("=", 1)
        if k not in inputs:
            raise SystemExit("run_action: the action has no input '%s'" % k)
        inputs[k] = v
    ctx = Context(inputs)
    out_file = tempfile.mktemp(prefix="github-output-")
    for step in action["runs"]["steps"]:
        name = step.get("name", step.get("uses", "?"))
        if not condition(ctx, step):
            print("step '%s': skipped" % name)
            continue
        if "uses" in step:
            rc = uses_step(ctx, step, a.sarif_schema)
        else:
            sys.stdout.flush()
            rc = run_step(ctx, step, action_dir, a.path, out_file)
            if "id" in step:
                ctx.steps[step["id"]] = read_outputs(out_file)
        print("step '%s': %s" % (name, "ok" if rc == 0 else "failed (exit %d)" % rc))
        sys.stdout.flush()
        ctx.failed |= rc != 0
    for k, v in (action.get("outputs") or {}).items():
        print("output %s=%s" % (k, ctx.substitute(str(v["value"]))))
    print("job: %s" % ("failed" if ctx.failed else "succeeded"))
    return 1 if ctx.failed else 0


if __name__ == "__main__":
    sys.exit(main())
