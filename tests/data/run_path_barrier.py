"""Worker for --run-path's end: records (by rename) when its script body ended
and, at interpreter exit, when the process left. argv: <out> <seconds>: rank 1
works that long (printing every 0.2 s) before it ends; the others end at once."""
import atexit
import os
import sys
import time

out, seconds = sys.argv[1], float(sys.argv[2])
rank = os.environ["RANK"]


def record(name):
    tmp = os.path.join(out, f".{name}_{rank}")
    with open(tmp, "w") as f:
        f.write(repr(time.time()))
    os.replace(tmp, os.path.join(out, f"{name}_{rank}"))


atexit.register(record, "exit")
if rank == "1":
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        print("rank 1 working", flush=True)
        time.sleep(0.2)
record("end")
