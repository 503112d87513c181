// kernels/sdpa_layout.h: the tensors of cuDNN's fused attention graphs
// (kernels/cuda/attention_cudnn.h) laid over the GPT's buffers, described on
// the host: for one shape, the dims, strides and base offset, in elements, of
// Q, K, V, O, dO, dQ, dK, dV and Stats exactly as the graphs are given them.
// Plain C++, in every build; the graph-building code takes its tensors from
// sdpa_layout(), so tests/test_sdpa_layout.cc checks what the GPU runs.
//
// Note [cuDNN attention layout]
// - The GPT's layout (kernels/cpu/attention.h, gpt_attention_forward): qkv
//   [B * T, 3 C] holds q | k | v per row, row n = b * T + t, head h at
//   columns h * hs of each third (C = H * hs); out [B * T, C] the heads side
//   by side. dqkv and dout are laid out as qkv and out.
// - cuDNN's tensors are logically [B, H, T, hs], each dim with a stride, so
//   the heads are read and written in place, never permuted: Q, K and V are
//   views of qkv (base offset 0, C and 2 C elements; strides [T 3C, hs, 3C,
//   1]), dQ, dK and dV the same views of dqkv, O and dO views of out and
//   dout (strides [T C, hs, C, 1]).
// - Stats [B, H, T, 1] fp32, dense: the log-sum-exp of each query row's
//   scaled, masked scores (natural log), written by the forward and read by
//   the backward; the same layout as the flash kernels' lse
//   (kernels/cuda/flash_attention_cuda.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace mp {

// One attention problem: batch B, heads H, sequence T, head size hs (C = H hs).
struct SdpaShape {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  int64_t channels() const { return heads * head_dim; }
  friend bool operator==(const SdpaShape&, const SdpaShape&) = default;
};

// "(B=4, H=12, T=1024, hs=64)": for messages.
std::string sdpa_shape_name(const SdpaShape& s);

// One tensor of the graph: logical dims [B, H, T, D] (D = hs, or 1 for
// Stats) with a stride per dim, and the offset of element [0, 0, 0, 0] from
// the start of the buffer it views; all in elements.
struct SdpaTensorLayout {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  int64_t base = 0;
  // base + sum of index * stride: the element [b, h, t, d] in its buffer.
  int64_t offset(int64_t b, int64_t h, int64_t t, int64_t d) const {
    return base + b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3];
  }
};

struct SdpaLayout {
  SdpaTensorLayout q, k, v;     // views of qkv [B T, 3 C] (bf16)
  SdpaTensorLayout o, d_o;      // views of out and dout [B T, C] (bf16)
  SdpaTensorLayout dq, dk, dv;  // views of dqkv [B T, 3 C] (bf16)
  SdpaTensorLayout stats;       // [B, H, T, 1] (fp32)
};

// The layout for `s` (Note [cuDNN attention layout]); EnforceError unless
// every size is positive.
SdpaLayout sdpa_layout(const SdpaShape& s);

}  // namespace mp
