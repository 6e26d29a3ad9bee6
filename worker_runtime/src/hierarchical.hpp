// The hierarchical all-reduce, composed of the two transports: the node's
// ranks reduce-scatter each chunk through shared memory (ShmNode), each rank
// all-reduces its share with the ranks of the same local index on the other
// nodes over the cross ring (Ring), and the node all-gathers the results.
// Cross-node traffic is then one share per rank instead of the whole buffer
// per node, spread over every rank's connections.
#pragma once

#include <cstddef>

#include "muster/process_group.hpp"
#include "ring.hpp"
#include "shm.hpp"
#include "wait.hpp"

namespace muster::detail {

void hierarchical_all_reduce(ShmNode& node, Ring& cross, void* data, std::size_t count, DataType type, ReduceOp op,
                             int divisor, Clock::time_point deadline);

}  // namespace muster::detail
