// runtime/host_staging.h: the host's way into the engine's device memory.
//
// Note [Host staging]
// Whatever the device, the host reads and writes engine buffers (weights,
// moments, params) only through these: a copy in order on a stream of the
// engine's device (ops::copy_bytes), then a wait for it. On the CPU that is
// a memcpy on the stream's worker; on CUDA a cudaMemcpyAsync through a
// pinned bounce buffer of the calling thread (core/pinned.h), 16 MiB at a
// time. Checkpoints,
// safetensors export and import, set_weights and the C API all go through
// here (via UnitState and ShardStateView), never through raw pointers, so
// they work the same for CUDA memory and never race work still queued on
// the engine's streams. Between steps only.
#pragma once

#include <cstdint>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"

namespace mp {

// Copies `bytes` bytes of device memory at `src` to the host, after the work
// already on `s`; returns once they are there.
void stage_to_host(void* host, const void* src, Device device, int64_t bytes, Stream& s);
// Copies `bytes` host bytes to device memory at `dst` on `s`; returns once
// they are there.
void stage_from_host(void* dst, Device device, const void* host, int64_t bytes, Stream& s);

// A host pointer to read `bytes` of device memory at `src`: src itself for
// CPU memory (after the work on `s` has run), else a copy in `staging`.
const void* host_view(const void* src, Device device, int64_t bytes, Stream& s, std::vector<char>& staging);
// A host pointer to fill with `bytes` bytes for device memory at `dst`: dst
// itself for CPU memory (after the work on `s` has run), else `staging`;
// then commit_host_write(dst, device, staging, s) copies them to the device
// (nothing to do for CPU memory).
void* host_target(void* dst, Device device, int64_t bytes, Stream& s, std::vector<char>& staging);
void commit_host_write(void* dst, Device device, const std::vector<char>& staging, Stream& s);

// Every element of `t`.
inline void stage_to_host(void* host, const Tensor& t, Stream& s) {
  stage_to_host(host, t.data(), t.device(), static_cast<int64_t>(t.size_bytes()), s);
}
inline void stage_from_host(const Tensor& t, const void* host, Stream& s) {
  stage_from_host(t.data(), t.device(), host, static_cast<int64_t>(t.size_bytes()), s);
}

}  // namespace mp
