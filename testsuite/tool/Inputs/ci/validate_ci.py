#!/usr/bin/env python3
"""Checks the CI configurations of a Markdown page (docs/ci.md).

  validate_ci.py PAGE --workflow-schema S --action ACTION_YML --ulplint BIN

Every ```yaml block is a GitHub workflow (it has `jobs`) or a GitLab
pipeline (jobs with `script`). GitHub workflows are validated against the
workflow schema (python3-jsonschema), and:
  - a job that uploads SARIF (upload-sarif, or the ulplint Action unless
    upload-sarif is false) has permissions contents: read, security-events:
    write and actions: read;
  - upload-sarif is v4;
  - the ulplint Action is given only inputs its action.yml declares.
GitLab pipelines are checked structurally (no schema is reachable here):
known keywords, a script per job, stages that exist, needs that name jobs,
artifact reports GitLab knows, a Code Quality report some script writes.
In both, every ulplint command line uses only options ulplint has.
Prints one line per block; exits 1 on the first problem.
"""
import argparse
import json
import re
import shlex
import subprocess
import sys

import jsonschema
import yaml

GITLAB_GLOBAL = {"stages", "variables", "default", "include", "workflow", "image",
                 "services", "cache", "before_script", "after_script"}
GITLAB_JOB = {"stage", "script", "image", "services", "before_script", "after_script",
              "variables", "cache", "artifacts", "needs", "dependencies", "rules", "only",
              "except", "when", "allow_failure", "parallel", "tags", "timeout", "retry",
              "extends", "environment", "coverage", "interruptible", "resource_group",
              "trigger", "release", "secrets", "id_tokens", "inherit", "hooks", "pages"}
GITLAB_ARTIFACTS = {"paths", "reports", "when", "expire_in", "name", "untracked",
                    "exclude", "expose_as", "public", "access"}
GITLAB_REPORTS = {"codequality", "junit", "sast", "dependency_scanning", "container_scanning",
                  "dast", "license_scanning", "metrics", "dotenv", "terraform",
                  "coverage_report", "secret_detection", "annotations", "cyclonedx"}


def fail(msg):
    sys.exit("validate_ci: " + msg)


def ulplint_options(binary):
    text = subprocess.run([binary, "--help-hidden"], capture_output=True, text=True).stdout
    text += subprocess.run([binary, "merge", "--help-hidden"], capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+(-{1,2}[\w-]+)", text, re.M))


def check_commands(text, known, where):
    """Every ulplint invocation in shell text uses known options."""
    text = text.replace("\\\n", " ")
    for line in text.split("\n"):
        m = re.search(r"\bulplint\b(?!-)(.*)", line)
        if not m:
            continue
        try:
            words = shlex.split(m.group(1).split("||")[0], comments=True)
        except ValueError:
            words = m.group(1).split()
        for w in words:
            if w == "--":
                break
            if w.startswith("-") and not w.startswith("-j"):
                opt = w.split("=", 1)[0]
                if opt not in known:
                    fail("%s: ulplint has no option %s (%s)" % (where, opt, line.strip()))


def github(doc, schema, action_inputs, known, where):
    if True in doc:  # YAML 1.1 reads the key `on` as true
        doc["on"] = doc.pop(True)
    jsonschema.Draft7Validator(schema).validate(doc)
    for name, job in doc["jobs"].items():
        uploads = False
        for step in job.get("steps", []):
            uses = step.get("uses", "")
            if "upload-sarif" in uses:
                uploads = True
                if not uses.endswith("@v4"):
                    fail("%s: job %s uses %s (use upload-sarif@v4)" % (where, name, uses))
            if re.match(r"[^/]+/ulplint@", uses):
                extra = set(step.get("with", {})) - action_inputs
                if extra:
                    fail("%s: the ulplint Action has no input %s" % (where, sorted(extra)))
                if str(step.get("with", {}).get("upload-sarif", "true")) != "false":
                    uploads = True
            check_commands(step.get("run", ""), known, "%s job %s" % (where, name))
        if uploads:
            perms = job.get("permissions", {})
            want = {"contents": "read", "security-events": "write", "actions": "read"}
            for k, v in want.items():
                if perms.get(k) != v:
                    fail("%s: job %s uploads SARIF without permissions %s: %s" % (where, name, k, v))
    return "GitHub workflow, %d job(s): valid" % len(doc["jobs"])


def gitlab(doc, known, where):
    jobs = {k: v for k, v in doc.items() if k not in GITLAB_GLOBAL and not k.startswith(".")}
    stages = doc.get("stages", ["build", "test", "deploy"]) + [".pre", ".post"]
    for name, job in jobs.items():
        if not isinstance(job, dict):
            fail("%s: %s is neither a keyword nor a job" % (where, name))
        unknown = set(job) - GITLAB_JOB
        if unknown:
            fail("%s: job %s: unknown keywords %s" % (where, name, sorted(unknown)))
        if "script" not in job and "trigger" not in job and "extends" not in job:
            fail("%s: job %s has no script" % (where, name))
        if job.get("stage", "test") not in stages:
            fail("%s: job %s: stage %s is not in stages %s" % (where, name, job["stage"], stages))
        for need in job.get("needs", []):
            need = need["job"] if isinstance(need, dict) else need
            if need not in jobs:
                fail("%s: job %s needs %s, which is not a job" % (where, name, need))
        script = "\n".join(str(s) for s in job.get("script", []))
        check_commands(script, known, "%s job %s" % (where, name))
        art = job.get("artifacts", {})
        if set(art) - GITLAB_ARTIFACTS:
            fail("%s: job %s: unknown artifacts keywords %s" % (where, name, sorted(set(art) - GITLAB_ARTIFACTS)))
        reports = art.get("reports", {})
        if set(reports) - GITLAB_REPORTS:
            fail("%s: job %s: unknown reports %s" % (where, name, sorted(set(reports) - GITLAB_REPORTS)))
        cq = reports.get("codequality")
        if cq and not re.search(r"--format=codeclimate\b[^\n]*-o %s" % re.escape(cq), script):
            fail("%s: job %s reports %s, which no ulplint --format=codeclimate writes" % (where, name, cq))
    return "GitLab pipeline, %d job(s): valid" % len(jobs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("page")
    p.add_argument("--workflow-schema", required=True)
    p.add_argument("--action", required=True)
    p.add_argument("--ulplint", required=True)
    a = p.parse_args()
    schema = json.load(open(a.workflow_schema))
    action_inputs = set(yaml.safe_load(open(a.action))["inputs"])
    known = ulplint_options(a.ulplint)
    text = open(a.page).read()
    blocks = re.findall(r"^```(yaml|sh|make)\n(.*?)^```", text, re.M | re.S)
    counts = {"github": 0, "gitlab": 0}
    for i, (lang, body) in enumerate(blocks, 1):
        where = "%s block %d" % (a.page.rsplit("/", 1)[-1], i)
        if lang != "yaml":
            check_commands(body, known, where)
            continue
        doc = yaml.safe_load(body)
        if isinstance(doc, dict) and "jobs" in doc:
            print("%s: %s" % (where, github(doc, schema, action_inputs, known, where)))
            counts["github"] += 1
        elif isinstance(doc, dict) and any(isinstance(v, dict) and "script" in v for v in doc.values()):
            print("%s: %s" % (where, gitlab(doc, known, where)))
            counts["gitlab"] += 1
    print("%d GitHub workflow(s), %d GitLab pipeline(s)" % (counts["github"], counts["gitlab"]))


if __name__ == "__main__":
    main()
