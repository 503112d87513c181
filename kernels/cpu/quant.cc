#include "kernels/cpu/quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/cpu_isa.h"

namespace mp {
namespace {

constexpr int64_t B = math::kQuantBlock;
constexpr int kLanes = 16;  // independent accumulators: the block's max and NaN check vectorize
static_assert(B % kLanes == 0);

// One block, Note [Int8 blocks]: its scale, then its codes (and residuals),
// the same values as math::int8_scale / int8_code / int8_value element by
// element. The max is exact in any order; the NaN/Inf check sums x - x
// (0, or NaN once a NaN or Inf is seen) in lanes; the codes' loop has no
// branch, so each ISA variant runs it in vectors.
// kLanes floats as one vector (GCC/clang vector extensions): the lanes are
// independent, so each ISA variant keeps them in its widest registers.
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

template <bool kResidual>
inline void quantize_block(const float* x, int8_t* codes, float* scale_out, float* residual) {
  Lanes most = {}, bad = {};
  for (int64_t j = 0; j < B; j += kLanes) {
    Lanes v;
    std::memcpy(&v, x + j, sizeof(v));
    const Lanes a = v < 0.0f ? -v : v;  // |v|; a NaN stays NaN and is caught by `bad`
    most = a > most ? a : most;
    bad += v - v;
  }
  float absmax = 0.0f, nan = 0.0f;
  for (int l = 0; l < kLanes; ++l) {
    absmax = most[l] > absmax ? most[l] : absmax;
    nan += bad[l];
  }
  const float scale = math::int8_scale(nan == 0.0f ? absmax : nan);
  *scale_out = scale;
  if (scale == 0.0f || scale != scale) {  // int8_code's zero codes
    for (int64_t j = 0; j < B; ++j) {
      codes[j] = 0;
      if constexpr (kResidual) residual[j] = x[j] - math::int8_value(0, scale);
    }
    return;
  }
  for (int64_t j = 0; j < B; ++j) {
    float q = std::nearbyint(x[j] / scale);
    q = q > 127.0f ? 127.0f : q;
    q = q < -127.0f ? -127.0f : q;
    codes[j] = static_cast<int8_t>(static_cast<int32_t>(q));
    if constexpr (kResidual) residual[j] = x[j] - q * scale;  // q is the code, exactly
  }
}

struct QuantLoops {
  void (*quantize)(const float* x, int64_t blocks, int8_t* codes, char* scales, float* residual);
  void (*dequantize)(const int8_t* codes, const char* scales, int64_t blocks, float* out, bool accumulate);
};

template <bool kResidual>
inline void quantize_blocks(const float* x, int64_t blocks, int8_t* codes, char* scales, float* residual) {
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    quantize_block<kResidual>(x + b * B, codes + b * B, &scale, kResidual ? residual + b * B : nullptr);
    std::memcpy(scales + b * sizeof(float), &scale, sizeof(scale));
  }
}

inline void dequantize_blocks(const int8_t* codes, const char* scales, int64_t blocks, float* out, bool accumulate) {
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, scales + b * sizeof(float), sizeof(scale));
    float* o = out + b * B;
    const int8_t* c = codes + b * B;
    if (accumulate) {
      for (int64_t j = 0; j < B; ++j) o[j] += math::int8_value(c[j], scale);
    } else {
      for (int64_t j = 0; j < B; ++j) o[j] = math::int8_value(c[j], scale);
    }
  }
}

#define MP_QUANT_LOOPS(isa, attributes)                                                                        \
  attributes void quantize_##isa(const float* x, int64_t blocks, int8_t* codes, char* scales, float* residual) { \
    if (residual != nullptr) return quantize_blocks<true>(x, blocks, codes, scales, residual);                 \
    quantize_blocks<false>(x, blocks, codes, scales, nullptr);                                                 \
  }                                                                                                            \
  attributes void dequantize_##isa(const int8_t* codes, const char* scales, int64_t blocks, float* out,        \
                                   bool accumulate) {                                                          \
    dequantize_blocks(codes, scales, blocks, out, accumulate);                                                 \
  }                                                                                                            \
  constexpr QuantLoops kQuantLoops_##isa{&quantize_##isa, &dequantize_##isa};

MP_ISA_VARIANTS(MP_QUANT_LOOPS)
#undef MP_QUANT_LOOPS

const QuantLoops& quant_loops() { return MP_ISA_TABLE(kQuantLoops); }

}  // namespace

// Both run on one thread (a communication thread calls them, beside the
// compute's pool), in the widest variant this CPU has (kernels/cpu/cpu_isa.h);
// every variant gives the same bits.
void quantize_int8(const float* x, int64_t n, void* out, float* residual) {
  MP_ENFORCE(n % B == 0, "int8 quantization of ", n, " elements: not a multiple of the block (", B, ")");
  quant_loops().quantize(x, n / B, static_cast<int8_t*>(out), static_cast<char*>(out) + n, residual);
}

void dequantize_int8(const void* in, int64_t n, float* out, bool accumulate) {
  MP_ENFORCE(n % B == 0, "int8 dequantization of ", n, " elements: not a multiple of the block (", B, ")");
  quant_loops().dequantize(static_cast<const int8_t*>(in), static_cast<const char*>(in) + n, n / B, out, accumulate);
}

}  // namespace mp
