// mlp_loss_and_grads (tests/model_reference.h): the MLP through the layer
// math of kernels/cpu/mlp_ops.h.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/mlp_ops.h"
#include "models/flat_layout.h"
#include "tests/model_reference.h"

namespace mp {
namespace {

int64_t num_layers(const MlpConfig& config) { return static_cast<int64_t>(config.dims.size()) - 1; }

struct LayerParams {
  int64_t weight_offset = 0;
  int64_t bias_offset = 0;
};

LayerParams layer_params(const UnitLayout& unit) {
  return LayerParams{unit.params.at(0).offset, unit.params.at(1).offset};
}

}  // namespace

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
  template double mlp_loss_and_grads<T>(const MlpConfig&, const float*, const int32_t*,             \
                                        const std::vector<std::vector<T>>&,                        \
                                        std::vector<std::vector<T>>&);
MP_MLP_INSTANTIATE(float)
MP_MLP_INSTANTIATE(double)
#undef MP_MLP_INSTANTIATE

}  // namespace mp
