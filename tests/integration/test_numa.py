"""--numa-binding on this machine: the CPUs a worker (and what it starts) may
run on are the ones torch's rules give its GPU. The GPUs come from a stand-in
CUDA driver (tests/tools/fake_libcuda.cpp, found through LD_LIBRARY_PATH) and
the topology from a sysfs tree (HWLOC_FSROOT) that lays this machine's own
CPUs out as NUMA nodes, so that the binding is real and observable here.
Parity with torch's code on whole fake machines: compat/test_torch_numa.py."""
import ctypes
import json
import os
import subprocess

import pytest

from muster_testing import DATA, MUSTER, SLACK, base_env, run_muster
from numa_trees import Cpu, Machine, cpu_list

FAKE_CUDA_DIR = os.environ.get("MUSTER_FAKE_CUDA_DIR", "")
CPUS = sorted(os.sched_getaffinity(0))

pytestmark = [
    pytest.mark.skipif(len(CPUS) < 2, reason="binding to different CPUs needs at least two usable CPUs"),
    pytest.mark.skipif(not os.path.isdir(FAKE_CUDA_DIR), reason="the build's fake CUDA driver is missing"),
]


def here(tmp_path, nodes, gpus_on_nodes, name="here"):
    """A tree of this machine's usable CPUs, split over the given NUMA nodes
    (each a list of indices into CPUS), one core and one package per node."""
    m = Machine(name)
    for node, members in enumerate(nodes):
        cpus = [CPUS[i] for i in members]
        m.nodes[node] = cpus
        for c in cpus:
            m.cpus[c] = Cpu(node, [c], [(1, "Data", [c]), (2, "Unified", [c]), (3, "Unified", cpus)])
    m.possible = list(range(len(nodes)))
    m.gpus = [(f"0000:{0x18 + 0x11 * i:02x}:00.0", node) for i, node in enumerate(gpus_on_nodes)]
    root = m.write(str(tmp_path / name))
    return m, root


def env_for(machine, root, **extra):
    return base_env(LD_LIBRARY_PATH=FAKE_CUDA_DIR, HWLOC_FSROOT=root, LOGLEVEL="INFO",
                    MUSTER_FAKE_CUDA_PCI=",".join(machine.gpu_pci), **extra)


def probe(tmp_path, args, env, *script_args, nproc=2):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    r = run_muster([f"--nproc-per-node={nproc}", *args, str(DATA / "affinity_probe.py"), str(out), *script_args],
                   env=env, timeout=120 * SLACK)
    results = {}
    for name in os.listdir(out):
        if name.endswith(".json"):
            _, rank, restart = name[:-5].split("_")
            results[(int(rank), int(restart))] = json.loads((out / name).read_text())
    return r, results


def test_each_worker_and_its_children_run_on_the_cpus_of_its_gpus_node_across_restarts(tmp_path):
    half = len(CPUS) // 2
    m, root = here(tmp_path, [range(half), range(half, len(CPUS))], [0, 1])
    # Rank 1 fails once: the restarted group is bound as the first was.
    r, seen = probe(tmp_path, ["--numa-binding=node", "--max-restarts=1"], env_for(m, root), "1")
    assert r.returncode == 0, r.stderr
    node_cpus = [cpu_list(m.nodes[0]), cpu_list(m.nodes[1])]
    for attempt in (0, 1):
        for rank in (0, 1):
            got = seen[(rank, attempt)]
            assert got["own"] == node_cpus[rank], (rank, attempt, got)
            assert got["child"] == node_cpus[rank], (rank, attempt, got)
    # One INFO line per local rank says what was bound (and only once: the
    # binding is computed before the first attempt).
    for rank in (0, 1):
        line = (f"NUMA binding (node): local_rank {rank} -> GPU cuda:{rank} ({m.gpu_pci[rank]}, NUMA node {rank}), "
                f"CPUs {node_cpus[rank]}")
        assert r.stderr.count(line) == 1, r.stderr


