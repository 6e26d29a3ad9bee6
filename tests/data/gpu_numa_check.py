"""The GPU check's --numa-binding step (scripts/gpu-check.sh), on a machine
with GPUs and a CUDA build of torch: for each mode, the CPUs every worker
muster starts may run on (its Cpus_allowed_list) equal the set torch's own
rules (torch.numa.binding) compute for its GPU on this machine's real
topology, or muster and torch both refuse the mode here.

  python gpu_numa_check.py MUSTER
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.numa.binding as binding

muster = sys.argv[1]
probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "affinity_probe.py")
gpus = torch.cuda.device_count()
if gpus == 0:
    print("gpu-numa: torch sees no GPU")
    sys.exit(1)
failures = 0
for mode in binding.AffinityMode:
    expected = []
    for gpu in range(gpus):
        try:
            # The rules alone: torch's validation also asks for numactl, which muster does not need.
            cpus = binding._get_logical_cpus_to_bind_to(gpu_index=gpu, numa_options=binding.NumaOptions(mode))
            expected.append(binding._get_ranges_str_from_ints(cpus) if cpus else None)
        except Exception as e:  # torch cannot bind this mode here
            expected.append(None)
            print(f"gpu-numa: {mode.value}: torch refuses cuda:{gpu}: {type(e).__name__}: {e}")
    with tempfile.TemporaryDirectory() as out:
        # The probe runs as a training script, in this (CUDA torch) Python.
        r = subprocess.run([muster, f"--nproc-per-node={gpus}", f"--numa-binding={mode.value}", probe, out],
                           env=dict(os.environ, PYTHON_EXEC=sys.executable), capture_output=True, text=True,
                           timeout=120)
        seen = {}
        for name in os.listdir(out):
            if name.endswith(".json"):
                with open(os.path.join(out, name)) as f:
                    seen[int(name.split("_")[1])] = json.load(f)["own"]
    if None in expected:
        # Refused before any worker ran, with muster's own error line.
        ok = r.returncode == 1 and not seen and "muster: error: " in r.stderr
        print(f"gpu-numa: {mode.value}: torch refuses; muster exit {r.returncode}: {'ok' if ok else 'MISMATCH'}")
        if not ok:
            print(r.stderr[-2000:])
    else:
        got = [seen.get(gpu) for gpu in range(gpus)]
        ok = r.returncode == 0 and got == expected
        print(f"gpu-numa: {mode.value}: {'ok' if ok else 'MISMATCH'}: torch {expected} muster {got}")
        if not ok:
            print(r.stderr[-2000:])
    failures += not ok
sys.exit(1 if failures else 0)
