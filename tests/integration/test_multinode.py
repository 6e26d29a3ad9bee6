"""Multi-node jobs as several agents on this machine, each with its own
--local-addr in 127.0.0.0/8: the rendezvous hosted by the agent that owns the
endpoint or by musterd, heterogeneous nodes, a node killed mid-job, a late
joiner, failures with and without restarts left."""
import signal

import pytest

from muster_testing import (envs, finish, FAST_RDZV_CONF, DATA, SLACK, free_port, port_open, start_muster, start_musterd, stop_musterd,
                            wait_for)

WORKER = str(DATA / "elastic_worker.py")
FAST = FAST_RDZV_CONF


def agent(endpoint, job, node, nproc, nnodes, out, *worker_args, extra=(), conf=FAST):
    return start_muster([f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                         f"--rdzv-endpoint={endpoint}", f"--rdzv-id={job}", f"--rdzv-conf={conf}",
                         f"--local-addr=127.0.0.{node}", *extra, WORKER, str(out), *worker_args])


@pytest.fixture
def musterd():
    proc, port = start_musterd()
    yield f"127.0.0.1:{port}"
    stop_musterd(proc)


def test_heterogeneous_nodes_with_the_rendezvous_in_the_endpoint_s_agent(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    host = agent(endpoint, "het", 1, 1, 2, tmp_path)
    host_addr, host_port = endpoint.split(":")
    assert wait_for(lambda: port_open(host_addr, int(host_port)), 30 * SLACK)  # the host listens first
    other = agent(endpoint, "het", 2, 3, 2, tmp_path)
    for rc, _, err in finish([host, other]):
        assert rc == 0, err
    e = envs(tmp_path)
    assert sorted(e) == [f"n2_a0_r{r}" for r in range(4)]
    assert e["n2_a0_r0"]["GROUP_RANK"] == "0" and e["n2_a0_r0"]["LOCAL_WORLD_SIZE"] == "1"
    for r in (1, 2, 3):
        w = e[f"n2_a0_r{r}"]
        assert (w["GROUP_RANK"], w["LOCAL_RANK"], w["LOCAL_WORLD_SIZE"]) == ("1", str(r - 1), "3")
    assert {w["WORLD_SIZE"] for w in e.values()} == {"4"}
    assert {w["MASTER_ADDR"] for w in e.values()} == {"127.0.0.1"}
    assert len({w["MASTER_PORT"] for w in e.values()}) == 1
    assert {w["TORCHELASTIC_USE_AGENT_STORE"] for w in e.values()} == {"True"}


def test_musterd_serves_two_jobs_at_once(tmp_path, musterd):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    procs = [agent(musterd, "jobA", 1, 2, 2, tmp_path / "a"), agent(musterd, "jobB", 3, 1, 2, tmp_path / "b"),
             agent(musterd, "jobA", 2, 1, 2, tmp_path / "a"), agent(musterd, "jobB", 4, 2, 2, tmp_path / "b")]
    for rc, _, err in finish(procs):
        assert rc == 0, err
    assert sorted(envs(tmp_path / "a")) == [f"n2_a0_r{r}" for r in range(3)]
    assert sorted(envs(tmp_path / "b")) == [f"n2_a0_r{r}" for r in range(3)]


def test_an_agent_killed_mid_job_and_the_survivors_re_form(tmp_path, musterd):
    procs = [agent(musterd, "kill", n, 1, "2:3", tmp_path, "--until-nodes=2") for n in (1, 2, 3)]
    assert wait_for(lambda: len(envs(tmp_path)) == 3, 60 * SLACK)
    procs[2].send_signal(signal.SIGKILL)
    procs[2].communicate(timeout=10)
    for rc, _, err in finish(procs[:2]):
        assert rc == 0, err
        assert "the job re-forms (node 127.0.0.3" in err
    e = envs(tmp_path)
    assert {"n2_a0_r0", "n2_a0_r1"} <= set(e)  # a membership restart: not counted
    assert e["n2_a0_r1"]["WORLD_SIZE"] == "2"


def test_a_late_joiner_is_admitted_in_the_next_round(tmp_path, musterd):
    first = agent(musterd, "late", 1, 1, "1:2", tmp_path, "--until-nodes=2")
    assert wait_for(lambda: "n1_a0_r0" in envs(tmp_path), 60 * SLACK)
    second = agent(musterd, "late", 2, 2, "1:2", tmp_path, "--until-nodes=2")
    for rc, _, err in finish([first, second]):
        assert rc == 0, err
    e = envs(tmp_path)
    assert {"n2_a0_r0", "n2_a0_r1", "n2_a0_r2"} <= set(e)
    assert e["n2_a0_r2"]["WORLD_SIZE"] == "3"


def test_a_failure_restarts_every_node_and_counts(tmp_path, musterd):
    procs = [agent(musterd, "restart", n, 2, 2, tmp_path, "--fail-rank=3", extra=["--max-restarts=1"]) for n in (1, 2)]
    for rc, _, err in finish(procs):
        assert rc == 0, err
    e = envs(tmp_path)
    assert {f"n2_a1_r{r}" for r in range(4)} <= set(e)
    assert {e[f"n2_a1_r{r}"]["TORCHELASTIC_RESTART_COUNT"] for r in range(4)} == {"1"}


def test_a_failure_with_no_restarts_left_ends_every_agent_with_the_job_wide_report(tmp_path, musterd):
    procs = [agent(musterd, "fail", n, 2, 2, tmp_path, "--fail-rank=3") for n in (1, 2)]
    (rc1, _, err1), (rc2, _, err2) = finish(procs)
    assert rc1 == 1 and rc2 == 1
    # The failing node reports its own worker; the other names it as the root cause
    # and lists its own ranks as stopped because of it.
    root2 = err2.split("Root Cause (first observed failure):")[1]
    assert "rank      : 3 (local_rank: 1)" in root2 and "exitcode  : 3" in root2
    root1 = err1.split("Root Cause (first observed failure):")[1]
    assert "rank      : 3 (local_rank: 1)" in root1
    assert "host      : 127.0.0.2" in root1
    others1 = err1.split("Failures:")[1].split("Root Cause")[0]
    assert "stopped by muster after rank 3 on 127.0.0.2 failed" in others1
    assert "rank      : 0 (local_rank: 0)" in others1


def test_a_late_joiner_to_a_finished_job_gets_a_clear_error(tmp_path, musterd):
    procs = [agent(musterd, "done", n, 1, 2, tmp_path) for n in (1, 2)]
    for rc, _, err in finish(procs):
        assert rc == 0, err
    late = agent(musterd, "done", 3, 1, 2, tmp_path)
    rc, _, err = finish([late])[0]
    assert rc == 1
    assert "the job has finished; start a new one with a new --rdzv-id" in err


def test_an_unreachable_rendezvous_is_named_in_the_error(tmp_path):
    port = free_port()
    p = agent(f"127.0.0.9:{port}", "none", 1, 1, 2, tmp_path, conf="join_timeout=0.5,is_host=false")
    rc, _, err = finish([p])[0]
    assert rc == 1
    assert f"cannot reach the rendezvous at 127.0.0.9:{port}" in err


def test_the_static_backend_uses_node_ranks_and_master_port(tmp_path):
    port = free_port()
    procs = []
    for rank, nproc in ((1, 3), (0, 1)):  # node rank 1 first: it waits for node rank 0
        procs.append(start_muster(["--nnodes=2", f"--node-rank={rank}", "--master-addr=127.0.0.1",
                                   f"--master-port={port}", f"--nproc-per-node={nproc}",
                                   f"--local-addr=127.0.0.{rank + 1}", WORKER, str(tmp_path)]))
    for rc, _, err in finish(procs):
        assert rc == 0, err
    e = envs(tmp_path)
    assert sorted(e) == [f"n2_a0_r{r}" for r in range(4)]
    assert e["n2_a0_r0"]["GROUP_RANK"] == "0" and e["n2_a0_r0"]["LOCAL_WORLD_SIZE"] == "1"
    assert all(e[f"n2_a0_r{r}"]["GROUP_RANK"] == "1" for r in (1, 2, 3))
    assert {w["MASTER_PORT"] for w in e.values()} == {str(port)}  # as torchrun: the store on --master-port
    assert {w["MASTER_ADDR"] for w in e.values()} == {"127.0.0.1"}
    assert {w["TORCHELASTIC_RUN_ID"] for w in e.values()} == {"none"}


def test_an_endpoint_held_by_another_program_is_named_every_few_seconds_then_given_up(tmp_path):
    # A program that takes connections and never says a word, where the rendezvous should be.
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def take():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    give_up = 8 * SLACK
    try:
        proc = agent(endpoint, "held", 2, 1, 2, tmp_path,
                     conf=f"keep_alive_interval=1,keep_alive_max_attempt=3,reconnect_timeout={give_up:g}")
        (rc, _, err), = finish([proc], timeout=60)
    finally:
        stop.set()
        taker.join(timeout=10)
        for c in held:
            c.close()
        listener.close()
    assert rc == 1, err
    hint = "something other than a muster rendezvous seems to hold that port (it took the connection and has said nothing)"
    # Said while it waits (every few seconds), and in the error that ends the launch.
    assert "has not answered the join of job 'held' for " in err and f"waiting up to {give_up:g} s" in err, err
    assert err.count(hint) >= 2, err
    assert f"muster: error: the rendezvous at {endpoint} has not answered the join" in err
    assert f"gave up after {give_up:g} s (--rdzv-conf reconnect_timeout)" in err
