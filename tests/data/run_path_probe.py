"""Worker for --run-path: records how it was run in <out>/rank_<RANK>.json (by
rename): argv, __name__, whether torch sees a torchelastic launch, and the
sum of an all_reduce over an env:// gloo group; then exits with argv[3] if given."""
import json
import os
import sys

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
dist.destroy_process_group()
rank = os.environ["RANK"]
record = {"argv": sys.argv, "name": __name__, "launched": dist.is_torchelastic_launched(), "sum": t.item()}
tmp = os.path.join(out, f".rank_{rank}.{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump(record, f)
os.rename(tmp, os.path.join(out, f"rank_{rank}.json"))
if len(sys.argv) > 3 and rank == "1":
    sys.exit(int(sys.argv[3]))
