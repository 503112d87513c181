#include "launch/plan_search.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "launch/run_model.h"
#include "runtime/memory_plan.h"
#include "runtime/precision.h"

namespace mp {
namespace {

using SC = proto::ShardingConfig;
using AC = proto::ActivationCheckpointing;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// The recomputation policies worth planning: none, every unit, and every
// 2nd where the model has 3 or more recomputable units (else it equals one
// of the others).
std::vector<int> recompute_options(const ModelSpec& spec) {
  const auto n = std::count_if(spec.units.begin(), spec.units.end(), [](const UnitSpec& u) { return u.recomputable; });
  if (n == 0) return {0};
  if (n < 3) return {0, 1};
  return {0, 1, 2};
}

// The config of row c's choices (strategy, recipe, recomputation,
// micro-batches), and into c.sets the --set assignments that turn the run's
// config into it.
proto::TrainConfig candidate_config(const proto::TrainConfig& base, PlanRow& c, int hybrid_group) {
  proto::TrainConfig config = base;
  proto::EngineConfig& e = *config.mutable_engine();
  auto set = [&](const std::string& path, const std::string& value, bool differs) {
    if (differs) c.sets.push_back(path + "=" + value);
  };
  set("engine.sharding.strategy", std::string(strategy_name(c.strategy)), e.sharding().strategy() != c.strategy);
  e.mutable_sharding()->set_strategy(c.strategy);
  const int group = c.strategy == SC::HYBRID_SHARD ? hybrid_group : 0;
  set("engine.sharding.hybrid_shard_size", std::to_string(group), e.sharding().hybrid_shard_size() != group);
  e.mutable_sharding()->set_hybrid_shard_size(group);
  const auto recipe = precision_recipe(c.recipe).recipe();
  set("engine.precision.recipe", proto::PrecisionPolicy::Recipe_Name(recipe), e.precision().recipe() != recipe);
  e.mutable_precision()->set_recipe(recipe);
  const AC::Policy policy = c.recompute_every == 0   ? AC::NONE
                            : c.recompute_every == 1 ? AC::EVERY_UNIT
                                                     : AC::EVERY_KTH_UNIT;
  const int every = c.recompute_every >= 2 ? c.recompute_every : 0;
  set("engine.activation_checkpointing.policy", AC::Policy_Name(policy),
      e.activation_checkpointing().policy() != policy);
  set("engine.activation_checkpointing.every", std::to_string(every), e.activation_checkpointing().every() != every);
  e.mutable_activation_checkpointing()->set_policy(policy);
  e.mutable_activation_checkpointing()->set_every(every);
  const int m0 = e.micro_batches() == 0 ? 1 : e.micro_batches();
  set("engine.micro_batches", std::to_string(c.micro_batches), m0 != c.micro_batches);
  e.set_micro_batches(c.micro_batches);
  set("data.micro_batch_size", std::to_string(c.micro_batch_size),
      config.data().micro_batch_size() != c.micro_batch_size);
  config.mutable_data()->set_micro_batch_size(static_cast<int32_t>(c.micro_batch_size));
  return config;
}

// The row's order (Note [Plan search]): communication, then compute, micro-batches and bytes.
auto order_key(const PlanRow& r) {
  return std::make_tuple(r.comm.total(), r.recompute_every == 0 ? 0 : 1000 - r.recompute_every, r.micro_batches,
                         r.bytes);
}

// "1.50 GiB", "37.2 MiB", "812 KiB".
std::string human(double bytes) {
  char s[32];
  if (bytes >= double(size_t{1} << 30)) {
    std::snprintf(s, sizeof s, "%.2f GiB", bytes / double(size_t{1} << 30));
  } else if (bytes >= double(size_t{1} << 20)) {
    std::snprintf(s, sizeof s, "%.1f MiB", bytes / double(size_t{1} << 20));
  } else {
    std::snprintf(s, sizeof s, "%.0f KiB", bytes / 1024.0);
  }
  return s;
}


}  // namespace

std::string recompute_name(int every) {
  if (every == 0) return "none";
  if (every == 1) return "every unit";
  if (every == 2) return "every 2nd";
  if (every == 3) return "every 3rd";
  return "every " + std::to_string(every) + "th";
}

PlanSearch search_plans(const TrainSettings& settings, int world_size, int ranks_per_host, size_t budget,
                        Device device) {
  if (ranks_per_host < 1 || world_size % ranks_per_host != 0) {
    MP_THROW(ConfigError, "--ranks-per-host ", ranks_per_host, " does not divide the world size ", world_size);
  }
  PlanSearch search;
  search.world_size = world_size;
  search.hybrid_group = ranks_per_host;
  search.budget = budget;
  search.smallest = static_cast<size_t>(-1);
  const ModelSpec spec = model_spec(settings);
  const proto::TrainConfig& base = settings.config;
  const int m0 = base.engine().micro_batches() == 0 ? 1 : base.engine().micro_batches();
  const int64_t sequences = m0 * static_cast<int64_t>(base.data().micro_batch_size());
  std::vector<Strategy> strategies = {SC::NO_SHARD, SC::SHARD_OPTIMIZER, SC::SHARD_GRAD_OP, SC::FULL_SHARD};
  if (ranks_per_host > 1 && ranks_per_host < world_size) strategies.push_back(SC::HYBRID_SHARD);
  for (Strategy strategy : strategies) {
    for (const std::string& recipe : precision_recipe_names()) {
      for (int every : recompute_options(spec)) {
        for (int64_t m : divisors(sequences)) {
          PlanRow row;
          row.strategy = strategy;
          row.recipe = recipe;
          row.recompute_every = every;
          row.micro_batches = static_cast<int>(m);
          row.micro_batch_size = sequences / m;
          TrainSettings t;
          try {
            t = resolve_train_config(candidate_config(base, row, ranks_per_host), world_size);
          } catch (const ConfigError&) {
            continue;  // a combination the config's other fields rule out (e.g. deterministic with bf16 reductions)
          }
          ++search.planned;
          row.bytes = plan_memory(spec, t.engine_options).total() +
                      static_cast<size_t>(model_activation_bytes(t, device));
          row.comm = plan_comm_volume(spec, t.engine_options);
          search.smallest = std::min(search.smallest, row.bytes);
          if (row.bytes <= budget) search.fits.push_back(std::move(row));
        }
      }
    }
  }
  std::stable_sort(search.fits.begin(), search.fits.end(),
                   [](const PlanRow& a, const PlanRow& b) { return order_key(a) < order_key(b); });
  const auto own = base.engine().precision().recipe();
  for (size_t i = 0; i < search.fits.size(); ++i) {
    if (precision_recipe(search.fits[i].recipe).recipe() == (own == 0 ? proto::PrecisionPolicy::RECIPE_FP32 : own)) {
      search.chosen = static_cast<int>(i);
      break;
    }
  }
  if (search.chosen >= 0) {
    const PlanRow& r = search.fits[static_cast<size_t>(search.chosen)];
    search.why = "the config's recipe (" + r.recipe + ") with the least communication per step that fits";
    if (r.recompute_every == 0) {
      search.why += ", without recomputation";
    } else {
      search.why += "; it needs recomputation (" + recompute_name(r.recompute_every) +
                    ": about a third more compute for the recomputed units)";
    }
    if (r.micro_batches > 1) {
      search.why += ", in " + std::to_string(r.micro_batches) + " micro-batches of " +
                    std::to_string(r.micro_batch_size);
    }
  }
  return search;
}

std::string to_string(const PlanSearch& search, const TrainSettings& settings, int max_rows) {
  std::ostringstream s;
  const ModelSpec spec = model_spec(settings);
  const int m0 = settings.config.engine().micro_batches() == 0 ? 1 : settings.config.engine().micro_batches();
  s << "plans that fit " << human(static_cast<double>(search.budget)) << " per rank: "
    << (settings.model == ModelKind::kGpt ? "GPT" : "MLP") << " of " << spec.numel() << " parameters, "
    << search.world_size << " ranks"
    << (search.hybrid_group > 1 && search.hybrid_group < search.world_size
            ? " (HYBRID_SHARD groups of " + std::to_string(search.hybrid_group) + ")"
            : std::string())
    << ", "
    << m0 * settings.config.data().micro_batch_size() << " sequences per rank per step\n";
  char line[640];
  std::snprintf(line, sizeof line, "%4s  %-15s %-14s %-10s %5s %12s %10s %10s  %s\n", "row", "strategy", "recipe",
                "recompute", "micro", "bytes/rank", "", "comm/step", "run with");
  s << line;
  auto print = [&](size_t i) {
    const PlanRow& r = search.fits[i];
    std::string sets;
    for (const std::string& a : r.sets) sets += (sets.empty() ? "--set " : " --set ") + a;
    const std::string micro = std::to_string(r.micro_batches) + "x" + std::to_string(r.micro_batch_size);
    std::snprintf(line, sizeof line, "%4zu%s %-15s %-14s %-10s %5s %12zu %10s %10s  %s\n", i + 1,
                  static_cast<int>(i) == search.chosen ? "*" : " ", std::string(strategy_name(r.strategy)).c_str(),
                  r.recipe.c_str(), recompute_name(r.recompute_every).c_str(), micro.c_str(), r.bytes,
                  human(static_cast<double>(r.bytes)).c_str(), human(r.comm.total()).c_str(),
                  sets.empty() ? "(the config as it is)" : sets.c_str());
    s << line;
  };
  size_t shown = 0;
  for (size_t i = 0; i < search.fits.size(); ++i) {
    if (max_rows <= 0 || static_cast<int>(i) < max_rows || static_cast<int>(i) == search.chosen) {
      print(i);
      ++shown;
    }
  }
  if (shown < search.fits.size()) s << "  (" << search.fits.size() - shown << " more rows: --plan-rows 0 shows all)\n";
  s << search.fits.size() << " of " << search.planned << " configurations fit; the smallest needs "
    << human(static_cast<double>(search.smallest)) << " per rank. micro: micro-batches x sequences; comm/step: "
    << "what each rank sends per step (Note [Communication volume])\n";
  if (search.chosen >= 0) {
    s << "choice: row " << search.chosen + 1 << ", " << search.why << "\n";
  } else {
    s << "choice: none: no configuration of the config's recipe fits"
      << (search.fits.empty() ? "" : " (other recipes do, above)") << "\n";
  }
  return s.str();
}

}  // namespace mp
