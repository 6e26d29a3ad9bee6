"""Worker: writes the CPUs it may run on, and those of a process it starts,
to <out>/rank_<LOCAL_RANK-or-RANK>_<restart>.json (by rename). With a second
argument N, the worker of global rank N fails on the first attempt, once every
worker of that attempt has written its file."""
import json
import os
import subprocess
import sys
import time


def allowed(status_text):
    for line in status_text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


out = sys.argv[1]
rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open("/proc/self/status") as f:
    own = allowed(f.read())
child = allowed(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True, check=True).stdout)
path = os.path.join(out, f"rank_{rank}_{restart}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"own": own, "child": child, "local_rank": os.environ["LOCAL_RANK"],
               "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
os.replace(path + ".tmp", path)
if len(sys.argv) > 2 and rank == int(sys.argv[2]) and restart == 0:
    # Fail only once every worker of this attempt has written what it saw:
    # the failure stops them, and a slow one would otherwise never write.
    world = int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out, f"rank_{r}_0.json")) for r in range(world)):
        time.sleep(0.02)
    sys.exit(3)
