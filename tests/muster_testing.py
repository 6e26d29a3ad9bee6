"""Helpers shared by the integration and compatibility tests: where the
binaries are, running them with bounded waits, and reading what workers wrote."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
MUSTER = os.environ.get("MUSTER_BIN", str(HERE.parent / "build" / "launcher" / "muster"))
RESTART_PROBE = os.environ.get("MUSTER_RESTART_PROBE", "")
SANITIZED = os.environ.get("MUSTER_SANITIZED", "0") in ("1", "ON", "TRUE", "true")
PYTHON = sys.executable
# Bounds for waits; a sanitizer build runs slower. MUSTER_TEST_SLACK sets it
# outright (a loaded or slow machine).
SLACK = float(os.environ.get("MUSTER_TEST_SLACK", "3.0" if SANITIZED else "1.0"))

# Rendezvous settings for quick multi-node tests, scaled by the slack: a round
# closes 1 s (times the slack) after its minimum of nodes, and a node is dead
# after keep_alive_interval x keep_alive_max_attempt = 1.5 s (times the slack)
# without a heartbeat.
KEEP_ALIVE_MAX_ATTEMPT = max(3, round(3 * SLACK))
FAST_RDZV_CONF = (f"last_call_timeout={SLACK:g},keep_alive_interval=0.5,"
                  f"keep_alive_max_attempt={KEEP_ALIVE_MAX_ATTEMPT},join_timeout=60")
# The settings a simulated agent (RdzvConn.join) sends: heartbeats every 500 ms
# (times the slack), dead after three missed, a round closing 1 s after its
# minimum, 10 s to reach it.
SIM_KEEP_ALIVE_MS = int(500 * SLACK)
SIM_KEEP_ALIVE_ATTEMPTS = 3


def base_env(**extra):
    """A small, known environment for the agent: the test's Python first on PATH."""
    env = {
        "PATH": f"{Path(PYTHON).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "LANG": "C.UTF-8",
    }
    for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_muster(args, env=None, timeout=120, cwd=None, **kwargs):
    """Runs muster to completion; returns CompletedProcess with text output."""
    return subprocess.run([MUSTER, *args], env=env if env is not None else base_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def start_muster(args, env=None, **kwargs):
    return subprocess.Popen([MUSTER, *args], env=env if env is not None else base_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def wait_for(predicate, timeout, interval=0.02):
    """Polls predicate until it is true or timeout seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def read_json_files(directory, pattern="rank_*.json"):
    out = {}
    for p in sorted(Path(directory).glob(pattern)):
        out[p.stem] = json.loads(p.read_text())
    return out


def kill_tree_of(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def torchrun_path():
    """torch 2.x's torchrun next to the test's Python."""
    p = Path(PYTHON).parent / "torchrun"
    return str(p) if p.exists() else None


DEBIAN_PYTHON = "/usr/bin/python3"


def debian_torch_available():
    """Debian's python3-torch 1.13 for /usr/bin/python3."""
    try:
        r = subprocess.run([DEBIAN_PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and r.stdout.startswith("1.13")


def slurm_port(job, step):
    """The port muster infers for a Slurm step (docs/slurm.md): 20000 + (job * 16 + step mod 16) mod 12768."""
    return 20000 + (job % 12768 * 16 + step % 16) % 12768


# The sockets that hold the ports free_port() handed out, for the life of the test process,
# and every port it handed out.
_held_ports = []
_handed_out = set()


def free_port(hold=True):
    """A port for a server the test starts next, held until that server takes it.

    The port is checked with a plain bind, which fails while anyone else holds it. Then
    SO_REUSEADDR is set on the bound socket (not listening), and this process keeps it for
    the rest of its life. So no other plain bind, and no other free_port() of any test
    process, can take the port meanwhile. The server can still take it, because it binds with
    SO_REUSEADDR, as muster, musterd, libmuster and torch's TCPStore all do: Linux lets
    SO_REUSEADDR sockets share a port while none of them listens.

    A port is never handed out twice. None comes from the kernel's ephemeral range
    (net.ipv4.ip_local_port_range), where a connection's automatic source port could land on
    it: the ports come from 10000-19999 unless that range overlaps the ephemeral one.
    hold=False, for a server not known to bind with SO_REUSEADDR, releases the port at once."""
    import random
    import socket
    low, high = 10000, 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first, last = (int(x) for x in f.read().split())
        if first < high and last >= low:  # overlapping: take the ports below it (or above)
            low, high = (1024, first) if first - 1024 >= 2000 else (last + 1, 65536)
    except (OSError, ValueError):
        pass
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        s = socket.socket()
        try:
            s.bind(("", port))
        except OSError:  # someone holds it: another
            s.close()
            continue
        _handed_out.add(port)
        if hold:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _held_ports.append(s)
        else:
            s.close()
        return port
    raise RuntimeError(f"no free port among 200 tries in {low}-{high - 1}")


MUSTERD = os.environ.get("MUSTERD_BIN", "")


def start_musterd(*extra, stderr=None, listen="127.0.0.1:0"):
    """Starts musterd (on a free loopback port unless `listen` says otherwise);
    returns (process, port). Its log goes to `stderr` (a file object) when
    given, else to a temporary file (proc.log_path, read with musterd_log): a
    pipe nobody reads would fill up and stall it, as it logs every join."""
    assert MUSTERD, "MUSTERD_BIN is not set (run through ctest)"
    log_path = None
    if stderr is None:
        fd, log_path = tempfile.mkstemp(prefix="musterd-", suffix=".log")
        stderr = os.fdopen(fd, "w")
    proc = subprocess.Popen([MUSTERD, "--listen", listen, *extra], stdout=subprocess.PIPE, stderr=stderr, text=True)
    proc.log_path = log_path
    line = proc.stdout.readline()
    assert line.startswith("musterd listening on "), line
    return proc, int(line.rsplit(":", 1)[1])


def metric(port, name):
    """The value of an unlabelled sample `name` on the Prometheus page at
    127.0.0.1:port (musterd's or an agent's --metrics-listen); None if absent."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10 * SLACK) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def musterd_log(proc):
    with open(proc.log_path) as f:
        return f.read()


def stop_musterd(proc):
    proc.terminate()
    proc.wait(timeout=10)


def port_open(host, port):
    import socket
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_all(procs, timeout):
    """Waits for every process; on a timeout kills them all. Returns the
    stderr of each that did not exit 0."""
    return [err for rc, err in finish_all(procs, timeout) if rc != 0]


import socket as _socket
import struct as _struct


class RdzvConn:
    """A simulated agent: one connection speaking the rendezvous protocol."""

    def __init__(self, port):
        self.sock = _socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, msg):
        data = json.dumps(msg).encode() if not isinstance(msg, bytes) else msg
        self.send_frame(self._encode(data))

    def send_frame(self, payload):
        self.sock.sendall(_struct.pack(">I", len(payload)) + payload)

    def _encode(self, data):
        """A message's bytes as they go into a frame (AuthConn tags them)."""
        return data

    def _decode(self, payload):
        """A frame's payload as a message (AuthConn checks its tag first)."""
        return json.loads(payload)

    def join(self, job, node, nproc=1, min_nodes=1, max_nodes=1, **settings):
        s = {"min_nodes": min_nodes, "max_nodes": max_nodes, "keep_alive_interval_ms": SIM_KEEP_ALIVE_MS,
             "keep_alive_max_attempt": SIM_KEEP_ALIVE_ATTEMPTS, "last_call_timeout_ms": int(1000 * SLACK),
             "join_timeout_ms": int(10000 * SLACK)}
        s.update(settings)
        self.send({"type": "join", "v": 1, "job": job, "node": node, "address": f"{node}.test",
                   "local_world_size": nproc, "store_port": 1000 + len(node), "settings": s})

    def recv(self, timeout=10.0):
        self.sock.settimeout(timeout * SLACK)
        while True:
            if len(self.buf) >= 4:
                (n,) = _struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    msg = self._decode(self.buf[4:4 + n])
                    self.buf = self.buf[4 + n:]
                    return msg
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buf += chunk

    def recv_beating(self, timeout=10.0, every=0.1, also=()):
        """Waits for the next message while heartbeating, as a live agent does
        (and for the agents in `also`, so they stay alive meanwhile);
        acknowledgements and progress reports are skipped."""
        deadline = time.monotonic() + timeout * SLACK
        while time.monotonic() < deadline:
            for a in (self, *also):
                a.send({"type": "heartbeat", "v": 1})
            self.sock.settimeout(every)
            try:
                chunk = self.sock.recv(65536)
            except _socket.timeout:
                chunk = None
            except ConnectionResetError:
                return None
            if chunk == b"":
                return None
            if chunk:
                self.buf += chunk
            while len(self.buf) >= 4:
                (n,) = _struct.unpack(">I", self.buf[:4])
                if len(self.buf) < 4 + n:
                    break
                msg = self._decode(self.buf[4:4 + n])
                self.buf = self.buf[4 + n:]
                if msg.get("type") not in ("heartbeat_ack", "waiting"):
                    return msg
        return None

    def close(self):
        self.sock.close()




def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def write_json_atomically(path, value):
    """Writes value as JSON by rename, so a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def read_stderr_until(proc, pattern, timeout):
    """Reads a running process's stderr (its raw descriptor, so nothing waits in a
    Python buffer that select cannot see) until the bytes pattern (a regex)
    matches or timeout seconds pass; returns (match or None, bytes read)."""
    import re
    import select
    fd = proc.stderr.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        seen += chunk
        if m := re.search(pattern, seen):
            return m, seen
    return None, seen


def envs(out):
    """What the workers wrote as <name>.json in out (dump_env.py's records), by name."""
    return {p.stem: json.loads(p.read_text()) for p in Path(out).glob("*.json")}


def finish(procs, timeout=90):
    """(returncode, stdout, stderr) of each process, waiting for each at most
    timeout seconds times the slack."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout * SLACK)
        results.append((p.returncode, out, err))
    return results


def kill_all(procs):
    """Kills every process still running and reaps it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)


def finish_all(procs, timeout):
    """(returncode, stderr) of each process; on a timeout every one is killed."""
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, err = p.communicate(timeout=30)
            err += f"\n(timed out after {timeout} s)"
        results.append((p.returncode, err))
    return results


def build_ddp_linear(build_dir, *cmake_args):
    """Configures and builds examples/ddp_linear out of the tree against an
    installed muster (cmake_args say where); returns the executable's path."""
    cmake = shutil.which("cmake", path="/usr/bin") or shutil.which("cmake")
    example = HERE.parent / "examples" / "ddp_linear"
    r = subprocess.run([cmake, "-S", str(example), "-B", str(build_dir), *cmake_args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([cmake, "--build", str(build_dir)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return Path(build_dir) / "ddp_linear"


def netns_ip(*args, ns=None):
    """Runs `ip ARGS` (inside network namespace ns when given)."""
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def bridged_namespaces(tag, subnet, count):
    """`count` hosts in network namespaces <tag>h1.. at <subnet>.1.., each
    with an eth0 on a bridge in a switch namespace <tag>sw (its port for host
    i is v<i>); yields (switch, names). Needs root and iproute2."""
    sw = f"{tag}sw"
    names = [f"{tag}h{i}" for i in range(1, count + 1)]
    made = []
    try:
        netns_ip("netns", "add", sw)
        made.append(sw)
        netns_ip("link", "add", "br0", "type", "bridge", ns=sw)
        netns_ip("link", "set", "br0", "up", ns=sw)
        for i, h in enumerate(names, start=1):
            netns_ip("netns", "add", h)
            made.append(h)
            netns_ip("link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", h, ns=sw)
            netns_ip("link", "set", f"v{i}", "master", "br0", ns=sw)
            netns_ip("link", "set", f"v{i}", "up", ns=sw)
            netns_ip("addr", "add", f"{subnet}.{i}/24", "dev", "eth0", ns=h)
            netns_ip("link", "set", "eth0", "up", ns=h)
            netns_ip("link", "set", "lo", "up", ns=h)
        yield sw, names
    finally:
        for n in reversed(made):
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=20)
