"""muster on a real Slurm cluster: slurmctld, munged and two slurmd, each node
in network namespaces of its own on this host (slurm_cluster.py). A plain
`srun -N2 muster --nproc-per-node=2` forms one job of ranks 0-3 with torchrun's
environment and trains a real DDP model across the two nodes; torchrun's long
recipes (c10d and static) still work; scancel, scancel --signal=TERM and a time
limit end the job leaving no process behind; a failing rank ends the step
non-zero with one job-wide report.

Skips only where the host cannot run the cluster (not root, no network
namespaces). Slurm and munge come from scripts/install-deps.sh: a missing one
fails the test."""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from muster_testing import DATA, MUSTER, PYTHON, SLACK, base_env, slurm_port, wait_for

import slurm_cluster

_why = slurm_cluster.missing_capability()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")

DUMP = str(DATA / "dump_env.py")
SLEEPER = str(DATA / "sleeper.py")
FAIL = str(DATA / "fail_worker.py")
DDP = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "ddp_train.py")
TIME_LIMIT_BOUND = 200  # s: a one-minute limit, slurmctld's 30 s check, KillWait 10 s, and slack


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = slurm_cluster.missing_tools()
    assert not missing, f"Slurm tools missing: {missing}: run scripts/install-deps.sh (it installs slurm-wlm and munge)"
    c = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"), slack=SLACK).start()
    try:
        yield c
    finally:
        try:  # the jobs first, so that their steps end as Slurm ends them
            c.run(["scancel", "--user=root", "--full"], check=False)
            wait_for(lambda: not c.run(["squeue", "-h"], check=False).stdout.strip(), 30 * SLACK, interval=0.25)
        except Exception:  # noqa: BLE001 - whatever happened, stop() still runs
            pass
        c.stop()


def job_env(cluster, marker, **extra):
    """What a job is submitted with: the test's known environment, the cluster's
    slurm.conf, and a marker that every process of the job inherits."""
    return base_env(SLURM_CONF=str(cluster.conf), MUSTER_SLURM_TEST=marker, **extra)


def processes_with(marker):
    """Pids of the live processes whose environment carries MUSTER_SLURM_TEST=marker."""
    needle = f"MUSTER_SLURM_TEST={marker}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(d))
    return found


def ranks(out):
    return {int(p.stem.split("_")[1]): json.loads(p.read_text())["env"] for p in Path(out).glob("rank_*.json")}


def recorded(out, prefix):
    return {p.name.split("_", 1)[1]: p.read_text().split() for p in Path(out).glob(f"{prefix}_*")}


def sbatch(cluster, tmp, name, body, env, *options):
    script = tmp / f"{name}.sbatch"
    script.write_text("#!/bin/sh\n" + body + "\n")
    r = cluster.run(["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--output={tmp / name}.out",
                     *options, str(script)], env=env)
    return int(r.stdout.strip().split(";")[0])


def srun_sleepers(out, *extra_worker_flags):
    """The batch script's step: muster with two sleeping workers per node."""
    return (f'srun {MUSTER} --nproc-per-node=2 --shutdown-timeout=5 {SLEEPER} {out} spawn-children '
            f'{" ".join(extra_worker_flags)}\necho "srun exited $?" > {out}/srun_exit')


# Submitted first, checked last: the one-minute time limit runs while the other tests do.
@pytest.fixture(scope="module")
def time_limited(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timelimit")
    out = tmp / "out"
    out.mkdir()
    env = job_env(cluster, "timelimit")
    job = sbatch(cluster, tmp, "timelimit", srun_sleepers(out, "hold=600"), env, "--time=1")
    return job, out, tmp


def test_srun_forms_one_job_over_the_step_with_torchrun_s_environment(cluster, time_limited, tmp_path):
    r = cluster.run(["srun", "-N2", "--ntasks-per-node=1", MUSTER, "--nproc-per-node=2", DUMP, str(tmp_path)],
                    env=job_env(cluster, "env"), timeout=120)
    envs = ranks(tmp_path)
    assert sorted(envs) == [0, 1, 2, 3], r.stderr
    job = int(envs[0]["SLURM_JOB_ID"])
    step = int(envs[0]["SLURM_STEP_ID"])
    lines = re.findall(r"muster: Slurm step (\d+)\.(\d+): one job over its 2 node\(s\), this one node rank (\d)",
                       r.stderr)
    assert sorted(lines) == [(str(job), str(step), "0"), (str(job), str(step), "1")], r.stderr
    for rank, env in envs.items():
        node = rank // 2
        assert env["SLURMD_NODENAME"] == slurm_cluster.NODES[node]  # node rank = SLURM_NODEID
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % 2)
        assert env["GROUP_RANK"] == str(node) and env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2"
        assert env["ROLE_WORLD_SIZE"] == "4" and env["ROLE_NAME"] == "default"
        assert env["MASTER_ADDR"] == slurm_cluster.NODES[0]
        assert env["MASTER_PORT"] == str(slurm_port(job, step))
        assert env["TORCHELASTIC_RUN_ID"] == f"slurm-{job}.{step}"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and env["OMP_NUM_THREADS"] == "1"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank % 2}/error.json")


