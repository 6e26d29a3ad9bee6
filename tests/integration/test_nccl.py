"""The NCCL backend on this machine's GPUs, one rank per GPU (at most 4),
launched by muster. Skips, saying why, when libmuster was built without NCCL
or no GPU is visible."""
import os

import pytest

from muster_testing import SLACK, base_env, run_muster

TOOL = os.environ.get("MUSTER_NCCL_TOOL", "")


def gpu_count():
    import subprocess
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


@pytest.mark.skipif(not TOOL, reason="libmuster was built without the NCCL backend (CUDA or NCCL not found)")
def test_nccl_collectives_on_every_gpu():
    gpus = gpu_count()
    if gpus == 0:
        pytest.skip("no GPU on this machine: the NCCL backend was built but cannot run here")
    nproc = min(gpus, 4)  # one rank per GPU: NCCL refuses two ranks of a communicator on one device
    r = run_muster(["--standalone", f"--nproc-per-node={nproc}", "--no-python", TOOL], env=base_env(),
                   timeout=600 * SLACK)
    if "no GPU" in r.stdout:
        pytest.skip("no CUDA device is visible to the workers")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(l.split()[2] for l in r.stdout.splitlines() if l.startswith("nccl ok")) == \
        [f"rank={i}" for i in range(nproc)]
