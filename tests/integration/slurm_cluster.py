"""A real Slurm cluster of two nodes on this one host, for the tests: munged,
slurmctld in this network namespace, and one slurmd per node, each in a network
namespace, UTS namespace (its own host name) and mount namespace (its own
/etc/hosts naming both nodes) of its own, joined by a bridge. Everything lives
under one scratch folder: its own munge key and socket, slurm.conf (clients find
it through SLURM_CONF), state, spool and logs; nothing of the host's Slurm or
munge set-up is read or changed, and no /etc file is touched.

Needs root (network namespaces, a bridge, slurmd as root) and Debian's slurm-wlm
and munge (scripts/install-deps.sh installs them)."""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from muster_testing import free_port

SUBNET = "198.51.100"  # TEST-NET-2: documentation addresses, only ever on the test's bridge and namespaces
CONTROLLER_ADDR = f"{SUBNET}.254"
NODES = ("sn1", "sn2")
TOOLS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scancel", "squeue", "sinfo", "scontrol")


def missing_capability():
    """Why this host cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "a Slurm cluster in network namespaces needs root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"mstprobe{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        return f"network namespaces cannot be created here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


def missing_tools():
    return [t for t in TOOLS if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]


def _tool(name):
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _ip(*args):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Cluster:
    """Start with start(), stop with stop() (which also runs when start fails)."""

    def __init__(self, work, slack=1.0):
        self.work = Path(work)
        self.slack = slack
        tag = f"ms{os.getpid() % 100000}"
        self.bridge = f"{tag}br"
        self.netns = [f"{tag}{n}" for n in NODES]
        self.procs = []  # (name, Popen)
        self.conf = self.work / "slurm.conf"
        self.env = None

    # ---- set-up -------------------------------------------------------------
    def start(self):
        try:
            for d in ("state", "spool", "log"):
                (self.work / d).mkdir()
            self._network()
            self._munge()
            self._config()
            self._daemons()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{CONTROLLER_ADDR}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.netns, start=1):
            _ip("netns", "add", ns)
            veth = f"{self.bridge[:-2]}v{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        hosts = Path("/etc/hosts").read_text().rstrip("\n").splitlines()
        hosts += [f"{SUBNET}.{i} {n}" for i, n in enumerate(NODES, start=1)]
        hosts.append(f"{CONTROLLER_ADDR} {socket.gethostname()}-ctl")
        (self.work / "hosts").write_text("\n".join(hosts) + "\n")

    def _munge(self):
        m = self.work / "munge"
        m.mkdir(mode=0o700)
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = m / "munge.socket"
        self._spawn("munged", [_tool("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={self.work / 'log' / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), 20, "munged to create its socket", self.work / "log" / "munged.log")

    def _config(self):
        w = self.work
        # Outside the ephemeral range, and not held: slurmctld is not known to bind with SO_REUSEADDR.
        self.ctl_port = free_port(hold=False)
        lines = [
            "ClusterName=mustertest",
            f"SlurmctldHost={socket.gethostname()}({CONTROLLER_ADDR})",
            f"SlurmctldPort={self.ctl_port}",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "KillWait=10",
            "MinJobAge=300",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "MessageTimeout=20",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool'}/%n",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={w / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for i, n in enumerate(NODES, start=1):
            lines.append(f"NodeName={n} NodeAddr={SUBNET}.{i} NodeHostname={n} CPUs=2 State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP "
                     "OverSubscribe=FORCE:4")
        self.conf.write_text("\n".join(lines) + "\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _daemons(self):
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.find("UP") >= 0, 30,
                   "slurmctld to answer", self.work / "log" / "slurmctld.log")
        for node, ns in zip(NODES, self.netns):
            setup = (f'hostname {node} && mount --bind "{self.work / "hosts"}" /etc/hosts && '
                     f'exec "{_tool("slurmd")}" -D -f "{self.conf}" -N {node}')
            self._spawn(f"slurmd-{node}", ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount",
                                           "--propagation", "private", "sh", "-c", setup])

        def idle():
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            return all(states.get(n) == "idle" for n in NODES)

        self._wait(idle, 60, "both slurmd to register idle", self.work / "log" / "slurmctld.log")

    def _spawn(self, name, cmd):
        log = open(self.work / "log" / f"{name}.out", "wb")
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "SLURM_CONF": str(self.conf)}, start_new_session=True)
        log.close()
        self.procs.append((name, p))
        return p

    def _wait(self, predicate, seconds, what, log=None):
        deadline = time.monotonic() + seconds * self.slack
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}"
                                       + self._tail(log))
            if predicate():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {seconds * self.slack:.0f} s waiting for {what}" + self._tail(log))

    @staticmethod
    def _tail(log):
        if log is None or not Path(log).exists():
            return ""
        return "\n--- " + str(log) + ":\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-30:])

    # ---- use ----------------------------------------------------------------
    def run(self, cmd, timeout=60, check=True, **kwargs):
        """A Slurm client command against this cluster."""
        r = subprocess.run(cmd, env=kwargs.pop("env", self.env), capture_output=True, text=True,
                           timeout=timeout * self.slack, **kwargs)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def job_state(self, job):
        r = self.run(["scontrol", "show", "job", str(job)], check=False)
        for word in r.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return None

    def wait_job_done(self, job, seconds):
        deadline = time.monotonic() + seconds * self.slack
        state = None
        while time.monotonic() < deadline:
            state = self.job_state(job)
            if state not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.25)
        raise AssertionError(f"job {job} still {state} after {seconds * self.slack:.0f} s")

    # ---- tear-down ----------------------------------------------------------
    def stop(self):
        """Everything the cluster started goes, each step on its own so that one failing
        does not leave the rest behind: every process in the nodes' namespaces (slurmd,
        slurmstepd and the jobs' tasks, which live in sessions of their own), then the
        daemons in this namespace, then the namespaces and the bridge."""
        for ns in self.netns:
            try:
                r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20)
                for pid in r.stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
            except (OSError, subprocess.TimeoutExpired):
                pass
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    pass
        self.procs = []
        for cmd in [["ip", "netns", "del", ns] for ns in self.netns] + [["ip", "link", "del", self.bridge]]:
            try:
                subprocess.run(cmd, capture_output=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                pass
