#include "runtime/precision.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace mp {
namespace {

using PP = proto::PrecisionPolicy;

DType to_dtype(proto::DataType t) {
  switch (t) {
    case proto::BF16: return DType::kBF16;
    case proto::FP16: return DType::kF16;
    default: return DType::kF32;
  }
}

const char* master_name(MasterMode m) {
  switch (m) {
    case MasterMode::kFp32: return "fp32";
    case MasterMode::kBf16Remainder: return "bf16_remainder";
    case MasterMode::kNone: return "none";
  }
  return "?";
}

const char* loss_scaling_name(LossScalingMode m) {
  switch (m) {
    case LossScalingMode::kNone: return "none";
    case LossScalingMode::kStatic: return "static";
    case LossScalingMode::kDynamic: return "dynamic";
  }
  return "?";
}

const char* cast_name(ParamCast c) {
  switch (c) {
    case ParamCast::kNone: return "none";
    case ParamCast::kAtUpdate: return "at_update";
    case ParamCast::kAtGather: return "at_gather";
  }
  return "?";
}

// Note [Precision recipes]
// The one table of recipes: the name users write, the proto value, and the
// choices before overrides. A new recipe is its proto value
// (PrecisionPolicy.Recipe in proto/mp.proto), one entry here and its row in
// docs/engine.md's recipe table; the engine tests (tests/mpi/test_engine.cc)
// run every entry.
struct RecipeEntry {
  PP::Recipe id;
  Precision choices;
};

const RecipeEntry kRecipes[] = {
    {PP::RECIPE_FP32, {.recipe = "fp32"}},
    {PP::RECIPE_TF32, {.recipe = "tf32", .tf32_matmul = true}},
    {PP::AMP_BF16, {.recipe = "amp_bf16", .param_dtype = DType::kBF16, .param_cast = ParamCast::kAtGather}},
    {PP::BF16_MASTER,
     {.recipe = "bf16_master",
      .param_dtype = DType::kBF16,
      .reduce_dtype = DType::kBF16,
      .reduce_accumulate = ReduceAccumulate::kFp32,
      .param_cast = ParamCast::kAtUpdate}},
    {PP::BF16_REMAINDER,
     {.recipe = "bf16_remainder",
      .param_dtype = DType::kBF16,
      .reduce_dtype = DType::kBF16,
      .reduce_accumulate = ReduceAccumulate::kFp32,
      .master = MasterMode::kBf16Remainder}},
    {PP::PURE_BF16,
     {.recipe = "pure_bf16",
      .param_dtype = DType::kBF16,
      .reduce_dtype = DType::kBF16,
      .grad_accum_dtype = DType::kBF16,
      .master = MasterMode::kNone,
      .state_dtype = DType::kBF16,
      .rounding = Rounding::kStochastic}},
    {PP::AMP_FP16,
     {.recipe = "amp_fp16",
      .param_dtype = DType::kF16,
      .reduce_dtype = DType::kF16,
      .reduce_accumulate = ReduceAccumulate::kFp32,
      .loss_scaling = LossScalingMode::kDynamic,
      .param_cast = ParamCast::kAtGather}},
};

// The recipe's choices, before overrides (UNSET is fp32).
Precision expand(PP::Recipe recipe) {
  if (recipe == PP::RECIPE_UNSET) recipe = PP::RECIPE_FP32;
  for (const RecipeEntry& r : kRecipes) {
    if (r.id == recipe) return r.choices;
  }
  MP_THROW(ConfigError, "precision.recipe = ", static_cast<int>(recipe), ": unknown recipe");
}

}  // namespace

std::string Precision::describe() const {
  std::ostringstream s;
  s << "recipe " << recipe << ": param " << dtype_name(param_dtype) << ", reduce " << dtype_name(reduce_dtype)
    << (reduce_accumulate == ReduceAccumulate::kFp32 ? " (fp32 accumulation)" : " (wire accumulation)")
    << ", grad_accum " << dtype_name(grad_accum_dtype) << ", master " << master_name(master) << ", state "
    << dtype_name(state_dtype) << ", rounding " << (rounding == Rounding::kStochastic ? "stochastic" : "nearest_even")
    << ", loss_scaling " << loss_scaling_name(loss_scaling) << ", param_cast " << cast_name(param_cast)
    << (tf32_matmul ? ", tf32 matmul" : "");
  return s.str();
}

