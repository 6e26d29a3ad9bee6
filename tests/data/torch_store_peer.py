"""PyTorch's side of the store compatibility tests; runs under torch 2.x and 1.13.
  torch_store_peer.py server PORT   torch's TCPStore server; sets 'theirs', waits for 'done', prints JSON
  torch_store_peer.py client PORT   torch's TCPStore client against some server; prints JSON results"""
import json
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

V2 = not torch.__version__.startswith("1.")
mode, port = sys.argv[1], int(sys.argv[2])
out = {"version": torch.__version__}

if mode == "server":
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    store.set("theirs", "py")
    print("READY", flush=True)
    store.wait(["done"], timedelta(seconds=30))
    for key in ("ours", "counter", "theirs"):
        out[key] = store.get(key).decode()
    out["m1"] = store.get("m1").decode()
    out["temp_deleted"] = not store.delete_key("temp")
    print(json.dumps(out), flush=True)
    sys.exit(0)

store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
store.set("py_key", "v")
out["get"] = store.get("py_key").decode()
out["add"] = store.add("cnt", 3)
out["add_again"] = store.add("cnt", 4)
out["get_cnt"] = store.get("cnt").decode()
out["cas"] = store.compare_set("py_key", "v", "w").decode()
out["cas_miss"] = store.compare_set("py_key", "zz", "q").decode()
out["cas_absent_empty"] = store.compare_set("absent", "", "made").decode()
out["num_keys"] = store.num_keys()
out["delete"] = store.delete_key("cnt")
out["delete_again"] = store.delete_key("cnt")

other = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
threading.Thread(target=lambda: (time.sleep(0.2), other.set("late", "arrived")), daemon=True).start()
store.wait(["late"], timedelta(seconds=10))
out["late"] = store.get("late").decode()

if V2:
    out["check_present"] = store.check(["py_key", "late"])
    out["check_absent"] = store.check(["py_key", "nothing"])
    store.multi_set(["m1", "m2"], ["a", "b"])
    out["multi_get"] = [v.decode() for v in store.multi_get(["m1", "m2"])]
    store.append("m1", "+")
    out["appended"] = store.get("m1").decode()

try:
    store.wait(["never"], timedelta(milliseconds=300))
    out["wait_timeout"] = "no timeout"
except Exception as e:  # torch raises its own error types
    out["wait_timeout"] = type(e).__name__
if V2:
    out["after_timeout"] = store.get("py_key").decode()
print(json.dumps(out), flush=True)
