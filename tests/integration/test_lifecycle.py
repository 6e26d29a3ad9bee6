"""Exit codes, restarts and the failure report, on the real binary."""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from muster_testing import DATA, SANITIZED, SLACK, base_env, run_muster, start_muster, wait_for

FAIL = str(DATA / "fail_worker.py")
HEAP_TRAP = os.environ.get("MUSTER_HEAP_TRAP", "")
HEAP_TRAP_PROBE = os.environ.get("MUSTER_HEAP_TRAP_PROBE", "")


def heap_trap_env(**extra):
    assert Path(HEAP_TRAP).is_file(), f"MUSTER_HEAP_TRAP={HEAP_TRAP!r} names no built heap_trap"
    env = base_env(LD_PRELOAD=HEAP_TRAP, **extra)
    if SANITIZED:
        # The trap is loaded before the sanitizer's runtime, which it hooks.
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
    return env


def test_heap_trap_ends_a_forked_child_that_allocates():
    """The check on the next test's tool: without it loaded, the child that
    allocates after fork exits 0; with it, with the trap's 86."""
    plain = subprocess.run([HEAP_TRAP_PROBE], env=base_env(), capture_output=True, text=True, timeout=60)
    assert (plain.returncode, plain.stdout.strip()) == (0, "0"), plain.stderr
    trapped = subprocess.run([HEAP_TRAP_PROBE], env=heap_trap_env(), capture_output=True, text=True, timeout=60)
    assert (trapped.returncode, trapped.stdout.strip()) == (0, "86"), trapped.stderr
    assert "heap_trap: " in trapped.stderr and "in a forked child before exec" in trapped.stderr


def test_the_shim_touches_no_heap_between_fork_and_exec(tmp_path):
    """The shim is a fork of the multi-threaded agent: a lock that another
    thread held at the fork (the heap's) stays held in it for ever, so code
    there that allocates can hang the run. With heap_trap preloaded, any such
    call ends the shim (or the worker before its exec) with code 86. Four
    workers fail once and are restarted, each leaving a process behind that
    its shim must find and kill: every path of the shim runs."""
    r = run_muster(["--nproc-per-node=4", "--max-restarts=1", str(DATA / "orphan_maker.py"), str(tmp_path),
                    "fail-first"], env=heap_trap_env())
    assert "heap_trap" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    records = read_orphans(tmp_path)
    # Every worker of the second attempt wrote its record; of the first, at
    # least the one whose exit stopped the group (the others may have been
    # stopped before they wrote).
    assert {f"orphan_{rank}_1" for rank in range(4)} <= records.keys(), records
    assert any(name.endswith("_0") for name in records), records
    for name, rec in records.items():
        assert rec["trap_in_shim"], f"{name}: heap_trap is not loaded in the shim"
        # The worker's shim killed and reaped the process the worker left behind.
        assert not Path(f"/proc/{rec['orphan']}").exists(), f"{name}: {rec} outlived its worker"


def read_orphans(directory):
    return {p.name: json.loads(p.read_text()) for p in directory.glob("orphan_*")}


