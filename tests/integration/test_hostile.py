"""Hostile and mistaken input against the real binaries: musterd, an agent
hosting a rendezvous or serving the static backend's port, and the store.
Whatever one peer sends, the process stays up, answers everyone else, gives
back what the peer held (descriptors, memory) and still forms a fresh job."""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from muster_testing import (FAST_RDZV_CONF, DATA, SANITIZED, SLACK, RdzvConn, base_env, fd_count, free_port, port_open, rss_kib, start_muster,
                            start_musterd, stop_musterd, wait_for)

STORE_TOOL = os.environ.get("MUSTER_STORE_TOOL", "")
if SANITIZED:
    # ASan holds freed memory in a quarantine (256 MB by default), which would
    # read as growth in the memory tests; a small one still catches reuse.
    os.environ["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8"
FAST = FAST_RDZV_CONF


@pytest.fixture
def daemon(tmp_path):
    """musterd with its log in a file; yields (process, port)."""
    log = open(tmp_path / "musterd.log", "w")
    proc, port = start_musterd(stderr=log)
    yield proc, port
    stop_musterd(proc)
    log.close()


def start_daemon(tmp_path, *extra):
    log = open(tmp_path / "musterd.log", "a")
    return start_musterd(*extra, stderr=log)


def forms_a_fresh_job(port, job="fresh"):
    a = RdzvConn(port)
    a.join(job, "fresh-node")
    msg = a.recv()
    a.send({"type": "leave", "v": 1})  # gone at once (a closed connection could still resume)
    a.close()
    return msg is not None and msg["type"] == "assign"


def join_msg(**override):
    m = {"type": "join", "v": 1, "job": "bad", "node": "n1", "address": "n1.test", "local_world_size": 1,
         "store_port": 1234, "settings": {"min_nodes": 1, "max_nodes": 2}}
    settings = override.pop("settings", {})
    m.update(override)
    m["settings"].update(settings)
    return m


BAD_JOINS = [
    ({"node": ""}, "\"node\""),
    ({"local_world_size": 0}, "local_world_size"),
    ({"local_world_size": 2 ** 40}, "local_world_size"),
    ({"local_world_size": 1e300}, "local_world_size"),
    ({"local_world_size": 1.5}, "local_world_size"),
    ({"local_world_size": 2 ** 31 - 1}, "local_world_size"),
    ({"local_world_size": "eight"}, "local_world_size"),
    ({"store_port": 2 ** 40}, "store_port"),
    ({"v": 4294967297}, "not supported"),
    ({"settings": {"join_timeout_ms": 2 ** 62}}, "join_timeout_ms"),
    ({"settings": {"keep_alive_interval_ms": 2 ** 62}}, "keep_alive_interval_ms"),
    ({"settings": {"min_nodes": 0}}, "min_nodes"),
    ({"settings": {"max_nodes": 2 ** 33}}, "max_nodes"),
    ({"job": "j" * 900_000}, "\"job\""),
]


@pytest.mark.parametrize("override,fragment", BAD_JOINS, ids=[f[1] + str(i) for i, f in enumerate(BAD_JOINS)])
def test_a_bad_join_gets_an_error_and_musterd_serves_on(daemon, override, fragment):
    proc, port = daemon
    bad = RdzvConn(port)
    bad.send(join_msg(**override))
    err = bad.recv()
    assert err is not None and err["type"] == "error" and fragment in err["message"], err
    assert bad.recv() is None  # that connection only is closed
    assert proc.poll() is None
    assert forms_a_fresh_job(port)


BAD_HEALTH = [
    ({"node": ""}, "\"node\""),
    ({"failures": 0}, "failures"),
    ({"failures": 2 ** 40}, "failures"),
    ({"retry_in_ms": -1}, "retry_in_ms"),
    ({"detail": "x" * 5000}, "detail"),
    ({"job": ["a"]}, "\"job\""),
]


@pytest.mark.parametrize("override,fragment", BAD_HEALTH, ids=[f[1] + str(i) for i, f in enumerate(BAD_HEALTH)])
def test_a_bad_health_report_gets_an_error_and_is_not_shown(daemon, override, fragment):
    proc, port = daemon
    report = {"type": "health", "v": 1, "job": "sick", "node": "n1", "address": "n1.test", "role": "default",
              "failures": 1, "detail": "exit 1", "retry_in_ms": 5000}
    bad = RdzvConn(port)
    bad.send({**report, **override})
    err = bad.recv()
    assert err is not None and err["type"] == "error" and fragment in err["message"], err
    assert bad.recv() is None
    # The same report, well formed, is noted; one from a joined connection is an error.
    good = RdzvConn(port)
    good.send(report)
    assert good.recv()["type"] == "health_noted"
    assert good.recv() is None  # the server closes it
    joined = RdzvConn(port)
    joined.join("sick", "n2")
    assert joined.recv()["type"] == "assign"
    joined.send(report)
    err = joined.recv()
    assert err is not None and err["type"] == "error" and "health" in err["message"], err
    assert proc.poll() is None
    assert forms_a_fresh_job(port)


def test_rejected_joins_of_the_core_leave_musterd_up(daemon):
    """Each of these once made musterd dereference a job it had just cleared."""
    proc, port = daemon
    static = {"min_nodes": 2, "max_nodes": 2, "static": True}
    first = RdzvConn(port)
    first.send(join_msg(job="st", node="a", node_rank=0, settings=static))
    cases = [join_msg(job="st", node="b", node_rank=0, settings=static),   # a node rank taken
             join_msg(job="st", node="c", settings=static),                 # no node rank
             join_msg(job="st2", node="d", node_rank=5, settings=static)]   # out of range
    for msg in cases:
        c = RdzvConn(port)
        c.send(msg)
        r = c.recv()
        assert r is not None and r["type"] in ("reject", "error"), r
        c.close()
        assert proc.poll() is None
    # A finished job: a late joiner is told it is closed.
    done = RdzvConn(port)
    done.join("over", "x")
    assert done.recv()["type"] == "assign"
    done.send({"type": "workers_succeeded", "v": 1, "round": 0})
    assert done.recv()["type"] == "finished"
    late = RdzvConn(port)
    late.join("over", "y")
    r = late.recv()
    assert r["type"] == "reject" and r["code"] == "closed"
    assert proc.poll() is None
    assert forms_a_fresh_job(port)


def test_two_runs_with_one_rdzv_id_leave_musterd_and_its_other_jobs_up(daemon, tmp_path):
    proc, port = daemon
    args = ["--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=samejob",
            f"--rdzv-conf={FAST}", "--no-python", "/bin/true"]
    other = RdzvConn(port)
    other.join("bystander", "b", min_nodes=2, max_nodes=2, join_timeout_ms=120000, keep_alive_interval_ms=60000)
    first = subprocess.run([os.environ["MUSTER_BIN"], *args], env=base_env(), capture_output=True, text=True,
                           timeout=120 * SLACK)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([os.environ["MUSTER_BIN"], *args], env=base_env(), capture_output=True, text=True,
                            timeout=120 * SLACK)
    assert second.returncode == 1
    assert "the job has finished" in second.stderr
    assert proc.poll() is None
    # The other job is still there: its second node completes the round.
    mate = RdzvConn(port)
    mate.join("bystander", "c", min_nodes=2, max_nodes=2, join_timeout_ms=120000, keep_alive_interval_ms=60000)
    assert other.recv()["type"] == "assign" and mate.recv()["type"] == "assign"


def test_json_nested_half_a_million_deep_is_refused(daemon):
    proc, port = daemon
    c = RdzvConn(port)
    c.join("deep", "d")
    assert c.recv()["type"] == "assign"
    depth = 500_000
    frame = b'{"type":"workers_failed","v":1,"round":0,"failure":' + b"[" * depth + b"]" * depth + b"}"
    c.send(frame)
    err = c.recv()
    assert err["type"] == "error" and "nests deeper" in err["message"]
    assert proc.poll() is None
    assert forms_a_fresh_job(port)


def test_wrong_typed_fields_close_their_connection_and_leak_no_descriptor(daemon):
    proc, port = daemon
    assert forms_a_fresh_job(port, "warm-up")
    baseline = fd_count(proc.pid)
    conns = []
    for i in range(200):
        c = RdzvConn(port)
        c.join(f"typed{i}", "t")
        conns.append(c)
    for c in conns:
        assert c.recv()["type"] == "assign"
        c.send({"type": "workers_failed", "v": 1, "round": "x", "failure": {}})
    for c in conns:
        err = c.recv()
        assert err["type"] == "error" and "\"round\" must be an integer" in err["message"], err
        assert c.recv() is None
        c.close()
    assert wait_for(lambda: fd_count(proc.pid) <= baseline, 10 * SLACK), (fd_count(proc.pid), baseline)
    assert forms_a_fresh_job(port)


def test_connections_that_never_join_are_closed_and_each_address_is_capped(tmp_path):
    proc, port = start_daemon(tmp_path, "--join-wait-ms=500", "--max-connections-per-peer=20")
    try:
        assert forms_a_fresh_job(port, "warm-up")  # the loop's own descriptors exist from here on
        baseline = fd_count(proc.pid)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10 * SLACK) for _ in range(30)]
        # The ten past the cap are closed at once; the rest after the join wait.
        for s in idle:
            s.settimeout(10 * SLACK)
        closed = 0
        for s in idle:
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            closed += 1
        assert closed == 30
        assert wait_for(lambda: fd_count(proc.pid) <= baseline, 10 * SLACK), (fd_count(proc.pid), baseline,
                                                                              os.listdir(f"/proc/{proc.pid}/fd"))
        for s in idle:
            s.close()
        assert proc.poll() is None
        assert forms_a_fresh_job(port)
    finally:
        stop_musterd(proc)


