"""Membership as a cluster user meets it, with real agents and musterd on
loopback (each agent its own --local-addr in 127.0.0.0/8): a paused node is
fenced and re-admitted, an impostor is refused, a musterd restart goes
unnoticed (and one that never comes back ends the job clearly), waits say what
they wait for, a signal that hits the agent and its workers together is the
root cause, and a failure on another node is reported with its real pid.

Each case is made deterministic by what it waits for (files written by
rename, processes gone, lines logged), never by sleeping."""
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest

from muster_testing import (envs, finish, kill_all, FAST_RDZV_CONF, KEEP_ALIVE_MAX_ATTEMPT, DATA, SLACK, RdzvConn, free_port, musterd_log, pid_alive, start_muster, start_musterd,
                            stop_musterd, wait_for)

WORKER = str(DATA / "elastic_worker.py")
# The dead-after window is keep_alive_interval x keep_alive_max_attempt.
FAST = FAST_RDZV_CONF


def agent(endpoint, job, node, nproc, nnodes, out, *worker_args, extra=(), conf=FAST, env=None):
    return start_muster([f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                         f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}", f"--rdzv-conf={conf}",
                         f"--local-addr=127.0.0.{node}", *extra, WORKER, str(out), *worker_args], env=env)


@pytest.fixture
def musterd():
    proc, port = start_musterd()
    yield proc, f"127.0.0.1:{port}"
    stop_musterd(proc)


def test_a_paused_node_is_fenced_on_waking_and_re_admitted(tmp_path, musterd):
    daemon, endpoint = musterd
    done = tmp_path / "done"
    procs = [agent(endpoint, "pause", n, 1, "2:3", tmp_path, f"--until-file={done}") for n in (1, 2, 3)]
    try:
        assert wait_for(lambda: len([k for k in envs(tmp_path) if k.startswith("n3_")]) == 3, 60 * SLACK)
        stale = int(envs(tmp_path)["n3_a0_r2"]["WORKER_PID"])  # node 3 (127.0.0.3) holds rank 2
        for f in Path(tmp_path).glob("n3_*.json"):
            f.unlink()  # so that node 3's re-admission shows as new files
        procs[2].send_signal(signal.SIGSTOP)
        try:
            # Past the dead-after window (1.5 s, times the slack) the other two re-form without it.
            assert wait_for(lambda: {"n2_a0_r0", "n2_a0_r1"} <= set(envs(tmp_path)), 30 * SLACK)
            assert pid_alive(stale)  # the paused agent could not stop it
        finally:
            procs[2].send_signal(signal.SIGCONT)
        woke = time.monotonic()
        assert wait_for(lambda: not pid_alive(stale), 1 * SLACK), "the stale worker outlived its world"
        assert time.monotonic() - woke <= 1 * SLACK
        # Below max (3), the fenced node is admitted again: a world of 3 once more.
        assert wait_for(lambda: len([k for k in envs(tmp_path) if k.startswith("n3_")]) == 3, 60 * SLACK)
        done.touch()
        results = finish(procs)
    finally:
        kill_all(procs)
    for rc, _, err in results:
        assert rc == 0, err
    err3 = results[2][2]
    assert "this node is out of the job" in err3
    assert "stopping its workers, then joining again" in err3
    log = musterd_log(daemon)
    assert "lost node 127.0.0.3_" in log and "stopped answering" in log


def node_name_of(log, address):
    m = re.search(r"node (" + re.escape(address) + r"_[0-9a-f]+) joined round", log)
    return m.group(1) if m else None


def test_an_impostor_under_a_members_name_is_refused_and_the_member_is_unaffected(tmp_path, musterd):
    daemon, endpoint = musterd
    done = tmp_path / "done"
    procs = [agent(endpoint, "imp", n, 1, "2:3", tmp_path, f"--until-file={done}") for n in (1, 2)]
    try:
        assert wait_for(lambda: {"n2_a0_r0", "n2_a0_r1"} <= set(envs(tmp_path)), 60 * SLACK)
        name = node_name_of(musterd_log(daemon), "127.0.0.1")
        assert name and len(name.rsplit("_", 1)[1]) == 32  # an identity with a 128-bit instance id
        before = {k: v["WORKER_PID"] for k, v in envs(tmp_path).items()}
        impostor = RdzvConn(int(endpoint.rsplit(":", 1)[1]))
        impostor.join("imp", name, min_nodes=2, max_nodes=3)
        r = impostor.recv()
        assert r["type"] == "reject" and r["code"] == "already_exists", r
        assert "already a member" in r["message"]
        impostor.close()
        done.touch()
        results = finish(procs)
    finally:
        kill_all(procs)
    for rc, _, err in results:
        assert rc == 0, err
        assert "re-forms" not in err
    assert {k: v["WORKER_PID"] for k, v in envs(tmp_path).items()} == before  # nobody restarted
    assert "refused a second join as node " + name in musterd_log(daemon)


