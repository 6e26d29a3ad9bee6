// The environment of one worker: the agent's own environment plus exactly the
// variables torchrun's agent sets, with torchrun's string values.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "muster/common/status.hpp"

namespace muster::launcher {

using Environment = std::map<std::string, std::string>;

// What one round of the rendezvous decided for this node's group.
struct GroupAssignment {
  std::string role = "default";
  int group_rank = 0;
  int group_world_size = 1;
  int local_world_size = 1;
  int base_global_rank = 0;
  int global_world_size = 1;
  int base_role_rank = 0;
  int role_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  bool use_agent_store = false;
  std::string run_id = "none";
  int restart_count = 0;
  int max_restarts = 0;
};

// `base` is the agent's environment after its own additions (OMP_NUM_THREADS,
// TORCHELASTIC_SIGNALS_TO_HANDLE). error_file is "" with --log-dir /dev/null.
Result<Environment> build_worker_env(const Environment& base, const GroupAssignment& group, int local_rank,
                                     const std::string& error_file, bool virtual_local_rank);

// "KEY=VALUE" strings for execve.
std::vector<std::string> to_envp(const Environment& env);

// env[key], or fallback when it is unset.
std::string env_or(const Environment& env, const std::string& key, const std::string& fallback);

}  // namespace muster::launcher
