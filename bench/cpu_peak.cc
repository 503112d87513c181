#include "bench/cpu_peak.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/gemm.h"

namespace mp::bench {
namespace {

struct CpuInfo {
  std::string vendor;
  int family = 0;
  double mhz = 0;
  int cores = 0;  // physical: distinct (physical id, core id) pairs
  std::set<std::string> flags;
};

CpuInfo read_cpuinfo() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, physical, logical_count;
  int processors = 0;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "processor") ++processors;
    if (key == "vendor_id") info.vendor = value;
    if (key == "cpu family") info.family = std::atoi(value.c_str());
    if (key == "cpu MHz") info.mhz = std::max(info.mhz, std::atof(value.c_str()));
    if (key == "physical id") physical = value;
    if (key == "core id") cores.emplace(physical, value);
    if (key == "flags" && info.flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) info.flags.insert(w);
    }
  }
  info.cores = cores.empty() ? processors : static_cast<int>(cores.size());
  return info;
}

// fp32 flops per cycle per core, and the unit's name.
std::pair<double, const char*> fp32_per_cycle(const CpuInfo& c) {
  const bool amd = c.vendor == "AuthenticAMD";
  if (c.flags.count("avx512f") != 0) {
    if (amd && c.family == 25) return {32, "AVX-512 on 2 x 256-bit FMA units"};
    return {64, "2 x AVX-512 FMA units"};
  }
  if (c.flags.count("fma") != 0) return {32, "2 x AVX2 FMA units"};
  return {8, "2 x SSE units, no FMA"};
}

}  // namespace

CpuPeak cpu_fma_peak(int threads, DType dtype) {
  const CpuInfo c = read_cpuinfo();
  const int cores = std::max(1, std::min(threads, c.cores));
  auto [per_cycle, unit] = fp32_per_cycle(c);
  std::string what = unit;
  if (dtype == DType::kBF16 && gemm_native_bf16()) {
    if (c.flags.count("amx_bf16") != 0) {
      per_cycle = 1024;
      what = "AMX-BF16 tiles";
    } else if (c.flags.count("avx512_bf16") != 0) {
      per_cycle *= 2;
      what += ", vdpbf16ps";
    }
  } else if (dtype == DType::kBF16) {
    what += ", bf16 widened to fp32";
  }
  CpuPeak peak;
  peak.gflops = cores * c.mhz * 1e-3 * per_cycle;
  peak.basis = detail::str(cores, " core(s) x ", c.mhz, " MHz x ", per_cycle, " flops/cycle (", what, ", ",
                           dtype_name(dtype), ")");
  return peak;
}

}  // namespace mp::bench
