// models/model_limits.h: the sizes a built-in model may have. Beyond these a
// size is a typo, not a model: the config checks (check_gpt_sizes in
// models/gpt.h, launch/train_config.h) name it before anything is built
// (model.gpt.layers = 99999999999 would otherwise build units until memory
// runs out).
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace mp {

inline constexpr int64_t kMaxModelLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxModelWidth = int64_t{1} << 24;  // GPT context and channels, an MLP width
inline constexpr double kMaxModelParams = 0x1p40;             // about 1.1e12 parameters

// ConfigError "FIELD = VALUE: must be at most LIMIT" when value > limit.
inline void check_size_at_most(const std::string& field, int64_t value, int64_t limit) {
  if (value > limit) MP_THROW(ConfigError, field, " = ", value, ": must be at most ", limit);
}

// ConfigError "MODEL: P parameters; at most 2^40 (...) are supported" when
// params > kMaxModelParams.
inline void check_model_params(const std::string& model, double params) {
  if (params > kMaxModelParams) {
    MP_THROW(ConfigError, model, ": ", params, " parameters; at most 2^40 (", kMaxModelParams, ") are supported");
  }
}

}  // namespace mp
