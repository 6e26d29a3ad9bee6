"""muster --hostfile / --hosts: one command launches the job on every host
over a real OpenSSH server (Debian's openssh-server, run by the test from a
scratch folder on 127.0.0.2, 127.0.0.3, ...; ssh_hosts.py)."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ssh_hosts
from muster_testing import (DATA, MUSTER, SLACK, RdzvConn, base_env, bridged_namespaces, netns_ip, pid_alive,
                            read_json_files, wait_for)

MUSTERCTL = os.environ.get("MUSTERCTL_BIN") or str(Path(MUSTER).parents[1] / "rendezvous" / "musterctl")
# Run ids unique to this run: another run of this file on the machine is not ours.
RUN = f"sshlaunch{os.getpid()}-"
why_not = ssh_hosts.available()
pytestmark = pytest.mark.skipif(why_not is not None, reason=why_not or "")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    h = ssh_hosts.SshHosts(tmp_path_factory.mktemp("sshd"), 3, slack=SLACK)
    yield h
    h.close()


def launch_env(hosts, **extra):
    env = base_env(**hosts.ssh_env())
    env.update(extra)
    return env


def launch(args, hosts, cwd, env=None, timeout=120):
    return subprocess.run([MUSTER, *args], env=env or launch_env(hosts), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout * SLACK)


def agents_of(run_id):
    """Pids of the remote agents (and anything else) whose command line names run_id."""
    out = subprocess.run(["pgrep", "-f", "--", f"--rdzv-id={run_id}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def remote_agents(run_id):
    """Pids of the agents a launching command started for run_id."""
    out = subprocess.run(["pgrep", "-f", "--", f"^{MUSTER} .*--rdzv-id={run_id} .*--from-launcher"],
                         capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def write_hostfile(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_two_hosts_of_two_workers_get_torchruns_environment_in_host_file_order(hosts, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / ".muster_env").write_text("# carried to every host\nFROM_ENV_FILE=file value\n")
    hostfile = write_hostfile(tmp_path / "hosts", ["# two hosts, the second address first",
                                                   "127.0.0.3 slots=2", "127.0.0.2   slots=2  # trailing comment"])
    env = launch_env(hosts, NCCL_DEBUG="WARN", MY_SETTING="from the shell", UNRELATED_VAR="stays here")
    r = launch(["--hostfile", hostfile, "--rdzv-id=sshjob", "--export", "MY_SETTING", "--export=EXTRA=a b,c",
                str(DATA / "dump_env.py"), str(out)], hosts, tmp_path, env)
    assert r.returncode == 0, r.stderr
    by_rank = {int(d["env"]["RANK"]): d["env"] for d in read_json_files(out).values()}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for rank, e in by_rank.items():
        assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["LOCAL_RANK"] == str(rank % 2) and e["GROUP_RANK"] == str(rank // 2)
        assert e["ROLE_RANK"] == str(rank) and e["ROLE_WORLD_SIZE"] == "4"
        assert e["TORCHELASTIC_RUN_ID"] == "sshjob"
        assert e["MASTER_PORT"] == by_rank[0]["MASTER_PORT"]
        # Node ranks follow the host file: 127.0.0.3 (ssh-node-1) is node 0.
        assert e["MUSTER_NODE_ID"] == ("ssh-node-1" if rank < 2 else "ssh-node-0")
        # Carried: the default prefixes, the .muster_env file, --export; not the rest.
        assert e["NCCL_DEBUG"] == "WARN"
        assert e["FROM_ENV_FILE"] == "file value"
        assert e["MY_SETTING"] == "from the shell" and e["EXTRA"] == "a b,c"
        assert "UNRELATED_VAR" not in e
        # The job's key never reaches a worker.
        assert not [k for k in e if "KEY" in k.upper() and k not in os.environ], e
        # The job runs in the launching command's working directory.
        assert Path(e["PWD"]).resolve() == tmp_path.resolve()
    # The agents' own lines come back prefixed with their host.
    for line in r.stderr.splitlines():
        assert line.startswith("muster:") or re.match(r"^127\.0\.0\.[23]: ", line), line


def test_output_lines_carry_host_and_rank_and_are_never_cut(hosts, tmp_path):
    hostfile = write_hostfile(tmp_path / "hosts", ["127.0.0.2 slots=2", "127.0.0.3 slots=1"])
    r = launch(["--hostfile", hostfile, str(DATA / "chatty.py"), "200", "5000"], hosts, tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    whole = re.compile(r"^(127\.0\.0\.[23]): \[default([01])\]:([01]):(\d+):x{5000}$")
    seen = set()
    for line in lines:
        m = whole.match(line)
        assert m, line[:200]
        assert m.group(2) == m.group(3)
        seen.add((m.group(1), m.group(2), int(m.group(4))))
    assert len(seen) == len(lines) == 3 * 200


def test_a_failing_rank_gives_exit_1_and_one_job_wide_report(hosts, tmp_path):
    hostfile = write_hostfile(tmp_path / "hosts", ["127.0.0.2 slots=2", "127.0.0.3 slots=2"])
    start = time.monotonic()
    r = launch(["--hostfile", hostfile, str(DATA / "fail_worker.py"), "exit3", "3"], hosts, tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("Root Cause (first observed failure):") == 1, r.stderr
    assert "rank      : 3" in r.stderr and "exitcode  : 3" in r.stderr, r.stderr
    assert "muster: the job failed on" in r.stderr
    assert "255" not in r.stderr.split("muster: the job failed on")[1]
    assert time.monotonic() - start < 60 * SLACK


def dumped_envs(hosts, tmp_path, name, args):
    """The workers' environments of a dump_env.py job launched with args."""
    out = tmp_path / name
    out.mkdir()
    r = launch([*args, str(DATA / "dump_env.py"), str(out)], hosts, tmp_path)
    assert r.returncode == 0, r.stderr
    return [d["env"] for d in read_json_files(out).values()]


