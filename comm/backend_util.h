// comm/backend_util.h: helpers that every Communicator backend shares (not
// part of the public interface): how a ReduceOptions maps onto element
// math, argument checks, and element addressing.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

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

// A collective as (op, dtype, count, sequence), compared across ranks under
// CommOptions::check_fingerprints.
std::array<int64_t, 4> fingerprint(const CollectiveInfo& info);
// `all` holds every rank's fingerprint, rank-major: throws CommError naming
// each rank's call unless they are all `mine`.
void check_fingerprints(const std::array<int64_t, 4>& mine, const std::vector<int64_t>& all,
                        const std::string& communicator, uint64_t sequence);

// A splitmix64 step: communicator ids derived from lineage (the parent's id,
// its split count, the color) agree on every member.
inline uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// Address of element `index` of `t` (typed element counts, not bytes).
inline char* element_ptr(const Tensor& t, int64_t index) {
  return static_cast<char*>(t.data()) + index * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace mp::comm_detail
