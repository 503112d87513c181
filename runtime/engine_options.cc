#include "runtime/engine_options.h"

#include <algorithm>
#include <cctype>

#include "comm/comm_config.h"
#include "core/error.h"
#include "optim/optimizer.h"

namespace mp {
namespace {
using SC = proto::ShardingConfig;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case SC::FULL_SHARD: return "FULL_SHARD";
    case SC::NO_SHARD: return "NO_SHARD";
    case SC::SHARD_OPTIMIZER: return "SHARD_OPTIMIZER";
    case SC::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case SC::HYBRID_SHARD: return "HYBRID_SHARD";
    default: return "?";
  }
}

Strategy parse_strategy(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Strategy s;
  if (SC::Strategy_Parse(upper, &s)) return s;
  MP_THROW(ConfigError, "sharding strategy '", name,
           "' is unknown; strategies: FULL_SHARD, NO_SHARD, SHARD_OPTIMIZER, SHARD_GRAD_OP, HYBRID_SHARD");
}

bool EngineOptions::gathers_per_unit() const {
  return shard_size > 1 && (strategy == SC::FULL_SHARD || strategy == SC::HYBRID_SHARD);
}

int EngineOptions::gather_slots(int num_units) const {
  return gathers_per_unit() ? std::min(prefetch_depth + 1 + held_units, num_units) : 0;
}

bool EngineOptions::keeps_full_params() const {
  return shard_size > 1 && (strategy == SC::SHARD_OPTIMIZER || strategy == SC::SHARD_GRAD_OP);
}

bool EngineOptions::full_grad_accumulators() const {
  if (deterministic) return false;
  return strategy == SC::NO_SHARD || strategy == SC::SHARD_OPTIMIZER ||
         (!sharded_accumulation && micro_batches > 1);
}

DType EngineOptions::reduce_out_dtype() const {
  if (deterministic) return DType::kF32;
  return precision.reduce_accumulate == ReduceAccumulate::kFp32 ? DType::kF32 : precision.reduce_dtype;
}

DType EngineOptions::grad_shard_dtype() const {
  if (deterministic) return DType::kF32;
  if (strategy == SC::NO_SHARD) return precision.grad_accum_dtype;  // the accumulator itself
  if (!full_grad_accumulators() && micro_batches > 1) return precision.grad_accum_dtype;
  return reduce_out_dtype();
}

bool EngineOptions::persistent_param_shard() const {
  if (precision.master != MasterMode::kFp32) return true;
  return precision.param_cast == ParamCast::kAtUpdate;
}

DType EngineOptions::grad_buffer_dtype() const {
  const Precision& p = precision;
  const bool as_is = param_dtype_gradients && !deterministic && !full_grad_accumulators() && !local_reduction() &&
                     p.param_dtype == p.reduce_dtype && p.loss_scaling == LossScalingMode::kNone;
  return as_is ? p.param_dtype : DType::kF32;
}

bool EngineOptions::wire_staging() const {
  if (deterministic || strategy == SC::NO_SHARD) return false;
  const DType source = full_grad_accumulators() ? precision.grad_accum_dtype : grad_buffer_dtype();
  return source != precision.reduce_dtype || precision.loss_scaling != LossScalingMode::kNone;
}

bool EngineOptions::local_reduction() const {
  return !deterministic && shard_size == 1 && replicate_size == 1 && micro_batches == 1 &&
         strategy != SC::NO_SHARD && !full_grad_accumulators() && grad_shard_dtype() == DType::kF32;
}

int recompute_every(const proto::ActivationCheckpointing& config) {
  using AC = proto::ActivationCheckpointing;
  switch (config.policy()) {
    case AC::NONE:
    case AC::EVERY_UNIT:
      if (config.every() != 0) {
        MP_THROW(ConfigError, "activation_checkpointing.every = ", config.every(), " is set but policy is ",
                 AC::Policy_Name(config.policy()), "; it applies to EVERY_KTH_UNIT");
      }
      return config.policy() == AC::NONE ? 0 : 1;
    case AC::EVERY_KTH_UNIT:
      if (config.every() < 2) {
        MP_THROW(ConfigError, "activation_checkpointing.every = ", config.every(),
                 ": EVERY_KTH_UNIT needs k >= 2 (EVERY_UNIT is k = 1)");
      }
      return config.every();
    default:
      MP_THROW(ConfigError, "activation_checkpointing.policy = ", static_cast<int>(config.policy()),
               ": unknown policy");
  }
}

