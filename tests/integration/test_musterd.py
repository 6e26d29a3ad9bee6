"""musterd as agents meet it: length-prefixed JSON frames over TCP, jobs keyed
by rdzv_id, rounds, rank assignment, liveness, and bad input closing only the
offending connection."""
import json
import os
import socket
import struct
import subprocess
import time

import pytest

from muster_testing import SIM_KEEP_ALIVE_ATTEMPTS, SIM_KEEP_ALIVE_MS, SLACK, RdzvConn as Agent, start_musterd, stop_musterd



@pytest.fixture
def musterd():
    proc, port = start_musterd()
    yield port
    stop_musterd(proc)


def test_two_jobs_at_once_with_heterogeneous_nodes(musterd):
    a1, a2 = Agent(musterd), Agent(musterd)
    b1, b2, b3 = Agent(musterd), Agent(musterd), Agent(musterd)
    a1.join("jobA", "n1", nproc=2, min_nodes=2, max_nodes=2)
    b1.join("jobB", "m1", nproc=1, min_nodes=3, max_nodes=3)
    a2.join("jobA", "n2", nproc=3, min_nodes=2, max_nodes=2)
    b2.join("jobB", "m2", nproc=4, min_nodes=3, max_nodes=3)
    b3.join("jobB", "m3", nproc=2, min_nodes=3, max_nodes=3)
    ra1, ra2 = a1.recv(), a2.recv()
    assert ra1["type"] == ra2["type"] == "assign"
    assert (ra1["group_rank"], ra1["base_global_rank"]) == (0, 0)
    assert (ra2["group_rank"], ra2["base_global_rank"]) == (1, 2)
    assert ra1["global_world_size"] == 5
    assert ra2["master_addr"] == "n1.test" and ra2["master_port"] == 1002
    rb = [x.recv() for x in (b1, b2, b3)]
    assert [r["base_global_rank"] for r in rb] == [0, 1, 5]
    assert all(r["global_world_size"] == 7 and r["group_world_size"] == 3 for r in rb)


def test_a_dead_agent_is_noticed_and_the_survivors_re_form(musterd):
    agents = [Agent(musterd) for _ in range(3)]
    for i, a in enumerate(agents):
        a.join("live", f"n{i}", min_nodes=2, max_nodes=3)
    assert all(a.recv()["type"] == "assign" for a in agents)
    agents[2].sock.shutdown(socket.SHUT_RDWR)  # the agent dies: its connection breaks
    agents[2].close()
    for i, a in enumerate(agents[:2]):
        msg = a.recv_beating(also=agents[:2])  # the survivors stay alive; n2 falls silent
        assert msg["type"] == "restart" and msg["counts_as_failure"] is False
        assert "n2" in msg["reason"]
    for i, a in enumerate(agents[:2]):
        a.join("live", f"n{i}", min_nodes=2, max_nodes=3)
    deadline = time.monotonic() + 5 * SLACK
    # Both keep heartbeating while the round closes, as live agents do.
    results = [a.recv_beating(also=agents[:2]) for a in agents[:2]]
    assert None not in results, results
    assert all(r["type"] == "assign" and r["group_world_size"] == 2 and r["round"] == 1 for r in results)
    assert time.monotonic() < deadline


def test_a_silent_agent_is_declared_dead_after_interval_times_attempts(musterd):
    a, b = Agent(musterd), Agent(musterd)
    a.join("quiet", "a", min_nodes=1, max_nodes=2)
    b.join("quiet", "b", min_nodes=1, max_nodes=2)
    assert a.recv()["type"] == "assign" and b.recv()["type"] == "assign"
    start = time.monotonic()
    while True:  # a heartbeats, b says nothing
        a.send({"type": "heartbeat", "v": 1})
        a.sock.settimeout(0.1)
        try:
            chunk = a.sock.recv(65536)
        except socket.timeout:
            chunk = b""
        a.buf += chunk
        if len(a.buf) >= 4 or time.monotonic() - start > 5 * SLACK:
            break
    msg = a.recv()
    assert msg["type"] == "restart"
    window = SIM_KEEP_ALIVE_MS * SIM_KEEP_ALIVE_ATTEMPTS
    seconds = f"{window // 1000}" if window % 1000 == 0 else f"{window / 1000:.3f}".rstrip("0")
    assert f"b stopped answering for {seconds} s" in msg["reason"]


