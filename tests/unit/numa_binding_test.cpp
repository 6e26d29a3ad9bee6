#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <map>

#include "numa_binding.hpp"
#include "plan_process.hpp"

using namespace muster::launcher::numa;
using muster::Code;
using muster::Result;
using muster::Status;

namespace {

// A machine in memory: every query answers from maps, a missing entry as a
// missing sysfs file.
struct FakeTopology : Topology {
  CpuSet possible;
  std::map<int, CpuSet> nodes;
  std::map<int, int> packages;
  std::map<int, CpuSet> siblings;
  std::map<int, CpuSet> caches;
  std::map<std::string, int> pci;

  template <typename M>
  static auto find(const M& m, const typename M::key_type& k) -> Result<typename M::mapped_type> {
    auto it = m.find(k);
    if (it == m.end()) return Status(Code::not_found, "missing");
    return it->second;
  }
  Result<CpuSet> possible_nodes() const override { return possible; }
  Result<CpuSet> node_cpus(int node) const override { return find(nodes, node); }
  Result<int> package_of(int cpu) const override { return find(packages, cpu); }
  Result<CpuSet> thread_siblings_of(int cpu) const override { return find(siblings, cpu); }
  Result<CpuSet> max_level_cache_of(int cpu) const override { return find(caches, cpu); }
  Result<int> pci_numa_node(const std::string& a) const override { return find(pci, a); }
};

// Two nodes of four CPUs (two cores of two threads each: 0/4, 1/5 on node 0;
// 2/6, 3/7 on node 1), one package per node, an L3 per node.
FakeTopology two_nodes() {
  FakeTopology t;
  t.possible = {0, 1};
  t.nodes = {{0, {0, 1, 4, 5}}, {1, {2, 3, 6, 7}}};
  for (int c = 0; c < 8; ++c) {
    int core = c % 4;
    t.packages[c] = core / 2;
    t.siblings[c] = {core, core + 4};
    t.caches[c] = core < 2 ? CpuSet{0, 1, 4, 5} : CpuSet{2, 3, 6, 7};
  }
  t.pci = {{"0000:18:00.0", 0}, {"0000:29:00.0", 1}, {"0000:3a:00.0", -1}};
  return t;
}

}  // namespace