EngineOptions resolve_engine_options(const proto::EngineConfig& config, int world_size) {
  if (world_size < 1) MP_THROW(ConfigError, "world size ", world_size, ": must be at least 1");
  EngineOptions o;
  o.world_size = world_size;
  const SC& sc = config.sharding();
  o.strategy = sc.strategy();
  if (strategy_name(o.strategy) == "?") {
    MP_THROW(ConfigError, "sharding.strategy = ", static_cast<int>(o.strategy), ": unknown strategy");
  }
  if (o.strategy == SC::HYBRID_SHARD) {
    const int s = sc.hybrid_shard_size();
    if (s < 1) MP_THROW(ConfigError, "sharding.hybrid_shard_size = ", s, ": HYBRID_SHARD needs a group size of at least 1");
    if (world_size % s != 0) {
      MP_THROW(ConfigError, "sharding.hybrid_shard_size = ", s, " does not divide the world size ", world_size);
    }
    o.shard_size = s;
  } else {
    if (sc.hybrid_shard_size() != 0) {
      MP_THROW(ConfigError, "sharding.hybrid_shard_size = ", sc.hybrid_shard_size(), " is set but strategy is ",
               strategy_name(o.strategy), "; it applies to HYBRID_SHARD only");
    }
    o.shard_size = o.strategy == SC::NO_SHARD ? 1 : world_size;
  }
  o.replicate_size = world_size / o.shard_size;
  o.prefetch_depth = sc.has_prefetch_depth() ? sc.prefetch_depth() : 1;
  if (o.prefetch_depth < 0 || o.prefetch_depth > 64) {
    MP_THROW(ConfigError, "sharding.prefetch_depth = ", o.prefetch_depth, ": must be in [0, 64]");
  }
  o.held_units = sc.held_units();
  o.param_dtype_gradients = sc.param_dtype_gradients();
  if (o.held_units < 0 || o.held_units > 64) {
    MP_THROW(ConfigError, "sharding.held_units = ", o.held_units, ": must be in [0, 64]");
  }
  o.micro_batches = config.micro_batches() == 0 ? 1 : config.micro_batches();
  if (o.micro_batches < 1) MP_THROW(ConfigError, "micro_batches = ", config.micro_batches(), ": must be positive");
  o.sharded_accumulation = sc.grad_accumulation() == SC::SHARDED;
  o.deterministic = config.deterministic();
  if (config.max_consecutive_skips() < 0) {
    MP_THROW(ConfigError, "max_consecutive_skips = ", config.max_consecutive_skips(), ": must not be negative");
  }
  o.max_consecutive_skips = config.max_consecutive_skips() == 0 ? 50 : config.max_consecutive_skips();
  o.stop_on_non_finite = config.non_finite() == proto::EngineConfig::NON_FINITE_STOP;
  o.locate_non_finite = config.locate_non_finite();
  o.recompute_every = recompute_every(config.activation_checkpointing());
  o.optimizer_in_backward = sc.optimizer_in_backward();
  o.serialize_communication = sc.serialize_communication();
  o.int8_param_gather = sc.int8_param_gather();
  if (o.int8_param_gather && o.strategy != SC::FULL_SHARD && o.strategy != SC::HYBRID_SHARD) {
    MP_THROW(ConfigError, "sharding.int8_param_gather applies to FULL_SHARD and HYBRID_SHARD (their per-unit ",
             "gathers); strategy is ", strategy_name(o.strategy));
  }
  o.seed = config.seed();
  o.accumulate_chunk_bytes = comm_options_from_config(config.comm()).accumulate_chunk_bytes;

  const Optimizer optimizer(config.optimizer());  // validates the optimizer fields
  o.state_count = optimizer.state_count();
  if (const MuonSettings* muon = optimizer.muon(); muon != nullptr) o.muon = muon->hyper;
  o.precision = resolve_precision(config.precision(), config.optimizer().has_loss_scaling());
  const Precision& p = o.precision;

  if (!config.comm().comm_hook().empty()) {
    if (o.strategy != SC::NO_SHARD && o.strategy != SC::HYBRID_SHARD) {
      MP_THROW(ConfigError, "comm.comm_hook = '", config.comm().comm_hook(), "' applies to NO_SHARD and to ",
               "HYBRID_SHARD's all-reduce across replicas; strategy is ", strategy_name(o.strategy));
    }
    if (p.grad_accum_dtype != DType::kF32) {
      MP_THROW(ConfigError, "comm.comm_hook needs fp32 gradient buckets: precision.grad_accum_dtype must be FP32, is ",
               dtype_name(p.grad_accum_dtype));
    }
    o.comm_hook = comm_hook_name(config.comm());
  }
  if (o.deterministic) {
    if (p.reduce_dtype != DType::kF32) {
      MP_THROW(ConfigError, "deterministic needs precision.reduce_dtype FP32 (every micro-batch's fp32 gradient ",
               "is summed in fp64); it is ", dtype_name(p.reduce_dtype));
    }
    if (!o.comm_hook.empty()) MP_THROW(ConfigError, "deterministic reduction does not go through comm.comm_hook");
    if (o.int8_param_gather) MP_THROW(ConfigError, "deterministic runs gather exact parameters: turn off sharding.int8_param_gather");
  }
  if (o.muon) {  // its matrices' update (Note [Muon in the engine] in runtime/muon_exchange.h)
    const char* refused =
        p.master == MasterMode::kNone ? "needs a master (precision.master): its matrices are updated on the fp32 "
                                        "master or bf16 + remainder"
        : p.rounding != Rounding::kNearestEven ? "writes its matrices' parameters rounded to nearest: "
                                                 "precision.rounding must be NEAREST"
        : p.state_dtype != DType::kF32 ? "keeps its matrices' momentum in the fp32 optimizer state: "
                                         "precision.state_dtype must be FP32"
                                       : nullptr;
    if (refused != nullptr) MP_THROW(ConfigError, "optimizer.kind = ", optimizer.kind().name(), " ", refused);
  }
  if (o.optimizer_in_backward) {
    if (config.optimizer().grad_clip() != 0) {
      MP_THROW(ConfigError, "sharding.optimizer_in_backward needs optimizer.grad_clip = 0 (clipping waits for the ",
               "global norm)");
    }
    if (p.loss_scaling != LossScalingMode::kNone) {
      MP_THROW(ConfigError, "sharding.optimizer_in_backward needs no loss scaling (a skipped step must be ",
               "decided before any unit is updated)");
    }
  }
  return o;
}

}  // namespace mp
