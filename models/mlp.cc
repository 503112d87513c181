#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "kernels/convert.h"
#include "kernels/philox_math.h"
#include "models/model_util.h"
#include "core/error.h"
#include "models/flat_layout.h"
#include "core/parallel.h"

namespace mp {
namespace {

// Columns of dx one tile of the input-gradient loop keeps in cache.
constexpr int64_t kDxTile = 256;

// Uniform in [-1, 1) with 24 random bits: exact in fp32.
float uniform_pm1(uint32_t word) { return static_cast<float>(word >> 8) * 0x1p-23f - 1.0f; }

int64_t num_layers(const MlpConfig& config) { return static_cast<int64_t>(config.dims.size()) - 1; }

struct LayerParams {
  int64_t weight_offset = 0;
  int64_t bias_offset = 0;
};

LayerParams layer_params(const UnitLayout& unit) {
  return LayerParams{unit.params.at(0).offset, unit.params.at(1).offset};
}

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

// ---- layer math -------------------------------------------------------------

template <class T>
void mlp_layer_forward(const T* x, const T* w, const T* b, int64_t batch, int64_t in, int64_t out,
                       bool hidden, T* y, int threads) {
  parallel_for(out, threads, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const T* wo = w + o * in;
      for (int64_t r = 0; r < batch; ++r) {
        const T z = b[o] + dot(x + r * in, wo, in);
        y[r * out + o] = hidden ? std::tanh(z) : z;
      }
    }
  });
}

template <class T>
double mlp_softmax_xent(const T* logits, const int32_t* labels, int64_t batch, int64_t classes,
                        T* dlogits) {
  const T inv_batch = T(1) / static_cast<T>(batch);
  double total = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const T* z = logits + r * classes;
    T* dz = dlogits + r * classes;
    const int32_t label = labels[r];
    MP_ENFORCE(label >= 0 && label < classes, "label ", label, " of row ", r, " with ", classes, " classes");
    total += static_cast<double>(softmax_xent_row(z, classes, label, inv_batch, dz));
  }
  return total / static_cast<double>(batch);
}

template <class T>
void mlp_layer_backward(const T* x, const T* w, const T* y, T* dy, int64_t batch, int64_t in,
                        int64_t out, bool hidden, T* dw, T* db, T* dx, int threads) {
  // dz := dy * tanh'(z), then dw, db: the thread owning output o owns column o of dz.
  parallel_for(out, threads, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      T* dwo = dw + o * in;
      std::fill(dwo, dwo + in, T(0));
      T bias_grad = 0;
      for (int64_t r = 0; r < batch; ++r) {
        T& dz = dy[r * out + o];
        if (hidden) {
          const T yo = y[r * out + o];
          dz = dz * (T(1) - yo * yo);
        }
        bias_grad += dz;
        axpy(dz, x + r * in, dwo, in);
      }
      db[o] = bias_grad;
    }
  });
  if (dx == nullptr) return;
  // dx = dz w: the thread owning columns [j0, j1) of dx sums over o in order.
  parallel_for(in, threads, 16, [&](int64_t j0, int64_t j1) {
    for (int64_t t0 = j0; t0 < j1; t0 += kDxTile) {
      const int64_t t1 = std::min(j1, t0 + kDxTile);
      for (int64_t r = 0; r < batch; ++r) std::fill(dx + r * in + t0, dx + r * in + t1, T(0));
      for (int64_t o = 0; o < out; ++o) {
        const T* wo = w + o * in;
        for (int64_t r = 0; r < batch; ++r) axpy(dy[r * out + o], wo + t0, dx + r * in + t0, t1 - t0);
      }
    }
  });
}

