#!/usr/bin/env python3
"""Checks that ulplint prints a unit's findings as soon as that unit is done.

  stream_check.py ULPLINT FIRST.c FIFO SECOND.c -- FLAGS

SECOND.c includes FIFO, a named pipe: clang blocks reading it until this
script writes to it, which it does only once FIRST.c's finding is on
ulplint's standard output. Without streaming, the finding would come after
SECOND.c is done, which waits for this script: a deadlock, caught by the
timeout. Prints what ulplint printed, marking when the pipe was released.
"""
import subprocess
import sys
import threading

ulplint, first, fifo, second = sys.argv[1:5]
flags = sys.argv[sys.argv.index("--"):]
proc = subprocess.Popen([ulplint, "--no-cache", "-j1", first, second] + flags,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
timer = threading.Timer(120, proc.kill)
timer.start()
lines = []
for line in proc.stdout:
    lines.append(line)
    if "[rdma-" in line and first in line:
        lines.append("== released the pipe ==\n")
        with open(fifo, "w") as f:
            f.write("#define SECOND_HEADER 1\n")
        break
lines.extend(proc.stdout)
rc = proc.wait()
timer.cancel()
sys.stdout.write("".join(lines))
sys.stdout.write("exit status %d\n" % rc)
