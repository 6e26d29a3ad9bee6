"""The init storm: N ranks, each its own connection, doing what
init_process_group and the gloo/NCCL set-up ask of the store (see
init_storm.cpp), against muster's store and against torch's own TCPStore
server (its libuv backend) in the same run. Prints, per N and per server, the
time to the last rank through the barrier and to the last rank done, requests
per second, the server's peak RSS, the handshakes redone after going
unanswered for 10 s, and torch's time over
muster's.

  .venv/bin/python bench/store/init_storm.py [BUILD_DIR] [N...] [--servers muster,torch,...]
(default: build, N = 1000 10000 and the largest the descriptor limit allows;
all three servers. torch's legacy server does not finish past ~10,000 ranks,
so a run at 100,000 names --servers muster,torch.) Each storm is bounded by
MUSTER_STORM_TIMEOUT seconds (default 120 + N/100).

Each rank is a descriptor in the server and one in init_storm: N is capped by
the hard RLIMIT_NOFILE, which this script raises the soft limit to (and the
servers inherit). It says the limit it ran under.

torch's store server looks up the host name of every connection it accepts
(getnameinfo on the peer, on its one event loop, before it reads a byte). Where
the resolver drops a query, that lookup holds the whole server for the
resolver's timeout (5 s), and the storm measures the resolver, not the store.
So each server runs in a mount namespace of its own whose /etc/hosts names
every source address the run connects from, as on a cluster whose nodes are
in /etc/hosts or whose DNS answers: a lookup is then answered at once. Without
the privilege for that (root, unshare) the servers run as they are and the
script says so."""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
args = sys.argv[1:]
servers = ("muster", "torch", "torch-legacy")
if "--servers" in args:
    i = args.index("--servers")
    servers = tuple(args[i + 1].split(",")) if i + 1 < len(args) else ()
    del args[i:i + 2]
    if not servers or servers[0] != "muster":
        sys.exit("init_storm.py: --servers takes a comma-separated list that starts with muster "
                 "(the ratios are over muster's figures), e.g. --servers muster,torch")
build = args[0] if args else os.path.join(ROOT, "build")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
largest = (hard - 200) // 1000 * 1000
sizes = [int(n) for n in args[1:]] or sorted({1000, 10000, largest})
sizes = [n for n in sizes if n > 0]

TORCH_SERVER = """
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=sys.argv[1] == "libuv", wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=600))
print("PORT", s.port, flush=True)
sys.stdin.read()
"""
SERVERS = {
    "muster": [os.path.join(build, "tests", "store_tool"), "serve"],
    "torch": [sys.executable, "-c", TORCH_SERVER, "libuv"],
    # torch's first server (poll() over every connection), still there behind use_libuv=False
    "torch-legacy": [sys.executable, "-c", TORCH_SERVER, "legacy"],
}


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


PER_SOURCE_ADDRESS = 4000  # bench/loopback_source.hpp's kPerSourceAddress


def source_addresses(n, block):
    """The source addresses init_storm binds for N ranks in BLOCK."""
    slots = (n + PER_SOURCE_ADDRESS - 1) // PER_SOURCE_ADDRESS
    return [f"127.{block}.{s // 250}.{1 + s % 250}" for s in range(slots)]


def hosts_file(n, block):
    """A hosts file naming every source address of the run, in both the forms a
    dual-stack server sees them in (IPv4 and v4-mapped IPv6)."""
    path = os.path.join(HOSTS_DIR, f"hosts.{block}")
    with open("/etc/hosts") as f:
        lines = [f.read().rstrip("\n")]
    for a in source_addresses(n, block):
        name = "storm-" + a.replace(".", "-")
        lines += [f"{a} {name}", f"::ffff:{a} {name}"]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(path + ".tmp", path)
    return path


def namespace_works():
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind /etc/hosts /etc/hosts'],
                           capture_output=True, timeout=30)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HOSTS_DIR = None
ISOLATE = False


def server_command(name, n, block):
    cmd = SERVERS[name]
    if not ISOLATE:
        return cmd
    return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', hosts_file(n, block)] + cmd


