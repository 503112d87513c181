// kernels/cpu/attention.h: causal self-attention on the CPU (Note [Layer ops on the CPU] in
// kernels/cpu/layer_parts.h) on activations that may hold bf16 (kernels/act.h); the template over T the tests
// call is in tests/gpt_test_ops.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- causal self-attention ----------------------------------------------------------
// The layouts of gpt_attention_forward above: qkv [rows,
// 3 C], out [rows, C], att [batch, heads, seq, seq] (fp32, the saved
// probabilities). The backward's scratch: batch * heads * seq.
int64_t gpt_attention_act_scratch_elements(int64_t batch, int64_t seq, int64_t channels, int64_t heads);

void gpt_attention_forward(Act qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* att, Act out,
                           float* scratch, int threads);

// Overwrites dqkv [rows, 3 C].
void gpt_attention_backward(Act qkv, const float* att, Act dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, Act dqkv, float* scratch, int threads);

}  // namespace mp
