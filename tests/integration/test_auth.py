"""The rendezvous with a shared key: agents that hold it run jobs (musterd,
the agent-hosted rendezvous, the static backend, a real torch DDP job); a
connection without it, with another key, replaying recorded frames or
altering one is refused with a clear error on both sides and leaves the
running job alone. The handshake is spoken here from its description in
docs/protocol.md, independently of muster's own client."""
import hashlib
import hmac
import json
import os
import secrets
import struct
import subprocess
from pathlib import Path

import pytest

from muster_testing import (envs, finish, FAST_RDZV_CONF, DATA, SLACK, RdzvConn, base_env, free_port, musterd_log,
                            port_open, run_muster, start_muster, start_musterd, stop_musterd, wait_for)

WORKER = str(DATA / "elastic_worker.py")
FAST = FAST_RDZV_CONF
KEY = b"a-shared-secret-of-some-length-0123456789"
SERVER_PROOF = b"muster-rdzv-auth-1 server proof"
CLIENT_PROOF = b"muster-rdzv-auth-1 client proof"
SESSION_KEY = b"muster-rdzv-auth-1 session key"


class AuthConn(RdzvConn):
    """A simulated agent that authenticates: the handshake, then every frame
    tagged. `wire` keeps every frame it sent, as bytes, for replaying."""

    def __init__(self, port, key=KEY):
        super().__init__(port)
        self.key = key
        self.session = None
        self.sent = 0
        self.received = 0
        self.wire = []

    def send_frame(self, payload):
        self.wire.append(struct.pack(">I", len(payload)) + payload)
        super().send_frame(payload)

    def _encode(self, data):
        if self.session is None:
            return data
        tag = hmac.new(self.session, b"C" + struct.pack(">Q", self.sent) + data, hashlib.sha256).digest()
        self.sent += 1
        return tag + data

    def _decode(self, payload):
        if self.session is None:
            return json.loads(payload)
        tag, body = payload[:32], payload[32:]
        want = hmac.new(self.session, b"S" + struct.pack(">Q", self.received) + body, hashlib.sha256).digest()
        assert hmac.compare_digest(tag, want), f"frame {self.received} from the server has a bad tag"
        self.received += 1
        return json.loads(body)

    def handshake(self):
        nonce = secrets.token_bytes(32)
        self.send({"type": "hello", "v": 1, "nonce": nonce.hex()})
        challenge = self.recv()
        assert challenge["type"] == "challenge", challenge
        theirs = bytes.fromhex(challenge["nonce"])

        def mac(label):
            return hmac.new(self.key, label + nonce + theirs, hashlib.sha256).digest()

        assert hmac.compare_digest(bytes.fromhex(challenge["proof"]), mac(SERVER_PROOF))
        self.send({"type": "auth", "v": 1, "proof": mac(CLIENT_PROOF).hex()})
        self.session = mac(SESSION_KEY)
        return self


