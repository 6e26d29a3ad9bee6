#!/usr/bin/env python3
"""bench/allreduce: muster's CPU all_reduce beside gloo's, same launcher, same
machine, same run. Bus bandwidth = bytes * 2(n-1)/n / time. Prints one table
per rank count with the ratios, and memcpy's bandwidth as the ceiling.

  bench/allreduce/run.py [--muster build/launcher/muster] [--bench build/bench/allreduce_bench]
                         [--ranks 2 4]
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lines(out):
    return {d["bytes"]: d["seconds"] for d in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}


def launch(muster, nproc, argv, env, timeout=1800):
    r = subprocess.run([muster, "--standalone", f"--nproc-per-node={nproc}", *argv], capture_output=True,
                       text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"benchmark run failed ({' '.join(argv)}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return lines(r.stdout)


def human(b):
    if b >= 1 << 30:
        return f"{b >> 30} GiB"
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muster", default=str(ROOT / "build/launcher/muster"))
    ap.add_argument("--bench", default=str(ROOT / "build/bench/allreduce_bench"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = ap.parse_args()
    env = dict(os.environ, PATH=f"{Path(args.python).parent}:{os.environ.get('PATH', '')}")
    copy = lines(subprocess.run([args.bench, "memcpy"], capture_output=True, text=True, check=True).stdout)
    for n in args.ranks:
        ours = launch(args.muster, n, ["--no-python", args.bench], env)
        gloo = launch(args.muster, n, [str(Path(__file__).parent / "gloo_bench.py")], env)
        factor = 2 * (n - 1) / n
        print(f"\nall_reduce float32 sum, {n} ranks on one node (bus bandwidth = bytes*2(n-1)/n / time)")
        print(f"{'size':>8} {'muster us':>10} {'gloo us':>10} {'muster GB/s':>12} {'gloo GB/s':>10} "
              f"{'memcpy GB/s':>12} {'vs gloo':>8} {'vs memcpy':>10}")
        for b in sorted(ours):
            bw_m = b * factor / ours[b] / 1e9
            bw_g = b * factor / gloo[b] / 1e9
            bw_c = b / copy[b] / 1e9
            print(f"{human(b):>8} {ours[b] * 1e6:10.1f} {gloo[b] * 1e6:10.1f} {bw_m:12.2f} {bw_g:10.2f} "
                  f"{bw_c:12.2f} {bw_m / bw_g:7.2f}x {bw_m / bw_c:9.2f}x")
        small = min(ours)
        print(f"small-message latency ({human(small)}): muster {ours[small] * 1e6:.1f} us, gloo "
              f"{gloo[small] * 1e6:.1f} us, ratio {ours[small] / gloo[small]:.2f}")


if __name__ == "__main__":
    main()