TEST_CASE("CPU lists read and write in sysfs's form", "[numa]") {
  CHECK(parse_cpu_list("0-3,8,10-11\n").value() == CpuSet{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("\n").value().empty());
  CHECK(parse_cpu_list(" 5 ").value() == CpuSet{5});
  for (const char* bad : {"a", "3-1", "-1", "1-", "0-70000", "1,x", "1--3"}) {
    INFO(bad);
    CHECK_FALSE(parse_cpu_list(bad).ok());
  }
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(format_cpu_list({}).empty());
  CHECK(format_cpu_list({7}) == "7");
}

TEST_CASE("PCI addresses take torch's form whatever form the driver prints", "[numa]") {
  CHECK(normalize_pci_address("00000000:1B:00.0").value() == "0000:1b:00.0");
  CHECK(normalize_pci_address("0000:18:00.0").value() == "0000:18:00.0");
  CHECK(normalize_pci_address("0001:c3:1f.7").value() == "0001:c3:1f.0");
  for (const char* bad : {"", "18:00.0", "0000:18:00", "0000:118:00.0", "0000:18:20.0", "x:18:00.0"}) {
    INFO(bad);
    CHECK_FALSE(normalize_pci_address(bad).ok());
  }
}

TEST_CASE("a CPU set becomes sched_setaffinity's mask", "[numa]") {
  CHECK(to_mask({}).empty());
  auto mask = to_mask({0, 3, 64, 65});
  REQUIRE(mask.size() == (sizeof(unsigned long) == 8 ? 2 : 3));
  CHECK(mask[0] == 0b1001UL);
  CHECK(mask.back() != 0);
}

TEST_CASE("node and socket modes follow the GPU's NUMA node, within the launcher's affinity", "[numa]") {
  auto t = two_nodes();
  Machine m{{"0000:18:00.0", "0000:29:00.0", "0000:3a:00.0"}, {0, 1, 2, 3, 4, 5, 6, 7}};
  CHECK(cpus_for_gpu(Mode::node, 0, t, m).value() == CpuSet{0, 1, 4, 5});
  CHECK(cpus_for_gpu(Mode::node, 1, t, m).value() == CpuSet{2, 3, 6, 7});
  // numa_node -1 is node 0.
  CHECK(cpus_for_gpu(Mode::node, 2, t, m).value() == CpuSet{0, 1, 4, 5});
  CHECK(numa_node_of_gpu(2, t, m).value() == 0);
  m.allowed = {1, 2, 5};
  CHECK(cpus_for_gpu(Mode::node, 0, t, m).value() == CpuSet{1, 5});
  CHECK(cpus_for_gpu(Mode::socket, 1, t, m).value() == CpuSet{2});
  // One package for both nodes: socket mode takes both.
  for (auto& [cpu, package] : t.packages) package = 0;
  CHECK(cpus_for_gpu(Mode::socket, 1, t, m).value() == CpuSet{1, 2, 5});
}

TEST_CASE("exclusive mode splits a node's physical cores, the remainder to the lowest GPUs", "[numa]") {
  auto t = two_nodes();
  // Three cores on node 0 (0/4, 1/5, 2/6), three GPUs there.
  t.nodes = {{0, {0, 1, 2, 4, 5, 6}}, {1, {3, 7}}};
  t.pci = {{"a", 0}, {"b", 1}, {"c", 0}, {"d", 0}};
  Machine m{{"a", "b", "c", "d"}, {0, 1, 2, 3, 4, 5, 6, 7}};
  CHECK(cpus_for_gpu(Mode::exclusive, 0, t, m).value() == CpuSet{0, 4});
  CHECK(cpus_for_gpu(Mode::exclusive, 2, t, m).value() == CpuSet{1, 5});
  CHECK(cpus_for_gpu(Mode::exclusive, 3, t, m).value() == CpuSet{2, 6});
  CHECK(cpus_for_gpu(Mode::exclusive, 1, t, m).value() == CpuSet{3, 7});
  // Two cores for three GPUs: not every GPU can have one, so no GPU on that node is bound (torch refuses too).
  m.allowed = {0, 1, 3};
  CHECK(cpus_for_gpu(Mode::exclusive, 0, t, m).status().message().find("has 2 physical cores") !=
        std::string::npos);
}

TEST_CASE("core-complex mode gives a GPU one cache's CPUs, largest cache first", "[numa]") {
  auto t = two_nodes();
  t.nodes = {{0, {0, 1, 2, 3, 4, 5, 6, 7}}};
  t.possible = {0};
  // Caches: {0,4} alone, {1,2,5,6,3,7} together.
  for (int c : {0, 4}) t.caches[c] = {0, 4};
  for (int c : {1, 2, 3, 5, 6, 7}) t.caches[c] = {1, 2, 3, 5, 6, 7};
  t.pci = {{"a", 0}, {"b", 0}, {"c", 0}};
  Machine m{{"a", "b", "c"}, {0, 1, 2, 3, 4, 5, 6, 7}};
  CHECK(cpus_for_gpu(Mode::core_complex, 0, t, m).value() == CpuSet{1, 2, 3, 5, 6, 7});
  CHECK(cpus_for_gpu(Mode::core_complex, 1, t, m).value() == CpuSet{0, 4});
  CHECK(cpus_for_gpu(Mode::core_complex, 2, t, m).value() == CpuSet{1, 2, 3, 5, 6, 7});
}

TEST_CASE("a binding that cannot be made is an error that says what to do", "[numa]") {
  auto t = two_nodes();
  Machine m{{"0000:18:00.0"}, {0, 1, 2, 3, 4, 5, 6, 7}};
  auto missing = cpus_for_gpu(Mode::node, 1, t, m);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("this node shows 1 GPU(s)") != std::string::npos);
  // A CPU-less node among the possible ones: no socket for it, as in torch.
  t.possible = {0, 1, 2};
  t.nodes[2] = {};
  auto socket = cpus_for_gpu(Mode::socket, 0, t, m);
  REQUIRE_FALSE(socket.ok());
  CHECK(socket.status().message().find("NUMA node 2 has no CPU") != std::string::npos);
  // Nothing allowed on the GPU's node: never an empty binding.
  m.allowed = {2};
  auto empty = cpus_for_gpu(Mode::node, 0, t, m);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("finds no CPU for cuda:0") != std::string::npos);
  // plan() stops at the first rank that cannot be bound.
  m.allowed = {0, 1, 2, 3, 4, 5, 6, 7};
  auto plan_two = plan(Mode::node, 2, t, m);
  CHECK_FALSE(plan_two.ok());
  auto plan_one = plan(Mode::node, 1, t, m);
  REQUIRE(plan_one.ok());
  CHECK(describe(Mode::node, plan_one->at(0)) ==
        "NUMA binding (node): local_rank 0 -> GPU cuda:0 (0000:18:00.0, NUMA node 0), CPUs 0-1,4-5");
}

TEST_CASE("the plan is worked out in a child process and comes back whole", "[numa]") {
  Binding b{1, 1, "0000:29:00.0", 1, {2, 3, 6, 7}};
  auto back = plan_in_child([&]() -> Result<std::vector<Binding>> { return std::vector<Binding>{b, b}; });
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK(back->at(1).gpu_pci == "0000:29:00.0");
  CHECK(back->at(1).cpus == CpuSet{2, 3, 6, 7});
  CHECK(back->at(1).numa_node == 1);
  // An error keeps its code and message (one line).
  auto refused = plan_in_child([]() -> Result<std::vector<Binding>> {
    return Status(Code::invalid_argument, "no GPU\\nhere");
  });
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::invalid_argument);
  CHECK(refused.status().message() == "no GPU\\nhere");
  // A child that dies without answering (a crashing driver) is named as such.
  auto crashed = plan_in_child([]() -> Result<std::vector<Binding>> { std::abort(); });
  REQUIRE_FALSE(crashed.ok());
  CHECK(crashed.status().message().find("without an answer") != std::string::npos);
  // One that hangs is killed after the limit.
  auto hung = plan_in_child(
      []() -> Result<std::vector<Binding>> {
        for (;;) pause();
      },
      std::chrono::milliseconds(300));
  REQUIRE_FALSE(hung.ok());
  CHECK(hung.status().code() == Code::timeout);
  // A garbled answer is refused, not half-read.
  CHECK_FALSE(decode_plan("bind 0 0 x\n").ok());
  CHECK_FALSE(decode_plan("bind 0 0 0000:18:00.0 0 0-1\n").ok());  // no end
  CHECK(decode_plan(encode_plan(std::vector<Binding>{})).value().empty());
}
