#include "numa_binding.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace muster::launcher::numa {

namespace {

// No machine Linux runs on has CPU or NUMA node numbers this large; a list
// that names one is not a sysfs CPU list.
constexpr int kMaxCpuIndex = 1 << 16;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<long> parse_long(std::string_view s, int base = 10) {
  s = trim(s);
  long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Status not_found(const std::string& what) { return {Code::not_found, what}; }

// The allowed CPUs of a NUMA node.
Result<CpuSet> allowed_node_cpus(int node, const Topology& topo, const Machine& machine) {
  auto cpus = topo.node_cpus(node);
  if (!cpus.ok()) return cpus.status();
  CpuSet out;
  std::set_intersection(cpus->begin(), cpus->end(), machine.allowed.begin(), machine.allowed.end(),
                        std::inserter(out, out.end()));
  return out;
}

// The lowest allowed CPU of a node: torch's stand-in for the node when it asks
// for the node's socket. A node with none (no CPUs, or none this launcher may
// use) has no socket, and torch fails there. gpu_node: the node is the GPU's
// own (nothing near the GPU to bind to), not another node socket mode looks at.
Result<int> lowest_allowed_cpu(int node, bool gpu_node, const Topology& topo, const Machine& machine) {
  auto cpus = allowed_node_cpus(node, topo, machine);
  if (!cpus.ok()) {
    if (gpu_node) return cpus.status();
    return Status(cpus.status().code(), "--numa-binding=socket looks at every possible NUMA node, and " +
                                            cpus.status().message() +
                                            "; use --numa-binding=node, exclusive or core-complex, which look at "
                                            "the GPU's own node only");
  }
  if (cpus->empty()) {
    if (gpu_node) {
      return invalid_argument("NUMA node " + std::to_string(node) +
                              " of the GPU has no CPU this launcher may use; widen the launcher's CPU affinity, "
                              "or drop --numa-binding");
    }
    return invalid_argument("NUMA node " + std::to_string(node) +
                            " has no CPU this launcher may use (a CPU-less memory node, or one outside its "
                            "affinity), so its socket is unknown; use --numa-binding=node, exclusive or "
                            "core-complex, which look at the GPU's own node only");
  }
  return *cpus->begin();
}

// The GPUs on the same NUMA node as cuda:<gpu_index>, and its place among them.
struct NodeShare {
  int node = 0;
  int gpus = 0;      // GPUs on that node
  int position = 0;  // this GPU's index among them, in ordinal order
};

Result<NodeShare> node_share(int gpu_index, const Topology& topo, const Machine& machine) {
  NodeShare share;
  auto node = numa_node_of_gpu(gpu_index, topo, machine);
  if (!node.ok()) return node.status();
  share.node = *node;
  for (int i = 0; i < static_cast<int>(machine.gpu_pci.size()); ++i) {
    auto other = numa_node_of_gpu(i, topo, machine);
    if (!other.ok()) return other.status();
    if (*other != share.node) continue;
    if (i < gpu_index) ++share.position;
    ++share.gpus;
  }
  return share;
}

// The allowed CPUs of a node grouped by what each shares (its physical
// core's threads, its cache's CPUs: `sharing`), each group named by the lowest
// CPU it shares with, the groups in that order. `nothing`: the error for a CPU
// that shares with none.
Result<std::map<int, CpuSet>> group_by_sharing(int node, const Topology& topo, const Machine& machine,
                                               Result<CpuSet> (Topology::*sharing)(int) const,
                                               const std::string& nothing) {
  auto cpus = allowed_node_cpus(node, topo, machine);
  if (!cpus.ok()) return cpus.status();
  std::map<int, CpuSet> groups;
  for (int cpu : *cpus) {
    auto shared = (topo.*sharing)(cpu);
    if (!shared.ok()) return shared.status();
    if (shared->empty()) return invalid_argument("CPU " + std::to_string(cpu) + " " + nothing);
    groups[*shared->begin()].insert(cpu);
  }
  return groups;
}

Result<CpuSet> node_mode(int gpu_index, const Topology& topo, const Machine& machine) {
  auto node = numa_node_of_gpu(gpu_index, topo, machine);
  if (!node.ok()) return node.status();
  return allowed_node_cpus(*node, topo, machine);
}

Result<CpuSet> socket_mode(int gpu_index, const Topology& topo, const Machine& machine) {
  auto node = numa_node_of_gpu(gpu_index, topo, machine);
  if (!node.ok()) return node.status();
  auto anchor = lowest_allowed_cpu(*node, true, topo, machine);
  if (!anchor.ok()) return anchor.status();
  auto socket = topo.package_of(*anchor);
  if (!socket.ok()) return socket.status();
  auto nodes = topo.possible_nodes();
  if (!nodes.ok()) return nodes.status();
  CpuSet out;
  for (int n : *nodes) {
    auto first = lowest_allowed_cpu(n, n == *node, topo, machine);
    if (!first.ok()) return first.status();
    auto package = topo.package_of(*first);
    if (!package.ok()) return package.status();
    if (*package != *socket) continue;
    auto cpus = allowed_node_cpus(n, topo, machine);
    if (!cpus.ok()) return cpus.status();
    out.insert(cpus->begin(), cpus->end());
  }
  return out;
}

Result<CpuSet> exclusive_mode(int gpu_index, const Topology& topo, const Machine& machine) {
  auto share = node_share(gpu_index, topo, machine);
  if (!share.ok()) return share.status();
  auto cores = group_by_sharing(share->node, topo, machine, &Topology::thread_siblings_of, "lists no thread siblings");
  if (!cores.ok()) return cores.status();
  const int n = static_cast<int>(cores->size());
  const int per_gpu = n / share->gpus;
  const int extra = n % share->gpus;
  if (per_gpu < 1) {
    return invalid_argument("NUMA node " + std::to_string(share->node) + " has " + std::to_string(n) +
                            " physical cores this launcher may use but " + std::to_string(share->gpus) +
                            " GPUs, so --numa-binding=exclusive cannot give each its own core; " +
                            (n > 0 ? "use --numa-binding=node, or widen the launcher's CPU affinity"
                                   : "widen the launcher's CPU affinity, or drop --numa-binding"));
  }
  const int start = share->position * per_gpu + std::min(share->position, extra);
  const int end = start + per_gpu + (share->position < extra ? 1 : 0);
  CpuSet out;
  int i = 0;
  for (const auto& [core, threads] : *cores) {
    if (i >= start && i < end) out.insert(threads.begin(), threads.end());
    ++i;
  }
  return out;
}

Result<CpuSet> core_complex_mode(int gpu_index, const Topology& topo, const Machine& machine) {
  auto share = node_share(gpu_index, topo, machine);
  if (!share.ok()) return share.status();
  auto caches = group_by_sharing(share->node, topo, machine, &Topology::max_level_cache_of,
                                 "has no data or unified cache in sysfs, so its core complex is unknown; use "
                                 "--numa-binding=node or exclusive instead");
  if (!caches.ok()) return caches.status();
  if (caches->empty()) {
    return invalid_argument("NUMA node " + std::to_string(share->node) +
                            " has no CPU this launcher may use; widen the launcher's CPU affinity, or drop "
                            "--numa-binding");
  }
  std::vector<std::pair<int, const CpuSet*>> order;
  for (const auto& [cache, members] : *caches) order.emplace_back(cache, &members);
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second->size() != b.second->size()) return a.second->size() > b.second->size();
    return a.first < b.first;
  });
  return *order[static_cast<std::size_t>(share->position) % order.size()].second;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<CpuSet> read_cpu_list(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  auto cpus = parse_cpu_list(*text);
  if (!cpus.ok()) return invalid_argument(path + ": " + cpus.status().message());
  return cpus;
}

