"""bench/node_loss's worker: a gloo group that all-reduces in a loop. On start it appends
"start <CLOCK_MONOTONIC seconds> <WORLD_SIZE> <TORCHELASTIC_RESTART_COUNT> <RANK> <node>" to
<out>/stamps (one write, O_APPEND; node: $BENCH_NODE); it exits 0 once <out>/stop exists, and 1
when a collective fails (a peer's node is gone), as a training script does. While
<out>/bad_<node> exists it exits 75 instead (its hardware went bad: the code a muster agent's
--exclude-exit-code names). argv: <out>"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
e = os.environ
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
node = e.get("BENCH_NODE", "0")
bad = os.path.join(out, f"bad_{node}")
line = f"start {time.monotonic():.6f} {e['WORLD_SIZE']} {e['TORCHELASTIC_RESTART_COUNT']} {e['RANK']} {node}\n"
fd = os.open(os.path.join(out, "stamps"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
t = torch.ones(1)
deadline = time.monotonic() + 600
try:
    while time.monotonic() < deadline and not os.path.exists(os.path.join(out, "stop")):
        if os.path.exists(bad):
            os._exit(75)
        dist.all_reduce(t)
        time.sleep(0.02)
except Exception:
    os._exit(1)
os._exit(0)
