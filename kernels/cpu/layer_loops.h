// kernels/cpu/layer_loops.h (private to kernels/cpu): the element loops of the
// layer ops (Note [Layer ops on the CPU] in kernels/cpu/layer_parts.h), each over one part of its index
// space, so each op splits the work with parallel_for and calls a loop
// per part.
//
// The float loops are compiled once per instruction set (layer_loops_<isa>.cc:
// baseline SSE2, AVX2, AVX-512) and layer_loops() picks the widest the CPU
// runs, as the fused update does (kernels/cpu/cpu_isa.h). Every variant
// computes the same bits: -ffp-contract=off, the reductions keep their fixed
// lane order (reduce8 in loops.h), the exp's floor is exact in each form
// (math::floor_in_range). The double loops (the reference of the tests) are
// the same templates, instantiated once at baseline for the double ops.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/cpu_isa.h"

namespace mp {

// Activations that hold bf16 values (kernels/act.h; float loops only): an
// input in bf16 storage is read through its `*16` pointer, widened exactly;
// an output is written to its `*16` pointer rounded to bf16 (nearest even),
// or, with `round`, to the float pointer rounded through bf16. So the loops
// compute the bits of the plain float loop on the same values, rounding the
// outputs in the same pass.
template <class T>
struct LayerNormLoopArgs {
  const T* x;
  const T* w;
  const T* b;
  int64_t channels;
  T* out;
  T* mean;
  T* rstd;
  bf16* out16 = nullptr;
  bool round = false;
};

template <class T>
struct LayerNormGradLoopArgs {
  const T* dout;
  const T* x;
  const T* w;
  const T* mean;
  const T* rstd;
  int64_t rows;
  int64_t channels;
  T* dx;  // accumulates (dx := 0 + d loss / d x when not `accumulate`)
  T* dw;
  T* db;
  const bf16* dout16 = nullptr;
  bool accumulate = true;
  // The new dx, also as the next bf16 GEMM reads it: bf16, or fp32 rounded.
  bf16* dx_copy16 = nullptr;
  T* dx_copy = nullptr;
};

// One (batch, head) pair per index: p = b * heads + h.
template <class T>
struct AttentionLoopArgs {
  const T* qkv;
  const T* att;   // backward: the saved probabilities
  const T* dout;  // backward: d out
  int64_t seq;
  int64_t channels;
  int64_t heads;
  T* att_out;  // forward: the probabilities
  T* out;      // forward: att v
  T* scratch;  // backward: seq elements per pair
  T* dqkv;     // backward
  const bf16* qkv16 = nullptr;
  const bf16* dout16 = nullptr;
  bf16* out16 = nullptr;
  bf16* dqkv16 = nullptr;
  bool round = false;  // out or dqkv (float) hold bf16 values
};

// Targets are checked by the caller before the loop runs. With dlogits16
// (float only) the gradient is written only rounded to bf16, in `storage`
// (kBF16, or kF32 holding bf16 values), each part computing its rows in
// dlogits' row `row_begin` (a scratch row that stays in cache).
template <class T>
struct SoftmaxXentLoopArgs {
  const T* logits;
  const int32_t* targets;
  int64_t vocab;
  int64_t padded_vocab;
  T inv_rows;
  T* row_loss;
  T* dlogits;
  void* dlogits16 = nullptr;
  DType storage = DType::kBF16;
};

// The classifier in place (float only): logits stored as bf16 or as fp32
// (holding bf16 values when bf16); each row is computed in `row` (padded_vocab
// floats: the caller's, per part) when it holds bf16 values, else in place.
struct ClassifierLoopArgs {
  void* logits;
  DType dtype;
  bool bf16;
  const int32_t* targets;
  int64_t vocab;
  int64_t padded_vocab;
  float inv_rows;
  float* row_loss;
};

// Each loop runs indices [begin, end) of its op.
template <class T>
struct LayerLoopsOf {
  void (*gelu_forward)(const T* x, T* out, int64_t begin, int64_t end);
  void (*gelu_backward)(const T* x, const T* dout, T* dx, int64_t begin, int64_t end);  // dx may alias dout
  void (*add)(const T* a, const T* b, T* out, int64_t begin, int64_t end);             // out may alias a or b
  // Columns [begin, end) of db = column sums of dy [rows, out].
  void (*bias_grad)(const T* dy, int64_t rows, int64_t out, T* db, int64_t begin, int64_t end);
  void (*layernorm_forward)(const LayerNormLoopArgs<T>& a, int64_t row_begin, int64_t row_end);
  void (*layernorm_grad_input)(const LayerNormGradLoopArgs<T>& a, int64_t row_begin, int64_t row_end);
  void (*layernorm_grad_params)(const LayerNormGradLoopArgs<T>& a, int64_t col_begin, int64_t col_end);
  void (*attention_forward)(const AttentionLoopArgs<T>& a, int64_t pair_begin, int64_t pair_end);
  void (*attention_backward)(const AttentionLoopArgs<T>& a, int64_t pair_begin, int64_t pair_end);
  void (*softmax_xent)(const SoftmaxXentLoopArgs<T>& a, int64_t row_begin, int64_t row_end);
  // Rows [begin, end) of the classifier (null for double).
  void (*classifier)(const ClassifierLoopArgs& a, float* row, int64_t row_begin, int64_t row_end);
  // x rounded to bf16 (nearest even), stored as bf16 or as its exact fp32.
  void (*round_to_bf16)(const float* x, bf16* out, int64_t begin, int64_t end);
  void (*round_through_bf16)(const float* x, float* out, int64_t begin, int64_t end);
};

using LayerLoops = LayerLoopsOf<float>;

// The float loops of `isa` (kAuto: cpu_isa_best()); EnforceError when this
// CPU or build has no such variant.
const LayerLoops& layer_loops(CpuIsa isa = CpuIsa::kAuto);

// A thread's scratch of n floats, one for each use that may be live beside
// another's, grown as needed and kept (the pool's workers are persistent),
// so repeated calls neither allocate nor fault in pages. Defined once, at
// baseline (layer_loops.cc): the vector's out-of-line members must not be
// compiled with a per-ISA object's instructions.
enum class ThreadFloats {
  kLayerLoops,    // the loops' rows (kernels/cpu/layer_loops_impl.h, the classifier)
  kGemmStaging,   // gemm_cpu's staged inputs when the caller gives no scratch
  kGemmTile,      // gemm_cpu's fp32 tile of products for the epilogue
  kGemmAux,       // the DGELU epilogue's row of aux, widened
  kNewtonSchulz,  // newton_schulz_cpu's scratch when the caller gives none
  kCount
};
float* thread_floats(ThreadFloats use, int64_t n);

namespace detail {
const LayerLoops& select_layer_loops_baseline();
const LayerLoops& select_layer_loops_avx2();
const LayerLoops& select_layer_loops_avx512();
}  // namespace detail

}  // namespace mp
