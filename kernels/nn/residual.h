// kernels/nn/residual.h: the element-wise ops of a model as ops on a stream
// (Note [Op dispatch] in kernels/dispatch.h): the residual add, and copies
// and fills of device memory.
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace mp::nn {

// out = a + b element-wise; out may alias a or b.
void add(const OpContext& cx, const float* a, const float* b, int64_t n, float* out);
// dst := src, `bytes` bytes of device memory (no overlap).
void copy(const OpContext& cx, void* dst, const void* src, int64_t bytes, const char* name);
// host := src, `bytes` bytes of device memory into host memory (pinned
// for a GPU: core/pinned.h), in stream order.
void copy_to_host(const OpContext& cx, void* host, const void* src, int64_t bytes, const char* name);
// `bytes` bytes of device memory at dst := 0.
void zero(const OpContext& cx, void* dst, int64_t bytes, const char* name);

}  // namespace mp::nn
