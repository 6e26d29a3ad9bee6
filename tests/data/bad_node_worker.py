"""Worker for the exclusion tests: a gloo group in which one node's workers always fail.
argv: <out>. Environment: MUSTER_TEST_NODE (the node's name), MUSTER_TEST_BAD=1 on the node
whose hardware is "bad", MUSTER_TEST_EXIT (the code its workers exit with, default 1).
Every worker writes <out>/start_<node>_a<TORCHELASTIC_RESTART_COUNT>_n<GROUP_WORLD_SIZE> once the
group has formed. A bad node's worker then exits at once; the others all-reduce 20 times
(50 ms apart) and write <out>/done_<node>_a<restart>_n<world> (by rename), or exit 1 when a
collective fails (the bad node's worker is gone). With MUSTER_TEST_HOLD=<path> they go on
all-reducing until that file exists (for up to 120 s)."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


out = sys.argv[1]
e = os.environ
node = e["MUSTER_TEST_NODE"]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
tag = f"{node}_a{e['TORCHELASTIC_RESTART_COUNT']}_n{e['GROUP_WORLD_SIZE']}"
put(os.path.join(out, "start_" + tag), str(os.getpid()))
if e.get("MUSTER_TEST_BAD") == "1":
    print(f"node {node}: the accelerator failed its self-test", file=sys.stderr, flush=True)
    os._exit(int(e.get("MUSTER_TEST_EXIT", "1")))
t = torch.ones(1)
hold = e.get("MUSTER_TEST_HOLD")
deadline = time.monotonic() + 120
try:
    steps = 0
    while steps < 20 or (hold and not os.path.exists(hold) and time.monotonic() < deadline):
        dist.all_reduce(t)
        time.sleep(0.05)
        steps += 1
except Exception as ex:
    print(f"collective failed: {ex}", file=sys.stderr, flush=True)
    os._exit(1)
put(os.path.join(out, "done_" + tag), str(int(t.item())))
dist.destroy_process_group()
