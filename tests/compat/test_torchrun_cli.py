"""Bad command lines under torch 2.13's torchrun and under muster, side by
side: the same exit status (2 for what argparse refuses, 1 for what
config_from_args raises on), and torchrun's own words where muster reports
the same fault; --nproc-per-node=cpu under taskset counts the same CPUs;
--run-path runs a script as torchrun's run_script_path does; log lines carry
torch's timestamp format."""
import concurrent.futures
import json
import re
import subprocess

import pytest

from muster_testing import DATA, MUSTER, SLACK, base_env, torchrun_path

# (arguments, a phrase torchrun's error has that muster's must have too, or None)
CASES = [
    (["--max-restarts=x", "x.py"], "invalid int value: 'x'"),
    (["--start-method=bogus", "x.py"], "invalid choice: 'bogus'"),
    (["--nnodes=a:b", "x.py"], None),
    (["--nnodes=2:1", "x.py"], "min_nodes must be > 0 and <= max_nodes, got min_nodes=2, max_nodes=1"),
    (["--nnodes=0", "x.py"], "min_nodes must be > 0 and <= max_nodes, got min_nodes=0, max_nodes=0"),
    (["--rdzv-conf=k", "x.py"], "The rendezvous configuration option 'k' must have a value specified."),
    (["--nproc-per-node=gpu", "x.py"], None),
    (["--nproc-per-node=0", "x.py"], None),
    (["--nproc-per-node=-2", "x.py"], None),
    (["--nproc-per-node=foo", "x.py"], "Unsupported nproc_per_node value: foo"),
    (["--max-restarts=-1", "--no-python", "true"], "max_restarts must be >= 0"),
    (["--monitor-interval=0", "--no-python", "true"], None),
    (["--no-python", "-m", "x"], "Don't use both the '--no-python' flag and the '--module' flag at the same time."),
    (["--rdzv-backend=bogus", "--no-python", "true"], "The rendezvous backend 'bogus' is not registered"),
    (["--logs-specs=nope", "x.py"], "Could not find entrypoint under 'torchrun.logs_specs[nope]' key"),
    (["--shutdown-timeout=-1", "--no-python", "true"], "shutdown_timeout must be non-negative, got -1"),
    (["--event-log-handler=bogus", "--no-python", "true"], None),
    (["--logs-specs=default", "--no-python", "true"], None),
]


def run(launcher, args):
    return subprocess.run([launcher, *args], env=base_env(), capture_output=True, text=True, timeout=120 * SLACK)


@pytest.fixture(scope="module")
def torchrun():
    exe = torchrun_path()
    assert exe, "torch 2.x's torchrun is not next to the test's Python (scripts/install-deps.sh makes .venv)"
    return exe


def test_bad_command_lines_exit_as_under_torchrun(torchrun):
    # torchrun takes seconds to import torch: two at a time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        theirs = list(pool.map(lambda case: run(torchrun, case[0]), CASES))
    for (args, phrase), t in zip(CASES, theirs):
        m = run(MUSTER, args)
        assert m.returncode == t.returncode, (args, m.returncode, t.returncode, m.stderr, t.stderr[-2000:])
        if phrase:
            assert phrase in t.stderr, (args, "torchrun no longer says", phrase, t.stderr[-2000:])
            assert phrase in m.stderr, (args, m.stderr)


def test_nproc_cpu_under_taskset_as_under_torchrun(torchrun):
    args = ["--nproc-per-node=cpu", "--no-python", "sh", "-c", "echo $WORLD_SIZE"]
    outs = [subprocess.run(["taskset", "-c", "0", exe, *args], env=base_env(), capture_output=True, text=True,
                           timeout=120 * SLACK) for exe in (MUSTER, torchrun)]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    assert outs[0].stdout.split() == outs[1].stdout.split() == ["1"]


def test_run_path_runs_the_script_as_torchrun_s_run_script_path(torchrun, tmp_path):
    probe = str(DATA / "run_path_probe.py")
    seen = {}
    for name, exe in (("muster", MUSTER), ("torchrun", torchrun)):
        out = tmp_path / name
        out.mkdir()
        r = subprocess.run([exe, "--nproc-per-node=2", "--run-path", probe, str(out), "x", "3"], env=base_env(),
                           capture_output=True, text=True, timeout=180 * SLACK)
        assert r.returncode == 1, (name, r.stderr[-3000:])
        assert "of fn: run_script_path (start_method: spawn)" in r.stderr and "run_script_path FAILED" in r.stderr
        # The log line's prefix as torch's formatter writes it: level, MMDD, time to the
        # millisecond written as six digits, pid.
        line = next(x for x in r.stderr.splitlines() if "failed (exitcode: 3)" in x)
        assert re.match(r"E\d{4} \d\d:\d\d:\d\d\.\d{3}000 \d+ \S+\] failed \(exitcode: 3\)", line), (name, line)
        records = [json.loads((out / f"rank_{rank}.json").read_text()) for rank in (0, 1)]
        for rec in records:
            assert rec["argv"] == [probe, str(out), "x", "3"], (name, rec)
        seen[name] = [(rec["name"], rec["launched"], rec["sum"]) for rec in records]
    assert seen["muster"] == seen["torchrun"] == [("__main__", True, 3.0)] * 2


def test_run_path_workers_leave_together_as_under_torchrun(tmp_path):
    # torchrun's run_script_path worker waits, its script done, until every worker of the node
    # is done, so none exits while a peer still runs. Rank 0 ends at once, rank 1 after 4 s
    # (times the slack) of output; under --worker-timeout shorter than that, rank 0's quiet
    # wait is no hang.
    work = 4 * SLACK
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = subprocess.run([MUSTER, "--nproc-per-node=2", "--run-path", f"--worker-timeout={work / 2}",
                        str(DATA / "run_path_barrier.py"), str(tmp_path), str(work)],
                       env=base_env(TMPDIR=str(scratch)), capture_output=True, text=True, timeout=180 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "worker watchdog" not in r.stderr
    t = {name: float((tmp_path / name).read_text()) for name in ("end_0", "end_1", "exit_0", "exit_1")}
    assert t["end_1"] - t["end_0"] >= work - 0.5  # rank 0 was done long before rank 1
    assert t["exit_0"] >= t["end_1"]  # but left only once rank 1 was done too
    assert not list(scratch.glob("muster-run-path-*"))  # the agent removed the attempt's folder
