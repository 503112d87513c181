// core/dtype.h: element types of tensors, buffers and collectives.
//
// fp32, bf16 and fp16 are compute and communication types; fp8 e4m3 (OCP
// "E4M3FN": no infinities, one NaN pattern per sign, max 448) and e5m2 (IEEE
// style, with infinities) are storage types for gathers and broadcasts. The
// 16- and 8-bit types below are plain bit containers; all conversion math is
// in kernels/convert_math.h, shared by CPU and CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace mp {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kF8E4M3 = 3, kF8E5M2 = 4 };
inline constexpr int kNumDTypes = 5;

struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};
struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2: return 1;
  }
  return 0;
}

constexpr bool is_fp8(DType t) { return t == DType::kF8E4M3 || t == DType::kF8E5M2; }

// "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2": the names configs use.
std::string_view dtype_name(DType t);
// Inverse of dtype_name; throws ConfigError listing the valid names.
DType parse_dtype(std::string_view name);

// The DType of a storage type (dispatch_dtype's inverse); no other T compiles.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::kF32> {};
template <>
struct dtype_of<bf16> : std::integral_constant<DType, DType::kBF16> {};
template <>
struct dtype_of<fp16> : std::integral_constant<DType, DType::kF16> {};
template <>
struct dtype_of<fp8_e4m3> : std::integral_constant<DType, DType::kF8E4M3> {};
template <>
struct dtype_of<fp8_e5m2> : std::integral_constant<DType, DType::kF8E5M2> {};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Calls f(T{}) with T the storage type of `t`, for type dispatch.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF16: return f(fp16{});
    case DType::kF8E4M3: return f(fp8_e4m3{});
    case DType::kF8E5M2: return f(fp8_e5m2{});
  }
  return f(float{});  // unreachable for valid enum values
}

}  // namespace mp
