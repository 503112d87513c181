#include "kernels/cpu/quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace mp {
namespace {

constexpr int64_t B = math::kQuantBlock;

}  // namespace

// Both loops run on one thread: the communication thread calls them, beside
// the compute's pool.
void quantize_int8(const float* x, int64_t n, void* out, float* residual) {
  MP_ENFORCE(n % B == 0, "int8 quantization of ", n, " elements: not a multiple of the block (", B, ")");
  int8_t* codes = static_cast<int8_t*>(out);
  char* scales = static_cast<char*>(out) + n;  // int8_span_bytes: n codes, then the scales
  for (int64_t b = 0; b < n / B; ++b) {
    const float* xb = x + b * B;
    float absmax = 0.0f, bad = 0.0f;  // bad: NaN once a NaN or Inf was seen (fmax would drop a NaN)
    for (int64_t j = 0; j < B; ++j) {
      absmax = std::fmax(absmax, std::fabs(xb[j]));
      bad += xb[j] - xb[j];
    }
    const float scale = math::int8_scale(bad == 0.0f ? absmax : bad);
    std::memcpy(scales + b * sizeof(float), &scale, sizeof(scale));
    for (int64_t j = 0; j < B; ++j) {
      const int8_t c = math::int8_code(xb[j], scale);
      codes[b * B + j] = c;
      if (residual != nullptr) residual[b * B + j] = xb[j] - math::int8_value(c, scale);
    }
  }
}

void dequantize_int8(const void* in, int64_t n, float* out, bool accumulate) {
  MP_ENFORCE(n % B == 0, "int8 dequantization of ", n, " elements: not a multiple of the block (", B, ")");
  const int8_t* codes = static_cast<const int8_t*>(in);
  const char* scales = static_cast<const char*>(in) + n;
  for (int64_t b = 0; b < n / B; ++b) {
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

}  // namespace mp
