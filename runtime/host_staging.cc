#include "runtime/host_staging.h"

#include <algorithm>
#include <cstring>

#include "core/pinned.h"
#include "kernels/ops.h"

namespace mp {

namespace {

constexpr int64_t kBounceBytes = int64_t{16} << 20;

// The calling thread's pinned bounce buffer for `device`'s copies.
PinnedBuffer& bounce(Device device) {
  thread_local PinnedBuffer buffer;
  if (buffer.size_bytes() == 0 || buffer.device() != device) buffer = PinnedBuffer(device, kBounceBytes);
  return buffer;
}

}  // namespace

void stage_to_host(void* host, const void* src, Device device, int64_t bytes, Stream& s) {
  if (device.is_cpu()) {
    ops::copy_bytes(host, Device::cpu(), src, device, bytes, s);
    s.synchronize();
    return;
  }
  // Through pinned memory, a chunk at a time: a copy into pageable memory
  // would block the host inside cudaMemcpyAsync (core/pinned.h).
  PinnedBuffer& b = bounce(device);
  for (int64_t at = 0; at < bytes; at += kBounceBytes) {
    const int64_t n = std::min(kBounceBytes, bytes - at);
    ops::copy_bytes(b.data(), Device::cpu(), static_cast<const char*>(src) + at, device, n, s);
    s.synchronize();
    std::memcpy(static_cast<char*>(host) + at, b.data(), static_cast<size_t>(n));
  }
}

void stage_from_host(void* dst, Device device, const void* host, int64_t bytes, Stream& s) {
  if (device.is_cpu()) {
    ops::copy_bytes(dst, device, host, Device::cpu(), bytes, s);
    s.synchronize();
    return;
  }
  PinnedBuffer& b = bounce(device);
  for (int64_t at = 0; at < bytes; at += kBounceBytes) {
    const int64_t n = std::min(kBounceBytes, bytes - at);
    s.synchronize();  // the last chunk's copy has read the bounce buffer
    std::memcpy(b.data(), static_cast<const char*>(host) + at, static_cast<size_t>(n));
    ops::copy_bytes(static_cast<char*>(dst) + at, device, b.data(), Device::cpu(), n, s);
  }
  s.synchronize();
}

const void* host_view(const void* src, Device device, int64_t bytes, Stream& s, std::vector<char>& staging) {
  if (device.is_cpu()) {
    s.synchronize();
    return src;
  }
  staging.resize(static_cast<size_t>(bytes));
  stage_to_host(staging.data(), src, device, bytes, s);
  return staging.data();
}

void* host_target(void* dst, Device device, int64_t bytes, Stream& s, std::vector<char>& staging) {
  s.synchronize();  // nothing queued still reads or writes dst
  if (device.is_cpu()) return dst;
  staging.resize(static_cast<size_t>(bytes));
  return staging.data();
}

void commit_host_write(void* dst, Device device, const std::vector<char>& staging, Stream& s) {
  if (device.is_cpu()) return;
  stage_from_host(dst, device, staging.data(), static_cast<int64_t>(staging.size()), s);
}

}  // namespace mp
