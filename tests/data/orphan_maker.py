"""Worker that leaves a process behind: `sleep` in a session of its own,
started with posix_spawn (no fork in this process) and without LD_PRELOAD.
Records that process's pid to <dir>/orphan_<RANK>, by rename.
argv: <dir> [fail-first]
  fail-first: the first attempt (TORCHELASTIC_RESTART_COUNT=0) exits 1."""
import os
import sys

out = sys.argv[1]
rank = os.environ["RANK"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
pid = os.posix_spawnp("sleep", ["sleep", "1000"], env, setsid=True)
tmp = os.path.join(out, f".orphan_{rank}_{attempt}.tmp")
with open(tmp, "w") as f:
    f.write(str(pid))
os.replace(tmp, os.path.join(out, f"orphan_{rank}_{attempt}"))
sys.exit(1 if "fail-first" in sys.argv[2:] and attempt == "0" else 0)
