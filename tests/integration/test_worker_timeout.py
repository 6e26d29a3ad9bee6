"""--worker-timeout: a worker with no progress for the timeout is taken for
hung, named with how long it was silent, killed, and the group fails as on a
crash (restarting while restarts remain). Output on stdout or stderr and
requests on the store the agent hosts are progress; the streams still reach
the console unchanged."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from muster_testing import (DATA, MUSTER, SLACK, base_env, read_stderr_until, run_muster, start_musterd, stop_musterd,
                            wait_for)

WORKER = str(DATA / "hang_worker.py")
# Where progress must keep workers alive: a timeout well above a loaded machine's Python start-up
# (which counts as silence), and workers that go on for three times as long.
PATIENT = 2.5 * SLACK
# Where a worker is to be caught: short, but longer than a loaded machine takes to start the
# workers that are not meant to hang (they exit as soon as Python is up).
QUICK = 1.5 * SLACK


def test_a_silent_worker_is_killed_and_the_group_restarts(tmp_path):
    r = run_muster(["--nproc-per-node=2", "--max-restarts=1", f"--worker-timeout={QUICK}", WORKER, str(tmp_path),
                    "hang"], timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"worker watchdog: rank 1 \(local_rank 1, pid (\d+)\) silent for ([\d.]+) s: no output on stdout "
                  r"or stderr, no store request and no file-timer request within --worker-timeout [\d.]+ s; taking it for "
                  r"hung: sending SIGKILL", r.stderr)
    assert m, r.stderr[-3000:]
    assert int(m.group(1)) == int((tmp_path / "pid_1_0").read_text())
    assert float(m.group(2)) >= QUICK - 0.05  # said to a tenth of a second
    assert "rank 0 (" not in r.stderr.split("worker watchdog:")[1].split("\n")[0]  # rank 0 had exited: not watched
    assert (tmp_path / "pid_0_1").exists() and (tmp_path / "pid_1_1").exists()  # the second attempt ran
    assert r.stdout.count("rank 1 started") == 1


def test_with_no_restarts_left_the_report_says_it_hung(tmp_path):
    r = run_muster(["--nproc-per-node=2", f"--worker-timeout={QUICK}", WORKER, str(tmp_path), "hang"],
                   timeout=120 * SLACK)
    assert r.returncode == 1
    root = r.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : -9" in root, root
    assert re.search(r"traceback : hung: no progress for [\d.]+ s \(--worker-timeout [\d.]+ s\), killed by muster", root), root


def test_the_stacks_of_every_worker_are_taken_before_the_kill(tmp_path):
    # py-spy (installed by scripts/install-deps.sh in the project's environment, beside the
    # workers' Python) dumps every local worker: the hung one and the one that waits for it.
    logs = tmp_path / "logs"
    r = run_muster(["--nproc-per-node=2", f"--worker-timeout={QUICK}", f"--log-dir={logs}", WORKER, str(tmp_path),
                    "deep"], timeout=120 * SLACK)
    assert r.returncode == 1, r.stderr[-3000:]
    hang = r.stderr.index("taking it for hung: sending SIGKILL")
    stacks = r.stderr.index("Python stacks of rank 1 (local_rank 1, pid ")
    kill = r.stderr.index("Root Cause (first observed failure):")
    assert hang < stacks < kill, r.stderr[-3000:]
    assert "muster_test_hung_here (hang_worker.py:" in r.stderr, r.stderr[-3000:]
    assert "muster_test_peer_waits (hang_worker.py:" in r.stderr, r.stderr[-3000:]
    files = sorted(logs.glob("*/attempt_0/*/stacks.txt"))
    assert [f.parent.name for f in files] == ["0", "1"], files
    assert "muster_test_hung_here" in files[1].read_text()
    # Where they are, after torch's report.
    assert re.search(r"muster: the Python stacks of every worker when one was taken for hung are in the log above "
                     r"and in \S+/attempt_0/<local_rank>/stacks.txt", r.stderr), r.stderr[-1000:]
    # The kill came after the dump: the hung worker died of SIGKILL, as without stacks.
    root = r.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "exitcode  : -9" in root, root


def test_without_py_spy_the_kill_goes_ahead_and_says_how_to_get_stacks(tmp_path):
    r = run_muster(["--nproc-per-node=2", f"--worker-timeout={QUICK}", WORKER, str(tmp_path), "hang"],
                   env=base_env(MUSTER_PY_SPY=""), timeout=120 * SLACK)
    assert r.returncode == 1
    assert r.stderr.count("install it (pip install py-spy)") == 1, r.stderr[-3000:]
    assert "Python stacks of rank" not in r.stderr
    assert "exitcode  : -9" in r.stderr.split("Root Cause (first observed failure):")[1]


def test_output_is_progress(tmp_path):
    r = run_muster(["--nproc-per-node=2", f"--worker-timeout={PATIENT}", WORKER, str(tmp_path), "chatty",
                    str(3 * PATIENT)],
                   timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "worker watchdog" not in r.stderr
    assert r.stdout.count("rank 0 working") >= 10 and r.stdout.count("rank 1 working") >= 10


@pytest.mark.parametrize("mode", ["store", "timer"])
def test_requests_are_progress(tmp_path, mode):
    # Silent on both streams for three times the timeout: only the requests (on the agent's
    # store, or on the file-timer pipe) keep the workers alive.
    env = base_env()
    if mode == "timer":
        env = base_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=str(tmp_path / "timer.pipe"))
    r = run_muster(["--nproc-per-node=2", f"--worker-timeout={PATIENT}", WORKER, str(tmp_path), mode,
                    str(3 * PATIENT)], env=env, timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "worker watchdog" not in r.stderr
    assert r.stdout == ""


def test_a_worker_held_back_by_a_console_nobody_reads_is_not_silent(tmp_path):
    # 8 MiB of output into a pipe the test leaves unread for three times the timeout: the
    # worker blocks on its writes, which is muster holding it back, not a hang.
    p = subprocess.Popen([MUSTER, f"--worker-timeout={PATIENT}", WORKER, str(tmp_path), "flood", "8"], env=base_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(3 * PATIENT)
    out, err = p.communicate(timeout=120 * SLACK)
    assert p.returncode == 0, err.decode()[-3000:]
    assert b"worker watchdog" not in err
    assert len(out) == 8 * 1024 * 1024


def test_an_agent_held_up_does_not_charge_its_own_pause_to_the_workers(tmp_path):
    # The agent is stopped for twice the timeout while its workers go on printing; when it
    # resumes, their output has not been read yet: that is no silence of theirs.
    p = subprocess.Popen([MUSTER, "--nproc-per-node=2", f"--worker-timeout={PATIENT}", WORKER, str(tmp_path), "chatty",
                          str(5 * PATIENT)], env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: (tmp_path / "pid_0_0").exists() and (tmp_path / "pid_1_0").exists(), 60 * SLACK)
    p.send_signal(signal.SIGSTOP)
    time.sleep(2 * PATIENT)
    p.send_signal(signal.SIGCONT)
    out, err = p.communicate(timeout=120 * SLACK)
    assert p.returncode == 0, err[-3000:]
    assert "worker watchdog" not in err


def test_the_streams_reach_the_console_unchanged(tmp_path):
    r = run_muster(["--worker-timeout=30", WORKER, str(tmp_path), "partial"], timeout=60 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "a\nb\nc"


def test_the_environment_variable_and_bad_values(tmp_path):
    r = run_muster(["--nproc-per-node=2", WORKER, str(tmp_path), "hang"],
                   env=base_env(MUSTER_WORKER_TIMEOUT=str(QUICK)), timeout=60 * SLACK)
    assert r.returncode == 1 and "; taking it for hung" in r.stderr, r.stderr[-3000:]
    for value, source in (("-1", "--worker-timeout"), ("soon", "--worker-timeout"), ("0.01", "--worker-timeout")):
        r = run_muster([f"--worker-timeout={value}", WORKER, str(tmp_path), "chatty", "0"], timeout=60 * SLACK)
        assert r.returncode == 1, r.stderr
        assert f"{source}='{value}': give the seconds a worker may go without progress" in r.stderr
    r = run_muster([WORKER, str(tmp_path), "chatty", "0"], env=base_env(MUSTER_WORKER_TIMEOUT="x"), timeout=60 * SLACK)
    assert r.returncode == 1 and "MUSTER_WORKER_TIMEOUT='x'" in r.stderr


def two_node_job(endpoint, job, out, watchdog_on_last, first_env=None):
    """Two agents through musterd, one worker each, hang_worker's deep-last mode: the last
    node's worker hangs in muster_test_hung_here, the first node's waits in
    muster_test_peer_waits (printing, so never silent). first_env: more for the first agent."""
    agents = []
    for node in (1, 2):
        extra = [f"--worker-timeout={QUICK}"] if watchdog_on_last and node == 2 else []
        env = base_env(**(first_env or {})) if node == 1 else base_env()
        agents.append(subprocess.Popen(
            [MUSTER, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
             f"--rdzv-id={job}", "--rdzv-conf=last_call_timeout=1,join_timeout=120", f"--local-addr=127.0.0.{node}",
             *extra, WORKER, str(out), "deep-last"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return agents


def py_spy_after_the_kill(out):
    """A py-spy for the first node that starts its dump only once the last node's hung worker
    is gone (pid_1_0) and a second more: by then the job's stop (the hung rank's failure, no
    restarts left) has reached the first node, while its dump is under way."""
    real = shutil.which("py-spy", path=base_env()["PATH"]) or str(Path(sys.executable).with_name("py-spy"))
    script = out / "slow-py-spy"
    script.write_text(f"""#!/bin/sh
