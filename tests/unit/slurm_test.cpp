#include <catch2/catch.hpp>

#include "cli.hpp"
#include "slurm.hpp"

using namespace muster::launcher;

namespace {

std::vector<std::string> hosts(const std::string& list) {
  auto r = expand_hostlist(list);
  REQUIRE(r.ok());
  return r.value();
}

std::string hostlist_error(const std::string& list, std::size_t max = kMaxHostlistHosts) {
  auto r = expand_hostlist(list, max);
  REQUIRE_FALSE(r.ok());
  return r.status().message();
}

Environment step(int nodes, int node_id, const std::string& list = "n[1-2]") {
  return {{"SLURM_JOB_ID", "4242"},           {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NUM_NODES", std::to_string(nodes)}, {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nodes)}, {"SLURM_STEP_NODELIST", list}};
}

HostFacts facts() {
  HostFacts h;
  h.cpu_count = 4;
  h.gpu_count = [] { return muster::Result<int>(0); };
  h.new_run_id = []() -> muster::Result<std::string> { return std::string("uuid"); };
  return h;
}

muster::Result<LaunchConfig> launch(const std::vector<std::string>& argv, const Environment& env) {
  auto parsed = parse_args(argv, env);
  if (!parsed.ok()) return parsed.status();
  return resolve_config(parsed.value(), env, facts());
}

}  // namespace

TEST_CASE("Slurm hostlists expand as scontrol show hostnames prints them", "[slurm]") {
  CHECK(hosts("n[1-3,07],gpu-a[01-02]b") ==
        std::vector<std::string>{"n1", "n2", "n3", "n07", "gpu-a01b", "gpu-a02b"});
  CHECK(hosts("node001") == std::vector<std::string>{"node001"});
  CHECK(hosts("a,b,c") == std::vector<std::string>{"a", "b", "c"});
  CHECK(hosts("n[08-11]") == std::vector<std::string>{"n08", "n09", "n10", "n11"});
  CHECK(hosts("r[1-2]n[1-2]") == std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(hosts("n[5]") == std::vector<std::string>{"n5"});
  CHECK(hostlist_error("n[3-1]").find("bad range '3-1'") != std::string::npos);
  CHECK(hostlist_error("n[1-").find("unmatched '['") != std::string::npos);
  CHECK(hostlist_error("n]1").find("unmatched ']'") != std::string::npos);
  CHECK(hostlist_error("n[[1]]").find("nests brackets") != std::string::npos);
  CHECK(hostlist_error("n[a-b]").find("bad range") != std::string::npos);
  CHECK(hostlist_error("n[1-100]", 50).find("more than 50 hosts") != std::string::npos);
  CHECK(hostlist_error("n[1-10]m[1-10]", 50).find("more than 50 hosts") != std::string::npos);
  CHECK(hostlist_error("n[0-99999999999999]").find("more than") != std::string::npos);
  CHECK(hostlist_error(",").find("names no host") != std::string::npos);
  CHECK(hostlist_error("a b").find("blank") != std::string::npos);
}

TEST_CASE("a Slurm step is read from srun's variables", "[slurm]") {
  auto s = read_slurm_step(step(2, 1, "gpu[07-08]"));
  REQUIRE(s.ok());
  REQUIRE(s.value());
  CHECK(s.value()->nodes == 2);
  CHECK(s.value()->node_id == 1);
  CHECK(s.value()->head == "gpu07");
  CHECK(s.value()->port == slurm_port("4242", "3"));
  // Not a step: an sbatch script's own shell has no SLURM_STEP_NUM_NODES.
  auto none = read_slurm_step({{"SLURM_JOB_ID", "1"}});
  REQUIRE(none.ok());
  CHECK_FALSE(none.value());
  // Two tasks on one node would be two agents with the same node rank.
  auto env = step(1, 0, "n1");
  env["SLURM_STEP_NUM_TASKS"] = "2";
  auto two = read_slurm_step(env);
  REQUIRE_FALSE(two.ok());
  CHECK(two.status().message().find("srun --ntasks-per-node=1") != std::string::npos);
  auto out_of_step = step(2, 2);
  CHECK_FALSE(read_slurm_step(out_of_step).ok());
  // A huge step's list is not expanded to find its head.
  auto huge = read_slurm_step(step(2, 0, "node[000001-999999],gpu[1-9]"));
  REQUIRE(huge.ok());
  CHECK(huge.value()->head == "node000001");
  auto many_tasks = step(2, 0);
  many_tasks["SLURM_STEP_NUM_TASKS"] = "4294967298";  // would wrap to 2 as an int
  CHECK_FALSE(read_slurm_step(many_tasks).ok());
  CHECK_FALSE(read_slurm_step(step(2, 0, "n[1-")).ok());
}

TEST_CASE("steps sharing a head node get different ports", "[slurm]") {
  CHECK(slurm_port("4242", "0") != slurm_port("4242", "1"));
  CHECK(slurm_port("4242", "0") != slurm_port("4243", "0"));
  for (const char* job : {"1", "99999", "123456789"}) {
    int p = slurm_port(job, "0");
    CHECK(p >= 20000);
    CHECK(p < 32768);  // below the ephemeral ports
  }
}

TEST_CASE("inside a step, a plain command line forms one job over it", "[slurm]") {
  auto env = step(2, 1);
  env["SLURM_GPUS_ON_NODE"] = "4";
  auto cfg = launch({"train.py"}, env);
  REQUIRE(cfg.ok());
  // One node: no port chosen from the job (as any one-node job).
  auto one = launch({"train.py"}, step(1, 0, "n1"));
  REQUIRE(one.ok());
  CHECK(one->max_nodes == 1);
  CHECK(one->master_port != slurm_port("4242", "3"));
  CHECK(one->notices[0].find("a free port") != std::string::npos);
  CHECK(cfg->min_nodes == 2);
  CHECK(cfg->max_nodes == 2);
  CHECK(cfg->node_rank == 1);
  CHECK(cfg->rdzv_backend == "static");
  CHECK(cfg->master_addr == "n1");
  CHECK(cfg->master_port == slurm_port("4242", "3"));
  CHECK(cfg->rdzv_id == "slurm-4242.3");
  CHECK(cfg->nproc_per_node == 4);
  REQUIRE(cfg->notices.size() == 1);
  CHECK(cfg->notices[0].find("Slurm step 4242.3: one job over its 2 node(s), this one node rank 1") == 0);

  // What the user gives wins where it may.
  auto given = launch({"--nproc-per-node=2", "--master-port=30001", "--rdzv-id=mine", "train.py"}, env);
  REQUIRE(given.ok());
  CHECK(given->nproc_per_node == 2);
  CHECK(given->master_port == 30001);
  CHECK(given->rdzv_id == "mine");
  CHECK(given->min_nodes == 2);
}

TEST_CASE("torchrun's own options inside a step keep torchrun's behaviour", "[slurm]") {
  auto env = step(2, 1);
  for (auto argv : std::vector<std::vector<std::string>>{{"--nnodes=1", "t.py"},
                                                         {"--standalone", "t.py"},
                                                         {"--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "t.py"},
                                                         {"--master-addr=h", "t.py"},
                                                         {"--node-rank=0", "t.py"}}) {
    auto cfg = launch(argv, env);
    REQUIRE(cfg.ok());
    CHECK(cfg->notices.empty());
  }
  auto pet = env;
  pet["PET_NNODES"] = "1";
  auto by_pet = launch({"t.py"}, pet);
  REQUIRE(by_pet.ok());
  CHECK(by_pet->max_nodes == 1);
  CHECK(by_pet->notices.empty());
}

TEST_CASE("with --rdzv-backend=slurm muster asks for the step explicitly", "[slurm]") {
  auto outside = launch({"--rdzv-backend=slurm", "t.py"}, {});
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.status().message().find("this is not a Slurm step") != std::string::npos);
  auto clash = launch({"--rdzv-backend=slurm", "--nnodes=3", "t.py"}, step(2, 0));
  REQUIRE_FALSE(clash.ok());
  CHECK(clash.status().message().find("drop --nnodes") != std::string::npos);
  auto ok = launch({"--rdzv-backend=slurm", "t.py"}, step(2, 0));
  REQUIRE(ok.ok());
  CHECK(ok->rdzv_backend == "static");
  CHECK(ok->node_rank == 0);
}
