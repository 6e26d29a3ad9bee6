#include "muster/rendezvous/rank_assignment.hpp"

#include <map>

namespace muster::rendezvous {

std::vector<NodeRanks> assign_worker_ranks(const std::vector<NodeSlot>& nodes) {
  std::vector<NodeRanks> out(nodes.size());
  int world = 0;
  std::map<std::string, int> role_totals;
  for (const auto& n : nodes) {
    world += n.local_world_size;
    role_totals[n.role] += n.local_world_size;
  }
  int global_base = 0;
  std::map<std::string, int> role_bases;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    out[i].base_global_rank = global_base;
    out[i].global_world_size = world;
    out[i].base_role_rank = role_bases[nodes[i].role];
    out[i].role_world_size = role_totals[nodes[i].role];
    global_base += nodes[i].local_world_size;
    role_bases[nodes[i].role] += nodes[i].local_world_size;
  }
  return out;
}

}  // namespace muster::rendezvous
