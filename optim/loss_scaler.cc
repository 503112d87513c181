#include "optim/loss_scaler.h"

#include <cmath>

#include "core/error.h"

namespace mp {

LossScaler::LossScaler(LossScalerOptions o) : o_(o), scale_(o.init_scale), hysteresis_left_(o.hysteresis) {
  if (!(o.init_scale > 0) || !std::isfinite(o.init_scale)) {
    MP_THROW(ConfigError, "loss_scaler.init_scale = ", o.init_scale, ": must be positive and finite");
  }
  if (!(o.growth_factor > 1)) MP_THROW(ConfigError, "loss_scaler.growth_factor = ", o.growth_factor, ": must exceed 1");
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) {
    MP_THROW(ConfigError, "loss_scaler.backoff_factor = ", o.backoff_factor, ": must be in (0, 1)");
  }
  if (o.growth_interval < 1) MP_THROW(ConfigError, "loss_scaler.growth_interval = ", o.growth_interval, ": must be >= 1");
  if (o.hysteresis < 1) MP_THROW(ConfigError, "loss_scaler.hysteresis = ", o.hysteresis, ": must be >= 1");
  if (o.min_scale < 0 || o.min_scale > o.init_scale) {
    MP_THROW(ConfigError, "loss_scaler.min_scale = ", o.min_scale, ": must be in [0, init_scale]");
  }
}

bool LossScaler::update(bool found_inf) {
  if (found_inf) {
    ++skipped_;
    tracker_ = 0;
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(scale_ * o_.backoff_factor, o_.min_scale);
      hysteresis_left_ = o_.hysteresis;
    }
    return true;
  }
  if (++tracker_ == o_.growth_interval) {
    const double grown = scale_ * o_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
    hysteresis_left_ = o_.hysteresis;
  }
  return false;
}

void LossScaler::restore(const State& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale)) MP_THROW(ConfigError, "loss scale ", s.scale, ": must be positive and finite");
  if (s.growth_tracker < 0 || s.skipped < 0 || s.hysteresis_left < 0) {
    MP_THROW(ConfigError, "loss scaler counters (growth tracker ", s.growth_tracker, ", hysteresis left ",
             s.hysteresis_left, ", skipped ", s.skipped, "): must not be negative");
  }
  scale_ = s.scale;
  tracker_ = s.growth_tracker;
  hysteresis_left_ = s.hysteresis_left;
  skipped_ = s.skipped;
}

}  // namespace mp