def test_hosts_option_include_and_exclude_pick_hosts_and_slots(hosts, tmp_path):
    envs = dumped_envs(hosts, tmp_path, "out", ["--hosts=127.0.0.2:2,127.0.0.3:2", "--exclude=127.0.0.2:1"])
    assert len(envs) == 3 and all(e["WORLD_SIZE"] == "3" for e in envs)
    first = [e for e in envs if e["GROUP_RANK"] == "0"]
    assert len(first) == 1 and first[0]["CUDA_VISIBLE_DEVICES"] == "0" and first[0]["MUSTER_NODE_ID"] == "ssh-node-0"

    envs = dumped_envs(hosts, tmp_path, "out2", ["--hosts=127.0.0.2:2,127.0.0.3:2", "--include=127.0.0.3"])
    assert len(envs) == 2 and {e["MUSTER_NODE_ID"] for e in envs} == {"ssh-node-1"}


@pytest.mark.parametrize("lines,message", [
    (["127.0.0.2 slots=two"], "hosts:1: slots 'two' is not a number"),
    (["127.0.0.2", "127.0.0.2 slots=1"], "hosts:2: host 127.0.0.2 is already listed"),
    (["-oProxyCommand=x"], "hosts:1: '-oProxyCommand=x' is not a host name"),
    (["fe80::1 slots=1"], "put an IPv6 address in brackets"),
    (["127.0.0.2 gpus=4"], "hosts:1: unknown field 'gpus'"),
])
def test_a_bad_host_file_is_refused_with_file_line_and_reason(hosts, tmp_path, lines, message):
    hostfile = write_hostfile(tmp_path / "hosts", lines)
    start = time.monotonic()
    r = launch(["--hostfile", hostfile, str(DATA / "dump_env.py"), str(tmp_path)], hosts, tmp_path)
    assert r.returncode == 1
    assert message in r.stderr, r.stderr
    assert time.monotonic() - start < 10 * SLACK


