#!/usr/bin/env python3
"""bench/ssh_launch: launching one job on N hosts from one command, beside a
plain loop of `ssh host muster ... &` and DeepSpeed's launcher (pdsh), in the
same run, on the same hosts.

The hosts are loopback addresses of this machine (127.0.0.2, ...) behind one
real OpenSSH server that the bench starts from a scratch folder
(tests/ssh_hosts.py); each gets its own MUSTER_NODE_ID. Every launch runs one
worker per host, `/bin/true` (no Python), and is timed from the command's
start to its exit: ssh set-up, the remote agents' start, the rendezvous, the
workers, the teardown. Median of --repeat runs; ratios are other/muster.

    python3 bench/ssh_launch/run.py --hosts 4 8 16 [--repeat 3] [--deepspeed /path/to/venv/bin/deepspeed]

Without --deepspeed (or where it cannot run) its column says why.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import ssh_hosts  # noqa: E402


def timed(argv, env, cwd, timeout=600):
    start = time.monotonic()
    r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {r.returncode}:\n{r.stderr[-2000:]}")
    return took


def muster_launch(muster, hosts, n, env, cwd):
    return timed([muster, "--hosts=" + ",".join(hosts.addresses[:n]), "--no-python", "/bin/true"], env, cwd)


def loop_launch(muster, hosts, n, env, cwd):
    """What a team writes without a launcher: one background ssh per host,
    every agent pointed at the first host's rendezvous."""
    job = "loop-" + uuid.uuid4().hex[:8]
    port = ssh_hosts._free_port(["127.0.0.1"])
    lines = ["#!/bin/sh", "set -e"]
    for a in hosts.addresses[:n]:
        remote = (f"cd {cwd} && {muster} --nnodes={n} --nproc-per-node=1 --rdzv-backend=c10d "
                  f"--rdzv-endpoint=127.0.0.1:{port} --rdzv-id={job} --no-python /bin/true")
        lines.append(f"{hosts.ssh_command()} -o BatchMode=yes {a} '{remote}' &")
    lines.append("for p in $(jobs -p); do wait $p; done")
    script = Path(cwd) / "loop.sh"
    script.write_text("\n".join(lines) + "\n")
    return timed(["/bin/sh", str(script)], env, cwd)


def deepspeed_launch(deepspeed, hosts, n, env, cwd):
    hostfile = Path(cwd) / "ds_hostfile"
    hostfile.write_text("".join(f"{a} slots=1\n" for a in hosts.addresses[:n]))
    port = ssh_hosts._free_port(["127.0.0.1"])
    return timed([deepspeed, f"--hostfile={hostfile}", "--launcher=pdsh", "--master_addr=127.0.0.2",
                  f"--master_port={port}", "--no_python", "--no_local_rank", "/bin/true"], env, cwd)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--muster", default=str(ROOT / "build" / "launcher" / "muster"))
    p.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--deepspeed", default="", help="DeepSpeed's `deepspeed` command (a scratch venv's)")
    args = p.parse_args()
    why = ssh_hosts.available()
    if why:
        raise SystemExit(why)
    most = max(args.hosts)
    scratch = Path(tempfile.mkdtemp(prefix="muster-ssh-bench-"))
    hosts = ssh_hosts.SshHosts(scratch / "sshd", most)
    try:
        # ssh found first on PATH carries the bench's configuration, for the
        # launchers that call plain `ssh` (pdsh under DeepSpeed).
        shim = scratch / "bin"
        shim.mkdir()
        (shim / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {hosts.dir / 'ssh_config'} \"$@\"\n")
        (shim / "ssh").chmod(0o755)
        env = dict(os.environ, MUSTER_SSH=hosts.ssh_command(), PATH=f"{shim}:{os.environ['PATH']}",
                   PDSH_RCMD_TYPE="ssh")
        work = scratch / "work"
        work.mkdir()
        ds_why = ""
        if not args.deepspeed:
            ds_why = "not given (--deepspeed)"
        elif shutil.which("pdsh") is None:
            ds_why = "pdsh is not installed"
        rows = []
        for n in sorted(args.hosts):
            m = statistics.median(muster_launch(args.muster, hosts, n, env, work) for _ in range(args.repeat))
            loop = statistics.median(loop_launch(args.muster, hosts, n, env, work) for _ in range(args.repeat))
            ds = None
            if not ds_why:
                try:
                    ds = statistics.median(deepspeed_launch(args.deepspeed, hosts, n, env, work)
                                           for _ in range(args.repeat))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    ds_why = "failed: " + str(e).strip().splitlines()[-1][:200]
            rows.append((n, m, loop, ds))
        print(f"launch of one job on N hosts (one /bin/true worker each), median of {args.repeat}, seconds")
        print(f"{'hosts':>5} {'muster --hosts':>15} {'ssh loop':>10} {'loop/muster':>12} {'deepspeed':>10} "
              f"{'ds/muster':>10}")
        for n, m, loop, ds in rows:
            ds_text = f"{ds:10.2f} {ds / m:10.1f}x" if ds is not None else f"{'-':>10} {'-':>10}"
            print(f"{n:5d} {m:15.2f} {loop:10.2f} {loop / m:11.1f}x {ds_text}")
        if ds_why:
            print(f"deepspeed: {ds_why}")
    finally:
        hosts.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