def test_a_ddp_model_trained_across_the_two_nodes_equals_the_one_node_run(cluster, tmp_path):
    across, local = tmp_path / "across", tmp_path / "local"
    across.mkdir()
    local.mkdir()
    r = cluster.run(["srun", "-N2", "--ntasks-per-node=1", MUSTER, "--nproc-per-node=2", DDP, str(across), "2"],
                    env=job_env(cluster, "ddp"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # The same world of four ranks on one node, outside Slurm.
    one = subprocess.run([MUSTER, "--nproc-per-node=4", DDP, str(local), "2"], env=base_env(),
                         capture_output=True, text=True, timeout=300 * SLACK)
    assert one.returncode == 0, one.stderr[-3000:]
    assert json.loads((across / "weights.json").read_text()) == json.loads((local / "weights.json").read_text())


@pytest.mark.parametrize("recipe", ["c10d", "static"])
def test_torchrun_s_long_recipes_still_work(cluster, tmp_path, recipe):
    head = slurm_cluster.NODES[0]
    if recipe == "c10d":
        options = f"--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint={head}:29500 --rdzv-id=$SLURM_JOB_ID"
    else:
        options = f"--nnodes=$SLURM_NNODES --node-rank=$SLURM_NODEID --master-addr={head} --master-port=29500"
    r = cluster.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                     f"exec {MUSTER} {options} --nproc-per-node=2 {DUMP} {tmp_path}"],
                    env=job_env(cluster, recipe), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Slurm step" not in r.stderr  # torchrun's options: torchrun's behaviour, nothing inferred
    envs = ranks(tmp_path)
    assert sorted(envs) == [0, 1, 2, 3]
    nodes = {env["SLURMD_NODENAME"]: env["GROUP_RANK"] for env in envs.values()}
    assert sorted(nodes.values()) == ["0", "1"]
    if recipe == "static":
        assert nodes == {slurm_cluster.NODES[0]: "0", slurm_cluster.NODES[1]: "1"}
    assert all(env["WORLD_SIZE"] == "4" and env["MASTER_PORT"] != "" for env in envs.values())


def test_a_failing_rank_ends_the_step_non_zero_with_one_job_wide_report(cluster, tmp_path):
    r = cluster.run(["srun", "-N2", "--ntasks-per-node=1", MUSTER, "--nproc-per-node=2", FAIL, "exit3", "3"],
                    env=job_env(cluster, "fail"), timeout=120, check=False)
    assert r.returncode != 0
    assert r.stderr.count("Root Cause (first observed failure)") == 1, r.stderr
    root = r.stderr.split("Root Cause (first observed failure):", 1)[1]
    assert re.search(r"host\s+: " + slurm_cluster.NODES[1], root), root
    assert re.search(r"rank\s+: 3 \(local_rank: 1\)", root) and re.search(r"exitcode\s+: 3 ", root), root
    assert wait_for(lambda: not processes_with("fail"), 10 * SLACK), processes_with("fail")


def started(out, n=4):
    return len(recorded(out, "pid")) == n and len(recorded(out, "daemon")) == n


@pytest.mark.parametrize("how", ["scancel", "scancel --signal=TERM"])
def test_scancel_leaves_no_process(cluster, tmp_path, how):
    out = tmp_path / "out"
    out.mkdir()
    marker = "cancel" if how == "scancel" else "term"
    env = job_env(cluster, marker)
    job = sbatch(cluster, tmp_path, marker, srun_sleepers(out), env)
    assert wait_for(lambda: started(out), 60 * SLACK), (cluster.job_state(job), recorded(out, "pid"))
    everything = processes_with(marker)
    assert len(everything) >= 4 * 4  # per rank: the worker, its child, the daemon's shell and its sleep
    cluster.run(how.split() + [str(job)], env=env)
    state = cluster.wait_job_done(job, 60)
    assert wait_for(lambda: not processes_with(marker), 15 * SLACK), processes_with(marker)
    signals = recorded(out, "signal")
    assert sorted(signals) == ["0", "1", "2", "3"] and all(s[0] == "SIGTERM" for s in signals.values()), signals
    if how == "scancel":
        assert state == "CANCELLED"
    else:
        # Only the step was signalled: srun came back non-zero and the batch script went on to the end.
        assert (out / "srun_exit").read_text().split() != ["srun", "exited", "0"]
        assert state in ("COMPLETED", "FAILED")


def test_a_time_limit_ends_the_job_cleanly(cluster, time_limited):
    job, out, tmp = time_limited
    assert wait_for(lambda: started(out), 60 * SLACK), (cluster.job_state(job), recorded(out, "pid"))
    state = cluster.wait_job_done(job, TIME_LIMIT_BOUND)
    assert state == "TIMEOUT"
    assert wait_for(lambda: not processes_with("timelimit"), 15 * SLACK), processes_with("timelimit")
    signals = recorded(out, "signal")
    assert sorted(signals) == ["0", "1", "2", "3"] and all(s[0] == "SIGTERM" for s in signals.values()), signals
    log = (tmp / "timelimit.out").read_text()
    assert "DUE TO TIME LIMIT" in log and "death signal, shutting down workers" in log, log[-3000:]