Result<long> read_number(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  auto v = parse_long(*text);
  if (!v) return invalid_argument(path + ": not a number: '" + std::string(trim(*text)) + "'");
  return *v;
}

}  // namespace

std::optional<Mode> parse_mode(std::string_view text) {
  if (text == "node") return Mode::node;
  if (text == "socket") return Mode::socket;
  if (text == "exclusive") return Mode::exclusive;
  if (text == "core-complex") return Mode::core_complex;
  return std::nullopt;
}

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::node: return "node";
    case Mode::socket: return "socket";
    case Mode::exclusive: return "exclusive";
    case Mode::core_complex: return "core-complex";
  }
  return "?";
}

Result<CpuSet> parse_cpu_list(std::string_view text) {
  CpuSet cpus;
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    if (!item.empty()) {
      auto dash = item.find('-');
      auto first = parse_long(item.substr(0, dash));
      auto last = dash == std::string_view::npos ? first : parse_long(item.substr(dash + 1));
      if (!first || !last || *first < 0 || *last < *first || *last > kMaxCpuIndex) {
        return invalid_argument("'" + std::string(item) + "' is not a CPU number or range (as in 0-3,8)");
      }
      for (long c = *first; c <= *last; ++c) cpus.insert(static_cast<int>(c));
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return cpus;
}

std::string format_cpu_list(const CpuSet& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int first = *it;
    int last = first;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!out.empty()) out += ',';
    out += std::to_string(first);
    if (last != first) out += '-' + std::to_string(last);
  }
  return out;
}

