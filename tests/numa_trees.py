"""Whole machines as sysfs trees, for the --numa-binding tests.

Each tree holds what torch's binding rules and muster's read: the possible
NUMA nodes and each node's cpulist, every CPU's package, thread siblings and
caches, and each GPU's PCI device with its numa_node. A Machine describes one;
write() lays it out under a root folder, as MUSTER_SYSFS_ROOT (and
HWLOC_FSROOT) expect.
"""

import os
from dataclasses import dataclass, field


def cpu_list(cpus):
    """The compact sysfs form of a set of CPUs: 0-3,8."""
    out = []
    run = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [c]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def cpu_map(cpus):
    """The sysfs bit-mask form of a set of CPUs (32-bit words, highest first,
    comma-separated): 00000000,0000000f. hwloc reads these."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = max(1, (max(cpus, default=0) // 32) + 1)
    return ",".join(f"{(bits >> (32 * w)) & 0xffffffff:08x}" for w in reversed(range(words)))


@dataclass
class Cpu:
    package: int
    siblings: list
    # (level, type, shared CPUs), written as index0, index1, ... in this order
    caches: list


@dataclass
class Machine:
    name: str
    cpus: dict = field(default_factory=dict)  # cpu -> Cpu
    nodes: dict = field(default_factory=dict)  # node -> CPUs, or None: offline (no folder)
    possible: list = field(default_factory=list)
    gpus: list = field(default_factory=list)  # (PCI address, numa_node) in CUDA order

    @property
    def gpu_pci(self):
        return [pci for pci, _ in self.gpus]

    def write(self, root):
        def put(path, text):
            full = os.path.join(root, path.lstrip("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text + "\n")

        put("/sys/devices/system/node/possible", cpu_list(self.possible))
        online = [n for n in self.possible if self.nodes.get(n) is not None]
        put("/sys/devices/system/node/online", cpu_list(online))
        for n, cpus in self.nodes.items():
            if cpus is not None:
                put(f"/sys/devices/system/node/node{n}/cpulist", cpu_list(cpus))
                put(f"/sys/devices/system/node/node{n}/cpumap", cpu_map(cpus))
        put("/sys/devices/system/cpu/possible", cpu_list(self.cpus))
        put("/sys/devices/system/cpu/online", cpu_list(self.cpus))
        packages = {}
        for c, cpu in self.cpus.items():
            packages.setdefault(cpu.package, []).append(c)
        for c, cpu in self.cpus.items():
            base = f"/sys/devices/system/cpu/cpu{c}"
            put(f"{base}/online", "1")
            put(f"{base}/topology/physical_package_id", str(cpu.package))
            put(f"{base}/topology/core_id", str(min(cpu.siblings)))
            put(f"{base}/topology/thread_siblings_list", cpu_list(cpu.siblings))
            put(f"{base}/topology/thread_siblings", cpu_map(cpu.siblings))
            put(f"{base}/topology/core_cpus", cpu_map(cpu.siblings))
            put(f"{base}/topology/core_cpus_list", cpu_list(cpu.siblings))
            put(f"{base}/topology/core_siblings", cpu_map(packages[cpu.package]))
            put(f"{base}/topology/package_cpus", cpu_map(packages[cpu.package]))
            put(f"{base}/topology/package_cpus_list", cpu_list(packages[cpu.package]))
            for i, (level, kind, shared) in enumerate(cpu.caches):
                put(f"{base}/cache/index{i}/level", str(level))
                put(f"{base}/cache/index{i}/type", kind)
                put(f"{base}/cache/index{i}/shared_cpu_list", cpu_list(shared))
                put(f"{base}/cache/index{i}/shared_cpu_map", cpu_map(shared))
                put(f"{base}/cache/index{i}/size", {1: "32K", 2: "1024K", 3: "32768K"}[level])
        for pci, node in self.gpus:
            put(f"/sys/bus/pci/devices/{pci}/numa_node", str(node))
        return root


def _build(name, *, sockets, nodes_per_socket, cores_per_node, smt, ccx_cores, gpus_on_nodes, cpuless=0,
           offline=0, pci_numa=None):
    """A regular machine: cores numbered socket by socket, node by node; with
    smt=2 the second thread of core k is CPU k + total cores (Intel and AMD
    number them so). L1d, L1i and L2 per core; L3 per ccx_cores cores of a
    node (the whole node when ccx_cores is None)."""
    m = Machine(name)
    per_node = cores_per_node if isinstance(cores_per_node, list) else [cores_per_node] * (sockets * nodes_per_socket)
    total = sum(per_node)
    core = 0
    for node, count in enumerate(per_node):
        package = node // nodes_per_socket
        cores = list(range(core, core + count))
        core += count
        threads = {k: [k + t * total for t in range(smt)] for k in cores}
        m.nodes[node] = sorted(c for k in cores for c in threads[k])
        l3_groups = [cores[i:i + (ccx_cores or count)] for i in range(0, count, ccx_cores or count)]
        for group in l3_groups:
            l3 = sorted(c for k in group for c in threads[k])
            for k in group:
                caches = [(1, "Data", threads[k]), (1, "Instruction", threads[k]), (2, "Unified", threads[k]),
                          (3, "Unified", l3)]
                for c in threads[k]:
                    m.cpus[c] = Cpu(package, threads[k], caches)
    cpu_nodes = len(per_node)
    for extra in range(cpuless):
        m.nodes[cpu_nodes + extra] = []
    for extra in range(offline):
        m.nodes[cpu_nodes + cpuless + extra] = None
    m.possible = list(range(cpu_nodes + cpuless + offline))
    for i, node in enumerate(gpus_on_nodes):
        m.gpus.append((f"0000:{0x18 + 0x11 * i:02x}:00.0", node))
    if pci_numa:
        m.gpus = [(pci, pci_numa.get(i, node)) for i, (pci, node) in enumerate(m.gpus)]
    return m


def _tied_caches():
    """One socket, one node, 8 cores, and two unified caches at level 3 for
    every CPU: a 4-core one and the whole socket's. torch takes whichever its
    directory listing gives first; muster must take the same."""
    m = _build("tied_caches", sockets=1, nodes_per_socket=1, cores_per_node=8, smt=1, ccx_cores=4,
               gpus_on_nodes=[0, 0, 0])
    everything = sorted(m.cpus)
    for cpu in m.cpus.values():
        cpu.caches = cpu.caches + [(3, "Unified", everything)]
    return m


def machines():
    """The test machines, by name."""
    return {
        # Two sockets, each split in two NUMA nodes (sub-NUMA clustering), 13
        # cores a node with hyper-threads, eight GPUs whose CUDA order
        # interleaves the nodes (as FASTEST_FIRST may).
        "two_socket_8gpu": _build("two_socket_8gpu", sockets=2, nodes_per_socket=2, cores_per_node=13, smt=2,
                                  ccx_cores=None, gpus_on_nodes=[0, 1, 2, 3, 0, 1, 2, 3]),
        # One AMD socket in two NUMA nodes (NPS2), an L3 per 8-core complex, the
        # second node one complex short of full (60 cores), 3 GPUs on the first
        # node and 5 on the second.
        "amd_ccx": _build("amd_ccx", sockets=1, nodes_per_socket=2, cores_per_node=[32, 28], smt=2, ccx_cores=8,
                          gpus_on_nodes=[0, 1, 0, 1, 1, 0, 1, 1]),
        # Two sockets, one node each, no hyper-threads, two CPU-less memory
        # nodes (HBM or CXL) and one offline node; a GPU whose numa_node is -1
        # and one on a CPU-less node.
        "cpuless_nodes": _build("cpuless_nodes", sockets=2, nodes_per_socket=1, cores_per_node=16, smt=1,
                                ccx_cores=None, gpus_on_nodes=[0, 0, 1, 2, 1], cpuless=2, offline=1,
                                pci_numa={1: -1}),
        # Two sockets, three nodes online (two on the first), a fourth offline (in node/possible,
        # without a folder): torch's socket mode fails on it, its other modes do not.
        "tied_caches": _tied_caches(),
        "offline_node": _build("offline_node", sockets=2, nodes_per_socket=2, cores_per_node=[8, 8, 8], smt=2,
                               ccx_cores=4, gpus_on_nodes=[0, 1, 2, 2], offline=1),
    }


# Launcher affinities: everything, and a cpuset that cuts across cores, nodes
# and complexes.
def affinities(machine):
    everything = sorted(machine.cpus)
    n = len(everything)
    restricted = [c for c in everything if (c % 7) not in (2, 3) and c < n * 3 // 4]
    return {"all": everything, "cpuset": restricted}
