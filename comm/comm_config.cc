#include "comm/comm_config.h"

#include <cmath>

#include "core/error.h"

namespace mp {
namespace {

std::chrono::milliseconds seconds_field(double value, double default_s, const char* field) {
  if (value == 0) value = default_s;
  if (!std::isfinite(value) || value < 0.001 || value > 30.0 * 24 * 3600) {
    MP_THROW(ConfigError, "comm.", field, " = ", value, ": must be between 0.001 and 2592000 seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(value * 1000)));
}

}  // namespace

CommOptions comm_options_from_config(const proto::CommConfig& config) {
  CommOptions o;
  o.timeout = seconds_field(config.timeout_s(), 300, "timeout_s");
  o.diagnose_timeout = seconds_field(config.diagnose_timeout_s(), 2, "diagnose_timeout_s");
  o.check_fingerprints = config.check_fingerprints();
  if (config.accumulate_chunk_bytes() != 0) {
    if (config.accumulate_chunk_bytes() < 1024 || config.accumulate_chunk_bytes() > (uint64_t{1} << 34)) {
      MP_THROW(ConfigError, "comm.accumulate_chunk_bytes = ", config.accumulate_chunk_bytes(),
               ": must be between 1024 and 2^34");
    }
    o.accumulate_chunk_bytes = static_cast<size_t>(config.accumulate_chunk_bytes());
  }
  return o;
}

std::string comm_hook_name(const proto::CommConfig& config) {
  return config.comm_hook().empty() ? "fp32" : config.comm_hook();
}

}  // namespace mp
