"""--health-check: a node runs its check before every join; while it fails the node stays out
of the job (logging the exit status and the output's tail) and tries again after a growing
cooldown; a check that hangs is killed at --health-check-timeout; nothing of a check outlives
a SIGKILLed agent. New flags leave torchrun's abbreviations their meaning."""
import json
import os
import re
import signal
import subprocess
from pathlib import Path

from muster_testing import (metric, DATA, FAST_RDZV_CONF, SLACK, finish, kill_all, read_stderr_until, run_muster,
                            start_muster, start_musterd, stop_musterd, wait_for)

WORKER = str(DATA / "elastic_worker.py")
MUSTERCTL = os.environ.get("MUSTERCTL_BIN") or str(Path(os.environ["MUSTERD_BIN"]).with_name("musterctl"))


def musterctl_job(endpoint, job, *extra):
    r = subprocess.run([MUSTERCTL, "--endpoint", endpoint, "job", job, *extra], capture_output=True, text=True,
                       timeout=60 * SLACK)
    assert r.returncode == 0, r.stderr
    return r.stdout


def agent(endpoint, node, out, *extra, worker_args=()):
    return start_muster(["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                         "--rdzv-id=health", f"--rdzv-conf={FAST_RDZV_CONF}", f"--local-addr=127.0.0.{node}", *extra,
                         WORKER, str(out), "--until-nodes", "2", *worker_args])


def test_a_node_whose_check_fails_stays_out_until_it_passes(tmp_path):
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    ok = tmp_path / "healthy"
    reasons_a, reasons_b = tmp_path / "reasons_a", tmp_path / "reasons_b"
    a = b = None
    try:
        a = agent(endpoint, 1, tmp_path, f"--health-check=echo $MUSTER_HEALTH_CHECK_REASON >> {reasons_a}")
        b = agent(endpoint, 2, tmp_path,
                  f"--health-check=env | grep ^MUSTER_ > {tmp_path}/facts; echo probing the GPUs; test -e {ok}")
        # b's check fails: the job runs on a alone.
        assert wait_for(lambda: (tmp_path / "n1_a0_r0.json").exists(), 60 * SLACK), "the one-node job never ran"
        assert wait_for(lambda: (tmp_path / "facts").exists(), 30 * SLACK)
        # The rendezvous shows b, which is no member, as failing its check.
        failing = r"health check failing: node 127\.0\.0\.2_\w+ \(127\.0\.0\.2\), \d+ times?, last \S+ ago, " \
                  r"(tries again in \S+|trying again): exit 1: probing the GPUs"
        seen = []
        assert wait_for(lambda: seen.append(musterctl_job(endpoint, "health")) or re.search(failing, seen[-1]),
                        30 * SLACK), seen[-1:]
        assert "127.0.0.1" in seen[-1] and "in round" in seen[-1]  # a runs the job meanwhile
        ok.touch()  # b passes its next try, joins, and the job re-forms on two nodes
        results = finish([a, b], timeout=120)
        for rc, _, err in results:
            assert rc == 0, err[-3000:]
        err_b = results[1][2]
        assert "health check failed (exit 1) before joining the rendezvous, so this node stays out of the job; " \
               "trying again in 5 s; its output:" in err_b, err_b[-3000:]
        assert "probing the GPUs" in err_b
        assert "health check passed; joining the rendezvous" in err_b
        assert (tmp_path / "n2_a0_r0.json").exists() and (tmp_path / "n2_a0_r1.json").exists()
        facts = dict(line.split("=", 1) for line in (tmp_path / "facts").read_text().splitlines())
        assert facts["MUSTER_HEALTH_CHECK_REASON"] == "first_join"
        assert facts["MUSTER_NODE_ADDRESS"] == "127.0.0.2"
        assert facts["MUSTER_RDZV_ID"] == "health" and facts["MUSTER_LOCAL_WORLD_SIZE"] == "1"
        # a ran its check before its first join and again before rejoining the re-formed job.
        assert reasons_a.read_text().split() == ["first_join", "rejoin"], reasons_a.read_text()
        # b joined once its check passed: no longer shown as failing.
        after = musterctl_job(endpoint, "health")
        assert "succeeded" in after and "health check failing" not in after, after
    finally:
        # A node whose check never passes would wait on for ever: nothing outlives a failed test.
        kill_all([p for p in (a, b) if p is not None])
        stop_musterd(musterd)