def test_open_jobs_are_capped_and_finished_ones_expire(tmp_path):
    proc, port = start_daemon(tmp_path, "--max-jobs=2", "--finished-job-lifetime=1")
    try:
        holders = []
        for j in ("j1", "j2"):
            c = RdzvConn(port)
            c.join(j, "a", min_nodes=2, max_nodes=2, join_timeout_ms=120000)
            holders.append(c)
        third = RdzvConn(port)
        third.join("j3", "a", min_nodes=2, max_nodes=2)
        r = third.recv()
        assert r["type"] == "reject" and r["code"] == "unavailable" and "limit" in r["message"]
        # A job every member left is forgotten: its place is free again.
        holders.pop().close()
        assert wait_for(lambda: forms_a_fresh_job(port, "j4"), 10 * SLACK)
        # A finished job is remembered for its lifetime, then its id is free.
        assert wait_for(lambda: forms_a_fresh_job(port, "once"), 10 * SLACK)
        late = RdzvConn(port)
        late.join("once", "z")
        r = late.recv_beating()
        assert r["type"] in ("reject", "assign")
        if r["type"] == "reject":
            assert r["code"] == "closed"
            assert wait_for(lambda: forms_a_fresh_job(port, "once"), 10 * SLACK)
    finally:
        stop_musterd(proc)


