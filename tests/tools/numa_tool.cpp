// Prints the CPUs muster's --numa-binding rules give each GPU of a machine
// described by a sysfs tree, for the parity test against torch's own code:
//
//   numa_tool ROOT MODE ALLOWED PCI[,PCI...] [best|sysfs|hwloc]
//
// ROOT: the tree (as HWLOC_FSROOT); MODE: node, socket, exclusive or
// core-complex; ALLOWED: the launcher's affinity as a CPU list; the GPUs'
// PCI addresses in CUDA order. One line per GPU: "<index> <cpu list>", or
// "<index> error <message>" where muster refuses to bind that GPU. The last
// argument picks the topology backend (default: best, as muster).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "numa_binding.hpp"

int main(int argc, char** argv) {
  namespace numa = muster::launcher::numa;
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: numa_tool ROOT MODE ALLOWED PCI[,PCI...] [best|sysfs|hwloc]\n");
    return 2;
  }
  auto mode = numa::parse_mode(argv[2]);
  auto allowed = numa::parse_cpu_list(argv[3]);
  if (!mode || !allowed.ok()) {
    std::fprintf(stderr, "numa_tool: bad mode or CPU list\n");
    return 2;
  }
  numa::Machine machine;
  machine.allowed = allowed.value();
  std::string list = argv[4];
  for (std::size_t pos = 0; pos <= list.size();) {
    std::size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    machine.gpu_pci.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  numa::Backend backend = numa::Backend::best;
  if (argc == 6 && std::strcmp(argv[5], "sysfs") == 0) backend = numa::Backend::sysfs;
  if (argc == 6 && std::strcmp(argv[5], "hwloc") == 0) backend = numa::Backend::hwloc;
  setenv("HWLOC_FSROOT", argv[1], 1);
  auto opened = numa::open_topology(backend);
  if (!opened.ok()) {
    std::fprintf(stderr, "numa_tool: %s\n", opened.status().message().c_str());
    return 1;
  }
  const numa::Topology& topology = *opened.value();
  for (int gpu = 0; gpu < static_cast<int>(machine.gpu_pci.size()); ++gpu) {
    auto cpus = numa::cpus_for_gpu(*mode, gpu, topology, machine);
    if (cpus.ok()) {
      std::printf("%d %s\n", gpu, numa::format_cpu_list(cpus.value()).c_str());
    } else {
      std::printf("%d error %s\n", gpu, cpus.status().message().c_str());
    }
  }
  return 0;
}