def test_failure_with_no_restarts_left_closes_the_job(musterd):
    a, b = Agent(musterd), Agent(musterd)
    a.join("fail", "a", min_nodes=2, max_nodes=2)
    b.join("fail", "b", min_nodes=2, max_nodes=2)
    assert a.recv()["round"] == 0 and b.recv()["round"] == 0
    b.send({"type": "workers_failed", "v": 1, "round": 0,
            "failure": {"global_rank": 1, "local_rank": 0, "exitcode": 3, "host": "b.test", "message": "boom",
                        "timestamp": 1}})
    fa, fb = a.recv(), b.recv()
    assert fa["type"] == fb["type"] == "finished"
    assert fa["success"] is False
    assert fa["root_cause"]["global_rank"] == 1 and fa["root_cause"]["host"] == "b.test"
    late = Agent(musterd)
    late.join("fail", "c", min_nodes=2, max_nodes=2)
    r = late.recv()
    assert r["type"] == "reject" and r["code"] == "closed"
    assert "new --rdzv-id" in r["message"]


def test_every_node_succeeding_finishes_the_job(musterd):
    a, b = Agent(musterd), Agent(musterd)
    a.join("ok", "a", min_nodes=2, max_nodes=2)
    b.join("ok", "b", min_nodes=2, max_nodes=2)
    a.recv(), b.recv()
    a.send({"type": "workers_succeeded", "v": 1, "round": 0})
    b.send({"type": "workers_succeeded", "v": 1, "round": 0})
    assert a.recv()["success"] is True and b.recv()["success"] is True


@pytest.mark.parametrize("raw,fragment", [
    (struct.pack(">I", 2 * 1024 * 1024), "over the limit"),
    (struct.pack(">I", 5) + b"{nope", "not a JSON object"),
    (struct.pack(">I", 2) + b"{}", "no \"type\""),
    (None, "unknown message type 'dance'"),
    (None, "'heartbeat' before 'join'"),
    (None, "protocol version 99 is not supported"),
])
def test_bad_input_gets_an_error_and_closes_that_connection_only(musterd, raw, fragment):
    good = Agent(musterd)
    good.join("steady", "g", min_nodes=1, max_nodes=2)
    assert good.recv()["type"] == "assign"
    bad = Agent(musterd)
    if raw is not None:
        bad.sock.sendall(raw)
    elif "dance" in fragment:
        bad.join("steady2", "x", min_nodes=1, max_nodes=1)
        assert bad.recv()["type"] == "assign"
        bad.send({"type": "dance", "v": 1})
    elif "before" in fragment:
        bad.send({"type": "heartbeat", "v": 1})
    else:
        bad.send({"type": "join", "v": 99})
    err = bad.recv()
    assert err["type"] == "error" and fragment in err["message"]
    assert bad.recv() is None  # closed
    # The server and the other job carry on.
    good.send({"type": "workers_succeeded", "v": 1, "round": 0})
    other = Agent(musterd)
    other.join("steady3", "o")
    assert other.recv()["type"] == "assign"


def test_mismatched_nnodes_is_rejected_with_the_job_s_setting(musterd):
    a, b = Agent(musterd), Agent(musterd)
    a.join("mix", "a", min_nodes=2, max_nodes=2)
    b.join("mix", "b", min_nodes=1, max_nodes=4)
    r = b.recv()
    assert r["type"] == "reject" and "--nnodes=2:2" in r["message"]
