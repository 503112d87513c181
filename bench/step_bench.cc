// bench/step_bench.cc: the "step" suite. One training step of the sharded
// engine on the built-in MLP, per phase: compute, communication the compute
// thread waited for (exposed), and the update. The reference is the same
// step with serialize_communication (every collective waited for as soon
// as it is issued, so all communication is exposed), measured in the same
// run: hidden_fraction = 1 - exposed / exposed(serialized).
#include <algorithm>
#include <memory>
#include <vector>

#include "bench/suites.h"
#include "bench/timing.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/error.h"
#include "models/mlp.h"
#include "runtime/engine.h"
#include "runtime/precision.h"

namespace mp::bench {
namespace {

using SC = proto::ShardingConfig;

struct PhaseTimes {
  double step_s = 0, compute_s = 0, exposed_s = 0, update_s = 0;
};


// Median per phase over the timed steps (rank 0's view; every rank runs the
// same schedule).
PhaseTimes measure(Communicator& world, const proto::EngineConfig& config, const MlpConfig& mlp,
                   const BenchOptions& o) {
  Mlp model(mlp);
  Engine engine(model.spec(), config, world);
  for (int i = 0; i < o.warmup; ++i) engine.step(model);
  std::vector<double> step, compute, exposed, update;
  for (int i = 0; i < o.iters; ++i) {
    const StepResult r = engine.step(model);
    step.push_back(r.timings.total_s);
    compute.push_back(r.timings.compute_s);
    exposed.push_back(r.timings.exposed_comm_s);
    update.push_back(r.timings.update_s);
  }
  return PhaseTimes{median(step), median(compute), median(exposed), median(update)};
}

}  // namespace

void run_step_suite(const BenchContext& ctx) {
  const int n = ctx.world.size();
  if (n < 2) MP_THROW(ConfigError, "the step suite measures communication: run it with -np 2 or more");
  auto world = MpiCommunicator::create_world("bench", CommOptions{});
  // --sizes W: the hidden width (default 2048: 16.8M parameters).
  const int64_t width = ctx.options.sizes_bytes.empty() ? 2048 : ctx.options.sizes_bytes.front();
  if (width < 8 || width > (1 << 16)) MP_THROW(ConfigError, "step suite: --sizes ", width, ": a width in [8, 65536]");
  MlpConfig mlp;
  mlp.dims = {width / 2, width, width, width, width, width / 2};
  mlp.micro_batch_size = 8;
  mlp.threads = 1;
  const double params = static_cast<double>(Mlp::spec_for(mlp).numel());
  ctx.reporter.note(detail::str("MLP ", params / 1e6, "M parameters (width ", width, "), 5 units, micro-batch ",
                                mlp.micro_batch_size,
                                ", bf16_master, ", n, " ranks"));
  for (Strategy s : {SC::FULL_SHARD, SC::SHARD_GRAD_OP}) {
    for (int depth : {0, 1}) {
      proto::EngineConfig c;
      c.mutable_sharding()->set_strategy(s);
      c.mutable_sharding()->set_prefetch_depth(depth);
      *c.mutable_precision() = precision_recipe("bf16_master");
      c.set_micro_batches(2);
      const PhaseTimes ours = measure(*world, c, mlp, ctx.options);
      c.mutable_sharding()->set_serialize_communication(true);
      const PhaseTimes serial = measure(*world, c, mlp, ctx.options);
      std::string name(strategy_name(s));
      std::transform(name.begin(), name.end(), name.begin(), [](char ch) { return static_cast<char>(std::tolower(ch)); });
      name += depth > 0 ? "_prefetch" + std::to_string(depth) : "_no_prefetch";
      const double hidden = serial.exposed_s > 0 ? 1.0 - ours.exposed_s / serial.exposed_s : 0.0;
      nlohmann::ordered_json j;
      j["case"] = name;
      j["value"] = round_to(ours.exposed_s * 1e3, 3);
      j["unit"] = "ms";
      j["ref"] = "serialized_comm";
      j["ref_value"] = round_to(serial.exposed_s * 1e3, 3);
      j["ratio"] = round_to(serial.exposed_s > 0 ? ours.exposed_s / serial.exposed_s : 0.0, 4);
      j["better"] = "lower";
      j["hidden_fraction"] = round_to(hidden, 4);
      j["step_ms"] = round_to(ours.step_s * 1e3, 3);
      j["compute_ms"] = round_to(ours.compute_s * 1e3, 3);
      j["update_ms"] = round_to(ours.update_s * 1e3, 3);
      j["serialized_step_ms"] = round_to(serial.step_s * 1e3, 3);
      j["ranks"] = n;
      j["iters"] = ctx.options.iters;
      ctx.reporter.emit(j);
      ctx.reporter.note(detail::str(name, ": step ", j["step_ms"].get<double>(), " ms (compute ",
                                    j["compute_ms"].get<double>(), ", exposed comm ", j["value"].get<double>(),
                                    ", update ", j["update_ms"].get<double>(), "); serialized: step ",
                                    j["serialized_step_ms"].get<double>(), " ms, exposed comm ",
                                    j["ref_value"].get<double>(), " ms; hidden ", 100 * hidden, "%"));
    }
  }
}

}  // namespace mp::bench
