"""Worker for the multi-node tests. Writes its environment to
<out>/n<GROUP_WORLD_SIZE>_a<RESTART_COUNT>_r<RANK>.json, then:
  --until-nodes N     sleeps (to be stopped) unless the job has N nodes, else exits 0
  --fail-rank R       rank R exits 3 while TORCHELASTIC_RESTART_COUNT < --fail-attempts (default 1);
                      the other ranks sleep until stopped, or exit 0 once no failure is due"""
import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--until-nodes", type=int)
p.add_argument("--fail-rank", type=int)
p.add_argument("--fail-attempts", type=int, default=1)
a = p.parse_args()
e = os.environ
name = f"n{e['GROUP_WORLD_SIZE']}_a{e['TORCHELASTIC_RESTART_COUNT']}_r{e['RANK']}.json"
with open(os.path.join(a.out, name), "w") as f:
    json.dump(dict(e), f)
restart = int(e["TORCHELASTIC_RESTART_COUNT"])


def sleep_until_stopped():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(9)


if a.until_nodes is not None and int(e["GROUP_WORLD_SIZE"]) != a.until_nodes:
    sleep_until_stopped()
if a.fail_rank is not None and restart < a.fail_attempts:
    if int(e["RANK"]) == a.fail_rank:
        time.sleep(0.3)
        sys.exit(3)
    sleep_until_stopped()
sys.exit(0)
