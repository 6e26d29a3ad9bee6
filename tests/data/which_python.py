"""Worker: records which interpreter and which torch run it in
<out>/python_<RANK>.json (by rename), then, given a script, runs it as
__main__ with <out> and the remaining arguments:
    which_python.py OUT [SCRIPT ARGS...]"""
import json
import os
import runpy
import sys

try:
    import torch
    torch_version = torch.__version__
except ImportError:
    torch_version = None

out = sys.argv[1]
rank = os.environ["RANK"]
tmp = os.path.join(out, f".python_{rank}.{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump({"executable": sys.executable, "prefix": sys.prefix, "torch": torch_version}, f)
os.rename(tmp, os.path.join(out, f"python_{rank}.json"))
if len(sys.argv) > 2:
    sys.argv = [sys.argv[2], out, *sys.argv[3:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
