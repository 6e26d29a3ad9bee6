"""Worker: writes its environment and argv to <out>/rank_<RANK>.json (by
rename, so a reader never sees half of it)."""
import json
import os
import sys

out = sys.argv[1]
path = os.path.join(out, f"rank_{os.environ['RANK']}.json")
with open(path + ".tmp", "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "pid": os.getpid(),
               "pgid": os.getpgid(0), "sid": os.getsid(0)}, f)
os.replace(path + ".tmp", path)
