"""Worker for the node-loss test: a gloo group that all-reduces in a loop.
argv: <out>. Once the group has formed it writes
<out>/n<GROUP_WORLD_SIZE>_a<TORCHELASTIC_RESTART_COUNT>_r<RANK> (by rename). With more than one
node it all-reduces every 50 ms (for up to 120 s) until a collective fails, then exits 1, as a
training script does when a peer dies; alone on one node it all-reduces three times and exits 0."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
e = os.environ
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
name = f"n{e['GROUP_WORLD_SIZE']}_a{e['TORCHELASTIC_RESTART_COUNT']}_r{e['RANK']}"
with open(os.path.join(out, "." + name), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, "." + name), os.path.join(out, name))
t = torch.ones(1)
if int(e["GROUP_WORLD_SIZE"]) == 1:
    for _ in range(3):
        dist.all_reduce(t)
    dist.destroy_process_group()
    sys.exit(0)
deadline = time.monotonic() + 120
try:
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        time.sleep(0.05)
except Exception as ex:  # the peer's node is gone
    print(f"collective failed: {ex}", file=sys.stderr, flush=True)
    os._exit(1)
sys.exit(0)
