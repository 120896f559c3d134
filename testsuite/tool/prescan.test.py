"""prescan.test: rules/prescan.yaml covers every function of rules/api/."""
import glob
import os
import re
import sys

rules = sys.argv[1]
lists, key = {}, None
with open(os.path.join(rules, "prescan.yaml")) as f:
    for line in f:
        line = line.split("#", 1)[0].rstrip()
        if re.match(r"^\w+:$", line):
            key = line[:-1]
            lists[key] = []
        elif line.strip().startswith("- ") and key:
            lists[key].append(line.strip()[2:].strip())
prefixes = tuple(lists["identifier_prefixes"])
not_rdma = set(lists.get("not_rdma", []))
missing, seen = [], 0
for path in sorted(glob.glob(os.path.join(rules, "api", "*.yaml"))):
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*- \{name: ([\w]+)(.*)", line)
            if not m:
                continue
            names = [m.group(1)]
            alias = re.search(r"match: \[([^\]]*)\]", m.group(2))
            if alias:
                names += [n.strip() for n in alias.group(1).split(",")]
            for name in names:
                seen += 1
                if not name.startswith(prefixes) and name not in not_rdma:
                    missing.append("%s: %s" % (os.path.basename(path), name))
if missing or seen < 100:
    sys.exit("rules/prescan.yaml: neither an RDMA prefix nor not_rdma (of %d):\n  "
             % seen + "\n  ".join(missing))
