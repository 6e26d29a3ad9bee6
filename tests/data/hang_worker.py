"""Worker for --worker-timeout. argv: <out dir> <mode> [<seconds>]
  hang:    on the first attempt, local rank 1 says it started and then goes
           silent (no output, no store request) until killed; every other
           worker, and every worker of a later attempt, exits 0 at once.
  deep:    as hang, silent inside a function named muster_test_hung_here
           (for the stacks the agent takes); the others wait for it in
           muster_test_peer_waits, printing a line every 0.2 s, until stopped.
  deep-last: as deep, but the worker of the last global rank hangs (on the
           job's last node), every other one waits for it.
  chatty:  prints a line every 0.2 s for <seconds>, then exits 0.
  store:   silent on stdout and stderr; asks the job's store (MASTER_ADDR:
           MASTER_PORT, torch's TCPStore protocol, one connection this process
           holds) ADD every 0.2 s for <seconds>, then exits 0.
  timer:   silent on stdout and stderr; writes a file-timer acquire and release
           (TORCHELASTIC_TIMER_FILE, FileTimerClient's format) every 0.2 s for
           <seconds>, then exits 0.
  flood:   writes <seconds> MiB to stdout in 1 KiB lines, then exits 0.
  partial: writes 'a\\nb\\nc' with no final newline, then exits 0.
Each worker records its pid and attempt in <out>/pid_<rank>_<attempt>."""
import os
import socket
import struct
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(out, f".pid_{rank}_{attempt}"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, f".pid_{rank}_{attempt}"), os.path.join(out, f"pid_{rank}_{attempt}"))

if mode == "hang":
    if attempt == 0 and local_rank == 1:
        print(f"rank {rank} started", flush=True)
        time.sleep(120)  # the agent kills it long before
        sys.exit(3)
    sys.exit(0)

if mode in ("deep", "deep-last"):
    def muster_test_hung_here():
        time.sleep(120)  # the agent kills it long before

    def muster_test_peer_waits():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            print(f"rank {rank} waits", flush=True)
            time.sleep(0.2)

    last = rank == int(os.environ["WORLD_SIZE"]) - 1
    if attempt == 0 and (local_rank == 1 if mode == "deep" else last):
        print(f"rank {rank} started", flush=True)
        muster_test_hung_here()
    elif attempt == 0:
        muster_test_peer_waits()
    sys.exit(0)

if mode == "chatty":
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        print(f"rank {rank} working", flush=True)
        time.sleep(0.2)
    sys.exit(0)

if mode == "store":
    s = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=30)

    def request(tag, payload=b""):
        s.sendall(bytes([tag]) + payload)

    def read(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise SystemExit("the store closed the connection")
            data += chunk
        return data

    request(0, struct.pack("<I", 0x3C85F7CE))  # VALIDATE
    request(13, struct.pack("<I", 77))         # PING
    assert struct.unpack("<I", read(4))[0] == 77
    key = f"progress/{rank}".encode()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        request(4, struct.pack("<Q", len(key)) + key + struct.pack("<q", 1))  # ADD key 1
        read(8)
        time.sleep(0.2)
    sys.exit(0)

if mode == "timer":
    import json
    fd = os.open(os.environ["TORCHELASTIC_TIMER_FILE"], os.O_WRONLY)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for expires in (time.time() + 600, -1):
            line = json.dumps({"version": 1, "pid": os.getpid(), "scope_id": "step", "expiration_time": expires,
                               "signal": 9}) + "\n"
            os.write(fd, line.encode())
        time.sleep(0.2)
    sys.exit(0)

if mode == "flood":
    line = ("x" * 1023 + "\n").encode()
    for _ in range(int(seconds * 1024)):
        os.write(1, line)
    sys.exit(0)

if mode == "partial":
    sys.stdout.write("a\nb\nc")
    sys.stdout.flush()
    sys.exit(0)

sys.exit(f"unknown mode {mode}")