def cpu_ms(pid):
    """User and system CPU time of PID so far, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) * 1000 / tick, int(fields[12]) * 1000 / tick


def one(name, n, block):
    p = subprocess.Popen(server_command(name, n, block), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        if not line.startswith("PORT"):
            raise RuntimeError(f"{name}'s store did not start: {line!r}")
        port = int(line.split()[1])
        base = peak_rss_mib(p.pid)
        cpu0 = cpu_ms(p.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([os.path.join(build, "bench", "init_storm"), "127.0.0.1", str(port), str(n), str(block)],
                             capture_output=True, text=True,
                             timeout=float(os.environ.get("MUSTER_STORM_TIMEOUT", 120 + n / 100)))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["client_cpu_ms"] = ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) * 1000
        result["peak_rss_mib"] = peak_rss_mib(p.pid)
        cpu1 = cpu_ms(p.pid)
        result["server_user_ms"] = cpu1[0] - cpu0[0]
        result["server_sys_ms"] = cpu1[1] - cpu0[1]
        result["server_cpu_ms"] = result["server_user_ms"] + result["server_sys_ms"]
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
    global HOSTS_DIR, ISOLATE
    HOSTS_DIR = tempfile.mkdtemp(prefix="init_storm.")
    ISOLATE = namespace_works()
    if ISOLATE:
        print("each server runs with an /etc/hosts naming the run's source addresses (mount namespace), "
              "so torch's per-connection host-name lookup is answered at once")
    else:
        print("WARNING: no mount namespace here (needs root and unshare): the servers use the system "
              "resolver, and torch's server waits on a host-name lookup for every connection it accepts")
    print(f"RLIMIT_NOFILE {hard} (hard): at most {largest} ranks here; each rank: VALIDATE+PING, ADD init/, "
          "SET address, barrier (ADD + WAIT), WAIT+MULTI_GET of 2 peers, WAIT+GET, CHECK")
    head = (f"{'ranks':>7} {'server':>12} {'barrier_ms':>11} {'done_ms':>9} {'req/s':>10} "
            f"{'peak_rss_MiB':>13} {'KiB/rank':>9} {'retries':>8} {'user_ms':>7} {'sys_ms':>7} {'us/req':>7} {'client_cpu':>10} {'torch/muster barrier':>21} {'done':>6} {'cpu':>6}")
    print(head)
    block = 1
    for n in sizes:
        rows = {}
        for name in servers:
            if name not in SERVERS:
                sys.exit(f"init_storm.py: unknown server {name!r} (known: {', '.join(SERVERS)})")
            try:
                r = one(name, n, block)
            except subprocess.TimeoutExpired as e:
                print(f"{n:>7} {name:>12} did not finish within {e.timeout:.0f} s", flush=True)
                block += 1
                rows[name] = {}
                continue
            block += 1
            rows[name] = r
            if r.get("done") != n:
                print(f"{n:>7} {name:>12} did not finish: {r}")
                continue
            rps = r["requests"] / (r["done_ms"] / 1000)
            per_rank = (r["peak_rss_mib"] - r["base_rss_mib"]) * 1024 / n
            ratio = ""
            if name != "muster" and rows["muster"].get("done") == n:
                m = rows["muster"]
                ratio = (f"{r['barrier_ms'] / m['barrier_ms']:>20.1f}x {r['done_ms'] / m['done_ms']:>5.1f}x "
                         f"{r['server_cpu_ms'] / m['server_cpu_ms']:>5.1f}x")
            print(f"{n:>7} {name:>12} {r['barrier_ms']:>11.1f} {r['done_ms']:>9.1f} {rps:>10.0f} "
                  f"{r['peak_rss_mib']:>13.1f} {per_rank:>9.2f} {r['handshake_retries']:>8} {r['server_user_ms']:>7.0f} {r['server_sys_ms']:>7.0f} "
                  f"{r['server_cpu_ms'] * 1000 / r['requests']:>7.2f} {r['client_cpu_ms']:>10.0f} {ratio}", flush=True)


try:
    main()
finally:
    if HOSTS_DIR:
        shutil.rmtree(HOSTS_DIR, ignore_errors=True)
