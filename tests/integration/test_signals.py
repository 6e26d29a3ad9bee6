"""Signal forwarding, the shutdown grace period, and nothing left behind."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from muster_testing import DATA, MUSTER, SLACK, base_env, pid_alive, start_muster, wait_for

SLEEPER = str(DATA / "sleeper.py")


def pids_in(directory, prefix):
    out = []
    for p in Path(directory).glob(f"{prefix}_*"):
        out += [int(x) for x in p.read_text().split()]
    return out


def start_sleepers(tmp_path, nproc, *flags, extra=()):
    agent = start_muster([f"--nproc-per-node={nproc}", *extra, SLEEPER, str(tmp_path), *flags])
    started = wait_for(lambda: len(pids_in(tmp_path, "pid")) == nproc, 30 * SLACK)
    assert started, "workers did not start"
    return agent


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_a_handled_signal_is_forwarded_as_is_and_the_agent_exits_1(tmp_path, signo):
    agent = start_sleepers(tmp_path, 2)
    agent.send_signal(signo)
    out, err = agent.communicate(timeout=30 * SLACK)
    assert agent.returncode == 1
    name = signal.Signals(signo).name
    for rank in range(2):
        assert (tmp_path / f"signal_{rank}").read_text().split() == [name]
    assert f"Received {name} death signal, shutting down workers" in err
    assert f"SignalException: Process {agent.pid} got signal: {int(signo)}" in err
    assert len(re.findall(rf"Sending process \d+ closing signal {name}", err)) == 2
    assert not any(pid_alive(p) for p in pids_in(tmp_path, "pid"))


def test_signals_to_handle_chooses_what_is_forwarded(tmp_path):
    agent = start_sleepers(tmp_path, 1, extra=["--signals-to-handle=SIGUSR1"])
    agent.send_signal(signal.SIGUSR1)
    agent.communicate(timeout=30 * SLACK)
    assert agent.returncode == 1
    assert (tmp_path / "signal_0").read_text().split() == ["SIGUSR1"]


def test_a_worker_ignoring_sigterm_is_killed_after_the_shutdown_timeout(tmp_path):
    agent = start_sleepers(tmp_path, 2, "ignore-term", extra=["--shutdown-timeout=2"])
    sent = time.monotonic()
    agent.send_signal(signal.SIGTERM)
    out, err = agent.communicate(timeout=30 * SLACK)
    waited = time.monotonic() - sent
    assert agent.returncode == 1
    # Both got SIGTERM, survived it, and were killed once the grace ran out.
    for rank in range(2):
        assert (tmp_path / f"signal_{rank}").read_text().split() == ["SIGTERM"]
    assert len(re.findall(r"Unable to shutdown process \d+ via SIGTERM, forcefully exiting via SIGKILL", err)) == 2
    assert waited >= 2.0  # the grace period was honoured, not cut short
    assert not any(pid_alive(p) for p in pids_in(tmp_path, "pid"))


def test_the_grace_period_also_reads_torch_elastic_shutdown_timeout(tmp_path):
    agent = subprocess.Popen(
        [MUSTER, "--nproc-per-node=1", SLEEPER, str(tmp_path), "ignore-term"],
        env=base_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: len(pids_in(tmp_path, "pid")) == 1, 30 * SLACK)
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=30 * SLACK)
    assert "forcefully exiting via SIGKILL" in err


def test_sigkill_of_the_agent_leaves_no_process_behind(tmp_path):
    agent = start_sleepers(tmp_path, 2, "spawn-children")
    assert wait_for(lambda: len(pids_in(tmp_path, "daemon")) == 2, 30 * SLACK)
    everything = pids_in(tmp_path, "pid") + pids_in(tmp_path, "child") + pids_in(tmp_path, "daemon")
    assert len(everything) == 8 and all(pid_alive(p) for p in everything)
    agent.kill()
    agent.communicate(timeout=10)
    gone = wait_for(lambda: not any(pid_alive(p) for p in everything), 1.0 * SLACK)
    assert gone, [p for p in everything if pid_alive(p)]


def test_a_worker_tree_is_cleaned_up_when_the_worker_exits(tmp_path):
    # The worker leaves a detached daemon behind and exits 0: the daemon goes with it.
    script = tmp_path / "leaver.sh"
    script.write_text("#!/bin/sh\nsetsid sh -c 'sleep 1000' &\necho $! > %s/leftover\nsleep 0.2\n" % tmp_path)
    script.chmod(0o755)
    r = subprocess.run([MUSTER, "--no-python", str(script)], env=base_env(),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    leftover = int((tmp_path / "leftover").read_text())
    assert wait_for(lambda: not pid_alive(leftover), 1.0 * SLACK)


def test_a_signal_during_start_up_is_handled_before_workers_start(tmp_path):
    # SIGTERM is pending when muster starts: it must stop muster cleanly, not kill it,
    # and no worker may run.
    def block_sigterm():
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])

    marker = tmp_path / "ran"
    agent = subprocess.Popen([MUSTER, "--no-python", "sh", "-c", f"touch {marker}"],
                             env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: (block_sigterm(), os.kill(os.getpid(), signal.SIGTERM)))
    _, err = agent.communicate(timeout=30)
    assert agent.returncode == 1
    assert "Received SIGTERM death signal" in err
    assert not marker.exists()


def test_a_terminal_interrupt_reaches_only_the_agent_which_forwards_it(tmp_path):
    # Workers lead their own sessions; SIGINT to the agent's process group does
    # not reach them directly, only through the agent.
    agent = start_muster(["--nproc-per-node=2", SLEEPER, str(tmp_path)], start_new_session=True)
    assert wait_for(lambda: len(pids_in(tmp_path, "pid")) == 2, 30 * SLACK)
    os.killpg(agent.pid, signal.SIGINT)
    agent.communicate(timeout=30 * SLACK)
    assert agent.returncode == 1
    for rank in range(2):
        assert (tmp_path / f"signal_{rank}").read_text().split() == ["SIGINT"]


def test_a_worker_inherits_no_descriptor_of_the_agent(tmp_path):
    # The agent holds the store's listening socket, pipes and control sockets.
    # "$$$$": the argument macros turn "$$" into "$", so the shell sees "$$".
    r = subprocess.run([MUSTER, "--nproc-per-node=3", "-t", "1", "--no-python", "sh", "-c", "ls /proc/$$$$/fd"],
                       env=base_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    for rank in range(3):
        fds = sorted(int(l.split(":", 1)[1]) for l in r.stdout.splitlines() if l.startswith(f"[default{rank}]:"))
        assert fds == [0, 1, 2], fds


def test_killing_a_shim_takes_its_worker_down_and_fails_the_group(tmp_path):
    agent = start_sleepers(tmp_path, 2)
    worker = pids_in(tmp_path, "pid")[0]
    with open(f"/proc/{worker}/stat") as f:
        shim = int(f.read().rsplit(")", 1)[1].split()[2])
    os.kill(shim, signal.SIGKILL)
    _, err = agent.communicate(timeout=30 * SLACK)
    assert agent.returncode == 1
    assert wait_for(lambda: not pid_alive(worker), 1.0 * SLACK)
    assert "ChildFailedError" in err
