"""WAIT on many absent keys: how long a store takes to take the request in,
muster's store beside torch's own TCPStore server (its libuv backend) in the
same run. One client sends WAIT on N keys followed by a PING on the same
connection; the time to the PING's answer is the cost of the WAIT. A second
client pings the store meanwhile: its worst round trip shows whether the
store kept serving others.

  .venv/bin/python bench/store/wait_many.py [STORE_TOOL] [N...]
(default: build/tests/store_tool, N = 60000 131072 1000000; both servers refuse more than 131072)"""
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = __file__.rsplit("/", 3)[0]
tool = sys.argv[1] if len(sys.argv) > 1 else f"{HERE}/build/tests/store_tool"
sizes = [int(n) for n in sys.argv[2:]] or [60000, 131072, 1000000]

TORCH_SERVER = """
import sys, time, datetime
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
                  timeout=datetime.timedelta(seconds=600))
print("PORT", s.port, flush=True)
sys.stdin.read()
"""


def sized(b):
    return struct.pack("<Q", len(b)) + b


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))
    return s


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def ping(s, nonce):
    s.sendall(b"\x0d" + struct.pack("<I", nonce))
    assert struct.unpack("<I", recv_exact(s, 4))[0] == nonce


def measure(port, n):
    keys = b"".join(sized(b"absent/%07d" % i) for i in range(n))
    request = b"\x06" + struct.pack("<Q", n) + keys + b"\x0d" + struct.pack("<I", 99)
    waiter, other = connect(port), connect(port)
    ping(other, 1)
    done = threading.Event()
    worst = [0.0]

    def prober():
        while not done.is_set():
            t0 = time.monotonic()
            ping(other, 2)
            worst[0] = max(worst[0], time.monotonic() - t0)
            time.sleep(0.01)

    t = threading.Thread(target=prober, daemon=True)
    t.start()
    t0 = time.monotonic()
    try:
        waiter.sendall(request)
        assert struct.unpack("<I", recv_exact(waiter, 4))[0] == 99
        took = time.monotonic() - t0
    except ConnectionError:
        took = None  # the server refused the request and closed the connection
    done.set()
    t.join()
    waiter.close()
    other.close()
    return took, worst[0]


def start(cmd):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("PORT"), line
    return p, int(line.split()[1])


def main():
    print(f"{'keys':>9} {'muster':>10} {'torch':>10} {'torch/muster':>13} {'worst ping muster':>18} {'torch':>8}")
    for n in sizes:
        results = []
        for cmd in ([tool, "serve"], [sys.executable, "-c", TORCH_SERVER]):
            p, port = start(cmd)
            try:
                results.append(measure(port, n))
            finally:
                p.stdin.close()
                p.wait(timeout=60)
        (m, mw), (t, tw) = results
        show = lambda v: f"{v:>9.3f}s" if v is not None else "  refused"
        ratio = f"{t / m:>12.1f}x" if m and t else f"{'-':>13}"
        print(f"{n:>9} {show(m)} {show(t)} {ratio} {mw * 1000:>16.1f}ms {tw * 1000:>6.1f}ms")


main()
