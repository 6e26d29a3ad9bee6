"""Runs torch's own --numa-binding rules (torch.numa.binding) on a machine
given as a sysfs tree, for the parity test with muster.

  python torch_numa_probe.py ROOT ALLOWED PCI[,PCI...]

torch's module reads /sys through open() and os.listdir(), asks torch.cuda
for the GPUs, os.sched_getaffinity for the launcher's CPUs and shutil.which
for numactl; each of those names is replaced in the module's own namespace
(nothing of torch is copied): files come from under ROOT, the GPUs are the
given PCI addresses in CUDA order, the affinity is ALLOWED, numactl is
"there". Prints one JSON object: mode -> [CPU list or "error: ..."] per GPU.
"""

import builtins
import json
import os
import sys
import types

import torch.numa.binding as binding

root, allowed_text, pci_text = sys.argv[1:4]


def ranges(text):
    out = set()
    for part in text.split(","):
        part = part.strip()
        if part:
            a, _, b = part.partition("-")
            out.update(range(int(a), int(b or a) + 1))
    return out


def under_root(path):
    return os.path.join(root, path.lstrip("/")) if str(path).startswith("/sys/") else path


def fake_open(path, *args, **kwargs):
    return builtins.open(under_root(path), *args, **kwargs)


fake_os = types.SimpleNamespace(
    listdir=lambda path: os.listdir(under_root(path)),
    path=os.path,
    sched_getaffinity=lambda pid: ranges(allowed_text),
)

gpus = []
for pci in pci_text.split(","):
    domain, bus, rest = pci.split(":")
    device = rest.split(".")[0]
    gpus.append(types.SimpleNamespace(pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16),
                                      pci_device_id=int(device, 16)))


def get_device_properties(index):
    if not 0 <= index < len(gpus):
        raise AssertionError(f"Invalid device id {index}")
    return gpus[index]


binding.open = fake_open
binding.os = fake_os
binding.shutil = types.SimpleNamespace(which=lambda name: "/usr/bin/" + name)
binding.torch = types.SimpleNamespace(
    cuda=types.SimpleNamespace(device_count=lambda: len(gpus), get_device_properties=get_device_properties))

result = {}
for mode in binding.AffinityMode:
    answers = []
    for gpu in range(len(gpus)):
        try:
            cpus = binding._get_validated_logical_cpus_to_bind_to(
                gpu_index=gpu, numa_options=binding.NumaOptions(affinity_mode=mode))
            answers.append(binding._get_ranges_str_from_ints(cpus))
        except Exception as e:  # torch's answer is a failure: the launch fails
            answers.append(f"error: {type(e).__name__}: {e}")
    result[mode.value] = answers
print(json.dumps(result))
