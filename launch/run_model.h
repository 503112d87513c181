// launch/run_model.h: the model and data of a training run (a resolved
// TrainConfig, launch/train_config.h) and what the run log says about them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/allocator.h"
#include "launch/train_config.h"
#include "models/gpt.h"
#include "models/model.h"
#include "models/token_data.h"
#include "runtime/engine.h"

namespace mp {

// Micro-batch indices of the held-out data: the synthetic language and the
// MLP's data are pure functions of the index, and training never reaches
// this one (it would take 2^40 micro-batches).
inline constexpr int64_t kHeldOutFirst = int64_t{1} << 40;

struct RunModel {
  std::unique_ptr<Model> model;
  Gpt* gpt = nullptr;                                   // when the model is the GPT
  std::shared_ptr<const TokenBatchSource> train, val;  // GPT sources; val null: held-out indices of train
  int64_t val_first = kHeldOutFirst;                    // first validation micro-batch index
  std::optional<double> floor;                          // the synthetic language's entropy floor
  double items_per_micro_batch = 0;                     // tokens (GPT) or samples (MLP)
  double flops_per_item = 0;                            // training FLOPs per token or sample
  int64_t activation_bytes = 0;                         // what the model allocated (model_activation_bytes)
  std::string description;                              // the log's "model: ..." line
  std::string data_description;                         // the log's "data: ..." lines

  // The mean loss of `batches` validation micro-batches (the GPT reads its
  // validation source meanwhile). Collective.
  double validate(Engine& engine, int batches);
  // `count` tokens sampled from the GPT at `step` (models/gpt_sample.h) as
  // text: one forward per token through the engine. Collective.
  std::string sample(Engine& engine, int count, uint64_t seed, int64_t step);
};

// The units of the model of `settings` (Gpt::spec_for or Mlp::spec_for).
ModelSpec model_spec(const TrainSettings& settings);

// The bytes of activations and workspace the model of `settings` allocates
// on `device` (the memory plan's activations row). For a CUDA device, that
// device must be current (the CUDA GPT asks CUB for its sort's scratch).
int64_t model_activation_bytes(const TrainSettings& settings, Device device);

// The model of `settings` on `threads` CPU threads (when the config leaves
// them 0) with its data: the GPT reads data.train_path (and its validation
// tokens) or the synthetic language, the MLP its own synthetic data.
RunModel make_model(const TrainSettings& settings, int threads, Allocator allocator);

}  // namespace mp
