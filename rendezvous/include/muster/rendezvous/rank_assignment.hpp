// Global and role ranks of every worker from the nodes of a round, as torchrun's
// agents compute them: nodes in group-rank order, each contributing its local
// world size; nodes may differ in size and in role.
#pragma once

#include <string>
#include <vector>

namespace muster::rendezvous {

struct NodeSlot {
  std::string role;
  int local_world_size = 0;
};

struct NodeRanks {
  int base_global_rank = 0;  // RANK of local rank 0
  int global_world_size = 0;
  int base_role_rank = 0;    // ROLE_RANK of local rank 0
  int role_world_size = 0;
};

// nodes[i] is the node of group rank i.
std::vector<NodeRanks> assign_worker_ranks(const std::vector<NodeSlot>& nodes);

}  // namespace muster::rendezvous
