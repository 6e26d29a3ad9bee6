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


HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
recorded = {}


def record(name, text):
    # The test reads these files while the worker runs: each is replaced whole
    # (write, then rename), so a reader sees the old lines or the new, never half.
    # The handled signals wait meanwhile, so a handler's record() cannot run
    # inside another's write of the same temporary file.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        recorded.setdefault(name, []).append(text)
        tmp = os.path.join(out, f".{name}_{rank}.tmp")  # not matched by the test's "<name>_*"
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in recorded[name]))
        os.replace(tmp, os.path.join(out, f"{name}_{rank}"))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def on_signal(signo, frame):
    record("signal", signal.Signals(signo).name)
    if not ("ignore-term" in flags and signo == signal.SIGTERM):
        sys.exit(128 + signo)


for s in HANDLED:
    signal.signal(s, on_signal)

if "spawn-children" in flags:
    child = subprocess.Popen(["sleep", "1000"])
    tmp, final = os.path.join(out, f".daemon_{rank}.tmp"), os.path.join(out, f"daemon_{rank}")
    daemon = subprocess.Popen(["setsid", "sh", "-c", f"sleep 1000 & echo $! > '{tmp}' && mv '{tmp}' '{final}'; wait"])
    record("child", str(child.pid))
    record("child", str(daemon.pid))

record("pid", str(os.getpid()))
deadline = time.monotonic() + hold
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0)
