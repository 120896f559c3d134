#!/usr/bin/env python3
"""edit_during_run.py FIFO FILE LINE -- CMD...

Runs CMD and, while it runs, inserts LINE at the top of FILE. The moment is
set by a named pipe: CMD must read FIFO after it has analysed FILE (a later
unit's compile command with `-include FIFO`). The edit happens once the
reader has opened the pipe, then an empty line goes through it and CMD goes
on. Passes CMD's output through and exits with its status."""
import errno
import os
import subprocess
import sys
import time

fifo, path, line = sys.argv[1:4]
cmd = sys.argv[sys.argv.index("--") + 1:]
os.mkfifo(fifo)
proc = subprocess.Popen(cmd)
deadline = time.monotonic() + 120
while True:  # opening for writing fails until the reader is there
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        break
    except OSError as e:
        if e.errno != errno.ENXIO or proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit("edit_during_run: %s never read %s" % (cmd[0], fifo))
        time.sleep(0.02)
with open(path) as f:
    text = f.read()
with open(path, "w") as f:
    f.write(line + "\n" + text)
os.write(fd, b"\n")
os.close(fd)
sys.exit(proc.wait())