Result<int> numa_node_of_gpu(int gpu_index, const Topology& topo, const Machine& machine) {
  if (gpu_index < 0 || gpu_index >= static_cast<int>(machine.gpu_pci.size())) {
    return invalid_argument("no GPU cuda:" + std::to_string(gpu_index) + " to bind local rank " +
                            std::to_string(gpu_index) + " to: this node shows " +
                            std::to_string(machine.gpu_pci.size()) +
                            " GPU(s) (CUDA_VISIBLE_DEVICES); give --nproc-per-node at most that many, or drop "
                            "--numa-binding");
  }
  auto node = topo.pci_numa_node(machine.gpu_pci[static_cast<std::size_t>(gpu_index)]);
  if (!node.ok()) return node.status();
  // One-node machines often write -1: there is a node 0 all the same.
  return std::max(*node, 0);
}

Result<CpuSet> cpus_for_gpu(Mode mode, int gpu_index, const Topology& topo, const Machine& machine) {
  Result<CpuSet> cpus = CpuSet{};
  switch (mode) {
    case Mode::node: cpus = node_mode(gpu_index, topo, machine); break;
    case Mode::socket: cpus = socket_mode(gpu_index, topo, machine); break;
    case Mode::exclusive: cpus = exclusive_mode(gpu_index, topo, machine); break;
    case Mode::core_complex: cpus = core_complex_mode(gpu_index, topo, machine); break;
  }
  if (cpus.ok() && cpus->empty()) {
    return invalid_argument(std::string("--numa-binding=") + mode_name(mode) + " finds no CPU for cuda:" +
                            std::to_string(gpu_index) +
                            " that this launcher may use (its NUMA node has no CPUs, or none in the launcher's "
                            "affinity); widen the launcher's CPU affinity, or drop --numa-binding");
  }
  return cpus;
}

Result<std::vector<Binding>> plan(Mode mode, int nproc, const Topology& topo, const Machine& machine) {
  std::vector<Binding> bindings;
  for (int lr = 0; lr < nproc; ++lr) {
    Binding b;
    b.local_rank = lr;
    b.gpu_index = lr;
    auto node = numa_node_of_gpu(lr, topo, machine);
    if (!node.ok()) return node.status();
    b.gpu_pci = machine.gpu_pci[static_cast<std::size_t>(lr)];
    b.numa_node = *node;
    auto cpus = cpus_for_gpu(mode, lr, topo, machine);
    if (!cpus.ok()) return cpus.status();
    b.cpus = std::move(cpus.value());
    bindings.push_back(std::move(b));
  }
  return bindings;
}

std::string describe(Mode mode, const Binding& b) {
  return "NUMA binding (" + std::string(mode_name(mode)) + "): local_rank " + std::to_string(b.local_rank) +
         " -> GPU cuda:" + std::to_string(b.gpu_index) + " (" + b.gpu_pci + ", NUMA node " +
         std::to_string(b.numa_node) + "), CPUs " + format_cpu_list(b.cpus);
}

SysfsTopology::SysfsTopology(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  if (root_ == "/") root_.clear();
}

std::string SysfsTopology::path(std::string_view absolute) const { return root_ + std::string(absolute); }

Result<CpuSet> SysfsTopology::possible_nodes() const {
  return read_cpu_list(path("/sys/devices/system/node/possible"));
}

