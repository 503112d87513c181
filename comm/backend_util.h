// comm/backend_util.h: helpers that every Communicator backend shares (not
// part of the public interface): how a ReduceOptions maps onto element
// math, argument checks, and element addressing.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "kernels/reduce_math.h"

namespace mp::comm_detail {

// The element operation of a reduction (avg is a sum, then a division).
math::ElementOp element_op(ReduceOp op);

// What the reduced result is divided by: size() for avg, times
// divide_factor. Throws EnforceError unless divide_factor > 0.
double reduction_divisor(const ReduceOptions& options, int size);

// Throws ConfigError for dtypes that cannot be reduced (fp8).
void check_reducible(DType t);

// Address of element `index` of `t` (typed element counts, not bytes).
inline char* element_ptr(const Tensor& t, int64_t index) {
  return static_cast<char*>(t.data()) + index * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace mp::comm_detail
