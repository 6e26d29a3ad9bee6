#include "hierarchical.hpp"

namespace muster::detail {

void hierarchical_all_reduce(ShmNode& node, Ring& cross, void* data, std::size_t count, DataType type, ReduceOp op,
                             int divisor, Clock::time_point deadline) {
  node.all_reduce(data, count, type, op, divisor, deadline, [&](char* share, std::size_t n) {
    cross.all_reduce(share, n, type, op, divisor, deadline);
  });
}

}  // namespace muster::detail
