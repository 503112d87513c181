#include "runtime/host_staging.h"

#include "kernels/ops.h"

namespace mp {

void stage_to_host(void* host, const void* src, Device device, int64_t bytes, Stream& s) {
  ops::copy_bytes(host, Device::cpu(), src, device, bytes, s);
  s.synchronize();
}

void stage_from_host(void* dst, Device device, const void* host, int64_t bytes, Stream& s) {
  ops::copy_bytes(dst, device, host, Device::cpu(), bytes, s);
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
