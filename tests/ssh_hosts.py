"""A real OpenSSH server for the launch-over-ssh tests, on several loopback
addresses of this machine (127.0.0.2, 127.0.0.3, ...), each a "host".

Everything lives in a scratch folder: the server's host key, the client's key
and authorized_keys, both configurations, known_hosts. Nothing of the
machine's own ssh setup is read or changed. The hosts share this machine's
host name and boot id, so the client configuration gives each its own
MUSTER_NODE_ID (SetEnv, which the server accepts).
"""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from muster_testing import free_port

SSHD = "/usr/sbin/sshd"
MAX_LISTEN = 16  # sshd's MAX_LISTEN_SOCKS
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def available():
    """Why the ssh tests cannot run here, or None."""
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        return "OpenSSH (openssh-server, openssh-client) is not installed: scripts/install-deps.sh installs it"
    return None


class SshHosts:
    """`count` hosts at 127.0.0.2.. behind one sshd. `ssh_env()` is what a
    launching muster needs (MUSTER_SSH)."""

    def __init__(self, scratch, count, node_ids=True, slack=1.0, netns=None, first=2, hide=None):
        """netns: {address: network namespace} to run one sshd per address
        inside its namespace instead (the addresses are the namespaces').
        first: the hosts are 127.0.0.<first>, 127.0.0.<first + 1>, ...; hide:
        a folder the hosts do not have (sshd runs in a mount namespace of its
        own with an empty tmpfs over it; needs root)."""
        self.dir = Path(scratch)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.netns = netns or {}
        self.addresses = list(self.netns) if self.netns else [f"127.0.0.{i + first}" for i in range(count)]
        # Held until sshd binds it (sshd sets SO_REUSEADDR), so no other suite's server takes it meanwhile.
        self.port = 2222 if self.netns else free_port()
        self.slack = slack
        d = self.dir
        for name in ("host_key", "client_key", "stranger_key"):
            subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        os.chmod(d / "authorized_keys", 0o600)
        host_pub = (d / "host_key.pub").read_text().split()
        with open(d / "known_hosts", "w") as f:
            for a in self.addresses:
                f.write(f"[{a}]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        common = f"""Port {self.port}
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
AllowUsers {user}
MaxStartups 256
MaxSessions 64
ClientAliveInterval 1
ClientAliveCountMax 5
AcceptEnv MUSTER_NODE_ID
PrintMotd no
LogLevel ERROR
"""
        # sshd listens on at most 16 sockets: one server per 16 addresses.
        groups = [self.addresses[i:i + MAX_LISTEN] for i in range(0, len(self.addresses), MAX_LISTEN)]
        if self.netns:
            groups = [[a] for a in self.addresses]
        for g, group in enumerate(groups):
            listen = "".join(f"ListenAddress {a}\n" for a in group)
            (d / f"sshd_config.{g}").write_text(common + listen + f"PidFile {d}/sshd.{g}.pid\n")
        client = [f"""Host {" ".join(self.addresses)}
  Port {self.port}
  User {user}
  IdentityFile {d}/client_key
  IdentitiesOnly yes
  UserKnownHostsFile {d}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  PasswordAuthentication no
"""]
        if node_ids:
            for i, a in enumerate(self.addresses):
                client.insert(0, f"Host {a}\n  SetEnv MUSTER_NODE_ID=ssh-node-{i}\n")
        (d / "ssh_config").write_text("\n".join(client))
        if os.geteuid() == 0:
            # sshd's privilege separation folder (a run-time folder, no configuration).
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.log = open(d / "sshd.log", "w")
        def in_ns(g):
            if hide:
                return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f"mount -t tmpfs muster-test '{hide}' && exec \"$@\"", "sh"]
            return ["ip", "netns", "exec", self.netns[groups[g][0]]] if self.netns else []
        self.procs = [subprocess.Popen([*in_ns(g), SSHD, "-D", "-e", "-f", str(d / f"sshd_config.{g}")],
                                       stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
                      for g in range(len(groups))]
        deadline = time.monotonic() + 20 * slack
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                self.close()
                raise RuntimeError("sshd did not start: " + (d / "sshd.log").read_text())
            # sshd writes its pid file once it listens; a namespace's address
            # cannot be tried from here.
            if self.netns and all((d / f"sshd.{g}.pid").exists() for g in range(len(groups))):
                return
            if not self.netns and all(self._listening(a) for a in self.addresses):
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError("sshd does not listen: " + (d / "sshd.log").read_text())

    def _listening(self, address):
        try:
            with socket.create_connection((address, self.port), timeout=1):
                return True
        except OSError:
            return False

    def ssh_command(self, config=None):
        return f"ssh -F {config or self.dir / 'ssh_config'}"

    def ssh_env(self, **extra):
        env = {"MUSTER_SSH": self.ssh_command()}
        env.update(extra)
        return env

    def unknown_host_config(self):
        """A client configuration that knows no host key (under batch mode: refused)."""
        text = (self.dir / "ssh_config").read_text().replace(f"{self.dir}/known_hosts", f"{self.dir}/no_known_hosts")
        path = self.dir / "unknown_host_config"
        path.write_text(text)
        return path

    def stranger_config(self):
        """A client configuration with a key the server does not know."""
        text = (self.dir / "ssh_config").read_text().replace(f"{self.dir}/client_key", f"{self.dir}/stranger_key")
        path = self.dir / "stranger_config"
        path.write_text(text)
        return path

    def _sessions(self):
        """Pids of the server's session processes (each in a session of its own,
        all writing to this server's log), the listeners' included."""
        log = str(self.dir / "sshd.log")
        pids = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{d}/fd/2").replace(" (deleted)", "") == log:
                    pids.append(int(d))
            except OSError:
                continue
        return pids

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10 * self.slack)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        # A session whose client vanished (a cut link) would wait for it: end them too.
        for _ in range(50):
            left = [p for p in self._sessions() if p != os.getpid()]
            if not left:
                break
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        self.log.close()
