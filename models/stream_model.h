// models/stream_model.h: the base of the built-in models (the GPT and the
// MLP), whose calls enqueue ops on the engine's stream (models/model.h):
// direct calls beside the Model calls, for tests and tools on the CPU. Each
// enqueues on the model's own CPU stream, made on first use, and waits for
// it; loss() returns the micro-batch's loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/pinned.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/dispatch.h"
#include "models/flat_layout.h"
#include "models/model.h"

namespace mp {

class StreamModel : public Model {
 public:
  // The device the model computes on (its allocator's).
  virtual Device device() const = 0;
  void loss_on(double* loss, Stream& s) final { enqueue_loss(loss, s); }

  // ---- Direct calls: CPU only (EnforceError otherwise).
  void begin_micro_batch(int64_t global_index);
  // params: 1-D, fp32, bf16 or fp16, at least the unit's numel elements.
  void forward(int unit, const Tensor& params);
  double loss() const;
  // Before backward(unit) of a unit the model recomputes (models/model.h).
  void recompute(int unit, const Tensor& params);
  // grads: 1-D, fp32, at least the unit's numel elements.
  void backward(int unit, const Tensor& params, const Tensor& grads);

 protected:
  // `name` names the model in errors ("Gpt"), `noun` in its checks' ("the GPT").
  StreamModel(const char* name, const char* noun) : name_(name), noun_(noun) {}
  // ConfigError unless `s` runs on the model's device.
  void check_stream(const Stream& s) const;
  // Enqueues on `s` (checked) the ops body(cx) adds for `unit`, its CPU ops
  // gathered into one task (CpuOpBatch, Note [Op dispatch] in kernels/dispatch.h).
  void unit_ops(Stream& s, const UnitLayout& unit, int threads, OpTimer* timer,
                const std::function<void(const OpContext&)>& body) const;
  // EnforceError unless `params` can be the parameters of `unit` (1-D, on the
  // model's device, fp32, bf16 or fp16, at least its numel elements), or
  // `grads` its gradients (the same in fp32).
  void check_params(const Tensor& params, const UnitLayout& unit) const;
  void check_grads(const Tensor& grads, const UnitLayout& unit) const;
  // Enqueues on `s` the copy of the micro-batch's mean loss into *loss
  // (Model::loss_on).
  virtual void enqueue_loss(double* loss, Stream& s) const = 0;

 private:
  // Runs `call` on the model's CPU stream, made on first use, and waits for it.
  void direct(const std::function<void(Stream&)>& call) const;

  const char* name_;
  const char* noun_;
  mutable std::unique_ptr<Stream> direct_;
  mutable PinnedBuffer direct_loss_;
};

}  // namespace mp