def test_shims_whose_agent_is_killed_touch_no_heap(tmp_path):
    """The other way a shim ends: its agent dies (SIGKILL), the shim sees the
    control socket close, kills its worker and what the worker left behind,
    and exits. A shim that touched the heap would end at the trap and leave
    those processes running."""
    agent = start_muster(["--nproc-per-node=2", str(DATA / "orphan_maker.py"), str(tmp_path), "hold"],
                         env=heap_trap_env())
    try:
        assert wait_for(lambda: len(read_orphans(tmp_path)) == 2, 30 * SLACK), agent.stderr
        agent.kill()
        agent.communicate(timeout=30 * SLACK)
        records = read_orphans(tmp_path)
        assert all(rec["trap_in_shim"] for rec in records.values()), records
        pids = [rec[k] for rec in records.values() for k in ("worker", "orphan")]
        assert wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 30 * SLACK), records
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate(timeout=30 * SLACK)
        for rec in read_orphans(tmp_path).values():  # what a failed run left
            for pid in (rec["worker"], rec["orphan"]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_success_exits_0():
    r = run_muster(["--nproc-per-node=3", "--no-python", "/bin/true"])
    assert r.returncode == 0, r.stderr
    assert "FAILED" not in r.stderr


def test_failure_without_error_file_reports_exit_code_and_hint():
    r = run_muster(["--nproc-per-node=2", FAIL, "exit3", "1"])
    assert r.returncode == 1
    err = r.stderr
    assert "ChildFailedError: \n====" in err
    root = err.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert re.search(r"exitcode  : 3 \(pid: \d+\)", root)
    assert "error_file: <N/A>" in root
    assert "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html" in root
    assert f"{FAIL} FAILED" in err
    # The peer the agent stopped is listed apart from the root cause, with its signal.
    others = err.split("Failures:")[1].split("Root Cause")[0]
    assert "rank      : 0 (local_rank: 0)" in others
    assert "exitcode  : -15" in others
    assert "Signal 15 (SIGTERM) received by PID" in others
    # torchrun names its interpreter by full path (sys.executable): python3 as found on PATH.
    assert re.search(r"failed \(exitcode: 3\) local_rank: 1 \(pid: \d+\) of binary: /\S+/python3\n", err)
    assert re.search(r"Sending process \d+ closing signal SIGTERM", err)


def test_failure_with_error_file_reports_the_traceback(tmp_path):
    parent_error = tmp_path / "agent_error.json"
    r = run_muster(["--nproc-per-node=2", f"--log-dir={tmp_path / 'logs'}", FAIL, "errorfile", "1"],
                   env=base_env(TORCHELASTIC_ERROR_FILE=parent_error))
    assert r.returncode == 1
    root = r.stderr.split("Root Cause (first observed failure):")[1]
    assert "traceback : Traceback (most recent call last):\n    File \"w.py\", line 1\n  ValueError: boom on rank1\n  \n" in root
    m = re.search(r"error_file: (\S+)", root)
    assert m and m.group(1).endswith("/attempt_0/1/error.json") and Path(m.group(1)).is_file()
    # The launcher's own error file gets the root cause, with its exit code.
    data = json.loads(parent_error.read_text())
    assert data["message"]["message"] == "ValueError: boom on rank1"
    assert data["message"]["errorCode"] == 1


def test_string_error_file_is_reported_as_is():
    r = run_muster([FAIL, "strerrorfile", "0"])
    assert r.returncode == 1
    assert "traceback : the C++ worker gave up" in r.stderr


def test_signal_death_is_reported_with_the_signal_name():
    r = run_muster([FAIL, "segv", "0"])
    assert r.returncode == 1
    assert re.search(r"exitcode  : -11 \(pid: (\d+)\)", r.stderr)
    pid = re.search(r"exitcode  : -11 \(pid: (\d+)\)", r.stderr).group(1)
    assert f"traceback : Signal 11 (SIGSEGV) received by PID {pid}" in r.stderr


def test_restarts_until_success(tmp_path):
    logs = tmp_path / "logs"
    r = run_muster(["--nproc-per-node=2", "--max-restarts=2", f"--log-dir={logs}", "--rdzv-backend=c10d", "--rdzv-id=rs", "-t", "1", FAIL,
                    "succeed_on_restart=2"])
    assert r.returncode == 0, r.stderr
    for attempt in range(3):
        for rank in range(2):
            assert f"[default{rank}]:attempt {attempt} rank {rank}" in r.stdout
    run_dirs = list(logs.glob("rs_*"))
    assert len(run_dirs) == 1
    assert sorted(p.name for p in run_dirs[0].iterdir()) == ["attempt_0", "attempt_1", "attempt_2"]
    assert "Worker group FAILED. 2/2 attempts left; will restart worker group" in r.stderr
    assert "Worker group FAILED. 1/2 attempts left; will restart worker group" in r.stderr


def test_restarts_exhausted_exits_1_reporting_the_last_attempt():
    r = run_muster(["--nproc-per-node=1", "--max-restarts=1", "-t", "1", FAIL, "succeed_on_restart=5"])
    assert r.returncode == 1
    assert "attempt 0 rank 0" in r.stdout and "attempt 1 rank 0" in r.stdout
    assert "attempt 2" not in r.stdout
    assert "exitcode  : 1" in r.stderr


def test_a_missing_program_is_a_clear_error():
    r = run_muster(["--no-python", "no-such-program-anywhere"])
    assert r.returncode == 1
    assert "cannot find 'no-such-program-anywhere' on PATH" in r.stderr


@pytest.mark.parametrize("trapped", [False, True], ids=["plain", "under_heap_trap"])
def test_a_non_executable_program_fails_like_a_worker(tmp_path, trapped):
    # Under heap_trap: the forked worker's message about the failed exec is
    # put together without the heap.
    script = tmp_path / "not_exec.sh"
    script.write_text("echo hi\n")
    r = run_muster(["--no-python", str(script)], env=heap_trap_env() if trapped else None)
    assert r.returncode == 1
    assert f"muster: cannot execute '{script}': Permission denied" in r.stderr
    assert "exitcode  : 126" in r.stderr
    assert "heap_trap" not in r.stderr