def test_large_job_ids_do_not_grow_musterd_or_its_log(daemon, tmp_path):
    proc, port = daemon
    assert forms_a_fresh_job(port, "warm-up")
    before = rss_kib(proc.pid)
    for i in range(300):
        c = RdzvConn(port)
        c.send(join_msg(job=f"{i}-" + "j" * 900_000, node="n"))
        assert c.recv()["type"] == "error"
        c.close()
    assert proc.poll() is None
    assert rss_kib(proc.pid) - before < 64 * 1024
    # Each refusal is logged once, cut short: 300 lines, not 270 MB of ids.
    log = (tmp_path / "musterd.log").read_text()
    assert log.count("over the limit") == 300
    assert len(log) < 300 * 1024


# --- The agent that hosts a rendezvous or the static backend's port ---------

def bad_frame_then_the_job_completes(port, payload, host, start_mate):
    """A frame that is not a JSON object gets an error; the host agent stays
    up, and once its mate joins the job runs to success on both."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        s.settimeout(10 * SLACK)
        assert b"not a JSON object" in s.recv(65536)
    assert host.poll() is None
    mate = start_mate()
    _, err = mate.communicate(timeout=90 * SLACK)
    assert mate.returncode == 0, err
    _, err = host.communicate(timeout=60 * SLACK)
    assert host.returncode == 0, err


def test_a_duplicate_static_rank_and_a_bad_frame_leave_node_rank_0_up(tmp_path):
    port = free_port()
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}", "--nproc-per-node=1",
              str(DATA / "elastic_worker.py"), str(tmp_path)]
    host = start_muster(["--node-rank=0", "--local-addr=127.0.0.1", *common])
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), 30 * SLACK)
        # A second node claiming node rank 0 (from another host it could bind the port).
        twin = RdzvConn(port)
        twin.send(join_msg(job="none", node="twin", node_rank=0, local_world_size=1,
                           settings={"min_nodes": 2, "max_nodes": 2, "static": True}))
        r = twin.recv()
        assert r is not None and r["type"] == "reject" and "already taken" in r["message"], r
        twin.close()
        bad_frame_then_the_job_completes(
            port, b"{nope", host, lambda: start_muster(["--node-rank=1", "--local-addr=127.0.0.2", *common]))
    finally:
        if host.poll() is None:
            host.kill()
            host.communicate()


def test_bad_joins_to_an_agent_hosting_the_rendezvous_leave_its_job_intact(tmp_path):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"

    def agent(node):
        return start_muster(["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                             "--rdzv-id=hosted", f"--rdzv-conf={FAST}", f"--local-addr=127.0.0.{node}",
                             str(DATA / "elastic_worker.py"), str(tmp_path)])

    host = agent(1)
    try:
        assert wait_for(lambda: port_open("127.0.0.1", port), 30 * SLACK)
        for msg in (join_msg(job="hosted", node="", settings={"min_nodes": 2, "max_nodes": 2}),
                    join_msg(job="hosted", node="x", local_world_size=2 ** 40),
                    join_msg(job="other", node="y", settings={"min_nodes": 1, "max_nodes": 1, "static": True})):
            c = RdzvConn(port)
            c.send(msg)
            r = c.recv()
            assert r is not None and r["type"] in ("error", "reject"), r
            c.close()
        bad_frame_then_the_job_completes(port, b"[1]", host, lambda: agent(2))
    finally:
        if host.poll() is None:
            host.kill()
            host.communicate()


# --- The store --------------------------------------------------------------

def sized(b):
    return struct.pack("<Q", len(b)) + b


class StoreConn:
    """A raw torch 2.x TCPStore client."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30 * SLACK)
        self.sock.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))

    def recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def ping(self, nonce=7):
        self.sock.sendall(b"\x0d" + struct.pack("<I", nonce))
        return struct.unpack("<I", self.recv_exact(4))[0]

    def set(self, key, value):
        self.sock.sendall(b"\x01" + sized(key) + sized(value))

    def add(self, key, delta):
        self.sock.sendall(b"\x04" + sized(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self.recv_exact(8))[0]


@pytest.fixture
def store():
    proc = subprocess.Popen([STORE_TOOL, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    yield proc, int(line.split()[1])
    proc.stdin.close()
    proc.wait(timeout=30)


def test_add_wraps_as_torch_does(store):
    proc, port = store
    c = StoreConn(port)
    c.set(b"counter", b"9223372036854775807")
    assert c.add(b"counter", 1) == -(2 ** 63)
    assert c.add(b"counter", -1) == 2 ** 63 - 1
    assert proc.poll() is None and c.ping() == 7


def wait_request(n, trailing_ping=None):
    keys = b"".join(sized(b"absent/%07d" % i) for i in range(n))
    request = b"\x06" + struct.pack("<Q", n) + keys
    if trailing_ping is not None:
        request += b"\x0d" + struct.pack("<I", trailing_ping)  # answered once the WAIT is in
    return request


def test_a_wait_on_the_most_keys_allowed_never_stalls_other_clients(store):
    proc, port = store
    waiter = StoreConn(port)
    other = StoreConn(port)
    request = wait_request(128 * 1024, trailing_ping=99)
    finished = threading.Event()
    answer = []

    def send():
        waiter.sock.sendall(request)
        answer.append(struct.unpack("<I", waiter.recv_exact(4))[0])
        finished.set()

    t = threading.Thread(target=send, daemon=True)
    started = time.monotonic()
    t.start()
    worst = 0.0
    while not finished.is_set() and time.monotonic() - started < 120 * SLACK:
        t0 = time.monotonic()
        assert other.ping(1) == 1
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.005)
    t.join(timeout=120 * SLACK)
    assert answer == [99]
    print(f"WAIT on 131072 absent keys taken in {time.monotonic() - started:.2f} s; "
          f"worst PING meanwhile {worst * 1000:.1f} ms")
    # A frozen store answers in seconds; one that streams the request in and
    # handles it in O(keys) answers every other client promptly.
    assert worst < 1.0 * SLACK
    waiter.sock.close()
    assert wait_for(lambda: other.ping(2) == 2, 10 * SLACK)


def test_a_wait_on_a_million_keys_is_refused_at_once(store):
    proc, port = store
    waiter = StoreConn(port)
    other = StoreConn(port)
    try:
        waiter.sock.sendall(wait_request(1_000_000))
    except (BrokenPipeError, ConnectionResetError):
        pass
    with pytest.raises((ConnectionError, OSError)):
        waiter.recv_exact(1)
    assert other.ping(3) == 3 and proc.poll() is None


def test_a_client_that_never_reads_its_replies_holds_no_more_than_a_bounded_buffer(store):
    proc, port = store
    c = StoreConn(port)
    c.set(b"big", b"v" * (1024 * 1024))
    assert c.ping() == 7
    before = rss_kib(proc.pid)
    get = b"\x03" + sized(b"big")
    c.sock.sendall(get * 600)  # 600 MB of replies, never read
    other = StoreConn(port)
    assert other.ping(3) == 3
    time.sleep(0.5)
    assert other.ping(4) == 4
    grown = rss_kib(proc.pid) - before
    assert grown < 64 * 1024, f"the store grew by {grown} KiB"
    c.sock.close()
    assert wait_for(lambda: other.ping(5) == 5, 10 * SLACK)


# --- A console nobody reads ---------------------------------------------------

def test_a_console_nobody_reads_stalls_neither_the_store_nor_sigterm(tmp_path):
    # With --shutdown-timeout=2: the workers get 2 s to go, and the output the
    # console will not take gets 2 s more; the agent then says what it dropped.
    import datetime

    import torch.distributed as dist
    agent = None
    fifo = tmp_path / "console"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    try:
        writer = open(fifo, "w")
        agent = subprocess.Popen([os.environ["MUSTER_BIN"], "--standalone", "--nproc-per-node=2", "--tee=3",
                                  "--shutdown-timeout=2", str(DATA / "flood.py"), str(tmp_path), "2"],
                                 env=base_env(), stdout=writer, stderr=subprocess.PIPE, text=True)
        writer.close()
        assert wait_for(lambda: (tmp_path / "env_0.json").exists(), 60 * SLACK)
        env = json.loads((tmp_path / "env_0.json").read_text())
        # The pipes and the agent's buffers fill up, until the worker is held
        # in its own write(2) to stdout: in that system call on fd 1, and
        # nothing more written, across a tenth of a second.
        proc_dir = f"/proc/{env['FLOOD_PID']}"

        def written():
            with open(f"{proc_dir}/io") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))

        def held_in_write():
            before = written()
            time.sleep(0.1)
            with open(f"{proc_dir}/syscall") as f:
                in_write = f.read().startswith("1 0x1 ")
            return in_write and written() == before

        assert wait_for(held_in_write, 60 * SLACK)
        assert not (tmp_path / "done_0").exists()  # it has not got past the flood
        client = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                               timeout=datetime.timedelta(seconds=30 * SLACK), wait_for_workers=False)
        times = []
        for i in range(20):
            t0 = time.monotonic()
            client.set(f"probe{i}", "x")
            assert client.get(f"probe{i}") == b"x"
            times.append(time.monotonic() - t0)
        times.sort()
        print(f"store round trips while the console is blocked: median {times[10] * 1000:.1f} ms, "
              f"worst {times[-1] * 1000:.1f} ms")
        assert times[10] < 0.1 * SLACK
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=40 * SLACK)
        took = time.monotonic() - t0
        print(f"SIGTERM ended the agent in {took:.2f} s")
        assert agent.returncode != 0
        # Within the two grace periods (workers, output), not the writer's own 5 s stall limit on top.
        assert took < 2 * 2 + 2 * SLACK
        err = agent.stderr.read()
        assert "got signal: 15" in err, err[-3000:]  # the final report, on the console that takes bytes
        dropped = [line for line in err.splitlines() if line.startswith("muster: at exit, output")]
        assert len(dropped) == 1, err[-3000:]
        assert "within --shutdown-timeout=2 s was dropped" in dropped[0]
        assert re.search(r"\d+ bytes for the console \(stdout\)", dropped[0]), dropped[0]
    finally:
        os.close(reader)
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()


