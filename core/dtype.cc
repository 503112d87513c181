#include "core/dtype.h"

#include <string>

#include "core/error.h"

namespace mp {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kF8E4M3: return "fp8_e4m3";
    case DType::kF8E5M2: return "fp8_e5m2";
  }
  MP_THROW(EnforceError, "invalid DType value ", static_cast<int>(t));
}

DType parse_dtype(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  MP_THROW(ConfigError, "unknown dtype '", name,
           "'; valid: fp32, bf16, fp16, fp8_e4m3, fp8_e5m2");
}

}  // namespace mp
