// kernels/cpu/attention.h: causal self-attention on the CPU (Note [Layer ops on the CPU] in
// kernels/cpu/layer_parts.h): the template over T, and the form on activations that may hold bf16 (kernels/act.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/act.h"

namespace mp {

// ---- causal self-attention ------------------------------------------------------
// qkv [rows, 3 channels]: row n holds q | k | v, head h at columns
// h * head_dim .. of each third (head_dim = channels / heads). att [batch,
// heads, seq, seq] := the softmax probabilities, softmax(q k^T / sqrt(head_dim))
// over keys t2 <= t (zero above the diagonal); out [rows, channels] :=
// att v, heads side by side.
template <class T>
void gpt_attention_forward(const T* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, T* att, T* out,
                           int threads);

// Overwrites dqkv [rows, 3 channels]. scratch: batch * heads * seq elements.
template <class T>
void gpt_attention_backward(const T* qkv, const T* att, const T* dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, T* scratch, T* dqkv, int threads);

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
