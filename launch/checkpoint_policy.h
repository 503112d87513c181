// launch/checkpoint_policy.h: where a training run starts and when it saves
// (proto::CheckpointConfig as resolved in TrainSettings): resuming from a
// checkpoint or starting from Hugging Face weights, checkpoints at a step
// interval, a time interval, a stop signal and the end, and the Hugging
// Face export. Rank 0 prints what it did.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "launch/step_agreement.h"
#include "launch/train_config.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"

namespace mp {

class CheckpointPolicy {
 public:
  // `engine` and `settings` must outlive the policy.
  CheckpointPolicy(Engine& engine, const TrainSettings& settings, bool lead);

  // Loads where the run starts: checkpoint.resume's checkpoint ("auto": the
  // latest under the checkpoint directory, when there is one), else
  // checkpoint.init_from_safetensors' weights, else the engine's init.
  // Returns the step the run goes on from (0: a fresh run); note() says what
  // happened. Collective. Throws an agreed ConfigError when the checkpoint
  // is past `steps`.
  int64_t restore();
  const std::string& note() const { return note_; }

  // The run log's "checkpoints: DIR (every 100 steps, ..., keeping 3)";
  // empty when the run saves none.
  std::string describe() const;
  // Whether a stop signal saves a checkpoint (then the run catches SIGTERM
  // and SIGUSR1; else they keep their default action).
  bool saves_on_signal() const;
  // Rank 0's clock: checkpoint.interval_minutes have passed since the last
  // save (false on the other ranks and without a time interval).
  bool time_due() const;

  // With checkpoint.async_save: whether this rank's background write has
  // ended (or none is in flight), for the step agreement. Never blocks.
  bool save_written() const;

  // After step `step`: commits an asynchronous save whose writes every rank
  // finished (agreed.save_written), then saves when the agreed signal, the
  // step interval or the time interval asks; a stop signal's checkpoint is
  // committed before this returns, asynchronous or not. Returns the signal
  // that stops the run, 0 to go on (a signal without checkpoints to save is
  // ignored). Collective.
  int after_step(int64_t step, const StepAgreement& agreed);
  // After the last step: save_at_end's checkpoint, the commit of an
  // asynchronous save still in flight, and the Hugging Face export
  // (checkpoint.export_safetensors). Collective.
  void finish();
  // The Hugging Face export alone (checkpoint.export_safetensors), of the
  // weights the engine holds: mp_worker --steps 0. Collective.
  void export_weights();

 private:
  // `complete`: committed before it returns (a stop signal's, the end's).
  void save(int64_t step, const char* why, bool complete);
  void commit();  // the asynchronous save in flight, if any
  void import_weights(const std::string& path);

  Engine& engine_;
  const TrainSettings& settings_;
  const proto::CheckpointConfig& config_;
  bool lead_;
  CheckpointSaveOptions save_options_;
  std::unique_ptr<CheckpointWriter> writer_;  // checkpoint.async_save
  std::chrono::steady_clock::time_point last_save_;
  std::string note_;
};

}  // namespace mp
