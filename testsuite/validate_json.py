#!/usr/bin/env python3
"""validate_json.py FILE [--sarif SCHEMA] [--expect PATH=VALUE ...]

Parses FILE as JSON; with --sarif validates it against the SARIF 2.1.0
schema (Draft 4, python3-jsonschema); --expect checks dotted paths such as
runs.0.results.0.ruleId=rdma-access-flags-invalid or findings.#=3 (# is
the length of a list)."""
import json
import sys

import jsonschema


def lookup(doc, path):
    for part in path.split("."):
        if part == "#":
            return len(doc)
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def main():
    args = sys.argv[1:]
    with open(args[0]) as f:
        doc = json.load(f)
    i = 1
    while i < len(args):
        if args[i] == "--sarif":
            with open(args[i + 1]) as f:
                schema = json.load(f)
            jsonschema.Draft4Validator(schema).validate(doc)
            i += 2
        elif args[i] == "--expect":
            path, want = args[i + 1].split("=", 1)
            got = lookup(doc, path)
            if str(got) != want:
                sys.exit("validate_json: %s is %r, expected %r" % (path, got, want))
            i += 2
        else:
            sys.exit("validate_json: unknown argument " + args[i])
    print("valid")


if __name__ == "__main__":
    main()
