"""Bad command lines under torch 2.13's torchrun and under muster, side by
side: the same exit status (2 for what argparse refuses, 1 for what
config_from_args raises on), and torchrun's own words where muster reports
the same fault; --nproc-per-node=cpu under taskset counts the same CPUs."""
import concurrent.futures
import subprocess

import pytest

from muster_testing import MUSTER, base_env, torchrun_path

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
    return subprocess.run([launcher, *args], env=base_env(), capture_output=True, text=True, timeout=120)


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
                           timeout=120) for exe in (MUSTER, torchrun)]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    assert outs[0].stdout.split() == outs[1].stdout.split() == ["1"]
