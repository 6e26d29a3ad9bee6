"""Bad nodes excluded (docs/failures.md): a real gloo job through musterd in which one node's
workers always fail. With --rdzv-conf exclude_after=2 the rendezvous takes that node out after
it was the root cause of two attempts in a row, and the job finishes on the healthy nodes within
its restart budget (torchrun, on the same script and nodes, spends its restarts and fails); a
spare steps into its place; a worker can ask for its own node's exclusion with
--exclude-exit-code; and no node is excluded where the job could not go on without it."""
import os
import subprocess
import time
from pathlib import Path

import pytest

from muster_testing import (metric, DATA, MUSTER, SLACK, base_env, free_port, musterd_log, port_open, start_musterd,
                            stop_musterd, torchrun_path, wait_for)

pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")

WORKER = str(DATA / "bad_node_worker.py")
MUSTERCTL = os.environ.get("MUSTERCTL_BIN") or str(Path(os.environ["MUSTERD_BIN"]).with_name("musterctl"))
# A cooldown longer than any test: an excluded node stays out until the test stops it. The
# last call leaves both nodes time to join the first round.
CONF = "last_call_timeout=5,join_timeout=120,exclude_cooldown=600"
TORCHRUN_CONF = "last_call_timeout=5,join_timeout=120"


def launch(launcher, endpoint, name, node, out, nnodes, conf, *extra, bad=False, env=None):
    return subprocess.Popen([*launcher, f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             f"--rdzv-endpoint={endpoint}", "--rdzv-id=exclusion", f"--rdzv-conf={conf}",
                             f"--local-addr=127.0.0.{node}", *extra, WORKER, str(out)],
                            env=base_env(GLOO_SOCKET_IFNAME="lo", MUSTER_TEST_NODE=name,
                                         MUSTER_TEST_BAD="1" if bad else "0", **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"an agent did not finish within {timeout} s:\n{err[-4000:]}")
    return proc.returncode, err


def kill_all(procs):
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


def ctl(endpoint, *args):
    return subprocess.run([MUSTERCTL, "--endpoint", endpoint, *args], capture_output=True, text=True,
                          timeout=60 * SLACK)


def test_a_node_that_always_fails_is_excluded_and_the_job_finishes_where_torchrun_fails(tmp_path):
    musterd, port = start_musterd("--metrics-listen", "127.0.0.1:0")
    metrics = int(musterd.stdout.readline().rsplit(":", 1)[1])
    endpoint = f"127.0.0.1:{port}"
    conf = CONF + ",exclude_after=2"
    good = bad = None
    try:
        began = time.monotonic()
        good = launch([MUSTER], endpoint, "good", 1, tmp_path, "1:2", conf, "--max-restarts=3")
        bad = launch([MUSTER], endpoint, "bad", 2, tmp_path, "1:2", conf, "--max-restarts=3", bad=True)
        rc, err = collect(good, 180 * SLACK)
        took = time.monotonic() - began
        # Attempts 0 and 1 failed on bad; it was excluded, and attempt 2 ran on good alone.
        assert rc == 0, err[-4000:]
        assert (tmp_path / "done_good_a2_n1").exists(), sorted(p.name for p in tmp_path.iterdir())
        assert (tmp_path / "start_bad_a0_n2").exists() and (tmp_path / "start_bad_a1_n2").exists()
        assert not list(tmp_path.glob("start_bad_a2_*"))
        assert "the workers of node 127.0.0.2_" in err, err[-4000:]
        # bad stayed a member while it waited out its cooldown: it hears at once that the job
        # succeeded without it, and ends with 0 (it did its part by stepping aside).
        rc_bad, err_bad = collect(bad, 60 * SLACK)
        assert rc_bad == 0, err_bad[-4000:]
        assert "this node is excluded from the job for 600 s: it was the root cause of 2 failed attempts in a row " \
               "(exclude_after=2); this node stops its workers and joins again as a spare in 600 s" in err_bad, \
            err_bad[-4000:]
        log = musterd_log(musterd)
        assert "excluded node 127.0.0.2_" in log and "(127.0.0.2) for 600 s (exclusion 1 of this address)" in log, log
        assert metric(metrics, "musterd_nodes_excluded_total") == 1
        assert metric(metrics, "musterd_restarts_total") == 2
    finally:
        kill_all([good, bad])
        stop_musterd(musterd)

    # torchrun, the same script on the same two nodes: it restarts onto the bad node, and the
    # job never finishes (on this torch its agents fail, or hang in the restarted group).
    torchrun = torchrun_path()
    assert torchrun, "torch's torchrun is missing next to the test's Python (scripts/install-deps.sh installs it)"
    ref = tmp_path / "torchrun"
    ref.mkdir()
    t_port = free_port(hold=False)
    t_endpoint = f"127.0.0.1:{t_port}"
    agents = []
    try:
        agents.append(launch([torchrun], t_endpoint, "good", 1, ref, "1:2", TORCHRUN_CONF, "--max-restarts=3"))
        # The first agent hosts the rendezvous: the second comes once it listens.
        assert wait_for(lambda: port_open("127.0.0.1", t_port) or agents[0].poll() is not None, 60 * SLACK)
        agents.append(launch([torchrun], t_endpoint, "bad", 2, ref, "1:2", TORCHRUN_CONF, "--max-restarts=3",
                             bad=True))
        assert wait_for(lambda: (ref / "start_bad_a0_n2").exists(), 120 * SLACK), \
            "torchrun's job never formed on both nodes"
        # As long as muster took to finish, and more: torchrun has not finished the job.
        wait_for(lambda: all(a.poll() is not None for a in agents), max(60.0 * SLACK, 3 * took))
        finished = [a.returncode == 0 for a in agents if a.poll() is not None]
        assert not any(finished) and not list(ref.glob("done_*")), sorted(p.name for p in ref.iterdir())
    finally:
        kill_all(agents)


def test_a_spare_takes_the_place_of_an_excluded_node(tmp_path):
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    conf = CONF + ",exclude_after=2"
    good = bad = spare = None
    try:
        # good's check holds its rejoin after the first attempt until bad's worker has started the
        # second one, so the next round is bad's and the spare's: bad fails its second attempt in
        # a row, with a spare waiting.
        hold = f"test ! -e {tmp_path}/start_good_a0_n2 || test -e {tmp_path}/start_bad_a1_n2"
        good = launch([MUSTER], endpoint, "good", 1, tmp_path, "2:2", conf, "--max-restarts=3",
                      f"--health-check={hold}")
        bad = launch([MUSTER], endpoint, "bad", 3, tmp_path, "2:2", conf, "--max-restarts=3", bad=True)
        assert wait_for(lambda: (tmp_path / "start_bad_a0_n2").exists(), 120 * SLACK), "the job never formed"
        spare = launch([MUSTER], endpoint, "spare", 2, tmp_path, "2:2", conf, "--max-restarts=3")
        results = [collect(p, 180 * SLACK) for p in (good, spare)]
        for rc, err in results:
            assert rc == 0, err[-4000:]
        done = sorted(p.name for p in tmp_path.glob("done_*"))
        assert len(done) == 2 and {d.split("_")[1] for d in done} == {"good", "spare"}, done
        assert all(d.endswith("_n2") for d in done), done
        assert int(done[0].split("_a")[1].split("_")[0]) <= 3  # within the restart budget
        # Attempts 0 and 1 failed on bad (the second with the spare), attempt 2 ran on good and the spare.
        assert all("_a2_" in d for d in done) and (tmp_path / "start_bad_a1_n2").exists(), done
        rc_bad, err_bad = collect(bad, 60 * SLACK)
        assert rc_bad == 0, err_bad[-4000:]
        assert "this node is excluded from the job for 600 s: it was the root cause of 2 failed attempts in a row" \
            in err_bad, err_bad[-4000:]
    finally:
        kill_all([good, bad, spare])
        stop_musterd(musterd)


def test_a_worker_asks_for_its_node_s_exclusion_with_its_exit_code(tmp_path):
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    hold = tmp_path / "hold"
    good = bad = None
    try:
        good = launch([MUSTER], endpoint, "good", 1, tmp_path, "1:2", CONF, "--max-restarts=1",
                      env={"MUSTER_TEST_HOLD": str(hold)})
        bad = launch([MUSTER], endpoint, "bad", 2, tmp_path, "1:2", CONF, "--max-restarts=1",
                     "--exclude-exit-code=75", bad=True, env={"MUSTER_TEST_EXIT": "75"})
        # One failed attempt was enough: good runs alone at restart 1 while bad waits out its cooldown.
        assert wait_for(lambda: (tmp_path / "start_good_a1_n1").exists(), 120 * SLACK), \
            sorted(p.name for p in tmp_path.iterdir())
        shown = ctl(endpoint, "job", "exclusion")
        assert shown.returncode == 0, shown.stderr
        assert "excluded: node 127.0.0.2_" in shown.stdout and "(127.0.0.2), 1 time, for another" in shown.stdout, \
            shown.stdout
        assert "exited with code 75, which asks for its node's exclusion (--exclude-exit-code)" in shown.stdout
        hold.touch()
        rc, err = collect(good, 120 * SLACK)
        assert rc == 0, err[-4000:]
        rc_bad, err_bad = collect(bad, 60 * SLACK)
        assert rc_bad == 0, err_bad[-4000:]
        assert "worker 0 exited with 75 (--exclude-exit-code): asking the rendezvous to exclude this node" in err_bad
        assert "this node is excluded from the job for 600 s" in err_bad, err_bad[-4000:]
    finally:
        kill_all([good, bad])
        stop_musterd(musterd)


def test_no_node_is_excluded_where_the_job_could_not_go_on_without_it(tmp_path):
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    conf = CONF + ",exclude_after=1"
    good = bad = None
    try:
        good = launch([MUSTER], endpoint, "good", 1, tmp_path, "2:2", conf, "--max-restarts=1")
        bad = launch([MUSTER], endpoint, "bad", 2, tmp_path, "2:2", conf, "--max-restarts=1", bad=True)
        rc_good, err_good = collect(good, 180 * SLACK)
        rc_bad, err_bad = collect(bad, 60 * SLACK)
        # No spare and --nnodes=2:2: bad stays, the budget decides as it would without exclude_after.
        assert rc_good == 1 and rc_bad == 1, err_good[-4000:]
        assert "excluded from the job" not in err_bad, err_bad[-4000:]
        log = musterd_log(musterd)
        assert "(127.0.0.2) is not excluded although it was the root cause of 1 failed attempts in a row " \
               "(exclude_after=1): without it 1 node would remain, fewer than --nnodes' minimum of 2, and no spare " \
               "waits" in log, log[-4000:]
    finally:
        kill_all([good, bad])
        stop_musterd(musterd)
