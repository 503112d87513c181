#include "kernels/cpu/gemm_epilogue.h"

#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/convert_loop.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/layer_loops.h"

namespace mp {
namespace {

// A row of fp32 values as C stores it: bf16 bits, the fp32 of its bf16
// rounding, or itself; through the GPT's rounding loops for this CPU.
template <class Out>
void store_row(const LayerLoops& loops, const float* v, Out* out, bool bf16_values, int64_t n) {
  if constexpr (std::is_same_v<Out, bf16>) {
    loops.round_to_bf16(v, out, 0, n);
  } else if (bf16_values) {
    loops.round_through_bf16(v, out, 0, n);
  } else {
    std::memcpy(out, v, static_cast<size_t>(n) * sizeof(float));
  }
}

// One instantiation per epilogue shape, so that each inner loop is
// branch-free and vectorizes; the GELU and its gradient run as the GPT's
// loops for this CPU (kernels/cpu/layer_loops.h) over a row of the tile,
// which is the caller's scratch.
template <class Out, GemmEpilogue kEpilogue, bool kAddend>
void epilogue_tile(const GemmProblem& p, float* product, int64_t product_ld, int64_t i0, int64_t rows, int64_t j0,
                   int64_t cols) {
  const bool round = p.bf16_output();
  const LayerLoops& loops = layer_loops();
  float* aux_row = kEpilogue == GemmEpilogue::kDGelu ? thread_floats(ThreadFloats::kGemmAux, cols) : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* v = product + r * product_ld;
    Out* c = static_cast<Out*>(p.c) + i * p.ldc + j0;
    if constexpr (kAddend) {
      const float* add = p.addend + i * p.ldc + j0;
      for (int64_t j = 0; j < cols; ++j) v[j] += add[j];
    }
    if constexpr (kEpilogue == GemmEpilogue::kGelu) {
      Out* aux = static_cast<Out*>(p.aux) + i * p.aux_ld + j0;
      store_row(loops, v, aux, round, cols);
      loops.gelu_forward(v, v, 0, cols);
    } else if constexpr (kEpilogue == GemmEpilogue::kDGelu) {
      const Out* aux = static_cast<const Out*>(p.aux) + i * p.aux_ld + j0;
      for (int64_t j = 0; j < cols; ++j) aux_row[j] = math::to_f32(aux[j]);
      loops.gelu_backward(aux_row, v, v, 0, cols);
    }
    store_row(loops, v, c, round, cols);
  }
}

template <class Out, GemmEpilogue kEpilogue>
void epilogue_tile(const GemmProblem& p, float* product, int64_t product_ld, int64_t i0, int64_t rows, int64_t j0,
                   int64_t cols) {
  if (p.addend != nullptr) {
    epilogue_tile<Out, kEpilogue, true>(p, product, product_ld, i0, rows, j0, cols);
  } else {
    epilogue_tile<Out, kEpilogue, false>(p, product, product_ld, i0, rows, j0, cols);
  }
}

template <class Out>
void epilogue_tile(const GemmProblem& p, float* product, int64_t product_ld, int64_t i0, int64_t rows, int64_t j0,
                   int64_t cols) {
  switch (p.epilogue) {
    case GemmEpilogue::kNone:
      return epilogue_tile<Out, GemmEpilogue::kNone>(p, product, product_ld, i0, rows, j0, cols);
    case GemmEpilogue::kGelu:
      return epilogue_tile<Out, GemmEpilogue::kGelu>(p, product, product_ld, i0, rows, j0, cols);
    case GemmEpilogue::kDGelu:
      return epilogue_tile<Out, GemmEpilogue::kDGelu>(p, product, product_ld, i0, rows, j0, cols);
  }
}

}  // namespace

bool gemm_needs_epilogue(const GemmProblem& p) { return p.bf16_output() || p.epilogue != GemmEpilogue::kNone; }

void gemm_epilogue_tile(const GemmProblem& p, float* product, int64_t product_ld, int64_t i0, int64_t rows,
                        int64_t j0, int64_t cols) {
  if (p.c_dtype == DType::kBF16) {
    epilogue_tile<bf16>(p, product, product_ld, i0, rows, j0, cols);
  } else {
    epilogue_tile<float>(p, product, product_ld, i0, rows, j0, cols);
  }
}

void gemm_bias_grad_of_b(const GemmProblem& p, int64_t j0, int64_t j1) {
  float* out = p.bias_grad;
  if (!p.b.transposed && p.b.dtype == DType::kF32 && p.b.ld == p.n) {
    // A dense dy [k, n]: the GPT's bias-gradient loop for this CPU, rows in order.
    layer_loops().bias_grad(static_cast<const float*>(p.b.data), p.k, p.n, out, j0, j1);
    return;
  }
  for (int64_t j = j0; j < j1; ++j) out[j] = 0.0f;
  if (!p.b.transposed) {  // rows of op(B) contiguous: a loop that vectorizes
    for (int64_t k = 0; k < p.k; ++k) {
      if (p.b.dtype == DType::kBF16) {
        const bf16* row = static_cast<const bf16*>(p.b.data) + k * p.b.ld;
        for (int64_t j = j0; j < j1; ++j) out[j] += math::to_f32(row[j]);
      } else {
        const float* row = static_cast<const float*>(p.b.data) + k * p.b.ld;
        for (int64_t j = j0; j < j1; ++j) out[j] += row[j];
      }
    }
    return;
  }
  // op(B)[k, j] = B[j, k].
  for (int64_t k = 0; k < p.k; ++k) {
    for (int64_t j = j0; j < j1; ++j) {
      out[j] += p.b.dtype == DType::kBF16 ? math::to_f32(static_cast<const bf16*>(p.b.data)[j * p.b.ld + k])
                                          : static_cast<const float*>(p.b.data)[j * p.b.ld + k];
    }
  }
}

}  // namespace mp