def test_a_job_that_no_node_joined_shows_the_nodes_whose_check_fails(tmp_path):
    musterd, port = start_musterd("--metrics-listen", "127.0.0.1:0")
    metrics = int(musterd.stdout.readline().rsplit(":", 1)[1])
    endpoint = f"127.0.0.1:{port}"
    assert metric(metrics, "musterd_unhealthy_nodes") == 0
    a = b = None
    try:
        a = agent(endpoint, 1, tmp_path, "--health-check=echo 'GPU 3: 12 uncorrectable ECC errors' >&2; exit 3")
        def job_reply():
            # Until a's first report arrives the rendezvous knows no job 'health'.
            r = subprocess.run([MUSTERCTL, "--endpoint", endpoint, "job", "health", "--json"], capture_output=True,
                               text=True, timeout=60 * SLACK)
            return json.loads(r.stdout) if r.returncode == 0 else None
        seen = []
        assert wait_for(lambda: seen.append(job_reply()) or seen[-1], 30 * SLACK), "no report reached the rendezvous"
        reply = seen[-1]
        assert reply["job"]["state"] == "not_joined" and reply["members"] == [], reply
        [node] = reply["unhealthy"]
        assert node["address"] == "127.0.0.1" and node["node"].startswith("127.0.0.1_"), node
        assert node["failures"] >= 1 and node["retry_in_ms"] >= 5000, node
        assert node["detail"] == "exit 3: GPU 3: 12 uncorrectable ECC errors", node
        text = musterctl_job(endpoint, "health")
        assert text.startswith("job 'health': no node has joined it; 1 node(s) stay out, failing their health "
                               "check\n"), text
        # The metrics page is rendered at most so often: it shows the report soon after.
        assert wait_for(lambda: metric(metrics, "musterd_unhealthy_nodes") == 1, 30 * SLACK)
        assert metric(metrics, "musterd_health_reports_total") >= 1
        a.send_signal(signal.SIGTERM)
        rc, _, err = finish([a], timeout=60)[0]
        assert rc != 0
    finally:
        # A node whose check never passes would wait on for ever: nothing outlives a failed test.
        kill_all([p for p in (a, b) if p is not None])
        stop_musterd(musterd)


def test_a_check_that_fails_mid_job_takes_the_node_out_uncounted_until_it_passes(tmp_path):
    musterd, port = start_musterd()
    endpoint = f"127.0.0.1:{port}"
    sick, done = tmp_path / "sick", tmp_path / "done"
    until = ["--until-file", str(done)]
    a = b = None
    try:
        # --max-restarts=0: a departure that counted would end the job.
        a = agent(endpoint, 1, tmp_path, "--max-restarts=0", worker_args=until)
        b = agent(endpoint, 2, tmp_path, "--max-restarts=0", f"--health-check=echo checked; test ! -e {sick}",
                  "--health-check-interval=1", worker_args=until)
        assert wait_for(lambda: len(list(tmp_path.glob("n2_a0_r*.json"))) == 2, 60 * SLACK), "never formed on two"
        first_b = json.loads((tmp_path / "n2_a0_r1.json").read_text())["WORKER_PID"]
        sick.touch()  # b's next periodic check fails: it leaves, the job goes on with a alone
        assert wait_for(lambda: list(tmp_path.glob("n1_a*_r0.json")), 60 * SLACK), "the job did not re-form on one"
        # Out of the job, b is shown failing its check (the periodic run, then the one before its rejoin).
        seen = []
        assert wait_for(lambda: seen.append(musterctl_job(endpoint, "health")) or
                        re.search(r"health check failing: node 127\.0\.0\.2_\w+ \(127\.0\.0\.2\), \d+ times?, "
                                  r".*: exit 1: checked", seen[-1]), 30 * SLACK), seen[-1:]
        sick.unlink()  # b passes its next try and joins again
        # Back on two nodes: b's rank 1 runs again (a new worker), and no
        # restart was counted (TORCHELASTIC_RESTART_COUNT stays 0).
        assert wait_for(lambda: json.loads((tmp_path / "n2_a0_r1.json").read_text())["WORKER_PID"] != first_b,
                        60 * SLACK), "b never came back"
        done.touch()
        results = finish([a, b], timeout=120)
        for rc, _, err in results:
            assert rc == 0, err[-3000:]
        err_b = results[1][2]
        assert "health check failed (exit 1) while its workers ran, so this node leaves the job (the others go on " \
               "without it, uncounted) and joins again once its check passes; its output:\n" in err_b, err_b[-3000:]
        assert "muster] checked\n" in err_b
        assert "this node is out of the job: its health check failed while its workers ran" in err_b
        assert "health check passed; joining the rendezvous" in err_b
        assert "Worker group FAILED" not in results[0][2]
    finally:
        # A node whose check never passes would wait on for ever: nothing outlives a failed test.
        kill_all([p for p in (a, b) if p is not None])
        stop_musterd(musterd)


