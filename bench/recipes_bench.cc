// bench/recipes_bench.cc: the "recipes" suite. Trains mp_worker's default
// model (configs/default.textproto: a small GPT on the synthetic language)
// for a fixed number of steps under every precision recipe and sharding
// strategy, and reports per case: the final training loss (mean of the last
// 5 steps) and every step's loss ("losses"), the validation loss on held-out sequences, tokens/s, and the
// measured bytes per parameter per rank of the engine's state (the memory
// plan's categories: params, master, optimizer state, gradients, gather and
// communication buffers; the model's activations are reported apart). On
// this 0.8M-parameter model the fixed-size buffers are a visible part of the
// total; `mp_worker --plan` gives the asymptotic bytes per parameter.
// The reference of every loss is the fp32 recipe under the same strategy in
// the same run (ratio = loss / fp32 loss); the reference of the memory is
// NO_SHARD fp32 (16 bytes per parameter plus buffers).
//
// --iters N: steps per case (default 60); --warmup is not used (every step
// counts toward the loss). --sizes is not used.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/suites.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "launch/train_config.h"
#include "models/gpt.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

using SC = proto::ShardingConfig;
using PP = proto::PrecisionPolicy;

struct Case {
  std::string name;
  proto::PrecisionPolicy precision;
};

std::vector<Case> recipe_cases() {
  std::vector<Case> cases;
  for (const char* r : {"fp32", "amp_bf16", "bf16_master", "bf16_remainder", "pure_bf16"}) {
    cases.push_back({r, precision_recipe(r)});
  }
  Case nearest{"pure_bf16_nearest", precision_recipe("pure_bf16")};
  nearest.precision.set_rounding(PP::NEAREST_EVEN);
  cases.push_back(nearest);
  cases.push_back({"amp_fp16", precision_recipe("amp_fp16")});
  return cases;
}

struct Outcome {
  double final_loss = 0, val_loss = 0, tokens_per_s = 0, bytes_per_param = 0, activation_mib = 0;
  int skipped = 0;
  std::vector<double> losses;  // every step's training loss, in order
};

Outcome run_case(Communicator& world, const TrainSettings& base, const Case& c, Strategy strategy, int steps) {
  proto::EngineConfig config = base.config.engine();
  config.mutable_sharding()->set_strategy(strategy);
  *config.mutable_precision() = c.precision;
  GptConfig g = base.gpt;
  g.threads = 1;
  Allocator allocator;
  // Autocast follows the recipe (gpt_matmul_dtype, models/gpt.h).
  TrainSettings settings = base;
  settings.engine_options = resolve_engine_options(config, world.size());
  g.matmul_dtype = settings.gpt_matmul_dtype();
  Gpt model(g, allocator);
  Engine engine(model.spec(), config, world, allocator);
  Outcome o;
  std::vector<double>& losses = o.losses;
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const StepResult r = engine.step(model);
    losses.push_back(r.loss);
    times.push_back(r.timings.total_s);
    o.skipped += r.skipped ? 1 : 0;
  }
  const size_t tail = std::min<size_t>(5, losses.size());
  for (size_t i = losses.size() - tail; i < losses.size(); ++i) o.final_loss += losses[i] / static_cast<double>(tail);
  o.val_loss = engine.evaluate(model, int64_t{1} << 40, 4);
  std::sort(times.begin(), times.end());
  const double tokens = static_cast<double>(g.micro_batch_size * g.context) * engine.options().micro_batches *
                        world.size();
  o.tokens_per_s = tokens / times[times.size() / 2];
  // The model's activations share the allocator: count the engine's state
  // (the memory plan's categories) per parameter, the activations apart.
  const MemStats mem = allocator.stats();
  const size_t activations = mem.current(MemCategory::kActivations);
  o.bytes_per_param = static_cast<double>(mem.total_current_bytes - activations) /
                      static_cast<double>(model.spec().numel());
  o.activation_mib = static_cast<double>(activations) / (1 << 20);
  return o;
}

}  // namespace

void run_recipes_suite(const BenchContext& ctx) {
  auto world = MpiCommunicator::create_world("bench", CommOptions{});
  const int steps = ctx.options.iters;
  if (steps < 5) MP_THROW(ConfigError, "recipes suite: --iters ", steps, ": at least 5 steps");
  const TrainSettings base = resolve_train_config(default_train_config(), world->size());
  const double floor = GptData(base.gpt).entropy_floor();
  ctx.reporter.note(detail::str("default GPT (configs/default.textproto) of ", Gpt::spec_for(base.gpt).numel(),
                                " parameters, ", steps, " steps per case, ", world->size(),
                                " rank(s) x 1 thread; entropy floor ", floor));
  double reference_bytes = 0;
  for (Strategy s : {SC::NO_SHARD, SC::SHARD_OPTIMIZER, SC::SHARD_GRAD_OP, SC::FULL_SHARD}) {
    double fp32_loss = 0;
    for (const Case& c : recipe_cases()) {
      const Outcome o = run_case(*world, base, c, s, steps);
      if (c.name == "fp32") fp32_loss = o.final_loss;
      if (c.name == "fp32" && s == SC::NO_SHARD) reference_bytes = o.bytes_per_param;
      std::string strategy(strategy_name(s));
      std::transform(strategy.begin(), strategy.end(), strategy.begin(),
                     [](char ch) { return static_cast<char>(std::tolower(ch)); });
      nlohmann::ordered_json j;
      j["case"] = c.name + "_" + strategy;
      j["value"] = round_to(o.final_loss, 5);
      j["unit"] = "loss";
      j["ref"] = "fp32_same_strategy";
      j["ref_value"] = round_to(fp32_loss, 5);
      j["ratio"] = round_to(o.final_loss / fp32_loss, 5);
      j["better"] = "lower";
      j["val_loss"] = round_to(o.val_loss, 5);
      j["entropy_floor"] = round_to(floor, 5);
      j["tokens_per_s"] = round_to(o.tokens_per_s, 1);
      j["bytes_per_param"] = round_to(o.bytes_per_param, 3);
      j["bytes_per_param_ratio_to_no_shard_fp32"] = round_to(o.bytes_per_param / reference_bytes, 4);
      j["activation_mib"] = round_to(o.activation_mib, 2);
      j["skipped_steps"] = o.skipped;
      std::vector<double> losses;  // for the loss curves (scripts/plot_recipes)
      for (double l : o.losses) losses.push_back(round_to(l, 5));
      j["losses"] = losses;
      j["ranks"] = world->size();
      j["steps"] = steps;
      ctx.reporter.emit(j);
      ctx.reporter.note(detail::str(c.name, " ", strategy, ": loss ", round_to(o.final_loss, 4), " (fp32 ",
                                    round_to(fp32_loss, 4), "), val ", round_to(o.val_loss, 4), ", ",
                                    round_to(o.tokens_per_s, 0), " tokens/s, ", round_to(o.bytes_per_param, 2),
                                    " bytes/param/rank", o.skipped > 0 ? detail::str(", ", o.skipped, " skipped") : ""));
    }
  }
}

}  // namespace mp::bench
