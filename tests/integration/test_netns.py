"""Three hosts in network namespaces joined by a bridge (in a fourth, the
switch); one host's link is cut mid-job. The other two notice it after
keep_alive_interval x keep_alive_max_attempt, re-form and finish; the cut-off
agent fences itself (its heartbeats go unacknowledged for that window, so it
stops its worker), tries to reconnect, and once its link is back finds the
rendezvous gone with the job (host 1's agent hosted it) and exits 1 when
reconnect_timeout runs out, saying so. Needs root and iproute2."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from muster_testing import (FAST_RDZV_CONF, DATA, MUSTER, PYTHON, SLACK, base_env, bridged_namespaces, netns_ip,
                            wait_for)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="network namespaces need root and iproute2 (ip)")

WORKER = str(DATA / "elastic_worker.py")
SUBNET = "192.0.2"  # TEST-NET-1: documentation addresses, only ever inside these namespaces


def ip(*args, ns=None):
    netns_ip(*args, ns=ns)


@pytest.fixture
def hosts():
    with bridged_namespaces(f"m{os.getpid() % 100000}", SUBNET, 3) as (sw, names):
        yield sw, names


def worker_pid_of_rank(out, rank):
    """The pid of the elastic worker writing into `out` whose RANK is `rank`."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if WORKER.encode() not in cmd or str(out).encode() not in cmd:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"RANK") == str(rank).encode() and env.get(b"GROUP_WORLD_SIZE") == b"3":
            return int(d)
    return None


def test_a_host_whose_link_is_cut_is_dropped_and_the_others_re_form(hosts, tmp_path):
    sw, names = hosts
    conf = FAST_RDZV_CONF + ",reconnect_timeout=8"
    procs = []
    for i, h in enumerate(names, start=1):
        cmd = ["ip", "netns", "exec", h, MUSTER, "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint={SUBNET}.1:29400", "--rdzv-id=netns", f"--rdzv-conf={conf}",
               f"--local-addr={SUBNET}.{i}", WORKER, str(tmp_path), "--until-nodes=2"]
        procs.append(subprocess.Popen(cmd, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(0.3)
    envs = lambda: list(Path(tmp_path).glob("n3_*.json"))  # noqa: E731
    assert wait_for(lambda: len(envs()) == 3, 60 * SLACK), [p.poll() for p in procs]
    stale = None
    assert wait_for(lambda: worker_pid_of_rank(tmp_path, 2) is not None, 10 * SLACK)
    stale = worker_pid_of_rank(tmp_path, 2)  # host 3's worker (ranks follow the addresses)
    ip("link", "set", "v3", "down", ns=sw)  # host 3 drops off the network
    # Its agent stops the worker by itself once the dead-after window (1.5 s, times the slack) passes unacknowledged.
    assert wait_for(lambda: not os.path.exists(f"/proc/{stale}"), 10 * SLACK)
    for p in procs[:2]:
        _, err = p.communicate(timeout=60 * SLACK)
        assert p.returncode == 0, err
        assert f"node {SUBNET}.3" in err and "stopped answering" in err
    assert {f"n2_a0_r{r}" for r in range(2)} <= {p.stem for p in Path(tmp_path).glob("*.json")}
    ip("link", "set", "v3", "up", ns=sw)  # back, after the job has ended without it
    _, err = procs[2].communicate(timeout=60 * SLACK)
    assert procs[2].returncode == 1
    assert "this node is out of the job: no heartbeat of this node was acknowledged" in err
    assert f"lost the rendezvous at {SUBNET}.1:29400 and could not reconnect within 8 s" in err, err
    assert "Traceback" not in err and "ChildFailedError" not in err  # the stopped worker is no root cause
