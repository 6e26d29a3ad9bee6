#!/usr/bin/env python3
"""bench/allreduce on GPUs: libmuster's NCCL all_reduce (nccl_bench) beside
torch.distributed's all_reduce on NCCL (nccl_torch.py), both launched by
muster with one rank per GPU, in the same run. Prints, per size, the time per
call, algorithm bandwidth (bytes / time) and bus bandwidth (bytes * 2(n-1)/n /
time, as nccl-tests prints it), and torch's time over muster's. With one GPU
the world is one rank: bus bandwidth is 0 by definition and the table shows
each library's per-call overhead only.

  bench/allreduce/nccl_run.py [--muster build/launcher/muster] [--bench build/bench/nccl_bench]
                              [--python PYTHON_WITH_CUDA_TORCH] [--ranks N]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

from run import ROOT, human, launch  # bench/allreduce/run.py: the CPU benchmark's runner


def gpu_count():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muster", default=str(ROOT / "build/launcher/muster"))
    ap.add_argument("--bench", default=str(ROOT / "build/bench/nccl_bench"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ranks", type=int, default=0, help="ranks (default: one per GPU, at most 8)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per launch")
    args = ap.parse_args()
    n = args.ranks or min(gpu_count(), 8)
    if n == 0:
        print("nccl_run: no GPU here (nvidia-smi lists none): nothing to measure")
        return 77
    env = dict(os.environ, PATH=f"{Path(args.python).parent}:{os.environ.get('PATH', '')}",
               PYTHON_EXEC=args.python)
    ours = launch(args.muster, n, ["--no-python", args.bench], env, args.timeout)
    torch_ = launch(args.muster, n, [str(Path(__file__).parent / "nccl_torch.py")], env, args.timeout)
    factor = 2 * (n - 1) / n
    print(f"all_reduce float32 sum on NCCL, {n} rank(s), one per GPU "
          f"(algbw = bytes/time; busbw = algbw*2(n-1)/n, as nccl-tests)")
    if n == 1:
        print("one rank: NCCL moves no data for an in-place all_reduce of one rank, so the columns are each "
              "library's cost per call (libmuster: a C++ call into NCCL; torch: dist.all_reduce from Python), "
              "not bandwidth; bandwidth needs two GPUs or more")
    print(f"{'size':>8} {'muster us':>10} {'torch us':>10} {'muster algbw':>13} {'torch algbw':>12} "
          f"{'muster busbw':>13} {'torch busbw':>12} {'torch/muster':>13}")
    for b in sorted(set(ours) & set(torch_)):
        am, at = b / ours[b] / 1e9, b / torch_[b] / 1e9
        print(f"{human(b):>8} {ours[b] * 1e6:10.1f} {torch_[b] * 1e6:10.1f} {am:13.2f} {at:12.2f} "
              f"{am * factor:13.2f} {at * factor:12.2f} {torch_[b] / ours[b]:12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