def test_an_unreachable_host_is_named_quickly_and_the_others_stop(hosts, tmp_path):
    # 127.0.0.9 has no sshd: the connection is refused.
    hostfile = write_hostfile(tmp_path / "hosts", ["127.0.0.2 slots=1", "127.0.0.9 slots=1"])
    env = launch_env(hosts)
    env["MUSTER_SSH"] = hosts.ssh_command() + " -p " + str(hosts.port)
    start = time.monotonic()
    r = launch(["--hostfile", hostfile, f"--rdzv-id={RUN}unreach", str(DATA / "sleeper.py"), str(tmp_path)], hosts,
               tmp_path, env)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stderr
    assert "host 127.0.0.9: ssh could not reach or log in to it" in r.stderr, r.stderr
    assert "Connection refused" in r.stderr
    assert took < 30 * SLACK, took
    assert wait_for(lambda: not agents_of(f"{RUN}unreach"), 10 * SLACK), agents_of(f"{RUN}unreach")


@pytest.mark.parametrize("config,says", [
    ("stranger_config", ["Permission denied"]),                            # a key the host does not take
    ("unknown_host_config", ["Host key verification failed", "known_hosts"]),  # batch mode: no question asked
])
def test_a_failing_login_is_named_quickly(hosts, tmp_path, config, says):
    env = launch_env(hosts, MUSTER_SSH=hosts.ssh_command(getattr(hosts, config)()))
    start = time.monotonic()
    r = launch(["--hosts=127.0.0.2", str(DATA / "dump_env.py"), str(tmp_path)], hosts, tmp_path, env)
    assert time.monotonic() - start < 30 * SLACK
    assert r.returncode == 1
    assert "host 127.0.0.2: ssh could not reach or log in to it" in r.stderr, r.stderr
    for text in says:
        assert text in r.stderr, r.stderr


def test_a_working_directory_missing_on_a_host_is_named(tmp_path):
    # The host's sshd runs in a mount namespace where the launch's folder is
    # an empty tmpfs: the folder the launching command runs in is not there.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a host without the launch's folder needs root and unshare (a mount namespace)")
    hidden = tmp_path / "shared"
    work = hidden / "project"
    work.mkdir(parents=True)
    hosts = ssh_hosts.SshHosts(tmp_path / "sshd", 1, first=20, slack=SLACK, hide=str(hidden))
    try:
        r = launch(["--hosts=127.0.0.20", str(DATA / "dump_env.py"), str(work)], hosts, work)
    finally:
        hosts.close()
    assert r.returncode == 1
    assert f"host 127.0.0.20: the working directory {work} is missing there" in r.stderr, r.stderr
    assert f"the working directory {work} does not exist on" in r.stderr


def test_muster_missing_on_a_host_and_another_version_are_named(hosts, tmp_path):
    env = launch_env(hosts, MUSTER_REMOTE_PATH="/nonexistent/bin/muster")
    r = launch(["--hosts=127.0.0.2", str(DATA / "dump_env.py"), str(tmp_path)], hosts, tmp_path, env)
    assert r.returncode == 1
    assert "muster is not installed there" in r.stderr, r.stderr

    # A host whose muster is of another version (a wrapper that reports one).
    other = tmp_path / "other_muster"
    other.write_text("#!/bin/sh\nfor a; do shift; case $a in --from-launcher=*) a=--from-launcher=0.0.0-other;; "
                     f"esac; set -- \"$@\" \"$a\"; done\nexec {MUSTER} \"$@\"\n")
    other.chmod(0o755)
    env = launch_env(hosts, MUSTER_REMOTE_PATH=str(other))
    r = launch(["--hosts=127.0.0.2", str(DATA / "dump_env.py"), str(tmp_path)], hosts, tmp_path, env)
    assert r.returncode == 1
    assert "install the same muster on every host" in r.stderr, r.stderr


