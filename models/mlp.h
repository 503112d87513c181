// models/mlp.h: a small deterministic multi-layer perceptron on synthetic
// data, the model the engine's tests and benchmarks train.
//
// Layers i = 0 .. L-1, one unit each ("layer{i}": "layer{i}.weight" of shape
// [out, in] and "layer{i}.bias" of shape [out]). Every layer but the last is
// followed by tanh; the loss is softmax cross-entropy of the last layer's
// logits, averaged over the micro-batch.
//
// Note [MLP data]
// Micro-batch g holds samples s = g * micro_batch_size + b, each a pure
// function of (data_seed, s): x[j] is uniform in [-1, 1) from
// philox_u32(data_seed, s, j) (exact in fp32), and the
// label is the argmax over classes of a fixed "teacher" linear map of x,
// drawn from philox stream kMlpTeacherStream (ties go to the lowest class).
// So any rank or process that loads micro-batch g sees the same bits, k
// micro-batches of size B hold the samples of one micro-batch of size k B,
// and the labels are learnable.
//
// Note [MLP math]
// The layer math is kernels/cpu/mlp_ops.h: templates over the scalar (float
// for the model's CPU ops, double for the reference), every output element
// computed by one thread in a fixed order, so results are bitwise identical
// for any thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/dispatch.h"
#include "kernels/nn/dense.h"
#include "models/call_order.h"
#include "models/input_ring.h"
#include "models/model.h"
#include "models/stream_model.h"

namespace mp {

struct MlpConfig {
  std::vector<int64_t> dims = {16, 32, 32, 10};  // input, hidden..., classes
  int64_t micro_batch_size = 8;
  uint64_t data_seed = 1234;
  int threads = 0;  // CPU threads of the layer loops; 0: default_cpu_threads()
};

// Throws ConfigError naming the field, e.g. "mlp.dims[2] = 0: must be positive".
void validate(const MlpConfig& config);

// ---- data (Note [MLP data]) -------------------------------------------------

inline constexpr uint64_t kMlpTeacherStream = uint64_t{1} << 63;

class MlpData {
 public:
  explicit MlpData(const MlpConfig& config);  // validates config
  // inputs: micro_batch_size * dims.front() values, row-major; labels:
  // micro_batch_size class indices. global_index >= 0.
  void micro_batch(int64_t global_index, float* inputs, int32_t* labels) const;

 private:
  int64_t batch_ = 0;
  int64_t in_ = 0;
  int64_t classes_ = 0;
  uint64_t seed_ = 0;
  std::vector<double> teacher_;  // [classes, in]
};

// ---- the model ----------------------------------------------------------------

namespace mlp {
struct Buffers;  // the workspace's buffers (mlp.cc)
}

// One model for every device (as the GPT: Note [GPT on every device] in
// models/gpt.h): each layer's forward and backward and the loss are ops on
// the engine's compute stream (kernels/nn/dense.h) with a CPU body (the
// fp32 loops of kernels/cpu/mlp_ops.h) and a CUDA body (fp32 cuBLASLt
// GEMMs and tanh kernels); the samples reach the device through a ring of
// pinned slots (models/input_ring.h).
class Mlp final : public StreamModel {
 public:
  // Computes on the allocator's device, where it allocates its one
  // workspace (MemCategory::kActivations). Validates config.
  explicit Mlp(const MlpConfig& config, Allocator allocator = Allocator());
  ~Mlp() override;
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  static ModelSpec spec_for(const MlpConfig& config);  // validates config
  // The bytes the constructor allocates on `device` (MemCategory::kActivations).
  static int64_t activation_bytes(const MlpConfig& config, Device device = Device::cpu());

  const MlpConfig& config() const { return config_; }
  const ModelSpec& spec() const override { return spec_; }
  Device device() const override { return device_; }

  // ---- Model (models/model.h): enqueued on the engine's compute stream
  // Loads micro-batch global_index (Note [MLP data]).
  void begin_micro_batch_on(int64_t global_index, Stream& s) override;
  // params: 1-D, fp32, bf16 or fp16, at least the unit's numel elements.
  void forward_on(int unit, const Tensor& params, Stream& s) override;
  // grads: 1-D, fp32, at least the unit's numel elements.
  void backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) override;

  // ---- Direct calls (models/stream_model.h), and on the CPU what they left:
  // The current micro-batch.
  const float* inputs() const;
  const int32_t* labels() const;

 private:
  const float* unit_params(const OpContext& cx, int unit, const Tensor& params);
  nn::Dense layer(int unit) const;
  void enqueue_loss(double* loss, Stream& s) const override;

  MlpConfig config_;
  ModelSpec spec_;
  std::vector<UnitLayout> layout_;  // FlatLayout(spec_, 1)
  Device device_;
  MlpData data_;
  Buffer workspace_;
  std::unique_ptr<mlp::Buffers> b_;
  InputRing samples_;  // inputs then labels of a micro-batch
  CallOrder order_;
};

}  // namespace mp
