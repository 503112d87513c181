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
// The layer math is written once as templates over the scalar (float for the
// model, double for reference tests). Every output element is computed by
// one thread in a fixed order, so results are bitwise identical for any
// thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "models/model.h"
#include "core/tensor.h"

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

// ---- layer math (Note [MLP math]) -------------------------------------------
// Row-major: x [batch, in], w [out, in], b [out], y [batch, out].

// y = x w^T + b, then tanh if `hidden`.
template <class T>
void mlp_layer_forward(const T* x, const T* w, const T* b, int64_t batch, int64_t in, int64_t out,
                       bool hidden, T* y, int threads);

// Mean cross-entropy of softmax(logits) against labels; dlogits := its
// gradient with respect to the logits.
template <class T>
double mlp_softmax_xent(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                        T* dlogits);

// Given dy = d loss / d y (y the layer's output, after tanh if `hidden`),
// overwrites dw and db with the parameters' gradients and, unless dx is null,
// dx with d loss / d x (w is read only for dx, and may be null without it).
// dy is overwritten (with d loss / d(x w^T + b)).
template <class T>
void mlp_layer_backward(const T* x, const T* w, const T* y, T* dy, int64_t batch, int64_t in,
                        int64_t out, bool hidden, T* dw, T* db, T* dx, int threads);

// The whole model on one micro-batch through the functions above. Unit u's
// parameters and gradients are flat buffers in the layout of
// FlatLayout(Mlp::spec_for(config), 1); gradients are overwritten on the
// parameters' ranges only. Returns the mean loss.
template <class T>
double mlp_loss_and_grads(const MlpConfig& config, const float* inputs, const int32_t* labels,
                          const std::vector<std::vector<T>>& unit_params,
                          std::vector<std::vector<T>>& unit_grads);

// ---- the model ----------------------------------------------------------------

class Mlp final : public HostModel {
 public:
  explicit Mlp(const MlpConfig& config, Allocator allocator = Allocator());  // validates config

  static ModelSpec spec_for(const MlpConfig& config);  // validates config
  // The bytes the constructor allocates (MemCategory::kActivations).
  static int64_t activation_bytes(const MlpConfig& config);

  const MlpConfig& config() const { return config_; }
  const ModelSpec& spec() const override { return spec_; }
  // Loads micro-batch global_index (Note [MLP data]).
  void begin_micro_batch(int64_t global_index) override;
  // params: CPU, 1-D, fp32, bf16 or fp16, at least the unit's numel elements.
  void forward(int unit, const Tensor& params) override;
  double loss() const override;
  // grads: CPU, 1-D, fp32, at least the unit's numel elements.
  void backward(int unit, const Tensor& params, const Tensor& grads) override;

  // The current micro-batch (for tests).
  const float* inputs() const;
  const int32_t* labels() const;

 private:
  const float* unit_params(int unit, const Tensor& params);  // fp32 view, converted if needed
  void check_unit(int unit, const char* what) const;

  MlpConfig config_;
  ModelSpec spec_;
  std::vector<UnitLayout> layout_;  // FlatLayout(spec_, 1)
  MlpData data_;
  Tensor param_ws_;              // fp32 copy of a non-fp32 unit
  std::vector<Tensor> acts_;     // acts_[0] = x, acts_[i + 1] = output of layer i
  Buffer labels_;                // int32 [micro_batch_size]
  Tensor grad_a_, grad_b_;       // d loss / d activation, ping-pong
  int64_t micro_batch_ = -1;     // loaded by begin_micro_batch; -1: none yet
  int forwarded_ = 0;            // units forwarded in the current micro-batch
  int next_backward_ = -1;       // the unit backward expects next; -1: none
  double loss_ = 0.0;
};

}  // namespace mp