def _start_sleeping_job(hosts, tmp_path, run_id, extra=()):
    out = tmp_path / "pids"
    out.mkdir()
    hostfile = write_hostfile(tmp_path / "hosts", ["127.0.0.2 slots=2", "127.0.0.3 slots=1"])
    proc = subprocess.Popen([MUSTER, "--hostfile", hostfile, f"--rdzv-id={run_id}", "--shutdown-timeout=5", *extra,
                             str(DATA / "sleeper.py"), str(out), "hold=300"],
                            env=launch_env(hosts, LOGLEVEL="INFO"), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(list(out.glob("pid_*"))) == 3 or proc.poll() is not None, 60 * SLACK), \
            (proc.poll(), list(out.iterdir()))
        assert proc.poll() is None
        pids = [int(p.read_text().split()[0]) for p in out.glob("pid_*")]
        assert len(agents_of(run_id)) >= 2
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, pids


@pytest.fixture
def launched():
    """Launching commands a test started: killed at its end if still there."""
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate()


def _nothing_left(run_id, pids, timeout, but=None):
    """Every remote agent, ssh session and worker of run_id is gone (all but `but`)."""
    return wait_for(lambda: not [p for p in agents_of(run_id) if p != but] and not any(pid_alive(p) for p in pids),
                    timeout)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launching_command_ends_every_remote_agent_and_worker(hosts, tmp_path, how, launched):
    run_id = f"{RUN}sig{int(how)}"
    proc, pids = _start_sleeping_job(hosts, tmp_path, run_id)
    launched.append(proc)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=60 * SLACK)
    assert proc.returncode == 1, err
    assert f"received {signal.Signals(how).name}: stopping the job on every host" in err
    assert _nothing_left(run_id, pids, 20 * SLACK), (agents_of(run_id), [p for p in pids if pid_alive(p)])


def test_a_killed_launching_command_leaves_nothing_on_any_host(hosts, tmp_path, launched):
    proc, pids = _start_sleeping_job(hosts, tmp_path, f"{RUN}killed")
    launched.append(proc)
    proc.kill()
    proc.wait()
    assert _nothing_left(f"{RUN}killed", pids, 30 * SLACK), (agents_of(f"{RUN}killed"),
                                                            [p for p in pids if pid_alive(p)])


def test_a_silent_launching_command_is_taken_for_gone(hosts, tmp_path, launched):
    # A stopped launcher sends no heartbeats while its ssh sessions stay up:
    # what a dropped network looks like to the remote agents.
    proc, pids = _start_sleeping_job(hosts, tmp_path, f"{RUN}silent")
    launched.append(proc)
    proc.send_signal(signal.SIGSTOP)
    try:
        assert _nothing_left(f"{RUN}silent", pids, (10 + 20) * SLACK, but=proc.pid), (agents_of(f"{RUN}silent"),
                                                                  [p for p in pids if pid_alive(p)])
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.communicate(timeout=30 * SLACK)


def test_an_outsider_cannot_join_the_launched_job_and_musterctl_sees_it_with_the_key(hosts, tmp_path, launched):
    proc, pids = _start_sleeping_job(hosts, tmp_path, f"{RUN}guarded")
    launched.append(proc)
    try:
        found = None
        deadline = time.monotonic() + 10 * SLACK
        seen = ""
        while found is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            seen += line
            found = re.search(r"musterctl --endpoint=(127\.0\.0\.1:(\d+)) --auth-key-file=(\S+) job " + RUN + "guarded",
                              line)
        assert found, seen
        endpoint, port, key_file = found.group(1), int(found.group(2)), found.group(3)
        assert os.stat(key_file).st_mode & 0o077 == 0
        # The operator, with the job's key file, sees the job and its two hosts.
        shown = subprocess.run([MUSTERCTL, f"--endpoint={endpoint}", f"--auth-key-file={key_file}", "--json", "job",
                                f"{RUN}guarded"], capture_output=True, text=True, timeout=30 * SLACK)
        assert shown.returncode == 0, shown.stderr
        job = json.loads(shown.stdout)
        assert len(job["members"]) == 2, job
        # Without it: refused.
        plain = subprocess.run([MUSTERCTL, f"--endpoint={endpoint}", "job", f"{RUN}guarded"], capture_output=True,
                               text=True, timeout=30 * SLACK, env=base_env())
        assert plain.returncode != 0
        stranger = RdzvConn(port)
        stranger.join(f"{RUN}guarded", "intruder", min_nodes=1, max_nodes=3)
        refused = stranger.recv()
        assert refused is not None and refused["type"] == "error" and refused["code"] == "auth_failed", refused
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60 * SLACK)
    assert _nothing_left(f"{RUN}guarded", pids, 20 * SLACK)
    assert not os.path.exists(key_file), "the key file goes with the job"


