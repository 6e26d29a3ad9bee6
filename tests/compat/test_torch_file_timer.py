"""torchrun's file-based worker watchdog under muster, driven by torch 2.13's
own FileTimerClient and expires(): an expired worker is killed and the group
restarted (torchrun, run side by side, kills the worker and then itself), a
released timer kills nobody, and what arrives on the pipe from elsewhere
(garbage, a timer naming a process that is not a worker) harms nothing."""
import json
import os
import stat
import subprocess
import time
from pathlib import Path

from muster_testing import DATA, SLACK, base_env, read_stderr_until, run_muster, start_muster, torchrun_path

WORKER = str(DATA / "file_timer_worker.py")


def records(out):
    return sorted(p.name for p in Path(out).glob("a*_r*.json"))


def test_an_expired_worker_is_killed_and_the_group_restarts(tmp_path):
    results = {}
    for launcher in ("muster", "torchrun"):
        out = tmp_path / launcher
        out.mkdir()
        env = base_env(TORCHELASTIC_ENABLE_FILE_TIMER="1")
        args = ["--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.1", WORKER, str(out), "hang"]
        if launcher == "muster":
            r = run_muster(args, env=env, timeout=120 * SLACK)
        else:
            exe = torchrun_path()
            assert exe, "torch 2.x's torchrun is not next to the test's Python (scripts/install-deps.sh makes .venv)"
            r = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=120 * SLACK)
        results[launcher] = (r.returncode, records(out))
        if launcher == "muster":
            assert "stuck_collective" in r.stderr and "expired; sending SIGKILL" in r.stderr, r.stderr[-3000:]
            # Rank 1 died by the watchdog's SIGKILL: the failure that restarted the group.
            assert "exitcode: -9" in r.stderr, r.stderr[-3000:]
            # The pipe was a fresh one in the temporary folder, and it is gone.
            given = json.loads((out / "a0_r0.json").read_text())["timer_file"]
            assert os.path.basename(given).startswith("watchdog_timer_") and not os.path.exists(given)
    assert results["muster"] == (0, ["a0_r0.json", "a0_r1.json", "a1_r0.json", "a1_r1.json"])
    # torch 2.13's FileTimerServer kills the expired worker the same way, then sends the same
    # signal to its own process: torchrun dies by SIGKILL and nothing restarts. muster treats
    # the killed worker as a failed one instead (docs/architecture.md, "Hung workers").
    assert results["torchrun"] == (-9, ["a0_r0.json", "a0_r1.json"])


def test_a_released_timer_kills_nobody(tmp_path):
    pipe = tmp_path / "timers"
    r = run_muster(["--nproc-per-node=2", "--max-restarts=1", WORKER, str(tmp_path), "release"],
                   env=base_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=str(pipe)),
                   timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert records(tmp_path) == ["a0_r0.json", "a0_r1.json"]  # no restart
    assert "expired" not in r.stderr
    assert json.loads((tmp_path / "a0_r0.json").read_text())["timer_file"] == str(pipe)
    assert not pipe.exists()


def test_without_the_switch_there_is_no_watchdog(tmp_path):
    r = run_muster(["--nproc-per-node=1", "-m", "json.tool", "--help"], env=base_env(TORCHELASTIC_ENABLE_FILE_TIMER="0"),
                   timeout=60 * SLACK)
    assert r.returncode == 0, r.stderr
    assert "watchdog" not in r.stderr


def test_what_else_arrives_on_the_pipe_harms_nothing(tmp_path):
    pipe = tmp_path / "timers"
    proc = start_muster(["--nproc-per-node=2", WORKER, str(tmp_path), "wait"],
                        env=base_env(TORCHELASTIC_ENABLE_FILE_TIMER="1", TORCHELASTIC_TIMER_FILE=str(pipe)))
    try:
        deadline = time.monotonic() + 60 * SLACK
        while len(records(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(records(tmp_path)) == 2
        assert stat.S_ISFIFO(pipe.stat().st_mode) and stat.S_IMODE(pipe.stat().st_mode) == 0o600
        past = time.time() - 10
        tail = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "tail-of-a-long-line", "expiration_time": past,
                           "signal": 9}).encode()
        lines = [b"not json at all", b"[1, 2, 3]", b'{"pid": "7"}', b"x" * 10000 + tail,
                 # A timer naming this test's own process, long expired, with SIGKILL: not a worker.
                 json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "intruder", "expiration_time": past,
                             "signal": 9}).encode()]
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        for line in lines:
            os.write(fd, line + b"\n")
        os.close(fd)
        # Wait for the agent to have read it all: its last word on the intruder.
        _, seen = read_stderr_until(proc, rb"none of this agent's workers", 30 * SLACK)
        text = seen.decode(errors="replace")
        assert "pid " + str(os.getpid()) + " expired, but that process is none of this agent's workers" in text, text
        assert "not a JSON object" in text and "longer than 4096 bytes" in text and "\"pid\" is not an integer" in text
        assert "tail-of-a-long-line" not in text  # the rest of an over-long line is no request
        (tmp_path / "release").touch()
        proc.communicate(timeout=60 * SLACK)
        assert proc.returncode == 0
        assert records(tmp_path) == ["a0_r0.json", "a0_r1.json"]
        assert not pipe.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