def test_a_check_that_hangs_is_killed_at_its_timeout():
    agent = start_muster(["--standalone", "--health-check-timeout=0.5", "--health-check=sleep 60", "--no-python",
                          "/bin/true"])
    try:
        said, seen = read_stderr_until(agent, rb"health check failed \(did not finish within --health-check-timeout "
                                              rb"0\.5 s\) before joining the rendezvous", 30 * SLACK)
        assert said, seen.decode(errors="replace")[-3000:]
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30 * SLACK)
        assert agent.returncode != 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_nothing_of_a_check_outlives_a_sigkilled_agent():
    marker = "31.713"  # a sleep of the test's own, to look for afterwards
    agent = start_muster(["--standalone", f"--health-check=sleep {marker}; sleep {marker}", "--no-python", "/bin/true"])
    try:
        assert wait_for(lambda: running(marker), 30 * SLACK), "the check never ran"
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30 * SLACK)
        assert wait_for(lambda: not running(marker), 10 * SLACK), "a check outlived the SIGKILLed agent"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def running(marker):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                    return True
        except OSError:
            pass
    return False


def test_new_flags_keep_torchrun_s_abbreviations_and_refuse_bad_values():
    r = run_muster(["--he"])
    assert r.returncode == 0 and r.stdout.startswith("usage: muster"), r.stderr
    r = run_muster(["--standalone", "--health-check-timeout=never", "--no-python", "/bin/true"])
    assert r.returncode == 1
    assert "--health-check-timeout='never': give the seconds one health check may take" in r.stderr, r.stderr
    r = run_muster(["--standalone", "--health-check=", "--no-python", "/bin/true"])
    assert r.returncode == 1 and "--health-check needs a command" in r.stderr, r.stderr
    r = run_muster(["--standalone", "--health-check-interval=0.5", "--health-check=true", "--no-python", "/bin/true"])
    assert r.returncode == 1 and "give the seconds between health checks while the workers run, at least 1" in r.stderr
    r = run_muster(["--standalone", "--health-check-interval=60", "--no-python", "/bin/true"])
    assert r.returncode == 1 and "--health-check-interval needs a check to run" in r.stderr, r.stderr


def test_a_check_that_leaves_a_process_behind_passes_and_leaves_nothing():
    # The check exits 0 at once; what it started in the background would hold the output pipe
    # open: it is killed with the check's process group.
    marker = "41.517"
    r = run_muster(["--standalone", f"--health-check=sleep {marker} & echo started", "--no-python", "/bin/true"],
                   timeout=60 * SLACK)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "health check failed" not in r.stderr
    assert wait_for(lambda: not running(marker), 10 * SLACK), "the check's background process outlived it"
