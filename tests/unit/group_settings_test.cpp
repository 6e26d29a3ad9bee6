// libmuster's process-group settings: options first, then the environment
// torchrun gives a worker, each value checked once with an error that says
// what to set.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "../../worker_runtime/src/group_settings.hpp"

using muster::ProcessGroupOptions;
using muster::detail::read_group_settings;

namespace {

const char* const kVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                  "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "MUSTER_CPU_TRANSPORT",
                                  "MUSTER_NODE_ID", "MUSTER_SHM_SLOT_BYTES"};

// Sets exactly these of the variables for the test's duration; the rest are unset.
struct Environment {
  std::map<std::string, std::optional<std::string>> saved;
  explicit Environment(const std::map<std::string, std::string>& vars) {
    for (const char* name : kVariables) {
      const char* old = std::getenv(name);
      saved[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(name);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Environment() {
    for (const auto& [k, v] : saved) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
};

std::string error_of(const ProcessGroupOptions& o) {
  try {
    read_group_settings(o);
  } catch (const muster::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("group settings come from torchrun's environment", "[group_settings]") {
  Environment env({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RESTART_COUNT", "2"}, {"MUSTER_NODE_ID", "rack4"},
                   {"MUSTER_SHM_SLOT_BYTES", "8192"}});
  auto s = read_group_settings({});
  CHECK(s.rank == 3);
  CHECK(s.world == 8);
  CHECK(s.local_rank == 1);
  CHECK(s.local_size == 2);
  CHECK(s.master_addr == "node0");
  CHECK(s.master_port == 29500);
  CHECK(s.agent_store);
  CHECK(s.restart == 2);
  CHECK(s.node_id == "rack4");
  CHECK_FALSE(s.tcp_only);
  CHECK(s.slot_bytes == 8192);

  SECTION("options win over the environment") {
    ProcessGroupOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.master_addr = "127.0.0.1";
    o.master_port = 1234;
    o.use_agent_store = false;
    o.name = "grads.v2";
    auto t = read_group_settings(o);
    CHECK((t.rank == 0 && t.world == 2 && t.master_addr == "127.0.0.1" && t.master_port == 1234));
    CHECK_FALSE(t.agent_store);
    CHECK(t.name == "grads.v2");
  }
}

TEST_CASE("group settings that cannot work are refused with what to set", "[group_settings]") {
  SECTION("nothing set") {
    Environment env({});
    auto e = error_of({});
    CHECK(e.find("RANK is not set") != std::string::npos);
    CHECK(e.find("muster or torchrun") != std::string::npos);
  }
  SECTION("values out of range or not numbers") {
    Environment env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    CHECK(error_of({}).find("RANK 2 is outside [0, 2)") != std::string::npos);
    ::setenv("RANK", "x1", 1);
    CHECK(error_of({}).find("RANK='x1' is not an integer") != std::string::npos);
    ::setenv("RANK", "0", 1);
    ::setenv("MASTER_PORT", "70000", 1);
    CHECK(error_of({}).find("MASTER_PORT 70000 is not a port") != std::string::npos);
    ::setenv("MASTER_PORT", "1", 1);
    ::setenv("MUSTER_CPU_TRANSPORT", "rdma", 1);
    CHECK(error_of({}).find("MUSTER_CPU_TRANSPORT='rdma'") != std::string::npos);
    ::setenv("MUSTER_CPU_TRANSPORT", "tcp", 1);
    ::setenv("MUSTER_SHM_SLOT_BYTES", "5000", 1);
    CHECK(error_of({}).find("multiple of 4096") != std::string::npos);
    ::unsetenv("MUSTER_SHM_SLOT_BYTES");
    CHECK(read_group_settings({}).tcp_only);
  }
  SECTION("names, backends and timeouts") {
    Environment env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
    ProcessGroupOptions o;
    o.name = "has space";
    CHECK(error_of(o).find("the group name 'has space'") != std::string::npos);
    o.name = std::string(129, 'a');
    CHECK(error_of(o).find("must be 1-128") != std::string::npos);
    o.name = std::string(128, 'a');
    CHECK(error_of(o).empty());
    o.backend = "nccl";
    CHECK(error_of(o).find("muster::NcclCommunicator") != std::string::npos);
    o.backend = "cpu";
    o.timeout = std::chrono::milliseconds(0);
    CHECK(error_of(o).find("timeout must be positive") != std::string::npos);
  }
}