def test_exclusive_splits_a_nodes_cores_among_its_gpus(tmp_path):
    m, root = here(tmp_path, [range(len(CPUS))], [0, 0])
    r, seen = probe(tmp_path, ["--numa_binding", "exclusive"], env_for(m, root))
    assert r.returncode == 0, r.stderr
    half = (len(CPUS) + 1) // 2  # the remainder goes to the lower GPU
    assert seen[(0, 0)]["own"] == cpu_list(CPUS[:half])
    assert seen[(1, 0)]["own"] == cpu_list(CPUS[half:])


def test_the_gpu_of_a_local_rank_is_cudas_after_cuda_visible_devices(tmp_path):
    half = len(CPUS) // 2
    m, root = here(tmp_path, [range(half), range(half, len(CPUS))], [0, 1])
    # cuda:0 is the second GPU, on node 1.
    r, seen = probe(tmp_path, ["--numa-binding=node"], env_for(m, root, CUDA_VISIBLE_DEVICES="1,0"))
    assert r.returncode == 0, r.stderr
    assert seen[(0, 0)]["own"] == cpu_list(m.nodes[1])
    assert seen[(1, 0)]["own"] == cpu_list(m.nodes[0])
    assert f"local_rank 0 -> GPU cuda:0 ({m.gpu_pci[1]}, NUMA node 1)" in r.stderr


def test_virtual_local_rank_binds_by_the_real_local_rank(tmp_path):
    half = len(CPUS) // 2
    m, root = here(tmp_path, [range(half), range(half, len(CPUS))], [0, 1])
    r, seen = probe(tmp_path, ["--numa-binding=node", "--virtual-local-rank"], env_for(m, root))
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert seen[(rank, 0)]["local_rank"] == "0"
        assert seen[(rank, 0)]["own"] == cpu_list(m.nodes[rank])


def test_the_launchers_own_affinity_bounds_the_binding(tmp_path):
    # A launcher held to one CPU (a cpuset, taskset) binds within it.
    m, root = here(tmp_path, [range(len(CPUS))], [0])
    only = CPUS[-1]
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(["taskset", "-c", str(only), MUSTER, "--numa-binding=node", "--nproc-per-node=1",
                        str(DATA / "affinity_probe.py"), str(out)], env=env_for(m, root), capture_output=True,
                       text=True, timeout=120 * SLACK)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "rank_0_0.json").read_text())["own"] == str(only)


@pytest.mark.parametrize("case", ["no GPU", "more workers than GPUs", "too few cores", "socket on a CPU-less node"])
def test_a_binding_that_cannot_be_made_ends_the_launch_with_exit_1_before_any_worker(tmp_path, case):
    half = len(CPUS) // 2
    mode, nproc = "node", 2
    if case == "no GPU":
        m, root = here(tmp_path, [range(len(CPUS))], [])
        message = "the CUDA driver shows no GPU"
    elif case == "more workers than GPUs":
        m, root = here(tmp_path, [range(len(CPUS))], [0])
        message = "no GPU cuda:1 to bind local rank 1 to: this node shows 1 GPU(s)"
    elif case == "too few cores":
        # One core on node 0 for two GPUs: exclusive cannot split it.
        m, root = here(tmp_path, [[0], range(1, len(CPUS))], [0, 0])
        mode = "exclusive"
        message = "NUMA node 0 has 1 physical cores this launcher may use but 2 GPUs"
    else:
        m, root = here(tmp_path, [range(half), range(half, len(CPUS)), []], [0, 1])
        mode = "socket"
        message = "NUMA node 2 has no CPU this launcher may use (a CPU-less memory node"
    r, seen = probe(tmp_path, [f"--numa-binding={mode}", "--max-restarts=3"], env_for(m, root), nproc=nproc)
    assert r.returncode == 1, r.stderr
    assert f"muster: error: " in r.stderr and message in r.stderr, r.stderr
    assert seen == {}  # no worker ran, and no restart was tried


def test_without_a_cuda_driver_the_binding_says_so(tmp_path):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has a CUDA driver: the missing-driver message cannot be shown here")
    except OSError:
        pass
    r = run_muster(["--numa-binding=node", "--nproc-per-node=1", "--no-python", "true"], env=base_env())
    assert r.returncode == 1
    assert "--numa-binding needs an NVIDIA GPU and its driver, and the CUDA driver library cannot be loaded" in r.stderr
