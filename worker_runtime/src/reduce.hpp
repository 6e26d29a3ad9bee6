// Element-wise reduction kernels for the collectives (pure functions).
#pragma once

#include <cstddef>

#include "muster/process_group.hpp"

namespace muster::detail {

// dst[i] = a[i] op b[i] for count elements; dst may be a (or b). avg reduces
// as sum: the caller divides once the reduction is complete (finish()).
void combine(DataType type, ReduceOp op, void* dst, const void* a, const void* b, std::size_t count);
// For avg: data[i] /= divisor (integers truncate toward zero, as NCCL's avg
// does); nothing for the other ops.
void finish(DataType type, ReduceOp op, void* data, std::size_t count, int divisor);

}  // namespace muster::detail
