// optim/loss_scaler.h: dynamic loss scaling with torch.amp.GradScaler's
// semantics and defaults, plus DeepSpeed's hysteresis and minimum scale
// (docs/optimizers.md "Reference semantics").
//
// Each step the ranks agree on found_inf (an integer MAX all-reduce), then:
// - found_inf: the step is skipped (no parameter, moment or step-count
//   change); the growth tracker resets; with hysteresis h the scale backs
//   off on the h-th overflow since the last growth (h = 1: every overflow,
//   as GradScaler), never below min_scale.
// - otherwise: the tracker counts good steps; after growth_interval of
//   them the scale grows (only if the result is finite) and the tracker and
//   hysteresis reset.
#pragma once

#include <cstdint>

namespace mp {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int hysteresis = 1;           // DeepSpeed's default is 2
  double min_scale = 0.0;       // DeepSpeed's default is 1
};

class LossScaler {
 public:
  // Throws ConfigError naming the bad option.
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // The multiplier the fused update applies to gradients: 1 / scale.
  double inverse_scale() const { return 1.0 / scale_; }
  // Records one step's outcome; returns true when the step must be skipped.
  bool update(bool found_inf);

  int64_t growth_tracker() const { return tracker_; }
  int64_t skipped_steps() const { return skipped_; }

  // Everything that evolves, for checkpoints.
  struct State {
    double scale = 0;
    int64_t growth_tracker = 0;
    int hysteresis_left = 0;
    int64_t skipped = 0;
  };
  State state() const { return State{scale_, tracker_, hysteresis_left_, skipped_}; }
  // Throws ConfigError for a scale that is not finite and positive or
  // negative counters.
  void restore(const State& s);

 private:
  LossScalerOptions o_;
  double scale_;
  int64_t tracker_ = 0;
  int hysteresis_left_;
  int64_t skipped_ = 0;
};

}  // namespace mp
