// launch/plan_search.h: which configurations of a run fit a memory budget
// per rank (mp_worker --plan --memory-per-rank 16GiB --world-size 64).
//
// Note [Plan search]
// From the run's config, a world size (and ranks per host, HYBRID_SHARD's
// group) and a budget, every combination of sharding strategy, precision
// recipe, activation recomputation (none, every unit, every 2nd unit where
// that differs) and micro-batches per step (each divisor of the sequences a
// rank runs per step, which stays the same: micro_batches x
// micro_batch_size) is planned exactly as the engine and the model will
// allocate it (plan_memory plus the model's activation bytes, each tested
// against what is measured), and its communication per step estimated
// (runtime/comm_volume.h). The rows that fit are ordered by communication
// volume per step. The choice keeps the config's recipe (a recipe changes
// the numerics, which is the user's call) and takes, among that recipe's
// rows that fit, the least communication per step; at equal volume, no
// recomputation before recomputation (a third more compute for the
// recomputed units), then fewer micro-batches (bigger GEMMs), then fewer
// bytes. Each row names the --set flags that run it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/device.h"
#include "launch/train_config.h"
#include "runtime/comm_volume.h"

namespace mp {

struct PlanRow {
  Strategy strategy = proto::ShardingConfig::FULL_SHARD;
  std::string recipe;          // precision_recipe_names()' spelling
  int recompute_every = 0;     // 0 none, 1 every unit, k every k-th
  int micro_batches = 1;
  int64_t micro_batch_size = 1;
  size_t bytes = 0;            // per rank: the engine's plan and the model's activations
  CommVolume comm;             // per rank per step
  std::vector<std::string> sets;  // mp_worker --set assignments that give this row
};

struct PlanSearch {
  int world_size = 1;
  int hybrid_group = 1;        // HYBRID_SHARD's shard group (ranks per host)
  size_t budget = 0;
  std::vector<PlanRow> fits;   // ordered by communication per step (Note [Plan search])
  int chosen = -1;             // index into fits; -1: none of the config's recipe fits
  int planned = 0;             // configurations planned
  size_t smallest = 0;         // the fewest bytes of any configuration planned
  std::string why;             // the choice, in a sentence
};

// Plans every configuration for `world_size` ranks, HYBRID_SHARD over
// groups of `ranks_per_host`, on `device` (where the model's activations
// live). ConfigError for a world size that ranks_per_host does not divide.
PlanSearch search_plans(const TrainSettings& settings, int world_size, int ranks_per_host, size_t budget,
                        Device device);

// A recomputation policy's k in words: "none", "every unit", "every 2nd".
std::string recompute_name(int every);

// The table mp_worker prints: the first max_rows rows that fit (all for
// 0) and the chosen one, then the choice and why.
std::string to_string(const PlanSearch& search, const TrainSettings& settings, int max_rows);

}  // namespace mp
