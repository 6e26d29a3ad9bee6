"""Worker: writes its environment and argv to <out>/rank_<RANK>.json."""
import json
import os
import sys

out = sys.argv[1]
with open(os.path.join(out, f"rank_{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "pid": os.getpid(),
               "pgid": os.getpgid(0), "sid": os.getsid(0)}, f)
