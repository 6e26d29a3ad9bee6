"""Worker for the multi-node tests. Writes its environment to
<out>/n<GROUP_WORLD_SIZE>_a<RESTART_COUNT>_r<RANK>.json (by rename, so a reader
never sees half a file), then:
  --until-nodes N     sleeps (to be stopped) unless the job has N nodes, else exits 0
  --fail-rank R       rank R exits 3 while TORCHELASTIC_RESTART_COUNT < --fail-attempts (default 1);
                      the other ranks sleep until stopped, or exit 0 once no failure is due
  --until-file PATH   instead of exiting 0, waits (up to 120 s) for PATH to exist, then exits 0
  --term-exit CODE    on SIGTERM, exits CODE (as a training script with its own handler does)"""
import argparse
import json
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--until-nodes", type=int)
p.add_argument("--fail-rank", type=int)
p.add_argument("--fail-attempts", type=int, default=1)
p.add_argument("--until-file")
p.add_argument("--term-exit", type=int)
a = p.parse_args()
if a.term_exit is not None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(a.term_exit))
e = os.environ
name = f"n{e['GROUP_WORLD_SIZE']}_a{e['TORCHELASTIC_RESTART_COUNT']}_r{e['RANK']}.json"
tmp = os.path.join(a.out, f".{name}.{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump(dict(e, WORKER_PID=str(os.getpid())), f)
os.rename(tmp, os.path.join(a.out, name))
restart = int(e["TORCHELASTIC_RESTART_COUNT"])


def sleep_until_stopped():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(9)


def succeed():
    if a.until_file:
        deadline = time.monotonic() + 120
        while not os.path.exists(a.until_file):
            if time.monotonic() > deadline:
                sys.exit(8)
            time.sleep(0.05)
    sys.exit(0)


if a.until_nodes is not None and int(e["GROUP_WORLD_SIZE"]) != a.until_nodes:
    sleep_until_stopped()
if a.fail_rank is not None and restart < a.fail_attempts:
    if int(e["RANK"]) == a.fail_rank:
        time.sleep(0.3)
        sys.exit(3)
    sleep_until_stopped()
succeed()
