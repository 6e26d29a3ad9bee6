"""Worker for the watchdog tests, with torch's own FileTimerClient. Writes
<out>/a<RESTART>_r<RANK>.json (by rename: its pid and the timer file it was
given), then, by mode:
  hang     rank 1 of the first attempt waits for rank 0's record, then takes a
           1 s timer and never returns (the watchdog must kill it); every other
           worker exits 0
  release  every worker takes a 5 s timer over a short step, releases it and
           outlives it by 2 s, then exits 0
  wait     waits (up to 120 s) for <out>/release, then exits 0"""
import json
import os
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
name = f"a{attempt}_r{rank}.json"
tmp = os.path.join(out, f".{name}.{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "timer_file": os.environ.get("TORCHELASTIC_TIMER_FILE")}, f)
os.rename(tmp, os.path.join(out, name))
# Imported after the record is written: a slow import cannot cost a record.
from torch.distributed.elastic.timer import FileTimerClient, configure, expires  # noqa: E402

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))

if mode == "hang" and attempt == 0 and rank == 1:
    # Rank 0 has written its record before this timer can kill anyone.
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "a0_r0.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    with expires(after=1, scope="stuck_collective"):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    sys.exit(7)  # not killed: the watchdog failed
elif mode == "release":
    # Long enough that a loaded machine releases it in time, then outlived.
    with expires(after=5, scope="quick_step"):
        time.sleep(0.1)
    time.sleep(7)
elif mode == "wait":
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "release")):
        if time.monotonic() > deadline:
            sys.exit(8)
        time.sleep(0.05)
sys.exit(0)
