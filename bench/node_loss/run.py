#!/usr/bin/env python3
"""bench/node_loss: how long a job stands still when a node dies, muster beside torchrun.

Agents on this machine (node addresses 127.0.0.1..3) run a gloo job (bench/node_loss/worker.py)
through a c10d rendezvous that the first agent hosts (torchrun) or musterd (muster), with
the default keep-alive (5 s x 3) and --max-restarts=3 for both. Then one
agent that does not host the rendezvous is lost, and the time from that moment to the first
worker of the new world starting (a CLOCK_MONOTONIC stamp the worker writes) is measured:

  kill      kill -KILL of the agent and its workers (a machine going down), 2 nodes of --nnodes=1:2
  spare     the same, 2 running nodes of --nnodes=2:2 and a third agent waiting as a spare
  silent    kill -STOP of the agent and its workers (a paused node: only silence tells),
            2 nodes of --nnodes=1:2
  exclude   the worker of a running node starts exiting 75 (bad hardware), 2 running nodes of
            --nnodes=2:2 and a spare; muster's agents run with --exclude-exit-code=75, so the
            node is excluded after one failure; measured to the spare's first worker (torchrun
            has no exclusion: it restarts onto the bad node, and a spare gets in only by chance)

Median of --repeat runs; prints seconds and torchrun/muster ratios (">180": no new world
within 180 s). Nothing is asserted:
    python3 bench/node_loss/run.py --muster build/launcher/muster --musterd build/rendezvous/musterd
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# torchrun's default keep-alive (5 s x 3): what a job that sets nothing gets.
CONF = "last_call_timeout=4,join_timeout=120"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stamps(out):
    path = out / "stamps"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        _, t, world, restart, rank, node = line.split()
        rows.append((float(t), int(world), int(restart), int(rank), int(node)))
    return rows


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def descendants(pid):
    """Every process below pid (a launcher's workers and their helpers), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def signal_tree(pid, signo):
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signo)
        except ProcessLookupError:
            pass


def one_run(kind, launcher, endpoint, run_id, env, extra=()):
    out = Path(tempfile.mkdtemp(prefix="node-loss-"))
    with_spare = kind in ("spare", "exclude")
    nodes = "2:2" if with_spare else "1:2"
    agents = []
    try:
        for node in (1, 2, 3) if with_spare else (1, 2):
            if node == 3:  # the spare comes once the first world runs, so it is the one waiting
                wait(lambda: any(world == 2 for _, world, *_ in stamps(out)), 120, f"the first world ({out})")
            argv = [*launcher, f"--nnodes={nodes}", "--nproc-per-node=1", "--max-restarts=3", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={CONF}",
                    f"--local-addr=127.0.0.{node}", *extra, str(HERE / "worker.py"), str(out)]
            log = open(out / f"agent{node}.log", "w")
            agents.append(subprocess.Popen(argv, env=dict(env, BENCH_NODE=str(node)), stdout=log, stderr=log,
                                           start_new_session=True))
            log.close()
            if node == 1:
                time.sleep(1.0)  # the first agent hosts the rendezvous (torchrun): it listens first
        wait(lambda: any(world == 2 for _, world, *_ in stamps(out)), 120, f"the first world of two ({out})")
        victim = agents[1]
        time.sleep(1.0)
        t0 = time.monotonic()
        if kind == "silent":
            signal_tree(victim.pid, signal.SIGSTOP)  # the agent and its worker, paused
        elif kind == "exclude":
            (out / "bad_2").touch()  # node 2's worker fails from now on, asking for its exclusion
        else:
            signal_tree(victim.pid, signal.SIGKILL)  # the agent and its worker, as a machine going down
        # The new world: its first worker; with exclude, the spare's first.
        def new(row):
            return row[0] > t0 and (kind != "exclude" or row[4] == 3)
        try:
            wait(lambda: any(new(r) for r in stamps(out)), 180, "the new world")
        except SystemExit:
            return None  # no new world within 180 s: the launcher did not recover
        return min(r[0] for r in stamps(out) if new(r)) - t0
    finally:
        (out / "stop").touch()
        for a in agents:
            signal_tree(a.pid, signal.SIGKILL)
            a.wait()
        # What the killed agent's workers left (they die with it; a paused one is killed above).
        time.sleep(0.2)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(out, ignore_errors=True)


def median(values):
    """The median, or None when a run did not recover (counted as the worst)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muster", required=True)
    ap.add_argument("--musterd", required=True)
    ap.add_argument("--torchrun", default=shutil.which("torchrun"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kinds", default="kill,spare,silent,exclude")
    a = ap.parse_args()
    # The workers' Python is this one (with torch): first on PATH for both launchers.
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", LOGLEVEL="ERROR",
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    port = free_port()
    musterd = subprocess.Popen([a.musterd, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    musterd.stdout.readline()
    rows = []
    try:
        for kind in a.kinds.split(","):
            extra = ["--exclude-exit-code=75"] if kind == "exclude" else []
            m = [one_run(kind, [a.muster], f"127.0.0.1:{port}", f"{kind}-{i}", env, extra) for i in range(a.repeat)]
            t = [one_run(kind, [a.torchrun], f"127.0.0.1:{free_port()}", f"{kind}-{i}", env)
                 for i in range(a.repeat)]
            rows.append((kind, median(m), median(t)))
    finally:
        musterd.kill()
        musterd.wait()
    print(f"{'loss':8} {'muster s':>9} {'torchrun s':>11} {'torchrun/muster':>16}")
    def shown(v):
        return f"{v:.2f}" if v is not None else ">180"
    for kind, m, t in rows:
        ratio = f"{t / m:.1f}" if m is not None and t is not None else ("inf" if m is not None else "?")
        print(f"{kind:8} {shown(m):>9} {shown(t):>11} {ratio:>16}")


if __name__ == "__main__":
    main()
