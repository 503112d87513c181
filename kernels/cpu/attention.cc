// kernels/cpu/attention.cc: kernels/cpu/attention.h.
#include "kernels/cpu/attention.h"

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/layer_loops.h"
#include "kernels/cpu/layer_parts.h"
#include "kernels/op_profile.h"

namespace mp {

using layer::bind_act;
using layer::check_act;
using layer::part_align;

// ---- causal self-attention ----------------------------------------------------------

int64_t gpt_attention_act_scratch_elements(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  (void)channels;
  return batch * heads * seq;  // the backward's; bf16 values are read and written in place
}

namespace {

void check_heads(int64_t channels, int64_t heads) {
  MP_ENFORCE(heads > 0 && channels % heads == 0, heads, " heads do not divide ", channels, " channels");
}

}  // namespace

void gpt_attention_forward(Act qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads, float* att, Act out,
                           float* scratch, int threads) {
  ScopedOp op(OpFamily::kAttention);
  (void)scratch;
  check_act(qkv, "attention input");
  check_act(out, "attention output");
  check_heads(channels, heads);
  AttentionLoopArgs<float> a{nullptr, nullptr, nullptr, seq, channels, heads, att, nullptr, nullptr, nullptr};
  bind_act(qkv, a.qkv, a.qkv16);
  bind_act(out, a.out, a.out16, &a.round);
  parallel_for(batch * heads, threads, part_align(seq * seq * channels / heads),
               [&](int64_t p0, int64_t p1) { layer_loops().attention_forward(a, p0, p1); });
}

void gpt_attention_backward(Act qkv, const float* att, Act dout, int64_t batch, int64_t seq, int64_t channels,
                            int64_t heads, Act dqkv, float* scratch, int threads) {
  ScopedOp op(OpFamily::kAttention);
  check_act(qkv, "attention input");
  check_act(dout, "attention output gradient");
  check_act(dqkv, "attention input gradient");
  check_heads(channels, heads);
  AttentionLoopArgs<float> a{nullptr, att, nullptr, seq, channels, heads, nullptr, nullptr, scratch, nullptr};
  bind_act(qkv, a.qkv, a.qkv16);
  bind_act(dout, a.dout, a.dout16);
  bind_act(dqkv, a.dqkv, a.dqkv16, &a.round);
  parallel_for(batch * heads, threads, part_align(2 * seq * seq * channels / heads),
               [&](int64_t p0, int64_t p1) { layer_loops().attention_backward(a, p0, p1); });
}

}  // namespace mp
