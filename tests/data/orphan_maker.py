"""Worker that leaves a process behind: `sleep` in a session of its own,
started with posix_spawn (no fork in this process) and without LD_PRELOAD.
Writes <dir>/orphan_<RANK>_<attempt> (by rename): JSON with that process's
pid, the worker's own, and whether heap_trap is loaded in the worker's parent
(its shim).
argv: <dir> [fail-first] [hold]
  fail-first: the first attempt (TORCHELASTIC_RESTART_COUNT=0) exits 1.
  hold: sleeps (up to 300 s) instead of exiting."""
import json
import os
import sys
import time

out = sys.argv[1]
flags = set(sys.argv[2:])
rank = os.environ["RANK"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
# Its output goes nowhere, so it holds no pipe of the agent's open.
quiet = [(os.POSIX_SPAWN_OPEN, fd, "/dev/null", os.O_WRONLY, 0) for fd in (1, 2)]
pid = os.posix_spawnp("sleep", ["sleep", "1000"], env, setsid=True, file_actions=quiet)
with open(f"/proc/{os.getppid()}/maps") as f:
    trap_in_shim = "heap_trap" in f.read()
tmp = os.path.join(out, f".orphan_{rank}_{attempt}.tmp")
with open(tmp, "w") as f:
    json.dump({"orphan": pid, "worker": os.getpid(), "trap_in_shim": trap_in_shim}, f)
os.replace(tmp, os.path.join(out, f"orphan_{rank}_{attempt}"))
if "hold" in flags:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.05)
sys.exit(1 if "fail-first" in flags and attempt == "0" else 0)
