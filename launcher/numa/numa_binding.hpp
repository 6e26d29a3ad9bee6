// --numa-binding: the CPUs each local rank's worker may run on, by torch's
// rules (torch/numa/binding.py, torch 2.9 and later), computed once before any
// worker starts and applied by the shim with sched_setaffinity before exec.
//
// Contract.
//  * The rules (cpus_for_gpu) do no I/O: they read the machine through a
//    Topology, whose every query answers as the matching sysfs file does, or
//    fails where torch's read of it fails. The CPUs are always intersected with
//    the launcher's own affinity (Machine::allowed), as torch does.
//      node          every allowed CPU of the GPU's NUMA node;
//      socket        the allowed CPUs of every possible NUMA node whose lowest
//                    allowed CPU sits on the package of the GPU node's lowest
//                    allowed CPU (a node without one fails, as in torch);
//      exclusive     the node's physical cores (by their thread siblings) in
//                    order of their lowest CPU, split evenly among the GPUs on
//                    that node, the remainder one each to the lowest GPUs;
//      core-complex  the node's CPUs grouped by their highest-level data or
//                    unified cache, largest group first (then lowest CPU), the
//                    GPU taking group (its index among the node's GPUs) modulo
//                    the number of groups.
//    A GPU's NUMA node is its PCI device's numa_node, -1 read as 0.
//  * open_topology() reads the machine under $HWLOC_FSROOT ("/" when unset:
//    the tests give a whole fake machine there, which hwloc reads too).
//    hwloc (when muster is built with it) answers package_of and
//    thread_siblings_of: its Package and Core objects are the kernel's package
//    and thread-sibling facts. sysfs answers the rest, where hwloc's model is
//    not torch's: it lists online NUMA nodes only (torch walks node/possible),
//    gives a CPU-less node its locality's CPUs where the firmware describes
//    one (torch's cpulist is empty), attaches a PCI device whose numa_node is
//    -1 to the whole machine (torch reads node 0), nests caches in a tree (of
//    two at the same highest level torch takes the one its directory listing
//    gives first), and allows the cgroup's CPUs (torch: the launcher's
//    sched_getaffinity).
//  * An empty set is an error: a worker is never bound to nothing.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher::numa {

enum class Mode { node, socket, exclusive, core_complex };

// "node", "socket", "exclusive", "core-complex" (torch's AffinityMode values).
std::optional<Mode> parse_mode(std::string_view text);
const char* mode_name(Mode mode);

using CpuSet = std::set<int>;

// A sysfs CPU list ("0-3,8,10-11\n"); an error names what is wrong with it.
Result<CpuSet> parse_cpu_list(std::string_view text);
// The compact form: "0-3,8,10-11" ("" for an empty set).
std::string format_cpu_list(const CpuSet& cpus);

// What the rules read about the machine.
class Topology {
 public:
  virtual ~Topology() = default;
  // /sys/devices/system/node/possible
  virtual Result<CpuSet> possible_nodes() const = 0;
  // /sys/devices/system/node/node<N>/cpulist
  virtual Result<CpuSet> node_cpus(int node) const = 0;
  // /sys/devices/system/cpu/cpu<N>/topology/physical_package_id
  virtual Result<int> package_of(int cpu) const = 0;
  // /sys/devices/system/cpu/cpu<N>/topology/thread_siblings_list
  virtual Result<CpuSet> thread_siblings_of(int cpu) const = 0;
  // shared_cpu_list of the highest-level Unified or Data cache in
  // /sys/devices/system/cpu/cpu<N>/cache/index*/, the first listed of equals
  // (empty: no such cache).
  virtual Result<CpuSet> max_level_cache_of(int cpu) const = 0;
  // /sys/bus/pci/devices/<address>/numa_node, as written there (-1 possible).
  virtual Result<int> pci_numa_node(const std::string& pci_address) const = 0;
};

// What the rules read besides the topology.
struct Machine {
  // The PCI address ("0000:18:00.0") of each GPU the launcher sees, in the
  // order of their CUDA ordinals (cuda:0 first).
  std::vector<std::string> gpu_pci;
  // The launcher's own CPU affinity.
  CpuSet allowed;
};

// The CPUs for the worker that uses cuda:<gpu_index>.
Result<CpuSet> cpus_for_gpu(Mode mode, int gpu_index, const Topology& topo, const Machine& machine);

// The NUMA node of cuda:<gpu_index> (for the log line).
Result<int> numa_node_of_gpu(int gpu_index, const Topology& topo, const Machine& machine);

enum class Backend {
  best,   // hwloc where the build has it, sysfs for the rest
  sysfs,  // sysfs alone
  hwloc,  // hwloc where it answers (an error in a build without it)
};
bool built_with_hwloc();
Result<std::unique_ptr<Topology>> open_topology(Backend backend = Backend::best);

class SysfsTopology : public Topology {
 public:
  explicit SysfsTopology(std::string root = "/");
  Result<CpuSet> possible_nodes() const override;
  Result<CpuSet> node_cpus(int node) const override;
  Result<int> package_of(int cpu) const override;
  Result<CpuSet> thread_siblings_of(int cpu) const override;
  Result<CpuSet> max_level_cache_of(int cpu) const override;
  Result<int> pci_numa_node(const std::string& pci_address) const override;

 private:
  std::string path(std::string_view absolute) const;
  std::string root_;
};

// The PCI address as torch forms it from a device's domain, bus and device
// numbers ("%04x:%02x:%02x.0"), from any of the forms drivers print
// ("00000000:18:00.0", "0000:18:00.0", upper or lower case).
Result<std::string> normalize_pci_address(std::string_view address);

// The binding of one local rank's worker.
struct Binding {
  int local_rank = 0;
  int gpu_index = 0;    // cuda:<gpu_index>: the real local rank, also under --virtual-local-rank
  std::string gpu_pci;  // its PCI address
  int numa_node = 0;    // its NUMA node
  CpuSet cpus;
};

// The bindings of local ranks 0 .. nproc-1, each to the GPU of its own index,
// as torchrun binds them; the first error ends the plan.
Result<std::vector<Binding>> plan(Mode mode, int nproc, const Topology& topo, const Machine& machine);

// The INFO line that says what a worker was bound to.
std::string describe(Mode mode, const Binding& binding);

// The calling thread's CPU affinity.
Result<CpuSet> own_affinity();

// A CPU set as the bit mask sched_setaffinity takes.
std::vector<unsigned long> to_mask(const CpuSet& cpus);

}  // namespace muster::launcher::numa
