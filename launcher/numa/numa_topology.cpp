// The machine's topology for --numa-binding: hwloc where its model gives
// torch's exact answer, sysfs where it does not (numa_binding.hpp says which).
#include <cstdlib>
#include <memory>

#include "numa_binding.hpp"

#ifdef MUSTER_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace muster::launcher::numa {

namespace {

std::string fsroot() {
  const char* root = std::getenv("HWLOC_FSROOT");
  return root != nullptr && *root != '\0' ? root : "/";
}

#ifdef MUSTER_HAVE_HWLOC

CpuSet to_cpus(hwloc_const_bitmap_t bitmap) {
  CpuSet cpus;
  for (int i = hwloc_bitmap_first(bitmap); i >= 0; i = hwloc_bitmap_next(bitmap, i)) cpus.insert(i);
  return cpus;
}

// Packages and physical cores from hwloc: its Package and Core objects are
// the kernel's package and thread-sibling facts (hwloc reads their bitmap
// files, torch the physical_package_id and list files), so they answer as
// torch does. Caches, NUMA nodes, the possible nodes and the GPUs' nodes come
// from sysfs (SysfsTopology): of two caches at the same highest level torch
// takes the one its directory listing gives first, which hwloc's tree cannot
// say.
class HwlocTopology : public SysfsTopology {
 public:
  explicit HwlocTopology(hwloc_topology_t topo) : SysfsTopology(fsroot()), topo_(topo) {}
  ~HwlocTopology() override { hwloc_topology_destroy(topo_); }
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;

  Result<int> package_of(int cpu) const override {
    auto package = ancestor(cpu, HWLOC_OBJ_PACKAGE);
    if (!package.ok()) return package.status();
    return static_cast<int>((*package)->os_index);
  }

  Result<CpuSet> thread_siblings_of(int cpu) const override {
    auto core = ancestor(cpu, HWLOC_OBJ_CORE);
    if (!core.ok()) return core.status();
    return to_cpus((*core)->cpuset);
  }

 private:
  Result<hwloc_obj_t> pu_of(int cpu) const {
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(topo_, static_cast<unsigned>(cpu));
    if (pu == nullptr) return invalid_argument("hwloc does not know CPU " + std::to_string(cpu) + " (offline?)");
    return pu;
  }

  Result<hwloc_obj_t> ancestor(int cpu, hwloc_obj_type_t type) const {
    auto pu = pu_of(cpu);
    if (!pu.ok()) return pu.status();
    hwloc_obj_t obj = hwloc_get_ancestor_obj_by_type(topo_, type, *pu);
    if (obj == nullptr) {
      return invalid_argument(std::string("hwloc finds no ") + hwloc_obj_type_string(type) + " above CPU " +
                              std::to_string(cpu));
    }
    return obj;
  }

  hwloc_topology_t topo_;
};

Result<std::unique_ptr<Topology>> load_hwloc() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return io_error("hwloc_topology_init failed");
  // Every CPU, also those outside this process's cgroup: a core's siblings
  // and a cache's sharers are what sysfs lists, allowed or not; the binding
  // intersects with the launcher's affinity itself.
  hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  hwloc_topology_set_cache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return io_error("hwloc cannot read this machine's topology (under " + fsroot() + ")");
  }
  return std::unique_ptr<Topology>(new HwlocTopology(topo));
}

#endif

}  // namespace

bool built_with_hwloc() {
#ifdef MUSTER_HAVE_HWLOC
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<Topology>> open_topology(Backend backend) {
  if (backend == Backend::sysfs || (backend == Backend::best && !built_with_hwloc())) {
    return std::unique_ptr<Topology>(new SysfsTopology(fsroot()));
  }
#ifdef MUSTER_HAVE_HWLOC
  return load_hwloc();
#else
  return invalid_argument("this muster was built without hwloc");
#endif
}

}  // namespace muster::launcher::numa
