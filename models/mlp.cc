#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/nn/cast.h"
#include "kernels/ops.h"
#include "kernels/philox_math.h"
#include "models/flat_layout.h"

namespace mp {
namespace {

// Uniform in [-1, 1) with 24 random bits: exact in fp32.
float uniform_pm1(uint32_t word) { return static_cast<float>(word >> 8) * 0x1p-23f - 1.0f; }

int64_t num_layers(const MlpConfig& config) { return static_cast<int64_t>(config.dims.size()) - 1; }

}  // namespace

void validate(const MlpConfig& config) {
  if (config.dims.size() < 2) {
    MP_THROW(ConfigError, "mlp.dims has ", config.dims.size(),
             " entries: need at least 2 (input size, classes)");
  }
  for (size_t i = 0; i < config.dims.size(); ++i) {
    if (config.dims[i] <= 0) MP_THROW(ConfigError, "mlp.dims[", i, "] = ", config.dims[i], ": must be positive");
  }
  if (config.micro_batch_size <= 0) {
    MP_THROW(ConfigError, "mlp.micro_batch_size = ", config.micro_batch_size, ": must be positive");
  }
  if (config.threads < 0) {
    MP_THROW(ConfigError, "mlp.threads = ", config.threads, ": must be 0 (default) or positive");
  }
}

// ---- data -------------------------------------------------------------------

MlpData::MlpData(const MlpConfig& config) {
  validate(config);
  batch_ = config.micro_batch_size;
  in_ = config.dims.front();
  classes_ = config.dims.back();
  seed_ = config.data_seed;
  teacher_.resize(static_cast<size_t>(classes_ * in_));
  for (size_t i = 0; i < teacher_.size(); ++i) {
    teacher_[i] = uniform_pm1(math::philox_u32(seed_, kMlpTeacherStream, i));
  }
}

void MlpData::micro_batch(int64_t global_index, float* inputs, int32_t* labels) const {
  MP_ENFORCE_GE(global_index, 0, "micro-batch index");
  for (int64_t b = 0; b < batch_; ++b) {
    const auto sample = static_cast<uint64_t>(global_index * batch_ + b);
    float* xb = inputs + b * in_;
    for (int64_t j = 0; j < in_; ++j) {
      xb[j] = uniform_pm1(math::philox_u32(seed_, sample, static_cast<uint64_t>(j)));
    }
    int32_t best = 0;
    double best_score = 0.0;
    for (int64_t c = 0; c < classes_; ++c) {
      const double* t = teacher_.data() + c * in_;
      double score = 0.0;
      for (int64_t j = 0; j < in_; ++j) score += t[j] * static_cast<double>(xb[j]);
      if (c == 0 || score > best_score) {
        best = static_cast<int32_t>(c);
        best_score = score;
      }
    }
    labels[b] = best;
  }
}

// ---- the model ----------------------------------------------------------------

ModelSpec Mlp::spec_for(const MlpConfig& config) {
  validate(config);
  ModelSpec spec;
  for (int64_t l = 0; l < num_layers(config); ++l) {
    const int64_t in = config.dims[static_cast<size_t>(l)];
    const int64_t out = config.dims[static_cast<size_t>(l + 1)];
    const std::string name = "layer" + std::to_string(l);
    UnitSpec unit{name, {}};
    unit.params.push_back(ParamSpec{name + ".weight", {out, in},
                                    ParamInit{ParamInit::Kind::kNormal, 1.0 / std::sqrt(static_cast<double>(in))}});
    unit.params.push_back(ParamSpec{name + ".bias", {out}, ParamInit{ParamInit::Kind::kZeros, 0.0}});
    spec.units.push_back(std::move(unit));
  }
  return spec;
}

// ---- workspace ----------------------------------------------------------------

namespace mlp {

// Every buffer of the model, carved from its one workspace.
struct Buffers {
  std::vector<float*> acts;  // acts[0] = x, acts[i + 1] = output of layer i
  int32_t* labels = nullptr;  // [batch], right after acts[0]: one copy brings both
  float* param_ws = nullptr;  // a narrow unit widened to fp32
  float *grad_a = nullptr, *grad_b = nullptr;  // d loss / d activation, ping-pong
  float* row_loss = nullptr;
  double* mean_loss = nullptr;
  void* dense_ws = nullptr;
};

}  // namespace mlp

namespace {

// The buffers carved from `base` (null: only count); *bytes := bytes used.
mlp::Buffers carve(const MlpConfig& c, const std::vector<UnitLayout>& layout, Device device, char* base,
                   int64_t* bytes) {
  int64_t used = 0;
  auto take = [&](int64_t n) {
    char* p = base == nullptr ? nullptr : base + used;
    used += (n + 255) / 256 * 256;
    return p;
  };
  const int64_t batch = c.micro_batch_size, max_dim = *std::max_element(c.dims.begin(), c.dims.end());
  int64_t max_numel = 0;
  for (const UnitLayout& unit : layout) max_numel = std::max(max_numel, unit.numel);
  mlp::Buffers b;
  const int64_t input_bytes = batch * c.dims.front() * 4;
  char* samples = take(input_bytes + batch * 4);  // inputs then labels
  b.acts.push_back(reinterpret_cast<float*>(samples));
  b.labels = reinterpret_cast<int32_t*>(samples == nullptr ? nullptr : samples + input_bytes);
  for (size_t i = 1; i < c.dims.size(); ++i) b.acts.push_back(reinterpret_cast<float*>(take(batch * c.dims[i] * 4)));
  b.param_ws = reinterpret_cast<float*>(take(max_numel * 4));
  b.grad_a = reinterpret_cast<float*>(take(batch * max_dim * 4));
  b.grad_b = reinterpret_cast<float*>(take(batch * max_dim * 4));
  b.row_loss = reinterpret_cast<float*>(take(batch * 4));
  b.mean_loss = reinterpret_cast<double*>(take(8));
  b.dense_ws = take(nn::dense_backward_workspace_bytes(device, batch, max_dim));
  *bytes = used;
  return b;
}

int64_t sample_bytes(const MlpConfig& c) { return c.micro_batch_size * (c.dims.front() + 1) * 4; }

}  // namespace

int64_t Mlp::activation_bytes(const MlpConfig& config, Device device) {
  int64_t bytes = 0;
  set_current_device(device);
  carve(config, FlatLayout(spec_for(config), 1).units(), device, nullptr, &bytes);
  return bytes;
}

Mlp::Mlp(const MlpConfig& config, Allocator allocator)
    : StreamModel("Mlp", "the MLP"), config_(config), spec_(spec_for(config)), layout_(FlatLayout(spec_, 1).units()),
      device_(allocator.device()),
      data_(config), order_("Mlp", static_cast<int>(layout_.size())) {
  set_current_device(device_);
  int64_t bytes = 0;
  carve(config_, layout_, device_, nullptr, &bytes);
  workspace_ = allocator.allocate(static_cast<size_t>(bytes), MemCategory::kActivations);
  b_ = std::make_unique<mlp::Buffers>(carve(config_, layout_, device_, static_cast<char*>(workspace_.data()), &bytes));
  samples_ = InputRing(device_, static_cast<size_t>(sample_bytes(config_)));
}

Mlp::~Mlp() {
  // Queued device work reads the workspace and the pinned slots: let it
  // finish (direct calls on the CPU have waited for theirs).
  wait_for_device_idle(device_);
}

nn::Dense Mlp::layer(int unit) const {
  const auto u = static_cast<size_t>(unit);
  return nn::Dense{config_.micro_batch_size, config_.dims[u], config_.dims[u + 1],
                   unit + 1 < static_cast<int>(layout_.size())};
}

const float* Mlp::unit_params(const OpContext& cx, int unit, const Tensor& params) {
  const UnitLayout& layout = layout_[static_cast<size_t>(unit)];
  check_params(params, layout);
  if (params.dtype() == DType::kF32) return params.data_as<float>();
  nn::widen(cx, params, {{0, layout.numel}}, b_->param_ws);
  return b_->param_ws;
}

// ---- the Model calls --------------------------------------------------------------

void Mlp::begin_micro_batch_on(int64_t global_index, Stream& s) {
  check_stream(s);
  auto* host = static_cast<float*>(samples_.next());
  data_.micro_batch(global_index, host,
                    reinterpret_cast<int32_t*>(host + config_.micro_batch_size * config_.dims.front()));
  samples_.send(b_->acts[0], s);
  order_.begin();
}

void Mlp::forward_on(int unit, const Tensor& params, Stream& s) {
  order_.check_forward(unit);
  const auto u = static_cast<size_t>(unit);
  const UnitLayout& l = layout_[u];
  unit_ops(s, l, config_.threads, nullptr, [&](const OpContext& cx) {
    const float* p = unit_params(cx, unit, params);
    nn::dense_forward(cx, layer(unit), b_->acts[u], p + l.params[0].offset, p + l.params[1].offset, b_->acts[u + 1]);
    if (unit + 1 == static_cast<int>(layout_.size())) {
      // d loss / d logits lands in grad_a, where the last unit's backward reads it.
      nn::dense_loss(cx, b_->acts.back(), b_->labels, config_.micro_batch_size, config_.dims.back(), b_->grad_a,
                     b_->row_loss, b_->mean_loss);
    }
  });
  order_.forwarded();
}

void Mlp::enqueue_loss(double* loss, Stream& s) const {
  order_.after_forward("loss");
  ops::copy_bytes(loss, Device::cpu(), b_->mean_loss, device_, sizeof(double), s);
}

void Mlp::backward_on(int unit, const Tensor& params, const Tensor& grads, Stream& s) {
  order_.check_backward(unit);
  const auto u = static_cast<size_t>(unit);
  const int layers = static_cast<int>(layout_.size());
  const UnitLayout& l = layout_[u];
  check_grads(grads, l);
  // The last unit reads grad_a (the loss wrote it); the buffers swap roles per unit.
  const bool dy_in_a = (layers - 1 - unit) % 2 == 0;
  float* dy = dy_in_a ? b_->grad_a : b_->grad_b;
  float* dx = unit > 0 ? (dy_in_a ? b_->grad_b : b_->grad_a) : nullptr;
  float* g = grads.data_as<float>();
  unit_ops(s, l, config_.threads, nullptr, [&](const OpContext& cx) {
    // Unit 0 needs no input gradient, so no weights either.
    const float* p = unit > 0 ? unit_params(cx, unit, params) : nullptr;
    nn::dense_backward(cx, layer(unit), b_->acts[u], p != nullptr ? p + l.params[0].offset : nullptr,
                       b_->acts[u + 1], dy, g + l.params[0].offset, g + l.params[1].offset, dx, b_->dense_ws);
  });
  order_.backwarded();
}

// ---- tests' views (CPU) ------------------------------------------------------------

const float* Mlp::inputs() const {
  MP_ENFORCE(device_.is_cpu() && order_.loaded(), "Mlp::inputs of a loaded micro-batch on the CPU");
  return b_->acts[0];
}
const int32_t* Mlp::labels() const {
  MP_ENFORCE(device_.is_cpu() && order_.loaded(), "Mlp::labels of a loaded micro-batch on the CPU");
  return b_->labels;
}

}  // namespace mp
