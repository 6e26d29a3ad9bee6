"""Operating muster: musterctl against musterd and against an agent-hosted
rendezvous, musterd's Prometheus metrics scraped during a job, its systemd
notifications (READY, WATCHDOG, STATUS, RELOADING, STOPPING) on a socket the
test binds, and --version on every binary."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from muster_testing import (finish, FAST_RDZV_CONF, DATA, SLACK, RdzvConn, base_env, free_port, read_stderr_until, run_muster,
                            start_muster, start_musterd, stop_musterd, wait_for)

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(DATA / "elastic_worker.py")
FAST = FAST_RDZV_CONF
MUSTERCTL = os.environ.get("MUSTERCTL_BIN") or str(Path(os.environ["MUSTERD_BIN"]).with_name("musterctl"))


def ctl(endpoint, *args, key=None):
    cmd = [MUSTERCTL, "--endpoint", endpoint, *(["--auth-key-file", key] if key else []), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60 * SLACK)


def agent(endpoint, job, node, out, *worker_args, key=None, extra=(), env=None):
    return start_muster(["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                         f"--rdzv-id={job}", f"--rdzv-conf={FAST}", f"--local-addr=127.0.0.{node}",
                         *([f"--auth-key-file={key}"] if key else []), *extra, WORKER, str(out), *worker_args],
                        env=env)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10 * SLACK) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


@pytest.fixture
def keyed(tmp_path):
    key = tmp_path / "auth.key"
    key.write_bytes(b"an-operator-test-key-0123456789\n")
    key.chmod(0o600)
    log = open(tmp_path / "musterd.log", "w")
    proc, port = start_musterd("--auth-key-file", str(key), "--metrics-listen", "127.0.0.1:0", stderr=log)
    metrics = int(proc.stdout.readline().rsplit(":", 1)[1])
    yield f"127.0.0.1:{port}", metrics, str(key)
    stop_musterd(proc)
    log.close()


def test_musterctl_and_metrics_follow_a_job_on_musterd(tmp_path, keyed):
    endpoint, metrics, key = keyed
    assert ctl(endpoint, "jobs", key=key).stdout.splitlines()[0].split() == \
        ["JOB", "STATE", "NODES", "MIN", "MAX", "ROUND", "RESTARTS", "AGE"]
    release = tmp_path / "release"
    job = [agent(endpoint, "opsjob", n, tmp_path, "--until-file", str(release), key=key) for n in (1, 2)]
    assert wait_for(lambda: len(list(tmp_path.glob("*.json"))) == 2, 60 * SLACK)

    listing = ctl(endpoint, "jobs", key=key)
    assert listing.returncode == 0, listing.stderr
    row = [line.split() for line in listing.stdout.splitlines() if line.startswith("opsjob ")]
    assert row and row[0][:7] == ["opsjob", "running", "2", "2", "2", "0", "0/0"]

    detail = ctl(endpoint, "--json", "job", "opsjob", key=key)
    assert detail.returncode == 0, detail.stderr
    d = json.loads(detail.stdout)
    assert d["job"]["state"] == "running" and d["total_members"] == 2
    assert [m["group_rank"] for m in d["members"]] == [0, 1]
    assert sorted(m["address"] for m in d["members"]) == ["127.0.0.1", "127.0.0.2"]
    assert all(m["local_world_size"] == 1 and m["connected"] and m["heard_ms_ago"] < 10000 * SLACK
               for m in d["members"])
    assert "last_failure" not in d
    table = ctl(endpoint, "job", "opsjob", key=key).stdout
    assert table.startswith("job 'opsjob': running, round 0, restarts 0/0, 2 node(s) joined")
    assert "no failure reported" in table

    # Without the key, musterctl is refused like any agent.
    refused = ctl(endpoint, "jobs")
    assert refused.returncode == 1 and "requires authentication" in refused.stderr
    assert "give this client (the agent, or musterctl) the rendezvous's key with --auth-key-file" in refused.stderr
    missing = ctl(endpoint, "job", "nope", key=key)
    assert missing.returncode == 1 and "no job 'nope' here" in missing.stderr

    m = scrape(metrics)
    assert m['musterd_jobs{state="running"}'] == 1
    assert m["musterd_nodes"] == 2
    assert m["musterd_rounds_total"] >= 1
    assert m['musterd_rejected_total{reason="auth"}'] >= 1
    assert m["musterd_connections"] >= 2

    release.touch()
    for rc, _, err in finish(job):
        assert rc == 0, err
    assert wait_for(lambda: scrape(metrics)['musterd_jobs{state="succeeded"}'] == 1, 30 * SLACK)
    done = ctl(endpoint, "jobs", key=key).stdout
    assert re.search(r"^opsjob\s+succeeded\s", done, re.M), done


def test_musterctl_shows_a_failed_job_s_root_cause(tmp_path, keyed):
    endpoint, metrics, key = keyed
    job = [agent(endpoint, "boom", n, tmp_path, "--fail-rank", "1", key=key) for n in (1, 2)]
    results = finish(job)
    assert all(rc == 1 for rc, _, _ in results), results
    d = json.loads(ctl(endpoint, "--json", "job", "boom", key=key).stdout)
    assert d["job"]["state"] == "failed"
    assert d["last_failure"]["global_rank"] == 1 and d["last_failure"]["exitcode"] == 3
    text = ctl(endpoint, "job", "boom", key=key).stdout
    assert "last failure: rank 1 (local rank 0" in text and "exit code 3" in text
    m = scrape(metrics)
    assert m["musterd_failures_total"] == 1 and m['musterd_jobs{state="failed"}'] == 1


def test_musterctl_asks_an_agent_hosted_rendezvous(tmp_path):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    release = tmp_path / "release"
    job = [agent(endpoint, "hosted", n, tmp_path, "--until-file", str(release)) for n in (1, 2)]
    assert wait_for(lambda: len(list(tmp_path.glob("*.json"))) == 2, 60 * SLACK)
    d = json.loads(ctl(endpoint, "--json", "jobs").stdout)
    assert [(j["id"], j["state"], j["nodes"]) for j in d["jobs"]] == [("hosted", "running", 2)]
    release.touch()
    for rc, _, err in finish(job):
        assert rc == 0, err


def test_one_node_of_c10d_at_a_given_endpoint_contacts_it(tmp_path, keyed):
    # As torchrun does: --nnodes=1 with c10d and an endpoint joins the rendezvous there,
    # so the job shows in musterd (not a private one-node group).
    endpoint, _, key = keyed
    release = tmp_path / "release"
    solo = start_muster(["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                         "--rdzv-id=solo", f"--rdzv-conf={FAST}", "--local-addr=127.0.0.1", f"--auth-key-file={key}",
                         WORKER, str(tmp_path), "--until-file", str(release)])
    assert wait_for(lambda: len(list(tmp_path.glob("*.json"))) == 1, 60 * SLACK)
    row = [line.split() for line in ctl(endpoint, "jobs", key=key).stdout.splitlines() if line.startswith("solo ")]
    assert row and row[0][:5] == ["solo", "running", "1", "1", "1"], row
    release.touch()
    for rc, _, err in finish([solo]):
        assert rc == 0, err
    assert wait_for(lambda: re.search(r"^solo\s+succeeded\s", ctl(endpoint, "jobs", key=key).stdout, re.M),
                    30 * SLACK)


def test_one_node_of_c10d_says_when_something_else_holds_the_endpoint(tmp_path):
    # A program that takes the connection and says nothing: the agent says so, and gives up.
    with socket.create_server(("127.0.0.1", 0)) as foreign:
        port = foreign.getsockname()[1]
        taken = []
        t = threading.Thread(target=lambda: taken.append(foreign.accept()), daemon=True)
        t.start()
        r = run_muster(["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lost",
                        "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=2,reconnect_timeout=3",
                        "--no-python", "/bin/true"], timeout=120 * SLACK)
    assert r.returncode == 1, r.stderr
    assert taken, "the agent never contacted the endpoint"
    assert "something other than a muster rendezvous seems to hold that port" in r.stderr, r.stderr[-3000:]
    assert "gave up after 3 s (--rdzv-conf reconnect_timeout)" in r.stderr, r.stderr[-3000:]


def test_musterctl_says_when_nothing_answers():
    r = ctl(f"127.0.0.1:{free_port()}", "--timeout", "1", "jobs")
    assert r.returncode == 1 and "cannot reach the rendezvous" in r.stderr
    usage = subprocess.run([MUSTERCTL], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "subcommand is required" in usage.stderr


def test_a_bad_scrape_is_refused_and_the_next_one_served(keyed):
    _, metrics, _ = keyed
    with socket.create_connection(("127.0.0.1", metrics), timeout=10) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", metrics), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert "musterd_nodes" in scrape(metrics).keys().__repr__()


def test_musterd_speaks_systemd_s_notify_protocol(tmp_path):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10 * SLACK)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="200000")
    key = tmp_path / "k"
    key.write_bytes(b"a-key-for-the-notify-test-000\n")
    key.chmod(0o600)
    proc = subprocess.Popen([os.environ["MUSTERD_BIN"], "--listen", "127.0.0.1:0", "--auth-key-file", str(key)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().rsplit(":", 1)[1])
        seen = []

        def until(pred):
            deadline = time.monotonic() + 10 * SLACK
            while time.monotonic() < deadline:
                msg = sock.recv(4096).decode()
                seen.append(msg)
                if pred(msg):
                    return msg
            raise AssertionError(f"not seen; got {seen}")

        until(lambda m: m == "READY=1")
        first = until(lambda m: m == "WATCHDOG=1") and time.monotonic()
        until(lambda m: m == "WATCHDOG=1")
        until(lambda m: m == "WATCHDOG=1")
        assert time.monotonic() - first < 2 * SLACK  # fed about every 100 ms
        a = RdzvConn(port)  # no key: refused, and counted in no job
        a.join("j", "n1")
        assert a.recv()["code"] == "auth_failed"
        assert "STATUS=0 jobs, 0 nodes, 0 connections" in seen
        proc.send_signal(signal.SIGHUP)
        assert until(lambda m: m.startswith("RELOADING=1")).split("\n")[1].startswith("MONOTONIC_USEC=")
        until(lambda m: m == "READY=1")
        proc.terminate()
        until(lambda m: m == "STOPPING=1")
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_every_binary_says_its_version():
    version = re.search(r"project\(muster VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    for name, binary in (("muster", os.environ["MUSTER_BIN"]), ("musterd", os.environ["MUSTERD_BIN"]),
                         ("musterctl", MUSTERCTL)):
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(rf"{name} {re.escape(version)} \(git [0-9a-f]+(-dirty)?\)\n", r.stdout) or \
            re.fullmatch(rf"{name} {re.escape(version)} \(git unknown\)\n", r.stdout), r.stdout


def test_a_reload_rotates_the_key_and_the_running_job_goes_on(tmp_path):
    key = tmp_path / "auth.key"
    old, new = b"the-key-before-rotation-000000", b"the-key-after-rotation-1111111"
    key.write_bytes(old + b"\n")
    key.chmod(0o600)
    old_copy = tmp_path / "old.key"
    old_copy.write_bytes(old)
    old_copy.chmod(0o600)
    log = tmp_path / "musterd.log"
    with open(log, "w") as err:
        proc, port = start_musterd("--auth-key-file", str(key), stderr=err)
    endpoint = f"127.0.0.1:{port}"
    try:
        release = tmp_path / "release"
        job = [agent(endpoint, "rot", n, tmp_path, "--until-file", str(release), key=str(old_copy)) for n in (1, 2)]
        assert wait_for(lambda: len(list(tmp_path.glob("*.json"))) == 2, 60 * SLACK)
        key.write_bytes(new + b"\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reloaded the auth key" in log.read_text(), 10 * SLACK)
        # Both keys are accepted until the next reload.
        assert ctl(endpoint, "jobs", key=str(key)).returncode == 0
        assert ctl(endpoint, "jobs", key=str(old_copy)).returncode == 0
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: log.read_text().count("reloaded the auth key") == 2, 10 * SLACK)
        stale = ctl(endpoint, "jobs", key=str(old_copy))
        assert stale.returncode == 1 and "does not hold this node's auth key" in stale.stderr
        release.touch()
        for rc, _, err in finish(job):
            assert rc == 0, err
        assert sorted(p.name for p in tmp_path.glob("*.json")) == ["n2_a0_r0.json", "n2_a0_r1.json"]
    finally:
        stop_musterd(proc)


def test_musterctl_pages_through_long_hostile_ids(tmp_path):
    proc, port = start_musterd()
    try:
        conns = []
        ids = [f"{i:04d}" + "\x01" * 1000 for i in range(400)]  # each id is 6 KB once escaped in JSON
        for job_id in ids:
            c = RdzvConn(port)
            c.join(job_id, "n1", min_nodes=2, max_nodes=2, join_timeout_ms=120000, keep_alive_interval_ms=60000)
            conns.append(c)
        conns[-1].send({"type": "heartbeat", "v": 1, "seq": 1})
        assert conns[-1].recv()["type"] == "heartbeat_ack"  # every join has been handled
        r = ctl(f"127.0.0.1:{port}", "--json", "jobs")
        assert r.returncode == 0, r.stderr
        assert [j["id"] for j in json.loads(r.stdout)["jobs"]] == sorted(ids)
        table = ctl(f"127.0.0.1:{port}", "jobs").stdout
        assert "\x01" not in table and "\\x01" in table  # escaped for the terminal
        for c in conns:
            c.close()
    finally:
        stop_musterd(proc)


def test_musterctl_pages_through_a_job_with_many_long_named_members(tmp_path):
    proc, port = start_musterd()
    try:
        conns = []
        names = [f"{i:04d}" + "\x01" * 1000 for i in range(400)]  # each 6 KB once escaped: several pages
        for name in reversed(names):
            c = RdzvConn(port)
            c.join("crowd", name, min_nodes=1000, max_nodes=1000, join_timeout_ms=120000,
                   keep_alive_interval_ms=60000)
            conns.append(c)
        conns[-1].send({"type": "heartbeat", "v": 1, "seq": 1})
        assert conns[-1].recv()["type"] == "heartbeat_ack"  # every join has been handled
        r = ctl(f"127.0.0.1:{port}", "--json", "job", "crowd")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["total_members"] == 400 and d["job"]["nodes"] == 400
        assert [m["node"] for m in d["members"]] == names  # in order (no ranks yet: by name), none twice
        for c in conns:
            c.close()
    finally:
        stop_musterd(proc)


def complete(command_line, function):
    """What bash completion offers for the last word of command_line."""
    words = command_line.split(" ")
    script = (f"source {ROOT / 'packaging/completion/muster.bash'}\n"
              f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              f"{function}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completion_offers_each_binary_s_own_options(tmp_path):
    muster, musterd = os.environ["MUSTER_BIN"], os.environ["MUSTERD_BIN"]
    assert complete(f"{muster} --nproc", "_muster") == ["--nproc-per-node", "--nproc_per_node"]
    assert "--auth-key-file" in complete(f"{muster} --a", "_muster")
    assert complete(f"{muster} --nproc-per-node ", "_muster") == ["auto", "cpu", "gpu"]
    assert complete(f"{muster} --rdzv-backend ", "_muster") == ["static", "c10d"]
    assert complete(f"{muster} --numa-binding ", "_muster") == ["node", "socket", "exclusive", "core-complex"]
    assert complete(f"{muster} --numa_binding c", "_muster") == ["core-complex"]
    # After the script, its own arguments: files, not muster's options.
    assert complete(f"{muster} --nnodes 2 train.py --n", "_muster") == []
    assert complete(f"{musterd} --metrics", "_musterd") == ["--metrics-listen"]
    # Every option that takes a value (read from --help) has its value skipped: what follows
    # it is still muster's command line, not the script's.
    usage = subprocess.run([muster, "--help"], capture_output=True, text=True, timeout=30).stdout
    valued = set(re.findall(r"\[(-[-\w]+) [A-Z_{][^\]]*\]", usage))
    assert {"--nnodes", "--auth-key-file", "--metrics-listen", "-r", "-t"} <= valued, valued
    for option in sorted(valued):
        assert complete(f"{muster} {option} some.value --nproc", "_muster") == \
            ["--nproc-per-node", "--nproc_per_node"], option
    assert complete(f"{MUSTERCTL} j", "_musterctl") == ["jobs", "job"]
    assert "--json" in complete(f"{MUSTERCTL} jobs --", "_musterctl")


def test_man_pages_document_every_option_and_render_cleanly():
    man_dir = Path(os.environ["MUSTER_BUILD_DIR"]) / "man"
    for binary, page in ((os.environ["MUSTER_BIN"], "muster.1"), (os.environ["MUSTERD_BIN"], "musterd.8"),
                         (MUSTERCTL, "musterctl.1")):
        text = (man_dir / page).read_text()
        help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
        options = set(re.findall(r"--[a-z][a-z0-9_-]*", help_text))
        assert options, help_text
        for option in options:
            assert option.replace("-", "\\-") in text, f"{page} does not document {option}"
        r = subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", str(man_dir / page)], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8"))
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "NAME" in r.stdout and "OPTIONS" in r.stdout


def test_the_systemd_units_verify_and_musterd_s_is_hardened(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    units = ROOT / "packaging" / "systemd"
    # The units as installed, pointing at the built binaries instead of /usr/bin.
    daemon = (units / "musterd.service").read_text().replace("/usr/bin/musterd", os.environ["MUSTERD_BIN"])
    agent_unit = (units / "muster@.service").read_text().replace("/usr/bin/muster ", os.environ["MUSTER_BIN"] + " ")
    (tmp_path / "musterd.service").write_text(daemon)
    (tmp_path / "muster@job.service").write_text(agent_unit)
    r = subprocess.run([analyze, "verify", str(tmp_path / "musterd.service"), str(tmp_path / "muster@job.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    assert "KillMode=mixed" in agent_unit and "EnvironmentFile=/etc/muster/%i.conf" in agent_unit
    for needed in ("WatchdogSec=", "LimitNOFILE=", "EnvironmentFile=-/etc/default/musterd", "ExecReload=",
                   "$MUSTERD_ARGS"):
        assert needed in daemon, needed
    # Installed, the units name the binaries under that install's prefix.
    cmake = shutil.which("cmake", path="/usr/bin") or shutil.which("cmake")
    prefix = tmp_path / "prefix"
    subprocess.run([cmake, "--install", os.environ["MUSTER_BUILD_DIR"], "--prefix", str(prefix), "--component",
                    "runtime"], check=True, capture_output=True, timeout=120)
    installed = prefix / "lib/systemd/system"
    assert f"ExecStart={prefix}/bin/musterd $MUSTERD_ARGS" in (installed / "musterd.service").read_text()
    assert f"ExecStart={prefix}/bin/muster $MUSTER_ARGS" in (installed / "muster@.service").read_text()
    assert f"file://{prefix}/share/doc/muster/operations.md" in (installed / "musterd.service").read_text()
    # Every page of docs/ is installed: --help and the man pages point at them.
    pages = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
    assert {"hangs.md", "numa.md", "python.md", "slurm.md", "kubernetes.md", "scale.md"} <= set(pages)
    assert sorted(p.name for p in (prefix / "share/doc/muster").glob("*.md")) == sorted(pages + ["README.md"])
    s = subprocess.run([analyze, "security", "--offline=yes", str(units / "musterd.service")],
                       capture_output=True, text=True, timeout=60)
    score = float(re.search(r"Overall exposure level for musterd.service: ([0-9.]+)", s.stdout + s.stderr).group(1))
    assert score <= 2.0, s.stdout


def metrics_port(proc):
    """The port an agent started with --metrics-listen=127.0.0.1:0 and LOGLEVEL=INFO says it serves on."""
    m, seen = read_stderr_until(proc, rb"metrics on http://127\.0\.0\.1:(\d+)/metrics", 30 * SLACK)
    assert m, f"no metrics line; stderr so far: {seen.decode(errors='replace')}"
    return int(m.group(1))


def test_the_agent_serves_its_metrics_through_a_restart(tmp_path):
    release = tmp_path / "release"
    proc = start_muster(["--nproc-per-node=2", "--max-restarts=1", "--metrics-listen=127.0.0.1:0", WORKER,
                         str(tmp_path), "--fail-rank", "1", "--until-file", str(release)], env=base_env(LOGLEVEL="INFO"))
    try:
        port = metrics_port(proc)
        # Attempt 0: rank 1 exits 3, rank 0 is stopped with SIGTERM; attempt 1 waits for the release.
        assert wait_for(lambda: len(list(tmp_path.glob("n1_a1_r*.json"))) == 2, 60 * SLACK)
        m = scrape(port)
        assert m['muster_agent_phase{phase="running"}'] == 1 and m['muster_agent_phase{phase="stopping"}'] == 0
        assert m["muster_local_world_size"] == 2 and m["muster_workers_running"] == 2
        assert m["muster_restart_count"] == 1 and m["muster_max_restarts"] == 1
        assert m["muster_worker_group_starts_total"] == 2 and m["muster_worker_failures_total"] == 1
        assert m['muster_worker_last_exit_code{local_rank="1"}'] == 3
        assert m['muster_worker_last_exit_code{local_rank="0"}'] == -signal.SIGTERM
        assert not any(k.startswith("muster_rendezvous") for k in m)  # one node: no rendezvous
        assert any(k.startswith("muster_build_info{") for k in m)
        release.touch()
        out, err = proc.communicate(timeout=60 * SLACK)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_multi_node_agent_s_metrics_show_its_assignment(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    release = tmp_path / "release"
    job = [agent(endpoint, "metered", n, tmp_path, "--until-file", str(release),
                 extra=["--metrics-listen=127.0.0.1:0"], env=base_env(LOGLEVEL="INFO")) for n in (1, 2)]
    try:
        ports = [metrics_port(p) for p in job]
        assert wait_for(lambda: len(list(tmp_path.glob("*.json"))) == 2, 60 * SLACK)
        seen = [scrape(p) for p in ports]
        assert sorted(m["muster_group_rank"] for m in seen) == [0, 1]
        for m in seen:
            assert m["muster_rendezvous_connected"] == 1 and m["muster_rendezvous_round"] == 0
            assert m["muster_group_world_size"] == 2 and m["muster_world_size"] == 2
            assert m["muster_workers_running"] == 1
        release.touch()
        for rc, _, err in finish(job):
            assert rc == 0, err
    finally:
        for p in job:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_a_bad_metrics_listen_is_refused_before_any_worker_starts(tmp_path):
    r = run_muster(["--metrics-listen=127.0.0.1:http", "--nproc-per-node=1", WORKER, str(tmp_path)], timeout=60)
    assert r.returncode == 1 and "--metrics-listen" in r.stderr, r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        r = run_muster([f"--metrics-listen=127.0.0.1:{busy}", "--nproc-per-node=1", WORKER, str(tmp_path)], timeout=60)
    assert r.returncode == 1 and "--metrics-listen" in r.stderr and str(busy) in r.stderr, r.stderr
    assert not list(tmp_path.glob("*.json"))  # no worker ran


def scrapes_served(conns):
    """How many of these connections a GET /metrics is answered on (refused ones are closed)."""
    served = 0
    for s in conns:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5 * SLACK)
        try:
            served += s.recv(20).startswith(b"HTTP/1.1 200")
        except (ConnectionError, socket.timeout):
            pass
    return served


def test_one_address_cannot_hold_every_metrics_slot(keyed):
    _, metrics, _ = keyed
    held = [socket.create_connection(("127.0.0.1", metrics), timeout=10) for _ in range(20)]
    try:
        assert scrapes_served(held) == 8  # kMaxConnectionsPerPeer; the rest closed at once
        # Another address is still served while these are held.
        with socket.create_connection(("127.0.0.1", metrics), timeout=10, source_address=("127.0.0.2", 0)) as other:
            assert scrapes_served([other]) == 1
    finally:
        for s in held:
            s.close()

    # Closed connections give their slots back: 8 at once from this address again.
    def eight_served():
        again = [socket.create_connection(("127.0.0.1", metrics), timeout=10) for _ in range(8)]
        try:
            return scrapes_served(again) == 8
        finally:
            for s in again:
                s.close()
    assert wait_for(eight_served, 20 * SLACK, interval=0.2)


def test_the_build_trees_cmake_package_finds_libmuster(tmp_path):
    # find_package(muster) with muster_DIR in the build tree, uninstalled: its
    # musterConfig.cmake has the targets file beside it.
    cmake = shutil.which("cmake", path="/usr/bin") or shutil.which("cmake")
    build_dir = Path(os.environ["MUSTER_BUILD_DIR"])
    r = subprocess.run([cmake, "-S", str(Path(__file__).resolve().parents[2] / "examples" / "ddp_linear"), "-B",
                        str(tmp_path / "consumer"), f"-Dmuster_DIR={build_dir / 'worker_runtime'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    cache = (tmp_path / "consumer" / "CMakeCache.txt").read_text()
    assert f"muster_DIR:UNINITIALIZED={build_dir / 'worker_runtime'}" in cache
    assert "Could not find" not in r.stderr


def test_the_layers_without_asio_are_checked_by_the_build(tmp_path):
    # core, numa and cli built (this suite runs after the build), so none of
    # their objects pulled in Boost.Asio; and the check does catch one that does.
    cmake = shutil.which("cmake", path="/usr/bin") or shutil.which("cmake")
    script = Path(__file__).resolve().parents[2] / "cmake" / "check_includes.cmake"
    build_dir = Path(os.environ["MUSTER_BUILD_DIR"])

    def check(objects, output):
        return subprocess.run([cmake, f"-DOBJECTS_DIR={objects}", "-DFORBIDDEN=boost/asio", "-DTARGET=layer",
                               f"-DOUTPUT={output}", "-DWHY=is Asio", "-P", str(script)],
                              capture_output=True, text=True, timeout=60)

    for layer in ("core", "numa", "cli"):
        objects = build_dir / "launcher" / "CMakeFiles" / f"muster_launcher_{layer}.dir"
        assert list(objects.rglob("*.d")), objects
        r = check(objects, tmp_path / "none")
        assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.dir"
    bad.mkdir()
    (bad / "x.cpp.o.d").write_text("x.cpp.o: x.cpp /usr/include/string \\\n /usr/include/boost/asio/post.hpp\n")
    output = tmp_path / "libx.a"
    output.write_text("archive")
    r = check(bad, output)
    assert r.returncode != 0
    assert "layer: x includes /usr/include/boost/asio/post.hpp, which is Asio" in " ".join(r.stderr.split())
    assert not output.exists()  # removed, so the next build checks again
