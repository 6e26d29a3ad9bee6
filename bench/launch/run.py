#!/usr/bin/env python3
"""bench/launch: muster beside torchrun, in the same run.

1. Launch: wall time and peak RSS of
       <launcher> --standalone --nproc-per-node=N --no-python /bin/true
   for N = 1, 2, 4, 8 (median of --repeat runs; RSS is the peak resident set of
   the largest process of the launcher's tree, from wait4 in bench/launch/peak_rss).
2. Restart latency: a worker's failing exit to its replacement's start, from a
   probe worker that stamps CLOCK_MONOTONIC at start and just before exit 1.

Prints one table with torchrun/muster ratios. Nothing here is asserted; run it:
    python3 bench/launch/run.py --muster build/launcher/muster --probe build/bench/restart_probe
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_once(peak_rss, argv, env):
    r = subprocess.run([peak_rss, *argv], env=env, capture_output=True, text=True, timeout=600)
    ns, rss_kib, status = (int(x) for x in r.stdout.split())
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed with {status}:\n{r.stderr}")
    return ns / 1e9, rss_kib / 1024.0


def launch(peak_rss, launcher, nproc, repeat, env):
    argv = [*launcher, "--standalone", f"--nproc-per-node={nproc}", "--no-python", "/bin/true"]
    runs = [run_once(peak_rss, argv, env) for _ in range(repeat)]
    return statistics.median(w for w, _ in runs), max(r for _, r in runs)


def restart_latency(launcher, probe, restarts, env):
    with tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps"
        argv = [*launcher, "--standalone", "--nproc-per-node=1", f"--max-restarts={restarts}", "--no-python", probe,
                str(stamps), str(restarts)]
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        events = [line.split() for line in stamps.read_text().splitlines()]
    gaps = []
    for (kind, t), (next_kind, next_t) in zip(events, events[1:]):
        if kind == "exit" and next_kind == "start":
            gaps.append((int(next_t) - int(t)) / 1e6)  # ms
    if len(gaps) != restarts:
        raise SystemExit(f"expected {restarts} restarts, saw {len(gaps)}")
    return statistics.median(gaps), max(gaps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--muster", default=str(ROOT / "build" / "launcher" / "muster"))
    p.add_argument("--probe", default=str(ROOT / "build" / "bench" / "restart_probe"))
    p.add_argument("--peak-rss", default=str(ROOT / "build" / "bench" / "peak_rss"))
    p.add_argument("--torchrun", default=shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--nprocs", default="1,2,4,8")
    p.add_argument("--restarts", type=int, default=10)
    args = p.parse_args()

    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # no banner, the same for both
    muster = [args.muster]
    torchrun = [args.torchrun]
    if not Path(args.torchrun).exists():
        raise SystemExit(f"torchrun not found at {args.torchrun}: pass --torchrun")

    rows = []
    for n in [int(x) for x in args.nprocs.split(",")]:
        mw, mr = launch(args.peak_rss, muster, n, args.repeat, env)
        tw, tr = launch(args.peak_rss, torchrun, n, max(1, args.repeat // 2), env)
        rows.append((f"launch N={n}: wall (ms)", mw * 1e3, tw * 1e3))
        rows.append((f"launch N={n}: peak RSS (MiB)", mr, tr))
    mlat, mmax = restart_latency(muster, args.probe, args.restarts, env)
    tlat, tmax = restart_latency(torchrun, args.probe, max(2, args.restarts // 3), env)
    rows.append(("restart latency, median (ms)", mlat, tlat))
    rows.append(("restart latency, max (ms)", mmax, tmax))

    print(f"{'measure':34} {'muster':>12} {'torchrun':>12} {'torchrun/muster':>16}")
    for name, m, t in rows:
        print(f"{name:34} {m:12.2f} {t:12.2f} {t / m if m else float('inf'):15.1f}x")


if __name__ == "__main__":
    main()
