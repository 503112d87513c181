// kernels/nn/residual.h: the memory ops of a model as ops on a stream
// (Note [Op dispatch] in kernels/dispatch.h): copies and fills of device
// memory. (The GPT's residual adds run in its GEMMs' epilogue.)
#pragma once

#include <cstdint>

#include "kernels/dispatch.h"

namespace mp::nn {

// dst := src, `bytes` bytes of device memory (no overlap).
void copy(const OpContext& cx, void* dst, const void* src, int64_t bytes, const char* name);
// host := src, `bytes` bytes of device memory into host memory (pinned
// for a GPU: core/pinned.h), in stream order.
void copy_to_host(const OpContext& cx, void* host, const void* src, int64_t bytes, const char* name);
// `bytes` bytes of device memory at dst := 0.
void zero(const OpContext& cx, void* dst, int64_t bytes, const char* name);

}  // namespace mp::nn
