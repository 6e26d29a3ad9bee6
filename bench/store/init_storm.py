"""The init storm: N ranks, each its own connection, doing what
init_process_group and the gloo/NCCL set-up ask of the store (see
init_storm.cpp), against muster's store and against torch's own TCPStore
server (its libuv backend) in the same run. Prints, per N and per server, the
time to the last rank through the barrier and to the last rank done, requests
per second, the server's peak RSS, the handshakes redone after going
unanswered for 10 s, and torch's time over
muster's.

  .venv/bin/python bench/store/init_storm.py [BUILD_DIR] [N...]
(default: build, N = 1000 10000 and the largest the descriptor limit allows)

Each rank is a descriptor in the server and one in init_storm: N is capped by
the hard RLIMIT_NOFILE, which this script raises the soft limit to (and the
servers inherit). It says the limit it ran under."""
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
largest = (hard - 200) // 1000 * 1000
sizes = [int(n) for n in sys.argv[2:]] or sorted({1000, 10000, largest})
sizes = [n for n in sizes if n > 0]

TORCH_SERVER = """
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=600))
print("PORT", s.port, flush=True)
sys.stdin.read()
"""
SERVERS = {
    "muster": [os.path.join(build, "tests", "store_tool"), "serve"],
    "torch": [sys.executable, "-c", TORCH_SERVER],
}


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(name, n, block):
    p = subprocess.Popen(SERVERS[name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        if not line.startswith("PORT"):
            raise RuntimeError(f"{name}'s store did not start: {line!r}")
        port = int(line.split()[1])
        base = peak_rss_mib(p.pid)
        out = subprocess.run([os.path.join(build, "bench", "init_storm"), "127.0.0.1", str(port), str(n), str(block)],
                             capture_output=True, text=True, timeout=120 + n / 100)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["peak_rss_mib"] = peak_rss_mib(p.pid)
        result["base_rss_mib"] = base
        return result
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    print(f"RLIMIT_NOFILE {hard} (hard): at most {largest} ranks here; each rank: VALIDATE+PING, ADD init/, "
          "SET address, barrier (ADD + WAIT), WAIT+MULTI_GET of 2 peers, WAIT+GET, CHECK")
    head = (f"{'ranks':>7} {'server':>7} {'barrier_ms':>11} {'done_ms':>9} {'req/s':>10} "
            f"{'peak_rss_MiB':>13} {'KiB/rank':>9} {'retries':>8} {'torch/muster':>13}")
    print(head)
    block = 1
    for n in sizes:
        rows = {}
        for name in ("muster", "torch"):
            r = one(name, n, block)
            block += 1
            rows[name] = r
            if r.get("done") != n:
                print(f"{n:>7} {name:>7} did not finish: {r}")
                continue
            rps = r["requests"] / (r["done_ms"] / 1000)
            per_rank = (r["peak_rss_mib"] - r["base_rss_mib"]) * 1024 / n
            ratio = ""
            if name == "torch" and rows["muster"].get("done") == n:
                ratio = f"{r['done_ms'] / rows['muster']['done_ms']:>12.1f}x"
            print(f"{n:>7} {name:>7} {r['barrier_ms']:>11.1f} {r['done_ms']:>9.1f} {rps:>10.0f} "
                  f"{r['peak_rss_mib']:>13.1f} {per_rank:>9.2f} {r['handshake_retries']:>8} {ratio:>13}", flush=True)


main()
