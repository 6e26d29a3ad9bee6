"""examples/pytorch/ddp_train.py, except that in the first attempt rank 1
dies right after the process group formed: the restarted group must form its
process group again through the agent's store and train to the same weights."""
import os
import runpy
import sys
from pathlib import Path

import torch.distributed as dist

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "ddp_train.py")

if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(7)
    dist.barrier()  # rank 0 fails here or is stopped by the agent
    sys.exit(0)

sys.argv = [EXAMPLE, *sys.argv[1:]]
runpy.run_path(EXAMPLE, run_name="__main__")