Result<CpuSet> SysfsTopology::node_cpus(int node) const {
  auto file = path("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  auto cpus = read_cpu_list(file);
  if (!cpus.ok() && cpus.status().code() == Code::not_found) {
    return invalid_argument("cannot determine the CPUs of NUMA node " + std::to_string(node) + " (" +
                            cpus.status().message() + "): the node seems offline");
  }
  return cpus;
}

Result<int> SysfsTopology::package_of(int cpu) const {
  auto v = read_number(path("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/physical_package_id"));
  if (!v.ok()) return invalid_argument("cannot determine the socket of CPU " + std::to_string(cpu) + ": " +
                                       v.status().message());
  return static_cast<int>(*v);
}

Result<CpuSet> SysfsTopology::thread_siblings_of(int cpu) const {
  return read_cpu_list(path("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list"));
}

Result<CpuSet> SysfsTopology::max_level_cache_of(int cpu) const {
  namespace fs = std::filesystem;
  const std::string dir = path("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache");
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return not_found("cannot list " + dir + ": " + ec.message());
  // In the directory's own order (readdir's, as torch's os.listdir): of two
  // caches at the same level, the first listed counts, as in torch.
  std::vector<std::string> entries;
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    if (name.size() <= 5 || name.rfind("index", 0) != 0 ||
        !std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    entries.push_back(entry.path().string());
  }
  long max_level = -1;
  CpuSet sharing;
  for (const auto& entry : entries) {
    auto type = read_file(entry + "/type");
    if (!type.ok()) return type.status();
    if (trim(*type) != "Unified" && trim(*type) != "Data") continue;
    auto level = read_number(entry + "/level");
    if (!level.ok()) return level.status();
    if (*level <= max_level) continue;
    max_level = *level;
    auto cpus = read_cpu_list(entry + "/shared_cpu_list");
    if (!cpus.ok()) return cpus.status();
    sharing = std::move(cpus.value());
  }
  return sharing;
}

Result<int> SysfsTopology::pci_numa_node(const std::string& pci_address) const {
  auto file = path("/sys/bus/pci/devices/" + pci_address + "/numa_node");
  auto v = read_number(file);
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

Result<std::string> normalize_pci_address(std::string_view address) {
  // domain:bus:device.function, every part hexadecimal.
  std::string_view a = trim(address);
  auto c1 = a.find(':');
  auto c2 = c1 == std::string_view::npos ? c1 : a.find(':', c1 + 1);
  auto dot = c2 == std::string_view::npos ? c2 : a.find('.', c2 + 1);
  if (dot == std::string_view::npos) {
    return invalid_argument("'" + std::string(address) + "' is not a PCI address (domain:bus:device.function)");
  }
  auto domain = parse_long(a.substr(0, c1), 16);
  auto bus = parse_long(a.substr(c1 + 1, c2 - c1 - 1), 16);
  auto device = parse_long(a.substr(c2 + 1, dot - c2 - 1), 16);
  auto function = parse_long(a.substr(dot + 1), 16);
  if (!domain || !bus || !device || !function || *domain < 0 || *domain > 0xffffffffL || *bus < 0 || *bus > 0xff ||
      *device < 0 || *device > 0x1f || *function < 0 || *function > 7) {
    return invalid_argument("'" + std::string(address) + "' is not a PCI address (domain:bus:device.function)");
  }
  char out[32];
  std::snprintf(out, sizeof out, "%04lx:%02lx:%02lx.0", *domain, *bus, *device);
  return std::string(out);
}

Result<CpuSet> own_affinity() {
  cpu_set_t* set = CPU_ALLOC(kMaxCpuIndex);
  if (set == nullptr) return io_error("cannot allocate a CPU mask");
  const std::size_t size = CPU_ALLOC_SIZE(kMaxCpuIndex);
  CPU_ZERO_S(size, set);
  if (sched_getaffinity(0, size, set) != 0) {
    int err = errno;
    CPU_FREE(set);
    return Status(Code::io_error, std::string("cannot read this process's CPU affinity: ") + std::strerror(err), err);
  }
  CpuSet cpus;
  for (int c = 0; c < kMaxCpuIndex; ++c) {
    if (CPU_ISSET_S(c, size, set)) cpus.insert(c);
  }
  CPU_FREE(set);
  return cpus;
}

std::vector<unsigned long> to_mask(const CpuSet& cpus) {
  constexpr int kBits = static_cast<int>(sizeof(unsigned long) * 8);
  std::vector<unsigned long> mask;
  if (cpus.empty()) return mask;
  mask.resize(static_cast<std::size_t>(*cpus.rbegin() / kBits + 1), 0UL);
  for (int c : cpus) mask[static_cast<std::size_t>(c / kBits)] |= 1UL << (c % kBits);
  return mask;
}

}  // namespace muster::launcher::numa
