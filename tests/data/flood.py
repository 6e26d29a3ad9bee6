"""Worker that writes its environment (and its pid, as FLOOD_PID) to
<out>/env_<RANK>.json (by rename), then floods stdout with <megabytes> MB and sleeps until stopped.
argv: <out> <megabytes>"""
import json
import os
import sys
import time

out, megabytes = sys.argv[1], float(sys.argv[2])
rank = os.environ["RANK"]
tmp = os.path.join(out, f".env_{rank}.tmp")
with open(tmp, "w") as f:
    json.dump({**os.environ, "FLOOD_PID": str(os.getpid())}, f)
os.replace(tmp, os.path.join(out, f"env_{rank}.json"))
line = ("y" * 1023 + "\n").encode()
for _ in range(int(megabytes * 1024)):
    os.write(1, line)
with open(os.path.join(out, f".done_{rank}.tmp"), "w") as f:
    f.write("done")
os.replace(os.path.join(out, f".done_{rank}.tmp"), os.path.join(out, f"done_{rank}"))
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