def test_musterd_killed_and_restarted_mid_job_goes_unnoticed(tmp_path):
    port = free_port()
    daemon, _ = start_musterd(listen=f"127.0.0.1:{port}")
    endpoint = f"127.0.0.1:{port}"
    done = tmp_path / "done"
    # A dead-after window of 5 s (scaled by the slack): the restart below, within 2 s, comes
    # well inside it.
    conf = f"last_call_timeout={SLACK:g},keep_alive_interval=0.5,keep_alive_max_attempt={int(10 * SLACK)},join_timeout=60"
    procs = [agent(endpoint, "durable", n, 2, 2, tmp_path, "--fail-rank=3", f"--until-file={done}",
                   extra=["--max-restarts=3"], conf=conf) for n in (1, 2)]
    second = None
    try:
        # One failure restart first, so there is a restart count to keep.
        assert wait_for(lambda: {f"n2_a1_r{r}" for r in range(4)} <= set(envs(tmp_path)), 60 * SLACK)
        before = {k: v["WORKER_PID"] for k, v in envs(tmp_path).items()}
        daemon.kill()
        daemon.wait(timeout=10)
        second, _ = start_musterd(listen=f"127.0.0.1:{port}")
        assert wait_for(lambda: "round 1 rebuilt" in musterd_log(second), 30 * SLACK), musterd_log(second)
        done.touch()
        results = finish(procs)
    finally:
        kill_all(procs)
        if daemon.poll() is None:
            stop_musterd(daemon)
        if second is not None:
            stop_musterd(second)
    for rc, _, err in results:
        assert rc == 0, err
        assert "back in round 1" in err
        assert err.count("re-forms") == 1  # the failure restart, and nothing for the daemon's restart
    e = envs(tmp_path)
    assert {k: v["WORKER_PID"] for k, v in e.items()} == before  # the same workers, none started again
    assert {e[f"n2_a1_r{r}"]["TORCHELASTIC_RESTART_COUNT"] for r in range(4)} == {"1"}
    assert "job finished" in musterd_log(second)


def test_musterd_gone_past_the_reconnect_window_ends_the_job_with_one_clear_message(tmp_path, musterd):
    daemon, endpoint = musterd
    # The agent reconnects for at least the dead-after window (0.5 s x the attempts).
    window = max(3, math.ceil(0.5 * KEEP_ALIVE_MAX_ATTEMPT))
    conf = FAST + f",reconnect_timeout={window}"
    procs = [agent(endpoint, "gone", n, 1, 2, tmp_path, "--until-nodes=9", conf=conf) for n in (1, 2)]
    try:
        assert wait_for(lambda: {"n2_a0_r0", "n2_a0_r1"} <= set(envs(tmp_path)), 60 * SLACK)
        workers = [int(v["WORKER_PID"]) for v in envs(tmp_path).values()]
        daemon.kill()
        daemon.wait(timeout=10)
        results = finish(procs, timeout=60)
    finally:
        kill_all(procs)
    for rc, _, err in results:
        assert rc == 1
        assert err.count("muster: error:") == 1, err
        assert f"lost the rendezvous at {endpoint} and could not reconnect within {window} s" in err
        assert "ChildFailedError" not in err  # the workers it stopped are not the cause
    assert not any(pid_alive(p) for p in workers)


def test_waits_say_what_they_wait_for(tmp_path, musterd):
    daemon, endpoint = musterd
    # Nobody listens at the endpoint (and this agent is told not to host it).
    nobody = f"127.0.0.1:{free_port()}"
    refused = agent(nobody, "w1", 1, 1, 2, tmp_path, conf=f"is_host=false,join_timeout={4 * SLACK:g}")
    # The name does not resolve.
    unresolved = agent("no-such-host.invalid:29400", "w2", 2, 1, 2, tmp_path, conf=f"join_timeout={4 * SLACK:g}")
    # One node of two has joined.
    alone = agent(endpoint, "w3", 3, 1, 2, tmp_path, conf=f"join_timeout={8 * SLACK:g},keep_alive_interval=0.5,"
                                                          f"keep_alive_max_attempt={KEEP_ALIVE_MAX_ATTEMPT}")
    try:
        (rc1, _, err1), (rc2, _, err2), (rc3, _, err3) = finish([refused, unresolved, alone], timeout=60)
    finally:
        kill_all([refused, unresolved, alone])
    assert rc1 == rc2 == rc3 == 1
    assert f"cannot reach the rendezvous at {nobody} yet (Connection refused); retrying for up to" in err1
    assert "cannot reach the rendezvous at no-such-host.invalid:29400 yet (the name no-such-host.invalid does " \
           "not resolve" in err2
    assert "waiting for the rendezvous of job 'w3' at " + endpoint + ": round 0 has 1 of 2..2 nodes" in err3
    assert "left of join_timeout" in err3
    log = musterd_log(daemon)
    assert "job 'w3': node 127.0.0.3_" in log and "joined round 0: 1 of 2..2 nodes" in log
    # musterd drops the node on its own clock, which may tick after the agent gave up and exited.
    gave_up = "nodes gave up: the rendezvous did not complete within join_timeout"
    assert wait_for(lambda: gave_up in musterd_log(daemon), 10 * SLACK), musterd_log(daemon)


