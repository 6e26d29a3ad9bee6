"""A node that dies is a membership change, not a failure of a healthy rank: two agents run a
gloo job through musterd with --nnodes=1:2 and --max-restarts=0; one agent is killed with
SIGKILL. The survivor's worker fails on the broken collective, the rendezvous holds that
failure until the dead node is counted lost (its connection closed without leave: seconds, not
the dead-after window), and the job re-forms on the survivor with no restart counted; the lost
node is named. A graceful SIGTERM of the same agent gives the same outcome."""
import os
import signal
import subprocess
import urllib.request

import pytest

from muster_testing import (DATA, MUSTER, SLACK, base_env, kill_tree_of, musterd_log, start_musterd, stop_musterd,
                            wait_for)

pytest.importorskip("torch", reason="the compatibility tests need PyTorch: scripts/install-deps.sh installs it")

WORKER = str(DATA / "gloo_loss_worker.py")
# Dead after 6 x 5 s of silence: a loss decided by the closed connection shows in far less.
CONF = "last_call_timeout=1,keep_alive_interval=5,keep_alive_max_attempt=6,join_timeout=120"


def agent(endpoint, node, out):
    return subprocess.Popen([MUSTER, "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0",
                             "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=loss",
                             f"--rdzv-conf={CONF}", f"--local-addr=127.0.0.{node}", WORKER, str(out)],
                            env=base_env(GLOO_SOCKET_IFNAME="lo"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_lost_node_re_forms_the_job_without_a_restart_and_is_named(tmp_path, how):
    musterd, port = start_musterd("--metrics-listen", "127.0.0.1:0")
    metrics = int(musterd.stdout.readline().rsplit(":", 1)[1])
    survivor = victim = None
    try:
        survivor = agent(f"127.0.0.1:{port}", 1, tmp_path)
        victim = agent(f"127.0.0.1:{port}", 2, tmp_path)
        assert wait_for(lambda: (tmp_path / "n2_a0_r0").exists() and (tmp_path / "n2_a0_r1").exists(),
                        120 * SLACK), "the job of two nodes never ran"
        victim_worker = int((tmp_path / "n2_a0_r1").read_text())
        victim.send_signal(how)
        victim.wait(timeout=60 * SLACK)
        # The survivor's worker failed on the broken collective; the job re-formed on one node,
        # with no restart counted (--max-restarts=0 would have ended it).
        out, err = survivor.communicate(timeout=120 * SLACK)
        assert survivor.returncode == 0, err[-4000:]
        assert (tmp_path / "n1_a0_r0").exists(), sorted(p.name for p in tmp_path.iterdir())
        assert "ChildFailedError" not in err, err[-4000:]
        if how == signal.SIGKILL:
            assert "node 127.0.0.2_" in err and "(127.0.0.2) closed its connection without leaving" in err, err[-4000:]
        else:
            assert "left the job" in err, err[-4000:]
        log = musterd_log(musterd)
        assert "127.0.0.2" in log and ("closed its connection without leaving" in log or "left the job" in log), log
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10 * SLACK) as r:
            text = r.read().decode()
        reason = "closed" if how == signal.SIGKILL else "left"
        assert f'musterd_node_losses_total{{reason="{reason}"}} 1' in text, text
        assert "musterd_restarts_total 0" in text, text
        kill_tree_of([victim_worker])
    finally:
        for p in (survivor, victim):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        stop_musterd(musterd)
