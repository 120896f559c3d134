#!/usr/bin/env python3
"""expect_exit.py CODE CMD...: run CMD, pass its output through, and fail
unless it exits with exactly CODE (lit's `not` only knows zero/non-zero)."""
import subprocess
import sys

want = int(sys.argv[1])
res = subprocess.run(sys.argv[2:])
if res.returncode != want:
    sys.stderr.write("expect_exit: %s exited with %d, expected %d\n"
                     % (sys.argv[2], res.returncode, want))
    sys.exit(1)
