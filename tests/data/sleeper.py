"""Worker that records its pid and the signals it receives, then sleeps.
argv: <dir> [ignore-term] [spawn-children] [hold=SECONDS]
  ignore-term: SIGTERM is recorded and ignored (so only SIGKILL ends it)
  spawn-children: starts a child in its own process group and a daemon that
                  leaves the worker's session, recording their pids too.
  hold=SECONDS: how long to sleep before exiting 0 (default 60)."""
import os
import signal
import subprocess
import sys
import time

out = sys.argv[1]
flags = set(sys.argv[2:])
hold = next((float(f.split("=", 1)[1]) for f in flags if f.startswith("hold=")), 60.0)
rank = os.environ["RANK"]


def record(name, text):
    with open(os.path.join(out, f"{name}_{rank}"), "a") as f:
        f.write(text + "\n")


def on_signal(signo, frame):
    record("signal", signal.Signals(signo).name)
    if not ("ignore-term" in flags and signo == signal.SIGTERM):
        sys.exit(128 + signo)


for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
    signal.signal(s, on_signal)

if "spawn-children" in flags:
    child = subprocess.Popen(["sleep", "1000"])
    daemon = subprocess.Popen(["setsid", "sh", "-c", "sleep 1000 & echo $! > %s/daemon_%s; wait" % (out, rank)])
    record("child", str(child.pid))
    record("child", str(daemon.pid))

record("pid", str(os.getpid()))
deadline = time.monotonic() + hold
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0)
