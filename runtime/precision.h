// runtime/precision.h: a PrecisionPolicy (proto/mp.proto) resolved into the
// dtypes and modes the engine uses, from a named recipe plus overrides.
//
// Note [Where casts happen]
// The model computes in fp32 from parameters gathered in param_dtype and
// hands back fp32 gradients (models/model.h).
// - param cast: with an fp32 master and 16-bit params, CAST_AT_UPDATE makes
//   the fused update write a persistent 16-bit shard, once per step (the
//   next all-gather sends it as is); CAST_AT_GATHER keeps no 16-bit copy and
//   casts the fp32 shard before every all-gather (twice per micro-batch with
//   FULL_SHARD: forward and backward), as autocast does.
// - gradients are cast once per micro-batch from fp32 to reduce_dtype where
//   they enter the reduction, multiplied by the loss scale in that same cast.
// - the update reads the reduced gradient shard in its own dtype.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "kernels/convert.h"
#include "kernels/update_math.h"
#include "proto/mp.pb.h"

namespace mp {

enum class LossScalingMode : uint8_t { kNone = 0, kStatic = 1, kDynamic = 2 };
enum class ParamCast : uint8_t { kNone = 0, kAtUpdate = 1, kAtGather = 2 };

struct Precision {
  std::string recipe;  // "fp32", "amp_bf16", ...
  DType param_dtype = DType::kF32;
  DType reduce_dtype = DType::kF32;
  ReduceAccumulate reduce_accumulate = ReduceAccumulate::kWire;
  DType grad_accum_dtype = DType::kF32;
  MasterMode master = MasterMode::kFp32;
  DType state_dtype = DType::kF32;
  Rounding rounding = Rounding::kNearestEven;
  LossScalingMode loss_scaling = LossScalingMode::kNone;
  double static_loss_scale = 65536.0;
  // kNone when the master is the parameter (fp32 params, bf16 remainder,
  // no master).
  ParamCast param_cast = ParamCast::kNone;
  bool tf32_matmul = false;  // the tf32 recipe: TF32 GEMMs on GPUs, fp32 on CPUs

  std::string describe() const;  // one line, every field
};

// Expands the recipe, applies the overrides and validates the combination.
// `optimizer_has_loss_scaling`: optimizer.loss_scaling is present. Throws
// ConfigError naming the field and why, e.g. "precision.param_dtype = FP16
// needs loss_scaling STATIC or DYNAMIC: fp16 gradients underflow without it".
Precision resolve_precision(const proto::PrecisionPolicy& policy, bool optimizer_has_loss_scaling);

// The recipe names users write, in table order.
const std::vector<std::string>& precision_recipe_names();
// A policy with just the recipe set; throws ConfigError listing the names.
proto::PrecisionPolicy precision_recipe(const std::string& name);

}  // namespace mp
