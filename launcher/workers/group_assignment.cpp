#include "group_assignment.hpp"

#include "muster/rendezvous/rank_assignment.hpp"

namespace muster::launcher {

GroupAssignment one_node_group(const LaunchConfig& cfg, const Environment& env, std::string master_addr,
                               int master_port) {
  rendezvous::NodeSlot self{cfg.role, cfg.nproc_per_node};
  auto ranks = rendezvous::assign_worker_ranks({self}).front();
  GroupAssignment g;
  g.role = cfg.role;
  g.group_rank = 0;
  g.group_world_size = 1;
  g.local_world_size = cfg.nproc_per_node;
  g.base_global_rank = ranks.base_global_rank;
  g.global_world_size = ranks.global_world_size;
  g.base_role_rank = ranks.base_role_rank;
  g.role_world_size = ranks.role_world_size;
  g.master_addr = std::move(master_addr);
  g.master_port = master_port;
  g.use_agent_store = cfg.rdzv_backend == "static" || env_or(env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "") != "1";
  g.run_id = cfg.rdzv_id;
  g.max_restarts = cfg.max_restarts;
  return g;
}

GroupAssignment placed_group(const LaunchConfig& cfg, const rendezvous::Placement& placement) {
  GroupAssignment g;
  g.role = cfg.role;
  g.group_rank = placement.group_rank;
  g.group_world_size = placement.group_world_size;
  g.local_world_size = cfg.nproc_per_node;
  g.base_global_rank = placement.ranks.base_global_rank;
  g.global_world_size = placement.ranks.global_world_size;
  g.base_role_rank = placement.ranks.base_role_rank;
  g.role_world_size = placement.ranks.role_world_size;
  g.master_addr = placement.master_addr;
  g.master_port = placement.master_port;
  g.use_agent_store = true;
  g.run_id = cfg.rdzv_id;
  g.restart_count = placement.restart_count;
  g.max_restarts = cfg.max_restarts;
  return g;
}

}  // namespace muster::launcher