def test_an_elastic_job_goes_on_without_an_unreachable_host(hosts, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(hosts)
    env["MUSTER_SSH"] = hosts.ssh_command() + " -p " + str(hosts.port)
    r = launch(["--hosts=127.0.0.2,127.0.0.9", "--nnodes=1:2", "--rdzv-conf=last_call_timeout=1",
                str(DATA / "dump_env.py"), str(out)], hosts, tmp_path, env)
    assert "the job goes on without it" in r.stderr, r.stderr
    assert len(read_json_files(out)) == 1
    # The job ran to its end on the host it had: the job's status.
    assert r.returncode == 0, r.stderr
    assert "muster: the job went on without 1 of 2 hosts" in r.stderr


NETNS_SUBNET = "198.18.7"  # RFC 2544 benchmarking addresses, only ever inside the test's namespaces


@pytest.fixture
def netns_hosts(tmp_path):
    """A launching host and two hosts in network namespaces of their own, on a
    bridge in a fourth (the switch), each host with its own sshd."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip)")
    with bridged_namespaces(f"s{os.getpid() % 100000}", NETNS_SUBNET, 3) as (sw, names):
        hosts = ssh_hosts.SshHosts(tmp_path / "sshd", 2, slack=SLACK,
                                   netns={f"{NETNS_SUBNET}.2": names[1], f"{NETNS_SUBNET}.3": names[2]})
        try:
            yield hosts, sw, names[0]
        finally:
            hosts.close()


def test_a_dropped_network_to_the_launching_host_ends_the_job_on_every_host(netns_hosts, tmp_path):
    hosts, switch, launcher_ns = netns_hosts
    out = tmp_path / "pids"
    out.mkdir()
    run_id = f"{RUN}netdrop"
    proc = subprocess.Popen(["ip", "netns", "exec", launcher_ns, MUSTER,
                             f"--hosts={NETNS_SUBNET}.2:2,{NETNS_SUBNET}.3:1", f"--rdzv-id={run_id}",
                             "--shutdown-timeout=5", str(DATA / "sleeper.py"), str(out), "hold=300"],
                            env=launch_env(hosts), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert wait_for(lambda: len(list(out.glob("pid_*"))) == 3 or proc.poll() is not None, 60 * SLACK), \
            (proc.poll(), proc.poll() is not None and proc.communicate())
        pids = [int(p.read_text().split()[0]) for p in out.glob("pid_*")]
        # The launching host's link goes down: nothing is closed, nothing arrives.
        cut = time.monotonic()
        netns_ip("link", "set", "v1", "down", ns=switch)
        # The remote agents hear no heartbeat and end their jobs (the ssh
        # clients on the launching host stay until their keep-alives give up).
        assert wait_for(lambda: not remote_agents(run_id) and not any(pid_alive(p) for p in pids), 40 * SLACK), \
            (remote_agents(run_id), [p for p in pids if pid_alive(p)])
        took = time.monotonic() - cut
        assert took >= 9, f"the remote agents ended after {took:.1f} s, before their 10 s silence limit"
        # The launching command's ssh sessions give up on the silent hosts (ssh's
        # keep-alives): it names them and exits with the job's failure.
        _, err = proc.communicate(timeout=60 * SLACK)
        assert proc.returncode == 1, err
        assert "its ssh connection was lost" in err or "its agent ended" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
