"""--numa-binding gives every rank the CPUs torch 2.13's own rules give it.

Each test machine (tests/numa_trees.py: two sockets with eight GPUs, an AMD
node with several L3 complexes, a node with CPU-less and offline NUMA nodes,
one with an offline node alone)
is written as a sysfs tree; torch's torch.numa.binding reads it through its
module's open/os/torch names, redirected (tests/data/torch_numa_probe.py), and
muster's rules read it as the agent does (tests/tools/numa_tool.cpp, through
HWLOC_FSROOT). For every machine, launcher affinity (all CPUs, and a cpuset
that cuts across cores and nodes), mode and GPU, both give the same CPU set,
or both refuse."""
import json
import os
import subprocess
import sys

import pytest

from muster_testing import DATA
from numa_trees import affinities, cpu_list, machines

NUMA_TOOL = os.environ.get("MUSTER_NUMA_TOOL", "")
MODES = ["node", "socket", "exclusive", "core-complex"]

pytestmark = pytest.mark.skipif(not os.path.exists(NUMA_TOOL), reason="the build's numa_tool is missing")


def torch_answers(root, allowed, gpus):
    r = subprocess.run([sys.executable, str(DATA / "torch_numa_probe.py"), root, allowed, ",".join(gpus)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def muster_answers(root, mode, allowed, gpus, backend):
    r = subprocess.run([NUMA_TOOL, root, mode, allowed, ",".join(gpus), backend], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [int(line.split(" ", 1)[0]) for line in lines] == list(range(len(gpus)))
    return [line.split(" ", 1)[1] for line in lines]


def backends():
    # The build's own choice (hwloc where built with it, as muster runs), and
    # sysfs alone (as a build without hwloc runs): both must be torch's.
    return ["best", "sysfs"]


@pytest.mark.parametrize("name", sorted(machines()))
def test_muster_binds_every_rank_as_torch_does(tmp_path, name):
    machine = machines()[name]
    root = machine.write(str(tmp_path / name))
    compared = refused = 0
    for affinity, allowed in affinities(machine).items():
        allowed_text = cpu_list(allowed)
        expected = torch_answers(root, allowed_text, machine.gpu_pci)
        for mode in MODES:
            for backend in backends():
                got = muster_answers(root, mode, allowed_text, machine.gpu_pci, backend)
                for gpu, (theirs, ours) in enumerate(zip(expected[mode], got)):
                    where = (name, affinity, mode, backend, gpu, theirs, ours)
                    if theirs.startswith("error: "):
                        assert ours.startswith("error "), where
                        refused += 1
                    else:
                        assert ours == theirs, where
                    compared += 1
    assert compared == 2 * len(MODES) * len(backends()) * len(machine.gpus)
    if name in ("cpuless_nodes", "offline_node"):
        # torch's socket mode fails on every GPU there, and so does muster's.
        assert refused >= 2 * len(backends()) * len(machine.gpus)


def test_hwloc_and_sysfs_agree_on_every_test_machine(tmp_path):
    """The claim behind using hwloc: on these machines its packages, cores and
    caches give the very sets sysfs does."""
    probe = subprocess.run([NUMA_TOOL, "/", "node", "0", "0000:00:00.0", "hwloc"], capture_output=True, text=True)
    if "built without hwloc" in probe.stderr:
        pytest.skip("this build has no hwloc (libhwloc-dev was not found when it was configured)")
    for name, machine in machines().items():
        root = machine.write(str(tmp_path / name))
        for allowed in affinities(machine).values():
            for mode in MODES:
                a = muster_answers(root, mode, cpu_list(allowed), machine.gpu_pci, "hwloc")
                b = muster_answers(root, mode, cpu_list(allowed), machine.gpu_pci, "sysfs")
                assert [x.startswith("error") or x for x in a] == [x.startswith("error") or x for x in b], (name, mode)