def test_a_console_that_fails_is_reported_once_and_the_job_goes_on(tmp_path):
    with open("/dev/full", "w") as full:
        r = subprocess.run([os.environ["MUSTER_BIN"], "--standalone", "--nproc-per-node=2", "--tee=3",
                            str(DATA / "chatty.py"), "200", "100"], env=base_env(), stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("cannot write to the console (stdout): No space left on device") == 1, r.stderr
    assert "[default0]:err 0" in r.stderr  # the other stream carries on


def test_a_full_log_filesystem_is_reported_once_and_the_job_goes_on(tmp_path):
    logs = tmp_path / "small"
    logs.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(logs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        r = subprocess.run([os.environ["MUSTER_BIN"], "--standalone", "--nproc-per-node=1", "--tee=3",
                            f"--log-dir={logs}", str(DATA / "chatty.py"), "2000", "1000"], env=base_env(),
                           capture_output=True, text=True, timeout=120 * SLACK)
        assert r.returncode == 0, r.stderr
        said = [line for line in r.stderr.splitlines() if "stdout.log: No space left on device" in line]
        assert len(said) == 1, r.stderr[-3000:]
        assert "the job goes on" in said[0]
        assert r.stdout.count("[default0]:0:") == 2000  # the console got every line
    finally:
        subprocess.run(["umount", str(logs)], capture_output=True)