hung=$(cat '{out}/pid_1_0')
i=0
while kill -0 "$hung" 2>/dev/null && [ $i -lt 40 ]; do sleep 0.1; i=$((i + 1)); done
sleep 1
exec '{real}' "$@"
""")
    script.chmod(0o755)
    return str(script)


def test_a_hung_rank_has_every_node_take_its_workers_stacks(tmp_path):
    musterd, port = start_musterd()
    agents = two_node_job(f"127.0.0.1:{port}", "hungjob", tmp_path, watchdog_on_last=True,
                          first_env={"MUSTER_PY_SPY": py_spy_after_the_kill(tmp_path)})
    try:
        # The first node has no watchdog of its own: the rendezvous asks it for its stacks when
        # the last node takes its rank for hung, while its worker still waits for the hung one.
        # The job's stop reaches it while that dump is under way: the stop waits for the dump.
        said, seen = read_stderr_until(agents[0], rb"muster_test_peer_waits \(hang_worker\.py:", 120 * SLACK)
        text = seen.decode(errors="replace")
        assert said, text[-4000:]
        assert re.search(r"the rendezvous asks for the workers' Python stacks: rank 1 on node 127\.0\.0\.2_\w+ was "
                         r"taken for hung", text), text[-4000:]
        assert re.search(r"Python stacks \(rank 1 on node 127\.0\.0\.2_\w+ was taken for hung\) of rank 0 "
                         r"\(local_rank 0, pid \d+\)", text), text[-4000:]
        _, err_last = agents[1].communicate(timeout=120 * SLACK)
        assert "muster_test_hung_here (hang_worker.py:" in err_last.decode(errors="replace")
        _, rest = agents[0].communicate(timeout=120 * SLACK)
        assert agents[0].returncode == 1
        # The waiting worker was stopped after its stack was taken, not before.
        whole = text + rest.decode(errors="replace")
        assert re.search(r"Sending process \d+ closing signal SIGTERM", whole[whole.index("muster_test_peer_waits"):]), \
            whole[-4000:]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        stop_musterd(musterd)


def test_musterctl_stacks_has_every_agent_log_its_workers_stacks(tmp_path):
    musterctl = os.environ.get("MUSTERCTL_BIN") or str(Path(os.environ["MUSTERD_BIN"]).with_name("musterctl"))
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    agents = two_node_job(endpoint, "stuckjob", tmp_path, watchdog_on_last=False)
    try:
        assert wait_for(lambda: (tmp_path / "pid_0_0").exists() and (tmp_path / "pid_1_0").exists(), 120 * SLACK)
        r = subprocess.run([musterctl, "--endpoint", endpoint, "stacks", "stuckjob"], capture_output=True, text=True,
                           timeout=60 * SLACK)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "asked 2 agent(s) of job 'stuckjob' to write their workers' Python stacks to their logs\n"
        for agent, where in ((agents[0], rb"muster_test_peer_waits \(hang_worker\.py:"),
                             (agents[1], rb"muster_test_hung_here \(hang_worker\.py:")):
            said, seen = read_stderr_until(agent, where, 60 * SLACK)
            assert said, seen.decode(errors="replace")[-4000:]
            assert b"Python stacks (asked by musterctl) of rank " in seen
        # A job that is not there is named.
        missing = subprocess.run([musterctl, "--endpoint", endpoint, "stacks", "nosuchjob"], capture_output=True,
                                 text=True, timeout=60 * SLACK)
        assert missing.returncode == 1 and "no open job 'nosuchjob' here" in missing.stderr, missing.stderr
    finally:
        for a in agents:
            a.send_signal(signal.SIGTERM)
        for a in agents:
            try:
                a.communicate(timeout=60 * SLACK)
            except subprocess.TimeoutExpired:
                a.kill()
                a.communicate()
        stop_musterd(musterd)