Precision resolve_precision(const proto::PrecisionPolicy& policy, bool optimizer_has_loss_scaling) {
  Precision p = expand(policy.recipe());
  if (policy.param_dtype() != proto::DATA_TYPE_UNSET) {
    p.param_dtype = to_dtype(policy.param_dtype());
    if (p.param_dtype == DType::kF32) p.param_cast = ParamCast::kNone;
  }
  if (policy.reduce_dtype() != proto::DATA_TYPE_UNSET) p.reduce_dtype = to_dtype(policy.reduce_dtype());
  if (policy.reduce_accumulate() == PP::WIRE) p.reduce_accumulate = ReduceAccumulate::kWire;
  if (policy.reduce_accumulate() == PP::ACCUMULATE_FP32) p.reduce_accumulate = ReduceAccumulate::kFp32;
  if (policy.grad_accum_dtype() != proto::DATA_TYPE_UNSET) p.grad_accum_dtype = to_dtype(policy.grad_accum_dtype());
  if (policy.state_dtype() != proto::DATA_TYPE_UNSET) p.state_dtype = to_dtype(policy.state_dtype());
  switch (policy.master()) {
    case PP::MASTER_FP32: p.master = MasterMode::kFp32; break;
    case PP::MASTER_BF16_REMAINDER: p.master = MasterMode::kBf16Remainder; break;
    case PP::MASTER_NONE: p.master = MasterMode::kNone; break;
    default: break;
  }
  if (p.master != MasterMode::kFp32) p.param_cast = ParamCast::kNone;
  if (p.master == MasterMode::kFp32 && p.param_dtype != DType::kF32 && p.param_cast == ParamCast::kNone) {
    p.param_cast = ParamCast::kAtUpdate;
  }
  if (policy.rounding() == PP::NEAREST_EVEN) p.rounding = Rounding::kNearestEven;
  if (policy.rounding() == PP::STOCHASTIC) p.rounding = Rounding::kStochastic;
  if (policy.param_cast() == PP::CAST_AT_UPDATE) p.param_cast = ParamCast::kAtUpdate;
  if (policy.param_cast() == PP::CAST_AT_GATHER) p.param_cast = ParamCast::kAtGather;
  if (policy.static_loss_scale() != 0) p.static_loss_scale = policy.static_loss_scale();

  switch (policy.loss_scaling()) {
    case PP::LOSS_SCALING_NONE:
      if (optimizer_has_loss_scaling) {
        MP_THROW(ConfigError, "precision.loss_scaling = NONE contradicts optimizer.loss_scaling, which is set");
      }
      p.loss_scaling = LossScalingMode::kNone;
      break;
    case PP::LOSS_SCALING_STATIC: p.loss_scaling = LossScalingMode::kStatic; break;
    case PP::LOSS_SCALING_DYNAMIC: p.loss_scaling = LossScalingMode::kDynamic; break;
    default:
      if (optimizer_has_loss_scaling) p.loss_scaling = LossScalingMode::kDynamic;
      break;
  }
  if (p.loss_scaling == LossScalingMode::kStatic && optimizer_has_loss_scaling) {
    MP_THROW(ConfigError, "precision.loss_scaling = STATIC contradicts optimizer.loss_scaling (dynamic), which is set");
  }

  // Validation: say why a combination cannot work.
  const std::string where = "precision (recipe " + p.recipe + "): ";
  if (p.loss_scaling == LossScalingMode::kStatic && !(p.static_loss_scale > 0 && std::isfinite(p.static_loss_scale))) {
    MP_THROW(ConfigError, where, "static_loss_scale = ", p.static_loss_scale, ": must be positive and finite");
  }
  if (p.loss_scaling == LossScalingMode::kNone) {
    if (p.param_dtype == DType::kF16) {
      MP_THROW(ConfigError, where,
               "param_dtype FP16 needs loss_scaling STATIC or DYNAMIC: fp16 gradients underflow without it");
    }
    if (p.reduce_dtype == DType::kF16) {
      MP_THROW(ConfigError, where,
               "reduce_dtype FP16 needs loss_scaling STATIC or DYNAMIC: fp16 gradients underflow without it");
    }
  }
  if (p.master == MasterMode::kBf16Remainder && p.param_dtype != DType::kBF16) {
    MP_THROW(ConfigError, where, "master BF16_REMAINDER needs param_dtype BF16 (the master is the bf16 param ",
             "plus a 16-bit remainder), not ", dtype_name(p.param_dtype));
  }
  if (p.master == MasterMode::kBf16Remainder && p.rounding == Rounding::kStochastic) {
    MP_THROW(ConfigError, where, "master BF16_REMAINDER keeps an exact fp32 master; rounding STOCHASTIC ",
             "applies only to master FP32 or NONE");
  }
  if (p.state_dtype != DType::kF32 && p.state_dtype != DType::kBF16) {
    MP_THROW(ConfigError, where, "state_dtype ", dtype_name(p.state_dtype), ": optimizer state is FP32 or BF16");
  }
  if (p.grad_accum_dtype == DType::kF16) {
    MP_THROW(ConfigError, where, "grad_accum_dtype FP16: accumulate in FP32 or BF16 (fp16 sums overflow)");
  }
  if (p.param_dtype == DType::kF32 && p.rounding == Rounding::kStochastic) {
    MP_THROW(ConfigError, where, "rounding STOCHASTIC needs a 16-bit param_dtype; fp32 params are not rounded");
  }
  if (p.param_dtype == DType::kF32 && policy.param_cast() != PP::PARAM_CAST_UNSET) {
    MP_THROW(ConfigError, where, "param_cast applies to 16-bit params; param_dtype is FP32");
  }
  if (p.master != MasterMode::kFp32 && policy.param_cast() != PP::PARAM_CAST_UNSET) {
    MP_THROW(ConfigError, where, "param_cast needs master FP32 (there is no separate master to cast from)");
  }
  if (p.param_cast == ParamCast::kAtGather && p.rounding == Rounding::kStochastic) {
    MP_THROW(ConfigError, where, "rounding STOCHASTIC applies to params the update writes; with param_cast ",
             "CAST_AT_GATHER the cast rounds to nearest-even");
  }
  return p;
}

const std::vector<std::string>& precision_recipe_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const RecipeEntry& r : kRecipes) v.push_back(r.choices.recipe);
    return v;
  }();
  return names;
}

proto::PrecisionPolicy precision_recipe(const std::string& name) {
  std::string all;
  for (const RecipeEntry& r : kRecipes) {
    if (r.choices.recipe == name) {
      proto::PrecisionPolicy p;
      p.set_recipe(r.id);
      return p;
    }
    all += (all.empty() ? "" : ", ") + r.choices.recipe;
  }
  MP_THROW(ConfigError, "precision recipe '", name, "' is unknown; recipes: ", all);
}

}  // namespace mp
