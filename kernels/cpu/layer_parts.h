// kernels/cpu/layer_parts.h: what the CPU bodies of the layer ops share
// (kernels/cpu/{embedding,layernorm,matmul,attention,loss,elementwise}.h;
// private to kernels/cpu): their contract, the parallel split, the loops of
// this CPU and the activations' widening and rounding.
//
// Note [Layer ops on the CPU]
// Each op's loops are written once as a template over the scalar T: float
// for the model, double for the float64 reference the tests compare against
// (the ops on plain T arrays the tests call are tests/gpt_test_ops.h). The float path's GEMMs (the matmul and tied-head
// ops) run on oneDNN through gemm_cpu (kernels/cpu/gemm.h), with fp32 or
// bf16 inputs; the double path keeps the plain loops.
//
// Note [GPT op math]
// Activations are row-major with one row per token position: rows = batch *
// seq, row n = b * seq + t. Weights follow the Hugging Face GPT-2 Conv1D
// layout [in, out] (y = x w + bias), except the tied head, which reads wte as
// [vocab rows, channels] (logits = x wte^T).
// Every output element is computed by exactly one thread, in an order that
// depends only on the shapes, never on how parallel_for splits the work; so
// results are bitwise identical for any thread count. Reductions use fixed
// per-lane partial sums (see `dot` in layer_loops_impl.h) so they vectorize without
// reassociation. The float GEMMs keep the promise by construction: gemm_cpu
// computes each tile of C in one single-threaded oneDNN call whose arguments
// do not depend on the thread count (Note [CPU GEMM threads] in
// kernels/cpu/gemm.h). Bits may differ between CPUs with different
// instruction sets (oneDNN's kernels, libm's vector exp).
// Gradients overwrite their outputs, except where a function says
// "accumulates": the residual-stream input gradient of layernorm_backward
// and the embedding tables of embedding_backward, which are sums of several
// contributions in the model (the residual branch; the tied head).
//
// The Act forms (LayerNorm, attention, the classifier, casts) take
// activations that may hold bf16 values (kernels/act.h). Each reads its bf16 inputs
// widened exactly, computes as the float ops do
// (the same loops, so the same bits for the same fp32 values), and rounds
// its outputs to bf16 (nearest even) where they hold bf16 values, in the
// same pass (kernels/cpu/layer_loops.h). So an Act of fp32 values gives the
// bits of the plain float op, and bf16 activations are rounded at the same
// points as on a GPU (Note [GPT activations] in models/gpt.h).
//
// `scratch` is fp32 the caller owns, at least the op's *_scratch_elements.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/act.h"
#include "kernels/cpu/layer_loops.h"

namespace mp::layer {

// Elements per part of a conversion.
inline constexpr int64_t kChunk = int64_t{1} << 14;
// Multiply-adds below which another thread's wake-up costs more than it saves.
inline constexpr int64_t kMinWorkPerPart = int64_t{1} << 14;

// parallel_for's `align` for items of `work` multiply-adds each: a multiple
// of `multiple` large enough that every part has kMinWorkPerPart of work.
// Only which thread computes an element depends on it, never the element's
// arithmetic (Note [GPT op math]).
inline int64_t part_align(int64_t work, int64_t multiple = 1) {
  const int64_t items = std::max<int64_t>(1, kMinWorkPerPart / std::max<int64_t>(work, 1));
  return (items + multiple - 1) / multiple * multiple;
}

inline void check_token(int32_t token, int64_t vocab, int64_t row, const char* what) {
  MP_ENFORCE(token >= 0 && token < vocab, what, " ", token, " at row ", row, " outside [0, ", vocab, ")");
}

// The double reference's loops: the same templates at baseline.
const LayerLoopsOf<double>& double_loops();

// The loops of T: float's picked for this CPU (kernels/cpu/layer_loops.h),
// double's the reference's.
template <class T>
const LayerLoopsOf<T>& loops() {
  if constexpr (std::is_same_v<T, float>) {
    return layer_loops();
  } else {
    return double_loops();
  }
}

// EnforceError unless `a` holds fp32 or bf16 values in fp32 or bf16 storage.
void check_act(const Act& a, const char* what);
// `a` as the loops' args take it (kernels/cpu/layer_loops.h): bf16 storage
// through the `*16` pointer, fp32 through the float one (the other null);
// for an output, `round` when its fp32 storage holds bf16 values.
template <class F, class H>
void bind_act(const Act& a, F*& f32, H*& f16, bool* round = nullptr) {
  const bool narrow = a.dtype == DType::kBF16;
  f32 = narrow ? nullptr : static_cast<F*>(a.data);
  f16 = narrow ? static_cast<H*>(a.data) : nullptr;
  if (round != nullptr) *round = !narrow && a.bf16;
}
// dst[i] := src's values widened exactly, i in [0, n).
void widen(const Act& src, float* dst, int64_t n, int threads);
// dst := src (fp32 values) as dst stores them.
void store(const float* src, const Act& dst, int64_t n, int threads);

}  // namespace mp::layer