template <class T>
double mlp_loss_and_grads(const MlpConfig& config, const float* inputs, const int32_t* labels,
                          const std::vector<std::vector<T>>& unit_params,
                          std::vector<std::vector<T>>& unit_grads) {
  const FlatLayout layout(Mlp::spec_for(config), 1);
  const int64_t layers = num_layers(config);
  const int64_t batch = config.micro_batch_size;
  const std::vector<int64_t>& dims = config.dims;
  MP_ENFORCE_EQ(static_cast<int64_t>(unit_params.size()), layers, "parameter buffers, one per unit");
  unit_grads.resize(unit_params.size());
  std::vector<std::vector<T>> acts(static_cast<size_t>(layers + 1));
  acts[0].assign(inputs, inputs + batch * dims[0]);
  for (int64_t l = 0; l < layers; ++l) {
    const auto u = static_cast<size_t>(l);
    const UnitLayout& unit = layout.unit(static_cast<int>(l));
    MP_ENFORCE_GE(static_cast<int64_t>(unit_params[u].size()), unit.numel, "unit ", unit.name);
    if (static_cast<int64_t>(unit_grads[u].size()) < unit.numel) {
      unit_grads[u].resize(static_cast<size_t>(unit.numel));
    }
    const LayerParams p = layer_params(unit);
    const T* params = unit_params[u].data();
    acts[u + 1].resize(static_cast<size_t>(batch * dims[u + 1]));
    mlp_layer_forward(acts[u].data(), params + p.weight_offset, params + p.bias_offset, batch, dims[u],
                      dims[u + 1], l + 1 < layers, acts[u + 1].data(), config.threads);
  }
  const int64_t max_dim = *std::max_element(dims.begin(), dims.end());
  std::vector<T> dy(static_cast<size_t>(batch * max_dim)), dx(dy.size());
  const double loss = mlp_softmax_xent(acts.back().data(), labels, batch, dims.back(), dy.data());
  for (int64_t l = layers - 1; l >= 0; --l) {
    const auto u = static_cast<size_t>(l);
    const LayerParams p = layer_params(layout.unit(static_cast<int>(l)));
    T* g = unit_grads[u].data();
    mlp_layer_backward(acts[u].data(), unit_params[u].data() + p.weight_offset, acts[u + 1].data(), dy.data(),
                       batch, dims[u], dims[u + 1], l + 1 < layers, g + p.weight_offset, g + p.bias_offset,
                       l > 0 ? dx.data() : nullptr, config.threads);
    std::swap(dy, dx);
  }
  return loss;
}

#define MP_MLP_INSTANTIATE(T)                                                                      \
  template void mlp_layer_forward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, \
                                     T*, int);                                                     \
  template double mlp_softmax_xent<T>(const T*, const int32_t*, int64_t, int64_t, T*);              \
  template void mlp_layer_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t,  \
                                      bool, T*, T*, T*, int);                                      \
  template double mlp_loss_and_grads<T>(const MlpConfig&, const float*, const int32_t*,             \
                                        const std::vector<std::vector<T>>&,                        \
                                        std::vector<std::vector<T>>&);
MP_MLP_INSTANTIATE(float)
MP_MLP_INSTANTIATE(double)
#undef MP_MLP_INSTANTIATE

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

int64_t Mlp::activation_bytes(const MlpConfig& config) {
  const ModelSpec spec = spec_for(config);
  const int64_t batch = config.micro_batch_size;
  int64_t max_numel = 0;
  const FlatLayout layout(spec, 1);
  for (const UnitLayout& unit : layout.units()) max_numel = std::max(max_numel, unit.numel);
  int64_t acts = 0;
  for (int64_t d : config.dims) acts += batch * d;
  const int64_t max_dim = *std::max_element(config.dims.begin(), config.dims.end());
  return static_cast<int64_t>(sizeof(float)) * (max_numel + acts + 2 * batch * max_dim) +
         static_cast<int64_t>(sizeof(int32_t)) * batch;
}

Mlp::Mlp(const MlpConfig& config, Allocator allocator)
    : config_(config), spec_(spec_for(config)), layout_(FlatLayout(spec_, 1).units()), data_(config) {
  const int64_t batch = config_.micro_batch_size;
  int64_t max_numel = 0;
  for (const UnitLayout& unit : layout_) max_numel = std::max(max_numel, unit.numel);
  param_ws_ = Tensor::empty(allocator, DType::kF32, {max_numel}, MemCategory::kActivations);
  for (int64_t d : config_.dims) {
    acts_.push_back(Tensor::empty(allocator, DType::kF32, {batch * d}, MemCategory::kActivations));
  }
  const int64_t max_dim = *std::max_element(config_.dims.begin(), config_.dims.end());
  grad_a_ = Tensor::empty(allocator, DType::kF32, {batch * max_dim}, MemCategory::kActivations);
  grad_b_ = Tensor::empty(allocator, DType::kF32, {batch * max_dim}, MemCategory::kActivations);
  labels_ = allocator.allocate(static_cast<size_t>(batch) * sizeof(int32_t), MemCategory::kActivations);
}

