// tests/model_reference.h: the built-in models on one micro-batch over flat
// std::vector buffers, the references the model tests compare against.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt.h"
#include "models/mlp.h"

namespace mp {

// The whole model on one micro-batch (inputs and targets: micro_batch_size *
// context tokens). T = float runs Gpt itself on the CPU (the same bits as
// the engine's model); T = double is the reference the tests compare
// against: the same math written plainly over the double loops of
// the CPU layer ops, exact (no bf16 rounding: it ignores matmul_dtype
// and fp32_ops). Unit u's parameters and gradients are flat buffers in the
// layout of FlatLayout(Gpt::spec_for(config), 1) (or any group size);
// gradients are resized to at least the unit's numel and overwritten on the
// parameters' ranges only. Returns the mean loss.
template <class T>
double gpt_loss_and_grads(const GptConfig& config, const int32_t* inputs, const int32_t* targets,
                          const std::vector<std::vector<T>>& unit_params, std::vector<std::vector<T>>& unit_grads);

// The whole model on one micro-batch through the layer math
// (kernels/cpu/mlp_ops.h). Unit u's
// parameters and gradients are flat buffers in the layout of
// FlatLayout(Mlp::spec_for(config), 1); gradients are overwritten on the
// parameters' ranges only. Returns the mean loss.
template <class T>
double mlp_loss_and_grads(const MlpConfig& config, const float* inputs, const int32_t* labels,
                          const std::vector<std::vector<T>>& unit_params,
                          std::vector<std::vector<T>>& unit_grads);

}  // namespace mp