def key_file(directory, key=KEY, mode=0o600):
    path = Path(directory) / "auth.key"
    path.write_bytes(key + b"\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture
def keyed_musterd(tmp_path):
    path = key_file(tmp_path)
    proc, port = start_musterd("--auth-key-file", path)
    yield proc, port, path
    stop_musterd(proc)


def agent(endpoint, job, node, out, *worker_args, nnodes=2, key=None, env=None, extra=()):
    args = [f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={job}", f"--rdzv-conf={FAST}", f"--local-addr=127.0.0.{node}"]
    if key:
        args.append(f"--auth-key-file={key}")
    return start_muster([*args, *extra, WORKER, str(out), *worker_args], env=env)


def test_agents_with_the_key_form_a_job_on_musterd(tmp_path, keyed_musterd):
    _, port, path = keyed_musterd
    endpoint = f"127.0.0.1:{port}"
    # One agent takes the key from the flag, the other from the environment.
    a = agent(endpoint, "keyed", 1, tmp_path, key=path)
    b = agent(endpoint, "keyed", 2, tmp_path, env=base_env(MUSTER_AUTH_KEY_FILE=path))
    for rc, _, err in finish([a, b]):
        assert rc == 0, err
    assert sorted(envs(tmp_path)) == ["n2_a0_r0", "n2_a0_r1"]


def test_an_agent_without_the_key_or_with_another_is_refused_and_the_job_goes_on(tmp_path, keyed_musterd):
    proc, port, path = keyed_musterd
    endpoint = f"127.0.0.1:{port}"
    release = tmp_path / "release"
    job = [agent(endpoint, "guarded", n, tmp_path, "--until-file", str(release), key=path) for n in (1, 2)]
    assert wait_for(lambda: len(envs(tmp_path)) == 2, 60 * SLACK)

    # The same job id, no key: refused at its first message, with the fix.
    intruder = run_muster(["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=guarded",
                           "--local-addr=127.0.0.3", WORKER, str(tmp_path / "x")], timeout=60 * SLACK)
    assert intruder.returncode == 1
    assert "requires authentication" in intruder.stderr and "--auth-key-file" in intruder.stderr
    assert "requires authentication" in musterd_log(proc)

    # Another key: the agent finds the server's proof wrong and goes.
    (tmp_path / "other").mkdir()
    other = key_file(tmp_path / "other", key=b"not-the-same-secret-at-all-000")
    wrong = run_muster(["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=guarded",
                        "--local-addr=127.0.0.4", f"--auth-key-file={other}", WORKER, str(tmp_path / "y")],
                       timeout=60 * SLACK)
    assert wrong.returncode == 1
    assert "does not hold this node's auth key" in wrong.stderr
    assert wait_for(lambda: "closed before it authenticated" in musterd_log(proc), 10 * SLACK)

    # The job never noticed: same round, no restart, both finish.
    release.touch()
    for rc, _, err in finish(job):
        assert rc == 0, err
    assert sorted(envs(tmp_path)) == ["n2_a0_r0", "n2_a0_r1"]
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").glob("*.json"))


def test_replayed_altered_and_unauthenticated_frames_are_refused(keyed_musterd):
    proc, port, _ = keyed_musterd
    # A member that authenticated and joined a job of two.
    member = AuthConn(port).handshake()
    member.join("replay", "n1", min_nodes=2, max_nodes=2, join_timeout_ms=60000)
    member.send({"type": "heartbeat", "v": 1, "seq": 1})
    assert member.recv() == {"type": "heartbeat_ack", "v": 1, "seq": 1}

    # Its recorded frames, replayed on a new connection: the server's new
    # nonce makes the recorded proof worthless.
    replay = RdzvConn(port)
    for frame in member.wire[:2]:  # its hello and its auth (the server closes at the auth)
        replay.sock.sendall(frame)
    challenge = replay.recv()
    assert challenge["type"] == "challenge"
    refused = replay.recv()
    assert refused["type"] == "error" and refused["code"] == "auth_failed"
    assert "proof does not match" in refused["message"]
    assert replay.recv() is None  # closed

    # A frame replayed within its own connection.
    again = AuthConn(port).handshake()
    again.join("other", "m1", min_nodes=2, max_nodes=2, join_timeout_ms=60000)
    again.send({"type": "heartbeat", "v": 1, "seq": 7})
    assert again.recv() == {"type": "heartbeat_ack", "v": 1, "seq": 7}
    again.sock.sendall(again.wire[-1])
    refused = again.recv()
    assert refused["type"] == "error" and refused["code"] == "auth_failed"
    assert "failed authentication" in refused["message"]
    assert again.recv() is None

    # An altered frame: one byte of the message changed after tagging.
    altered = AuthConn(port).handshake()
    data = json.dumps({"type": "leave", "v": 1}).encode()
    tagged = altered._encode(data)
    tampered = tagged[:-2] + b" }"
    altered.send_frame(tampered)
    refused = altered.recv()
    assert refused["type"] == "error" and refused["code"] == "auth_failed"
    assert "failed authentication" in refused["message"]
    assert altered.recv() is None

    # No handshake at all.
    plain = RdzvConn(port)
    plain.join("replay", "n9", min_nodes=2, max_nodes=2)
    refused = plain.recv()
    assert refused["code"] == "auth_failed" and "requires authentication" in refused["message"]

    # The member is still in its job and answered.
    member.send({"type": "heartbeat", "v": 1, "seq": 2})
    assert member.recv() == {"type": "heartbeat_ack", "v": 1, "seq": 2}
    partner = AuthConn(port).handshake()
    partner.join("replay", "n2", min_nodes=2, max_nodes=2, join_timeout_ms=60000)
    assert partner.recv_beating(also=[member])["type"] == "assign"
    assert member.recv_beating(also=[partner])["type"] == "assign"
    log = musterd_log(proc)
    assert log.count("proof does not match") == 1 and log.count("failed authentication") == 2


def test_the_agent_hosted_and_static_rendezvous_take_the_key(tmp_path):
    path = key_file(tmp_path)
    # c10d, hosted by the agent that owns the endpoint.
    endpoint = f"127.0.0.1:{free_port()}"
    (tmp_path / "c10d").mkdir()
    host = agent(endpoint, "hosted", 1, tmp_path / "c10d", "--until-file", str(tmp_path / "go"), key=path)
    assert wait_for(lambda: port_open("127.0.0.1", int(endpoint.split(":")[1])), 30 * SLACK)
    refused = run_muster(["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=hosted",
                          "--local-addr=127.0.0.3", WORKER, str(tmp_path / "x")], timeout=60 * SLACK)
    assert refused.returncode == 1 and "requires authentication" in refused.stderr
    other = agent(endpoint, "hosted", 2, tmp_path / "c10d", "--until-file", str(tmp_path / "go"), key=path)
    assert wait_for(lambda: len(envs(tmp_path / "c10d")) == 2, 60 * SLACK)
    (tmp_path / "go").touch()
    for rc, _, err in finish([host, other]):
        assert rc == 0, err

    # static: node rank 0 serves the rendezvous on --master-port.
    (tmp_path / "static").mkdir()
    port = free_port()
    nodes = [start_muster(["--nnodes=2", "--nproc-per-node=1", f"--node-rank={r}", "--master-addr=127.0.0.1",
                           f"--master-port={port}", f"--auth-key-file={path}", str(DATA / "dump_env.py"),
                           str(tmp_path / "static")]) for r in (0, 1)]
    for rc, _, err in finish(nodes):
        assert rc == 0, err
    assert len(list((tmp_path / "static").glob("*.json"))) == 2


def test_a_torch_ddp_job_runs_with_a_key(tmp_path, keyed_musterd):
    pytest.importorskip("torch", reason="the torch job needs PyTorch: scripts/install-deps.sh installs it")
    _, port, path = keyed_musterd
    script = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "ddp_train.py")

    out = tmp_path / "out"
    out.mkdir()
    procs = [start_muster(["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ddp", f"--rdzv-conf={FAST}",
                           f"--local-addr=127.0.0.{n}", f"--auth-key-file={path}", script, str(out), "1"])
             for n in (1, 2)]
    results = finish(procs, timeout=300)
    assert [rc for rc, _, _ in results] == [0, 0], "".join(err for _, _, err in results)
    weights = json.loads((out / "weights.json").read_text())
    assert weights["world_size"] == 2


def test_bad_key_files_are_refused_with_the_fix(tmp_path):
    loose = key_file(tmp_path, mode=0o644)
    r = run_muster(["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                    f"--auth-key-file={loose}", WORKER, str(tmp_path)], timeout=30 * SLACK)
    assert r.returncode == 1
    assert "chmod 600" in r.stderr and loose in r.stderr
    d = subprocess.run([os.environ["MUSTERD_BIN"], "--listen", "127.0.0.1:0", "--auth-key-file",
                        str(tmp_path / "missing")], capture_output=True, text=True, timeout=30)
    assert d.returncode == 2 and "missing" in d.stderr and "/dev/urandom" in d.stderr


def test_musterd_says_what_it_exposes(tmp_path):
    # Without --listen: loopback only, and it says so.
    if port_open("127.0.0.1", 29400):
        pytest.skip("port 29400 is in use on this machine")
    log = tmp_path / "musterd.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([os.environ["MUSTERD_BIN"]], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout.readline().strip() == "musterd listening on 127.0.0.1:29400"
        assert wait_for(lambda: "loopback only" in log.read_text(), 10 * SLACK)
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert "--listen" in log.read_text()
    # Every interface and no key: a warning.
    proc, port = start_musterd(listen="0.0.0.0:0")
    try:
        assert wait_for(lambda: f"no auth key: any process that reaches 0.0.0.0:{port}" in musterd_log(proc),
                        10 * SLACK)
    finally:
        stop_musterd(proc)