const float* Mlp::inputs() const { return acts_[0].data_as<float>(); }
const int32_t* Mlp::labels() const { return static_cast<const int32_t*>(labels_.data()); }

void Mlp::begin_micro_batch(int64_t global_index) {
  data_.micro_batch(global_index, acts_[0].data_as<float>(), static_cast<int32_t*>(labels_.data()));
  micro_batch_ = global_index;
  forwarded_ = 0;
  next_backward_ = -1;
}

void Mlp::check_unit(int unit, const char* what) const {
  MP_ENFORCE(micro_batch_ >= 0, "Mlp::", what, " before begin_micro_batch");
  MP_ENFORCE(unit >= 0 && unit < static_cast<int>(layout_.size()), "Mlp::", what, " of unit ", unit, " of ",
             layout_.size());
}

const float* Mlp::unit_params(int unit, const Tensor& params) {
  return unit_params_fp32(layout_[static_cast<size_t>(unit)], params, param_ws_);
}

void Mlp::forward(int unit, const Tensor& params) {
  check_unit(unit, "forward");
  MP_ENFORCE_EQ(unit, forwarded_, "Mlp::forward runs units in order");
  const auto u = static_cast<size_t>(unit);
  const int layers = static_cast<int>(layout_.size());
  const float* p = unit_params(unit, params);
  const LayerParams lp = layer_params(layout_[u]);
  mlp_layer_forward(acts_[u].data_as<float>(), p + lp.weight_offset, p + lp.bias_offset, config_.micro_batch_size,
                    config_.dims[u], config_.dims[u + 1], unit + 1 < layers, acts_[u + 1].data_as<float>(),
                    config_.threads);
  ++forwarded_;
  if (forwarded_ == layers) {
    // d loss / d logits lands in grad_a_, where backward of the last unit reads it.
    loss_ = mlp_softmax_xent(acts_.back().data_as<float>(), labels(), config_.micro_batch_size,
                             config_.dims.back(), grad_a_.data_as<float>());
    next_backward_ = layers - 1;
  }
}

double Mlp::loss() const {
  MP_ENFORCE(micro_batch_ >= 0 && forwarded_ == static_cast<int>(layout_.size()),
             "Mlp::loss before the forward of every unit");
  return loss_;
}

void Mlp::backward(int unit, const Tensor& params, const Tensor& grads) {
  check_unit(unit, "backward");
  MP_ENFORCE(next_backward_ >= 0, "Mlp::backward before the forward of every unit (or after unit 0)");
  MP_ENFORCE_EQ(unit, next_backward_, "Mlp::backward runs units in reverse order, once each");
  const auto u = static_cast<size_t>(unit);
  const int layers = static_cast<int>(layout_.size());
  const UnitLayout& layout = layout_[u];
  MP_ENFORCE(grads.device().is_cpu() && grads.dtype() == DType::kF32 && grads.shape().size() == 1 &&
                 grads.numel() >= layout.numel,
             "gradients of unit ", layout.name, " (fp32, ", layout.numel, " elements): got ", grads.describe());
  // Unit 0 needs no input gradient, so no weights either.
  const float* p = unit > 0 ? unit_params(unit, params) : nullptr;
  const LayerParams lp = layer_params(layout);
  // The last unit reads grad_a_ (Mlp::forward); the buffers swap roles per unit.
  const bool dy_in_a = (layers - 1 - unit) % 2 == 0;
  float* dy = (dy_in_a ? grad_a_ : grad_b_).data_as<float>();
  float* dx = unit > 0 ? (dy_in_a ? grad_b_ : grad_a_).data_as<float>() : nullptr;
  float* g = grads.data_as<float>();
  const float* w = p != nullptr ? p + lp.weight_offset : nullptr;
  mlp_layer_backward(acts_[u].data_as<float>(), w, acts_[u + 1].data_as<float>(), dy, config_.micro_batch_size,
                     config_.dims[u], config_.dims[u + 1], unit + 1 < layers, g + lp.weight_offset,
                     g + lp.bias_offset, dx, config_.threads);
  --next_backward_;
}

}  // namespace mp
