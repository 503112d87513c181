#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_isa.h"

namespace mp {
namespace {

// The generic loop: any op, any input and output dtypes.
template <class In, class Out>
void accumulate_generic(const void* const* pieces, int n, int64_t count, void* out, math::ElementOp op,
                        double divisor) {
  Out* o = static_cast<Out*>(out);
  for (int64_t i = 0; i < count; ++i) {
    double acc = math::to_f64(static_cast<const In*>(pieces[0])[i]);
    for (int k = 1; k < n; ++k) acc = math::apply_op(acc, math::to_f64(static_cast<const In*>(pieces[k])[i]), op);
    o[i] = math::round_from_f64<Out>(acc / divisor);
  }
}

// The hot case, a sum into fp32 (every reduce-scatter and all-reduce of
// gradients): kBlock fp64 sums at a time, piece by piece, so each pass is a
// plain vector loop. The adds are accumulate_element's, in the same order,
// and x / 1 is x: the same bits. Compiled also for AVX2 and AVX-512 (target
// attributes, picked by cpu_isa_best()); -ffp-contract=off
// (kernels/CMakeLists.txt) keeps every variant's bits the same.
constexpr int64_t kBlock = 512;

template <class In>
inline void sum_blocks(const In* const* p, int n, int64_t count, float* out, double divisor) {
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t len = std::min(kBlock, count - b);
    double acc[kBlock];
    const In* p0 = p[0] + b;
    for (int64_t j = 0; j < len; ++j) acc[j] = math::to_f64(p0[j]);
    for (int k = 1; k < n; ++k) {
      const In* pk = p[k] + b;
      for (int64_t j = 0; j < len; ++j) acc[j] += math::to_f64(pk[j]);
    }
    float* o = out + b;  // may be one of the pieces: block b is read in full above
    if (divisor == 1.0) {
      for (int64_t j = 0; j < len; ++j) o[j] = static_cast<float>(acc[j]);
    } else {
      for (int64_t j = 0; j < len; ++j) o[j] = static_cast<float>(acc[j] / divisor);
    }
  }
}

// The wire accumulation: reduce_pair_element (MPI's user op: in (op) inout,
// in fp32, rounded to T) folded over the pieces in rank order, a block at a
// time (the block is read in full before it is written).
template <class T, math::ElementOp kOp>
inline void wire_blocks(const T* const* p, int n, int64_t count, T* out) {
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t len = std::min(kBlock, count - b);
    T acc[kBlock];
    const T* p0 = p[0] + b;
    for (int64_t j = 0; j < len; ++j) acc[j] = p0[j];
    for (int k = 1; k < n; ++k) {
      const T* pk = p[k] + b;
      for (int64_t j = 0; j < len; ++j) math::reduce_pair_element(pk, acc, j, kOp);
    }
    std::copy(acc, acc + len, out + b);
  }
}

struct SumLoops {
  void (*f32)(const float* const* p, int n, int64_t count, float* out, double divisor);
  void (*bf16_in)(const bf16* const* p, int n, int64_t count, float* out, double divisor);
  void (*wire_f32)(const float* const* p, int n, int64_t count, float* out);
  void (*wire_bf16)(const bf16* const* p, int n, int64_t count, bf16* out);
};

#define MP_SUM_LOOPS(isa, attributes)                                                                   \
  attributes void sum_f32_##isa(const float* const* p, int n, int64_t count, float* out, double d) {   \
    sum_blocks(p, n, count, out, d);                                                                    \
  }                                                                                                     \
  attributes void sum_bf16_##isa(const bf16* const* p, int n, int64_t count, float* out, double d) {   \
    sum_blocks(p, n, count, out, d);                                                                    \
  }                                                                                                     \
  attributes void wire_f32_##isa(const float* const* p, int n, int64_t count, float* out) {            \
    wire_blocks<float, math::ElementOp::kSum>(p, n, count, out);                                        \
  }                                                                                                     \
  attributes void wire_bf16_##isa(const bf16* const* p, int n, int64_t count, bf16* out) {             \
    wire_blocks<bf16, math::ElementOp::kSum>(p, n, count, out);                                         \
  }                                                                                                     \
  constexpr SumLoops kSumLoops_##isa{&sum_f32_##isa, &sum_bf16_##isa, &wire_f32_##isa, &wire_bf16_##isa};

MP_ISA_VARIANTS(MP_SUM_LOOPS)
#undef MP_SUM_LOOPS

const SumLoops& sum_loops() { return MP_ISA_TABLE(kSumLoops); }

}  // namespace

void accumulate_rank_pieces_cpu(const void* const* pieces, DType in, int n, int64_t count, void* out,
                                DType out_dtype, math::ElementOp op, double divisor) {
  MP_ENFORCE(!is_fp8(in) && !is_fp8(out_dtype), "accumulation of ", dtype_name(in), " into ",
             dtype_name(out_dtype), " is not supported");
  MP_ENFORCE(n >= 1, "accumulation of ", n, " pieces");
  if (op == math::ElementOp::kSum && out_dtype == DType::kF32) {
    float* o = static_cast<float*>(out);
    if (in == DType::kF32) return sum_loops().f32(reinterpret_cast<const float* const*>(pieces), n, count, o, divisor);
    if (in == DType::kBF16) {
      return sum_loops().bf16_in(reinterpret_cast<const bf16* const*>(pieces), n, count, o, divisor);
    }
  }
  dispatch_dtype(in, [&](auto in_tag) {
    dispatch_dtype(out_dtype, [&](auto out_tag) {
      accumulate_generic<decltype(in_tag), decltype(out_tag)>(pieces, n, count, out, op, divisor);
    });
  });
}

void accumulate_rank_pieces_wire_cpu(const void* const* pieces, DType t, int n, int64_t count, void* out,
                                     math::ElementOp op) {
  MP_ENFORCE(!is_fp8(t), "reductions on ", dtype_name(t), " are not supported");
  MP_ENFORCE(n >= 1, "accumulation of ", n, " pieces");
  if (op == math::ElementOp::kSum && t == DType::kF32) {
    return sum_loops().wire_f32(reinterpret_cast<const float* const*>(pieces), n, count, static_cast<float*>(out));
  }
  if (op == math::ElementOp::kSum && t == DType::kBF16) {
    return sum_loops().wire_bf16(reinterpret_cast<const bf16* const*>(pieces), n, count, static_cast<bf16*>(out));
  }
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T* const* p = reinterpret_cast<const T* const*>(pieces);
    T* o = static_cast<T*>(out);
    switch (op) {
      case math::ElementOp::kSum: return wire_blocks<T, math::ElementOp::kSum>(p, n, count, o);
      case math::ElementOp::kMax: return wire_blocks<T, math::ElementOp::kMax>(p, n, count, o);
      case math::ElementOp::kMin: return wire_blocks<T, math::ElementOp::kMin>(p, n, count, o);
    }
  });
}

void accumulate_rank_chunks_cpu(const void* chunks, DType in, int n, int64_t stride, int64_t count,
                                void* out, DType out_dtype, math::ElementOp op, double divisor) {
  std::vector<const void*> pieces(static_cast<size_t>(std::max(n, 0)));
  const size_t elem = dtype_size(in);
  for (int k = 0; k < n; ++k) {
    pieces[static_cast<size_t>(k)] = static_cast<const char*>(chunks) + static_cast<size_t>(k * stride) * elem;
  }
  accumulate_rank_pieces_cpu(pieces.data(), in, n, count, out, out_dtype, op, divisor);
}

}  // namespace mp
