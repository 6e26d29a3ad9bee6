// Where this node's workers stand in the job (worker_env.hpp's
// GroupAssignment), from the two sources there are: a one-node job makes its
// own group, a multi-node job takes the rendezvous's placement.
#pragma once

#include <string>

#include "launch_config.hpp"
#include "muster/rendezvous/core.hpp"
#include "worker_env.hpp"

namespace muster::launcher {

// A one-node job: this agent is group rank 0 of a group of one. The agent
// serves the workers' store, as torch 2.x's agent does, so a worker's death
// never takes the store down; with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
// (c10d only, as in torchrun) worker 0 hosts it instead. master_addr is
// where the workers reach the store; master_port is the port asked for (0:
// any), to be replaced by the one the store got.
GroupAssignment one_node_group(const LaunchConfig& cfg, const Environment& env, std::string master_addr,
                               int master_port);

// A multi-node round as the rendezvous placed this node; the agent's store
// serves the round.
GroupAssignment placed_group(const LaunchConfig& cfg, const rendezvous::Placement& placement);

}  // namespace muster::launcher
