"""Worker that fails in a chosen way. argv: <mode> [<rank that fails>]
modes: exit3, segv, errorfile (writes a torch-style error file, exits 1),
       strerrorfile (the string form), succeed_on_restart=<n> (fails until
       TORCHELASTIC_RESTART_COUNT reaches n)."""
import json
import os
import signal
import sys
import time

mode = sys.argv[1]
failing = int(sys.argv[2]) if len(sys.argv) > 2 else 0
rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

if mode.startswith("succeed_on_restart="):
    print(f"attempt {restart} rank {rank}", flush=True)
    if rank != 0:
        sys.exit(0)
    time.sleep(0.3)  # let the others print before the group is stopped
    sys.exit(0 if restart >= int(mode.split("=")[1]) else 1)

if rank != failing:
    time.sleep(60)  # the agent stops us
    sys.exit(0)

if mode == "exit3":
    sys.exit(3)
if mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
if mode == "errorfile":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"] + ".tmp", "w") as f:
        json.dump({"message": {"message": "ValueError: boom on rank1",
                               "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"w.py\", line 1\nValueError: boom on rank1\n",
                                             "timestamp": str(int(time.time()))}}}, f)
    os.replace(os.environ["TORCHELASTIC_ERROR_FILE"] + ".tmp", os.environ["TORCHELASTIC_ERROR_FILE"])
    sys.exit(1)
if mode == "strerrorfile":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"] + ".tmp", "w") as f:
        json.dump({"message": "the C++ worker gave up", "timestamp": int(time.time())}, f)
    os.replace(os.environ["TORCHELASTIC_ERROR_FILE"] + ".tmp", os.environ["TORCHELASTIC_ERROR_FILE"])
    sys.exit(1)
sys.exit(99)