def test_the_rendezvous_host_logs_rounds_losses_and_the_end(tmp_path, musterd):
    daemon, endpoint = musterd
    procs = [agent(endpoint, "told", n, 1, "2:3", tmp_path, "--until-nodes=2") for n in (1, 2, 3)]
    try:
        assert wait_for(lambda: len([k for k in envs(tmp_path) if k.startswith("n3_")]) == 3, 60 * SLACK)
        procs[2].send_signal(signal.SIGTERM)  # leaves: the others re-form with two and finish
        results = finish(procs)
    finally:
        kill_all(procs)
    assert [rc for rc, _, _ in results[:2]] == [0, 0]
    log = musterd_log(daemon)
    assert "round 0 complete: 3 nodes, world size 3" in log
    assert "lost node 127.0.0.3_" in log and "left the job" in log
    assert "round 1 complete: 2 nodes, world size 2" in log
    # Logged just after the finish orders went out: the agents may be gone before it is written.
    finished = "job finished: every node's workers succeeded in round 1"
    assert wait_for(lambda: finished in musterd_log(daemon), 10 * SLACK), musterd_log(daemon)


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_signal_to_the_agent_and_its_workers_together_is_the_root_cause(tmp_path, musterd, nodes):
    _, endpoint = musterd
    if nodes == 1:
        procs = [start_muster(["--nproc-per-node=2", "--max-restarts=1", WORKER, str(tmp_path), "--until-nodes=9",
                               "--term-exit=42"])]
        ready = lambda: len(envs(tmp_path)) == 2  # noqa: E731
    else:
        procs = [agent(endpoint, "sig", n, 2, 2, tmp_path, "--until-nodes=9", "--term-exit=42",
                       extra=["--max-restarts=1"]) for n in (1, 2)]
        ready = lambda: len(envs(tmp_path)) == 4  # noqa: E731
    target = procs[0]
    try:
        assert wait_for(ready, 60 * SLACK)
        mine = [int(v["WORKER_PID"]) for v in envs(tmp_path).values() if v["GROUP_RANK"] == "0"]
        # As scancel --signal=TERM does, but in the order that used to mislead:
        # the workers have exited (with 42) before the agent looks at its signal.
        target.send_signal(signal.SIGSTOP)
        for p in mine:
            os.kill(p, signal.SIGTERM)
        assert wait_for(lambda: not any(pid_alive(p) for p in mine), 10 * SLACK)
        target.send_signal(signal.SIGTERM)
        target.send_signal(signal.SIGCONT)
        _, err = target.communicate(timeout=60 * SLACK)
    finally:
        kill_all(procs)
    assert target.returncode == 1
    assert f"SignalException: Process {target.pid} got signal: {int(signal.SIGTERM)}" in err
    assert "exit code 42" not in err and "exitcode: 42" not in err
    assert "will restart worker group" not in err and "the job failed" not in err
    assert "ChildFailedError" not in err


def test_a_failure_on_another_node_is_reported_with_its_real_pid(tmp_path, musterd):
    _, endpoint = musterd
    procs = [agent(endpoint, "pid", n, 2, 2, tmp_path, "--fail-rank=3") for n in (1, 2)]
    try:
        (rc1, _, err1), (rc2, _, err2) = finish(procs)
    finally:
        kill_all(procs)
    assert rc1 == rc2 == 1
    failing = int(envs(tmp_path)["n2_a0_r3"]["WORKER_PID"])
    root1 = err1.split("Root Cause (first observed failure):")[1]
    root2 = err2.split("Root Cause (first observed failure):")[1]
    assert f"exitcode  : 3 (pid: {failing})" in root2
    assert f"exitcode  : 3 (pid: {failing})" in root1  # carried from node 2 to node 1
    assert "host      : 127.0.0.2" in root1
