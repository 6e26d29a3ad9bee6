"""A real PyTorch DDP job (gloo) under muster and under torchrun gives
bit-identical weights. torch 2.13 runs under its own torchrun; Debian's torch
1.13 runs under its torchrun with the Python 3.11 parser mended."""
import json
import math
import subprocess
from pathlib import Path

import pytest

from muster_testing import (DATA, DEBIAN_PYTHON, MUSTER, SLACK, base_env, debian_torch_available, free_port,
                            port_open, run_muster, torchrun_path, wait_all, wait_for)

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "pytorch" / "ddp_train.py")

pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")


def weights(out_dir):
    data = json.loads((Path(out_dir) / "weights.json").read_text())
    return data["world_size"], data["weights"]


@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_weights_are_bitwise_identical_to_torchrun(tmp_path, nproc):
    assert torchrun_path(), "torch 2.x's torchrun must be next to the test's Python"
    m = run_muster([f"--nproc-per-node={nproc}", SCRIPT, str(tmp_path / "muster")], timeout=600)
    assert m.returncode == 0, m.stderr
    t = subprocess.run([torchrun_path(), f"--nproc-per-node={nproc}", SCRIPT, str(tmp_path / "torchrun")],
                       env=base_env(), capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stderr
    mw, tw = weights(tmp_path / "muster"), weights(tmp_path / "torchrun")
    assert mw[0] == tw[0] == nproc
    assert mw[1] == tw[1]
    # Both printed the same losses, epoch by epoch.
    assert [l for l in m.stdout.splitlines() if l.startswith("epoch")] == \
        [l for l in t.stdout.splitlines() if l.startswith("epoch")]


@pytest.mark.skipif(not debian_torch_available(), reason="Debian's python3-torch 1.13 is not installed")
def test_ddp_under_torch_1_13_matches_its_torchrun(tmp_path):
    env = base_env(PYTHON_EXEC=DEBIAN_PYTHON)
    m = run_muster(["--nproc-per-node=2", SCRIPT, str(tmp_path / "muster")], env=env, timeout=600)
    assert m.returncode == 0, m.stderr
    t = subprocess.run([DEBIAN_PYTHON, str(DATA / "torchrun113.py"), "--nproc_per_node=2",
                        f"--master_port={free_port()}", SCRIPT, str(tmp_path / "torchrun")],
                       env=base_env(), capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stderr
    assert weights(tmp_path / "muster") == weights(tmp_path / "torchrun")


def test_a_restarted_group_forms_again_through_the_agent_store(tmp_path):
    crash = str(DATA / "ddp_crash_once.py")
    r = run_muster(["--nproc-per-node=2", "--max-restarts=1", crash, str(tmp_path / "restarted")], timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Worker group FAILED. 1/1 attempts left" in r.stderr
    clean = run_muster(["--nproc-per-node=2", SCRIPT, str(tmp_path / "clean")], timeout=600)
    assert clean.returncode == 0, clean.stderr
    assert weights(tmp_path / "restarted") == weights(tmp_path / "clean")


def test_two_nodes_of_two_workers_match_torchrun(tmp_path):
    def two_agents(launcher, out, local_addr_flag):
        port = free_port()
        common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                  "--rdzv-id=ddp2x2", f"--rdzv-conf=last_call_timeout={math.ceil(SLACK)}"]  # torchrun reads an int
        procs = []
        for node in (1, 2):
            procs.append(subprocess.Popen([*launcher, *common, f"{local_addr_flag}=127.0.0.{node}", SCRIPT, str(out)],
                                          env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            if node == 1:  # the endpoint's host listens before the other agent starts
                assert wait_for(lambda: port_open("127.0.0.1", port) or procs[0].poll() is not None, 60 * SLACK), \
                    "the first agent neither listened nor exited"
        failed = wait_all(procs, 180)
        return None if failed else weights(out), failed

    def once(launcher, name):
        w, failed = two_agents(launcher, tmp_path / name, "--local-addr")
        assert not failed, failed
        return w

    m = once([MUSTER], "muster")
    t = once([torchrun_path()], "torchrun")
    assert m[0] == t[0] == 4
    assert m[1] == t[1]
    # The static backend: node rank 0 serves the workers' store on --master-port.
    def static_run(out):
        port = free_port()
        procs = [subprocess.Popen([MUSTER, "--nnodes=2", f"--node-rank={r}", "--nproc-per-node=2",
                                   "--master-addr=127.0.0.1", f"--master-port={port}", SCRIPT, str(out)],
                                  env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        return wait_all(procs, 180)

    errs = static_run(tmp_path / "static")
    assert not errs, errs
    assert weights(tmp_path / "static") == t


def test_ddp_launched_over_ssh_on_two_hosts_matches_one_node(tmp_path):
    import ssh_hosts
    why_not = ssh_hosts.available()
    if why_not:
        pytest.skip(why_not)
    hosts = ssh_hosts.SshHosts(tmp_path / "sshd", 2, slack=SLACK)
    try:
        env = base_env(**hosts.ssh_env())
        over_ssh = subprocess.run([MUSTER, "--hosts=127.0.0.2:1,127.0.0.3:1", SCRIPT, str(tmp_path / "ssh")], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert over_ssh.returncode == 0, over_ssh.stderr
    finally:
        hosts.close()
    one = run_muster(["--nproc-per-node=2", SCRIPT, str(tmp_path / "one")], timeout=600)
    assert one.returncode == 0, one.stderr
    assert weights(tmp_path / "ssh") == weights(tmp_path / "one")
    assert weights(tmp_path / "ssh")[0] == 2
    # Rank 0's losses came back through its host's ssh session, prefixed.
    assert [l.split(": ", 1)[1].split(":", 1)[1] for l in over_ssh.stdout.splitlines() if "epoch" in l and
            l.startswith("127.0.0.2: [default0]:")] == [l for l in one.stdout.splitlines() if l.startswith("epoch")]
