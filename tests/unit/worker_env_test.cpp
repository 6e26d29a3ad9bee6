#include <catch2/catch.hpp>

#include "worker_env.hpp"

using namespace muster::launcher;

namespace {

GroupAssignment two_nodes_second() {
  GroupAssignment g;
  g.role = "trainer";
  g.group_rank = 1;
  g.group_world_size = 2;
  g.local_world_size = 3;
  g.base_global_rank = 1;
  g.global_world_size = 4;
  g.base_role_rank = 1;
  g.role_world_size = 4;
  g.master_addr = "node0";
  g.master_port = 29500;
  g.use_agent_store = false;
  g.run_id = "job";
  g.restart_count = 2;
  g.max_restarts = 5;
  return g;
}

}  // namespace

TEST_CASE("a worker gets exactly torchrun's variables on top of the agent's environment", "[env]") {
  Environment base = {{"PATH", "/usr/bin"}, {"OMP_NUM_THREADS", "1"}, {"RANK", "stale"}};
  auto env = build_worker_env(base, two_nodes_second(), 2, "/logs/attempt_2/2/error.json", false);
  REQUIRE(env.ok());
  Environment expected = base;
  expected["LOCAL_RANK"] = "2";
  expected["RANK"] = "3";
  expected["GROUP_RANK"] = "1";
  expected["ROLE_RANK"] = "3";
  expected["ROLE_NAME"] = "trainer";
  expected["LOCAL_WORLD_SIZE"] = "3";
  expected["WORLD_SIZE"] = "4";
  expected["GROUP_WORLD_SIZE"] = "2";
  expected["ROLE_WORLD_SIZE"] = "4";
  expected["MASTER_ADDR"] = "node0";
  expected["MASTER_PORT"] = "29500";
  expected["TORCHELASTIC_RESTART_COUNT"] = "2";
  expected["TORCHELASTIC_MAX_RESTARTS"] = "5";
  expected["TORCHELASTIC_RUN_ID"] = "job";
  expected["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  expected["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  expected["TORCHELASTIC_ERROR_FILE"] = "/logs/attempt_2/2/error.json";
  CHECK(env.value() == expected);
}

TEST_CASE("the agent's TORCH_NCCL_ASYNC_ERROR_HANDLING is passed on", "[env]") {
  auto env = build_worker_env({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, two_nodes_second(), 0, "", false);
  CHECK(env->at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
  CHECK(env->at("TORCHELASTIC_ERROR_FILE").empty());
  GroupAssignment g = two_nodes_second();
  g.use_agent_store = true;
  CHECK(build_worker_env({}, g, 0, "", false)->at("TORCHELASTIC_USE_AGENT_STORE") == "True");
}

TEST_CASE("with --virtual-local-rank each worker gets LOCAL_RANK 0 and one device each", "[env]") {
  auto unset = build_worker_env({}, two_nodes_second(), 2, "", true);
  CHECK(unset->at("LOCAL_RANK") == "0");
  CHECK(unset->at("RANK") == "3");
  CHECK(unset->at("CUDA_VISIBLE_DEVICES") == "2");
  auto listed = build_worker_env({{"CUDA_VISIBLE_DEVICES", "4, 5,GPU-abc"}}, two_nodes_second(), 2, "", true);
  CHECK(listed->at("CUDA_VISIBLE_DEVICES") == "GPU-abc");
  auto too_short = build_worker_env({{"CUDA_VISIBLE_DEVICES", "4"}}, two_nodes_second(), 1, "", true);
  REQUIRE_FALSE(too_short.ok());
  CHECK(too_short.status().message().find("local_rank 1 exceeds available GPUs in CUDA_VISIBLE_DEVICES=4") == 0);
  auto plain = build_worker_env({{"CUDA_VISIBLE_DEVICES", "4,5"}}, two_nodes_second(), 1, "", false);
  CHECK(plain->at("CUDA_VISIBLE_DEVICES") == "4,5");
  CHECK(plain->at("LOCAL_RANK") == "1");
}
