#include "python/src/arrays.h"

#include "core/error.h"

namespace nb = nanobind;

namespace mp::python {
namespace {

nb::dlpack::dtype dlpack_dtype(DType d) {
  switch (d) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kBF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::kF16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kF8E4M3: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float8_E4M3FN), 8, 1};
    case DType::kF8E5M2: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float8_E5M2), 8, 1};
  }
  MP_THROW(EnforceError, "no DLPack dtype for ", dtype_name(d));
}

}  // namespace

const char* python_dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kF8E5M2: return "float8_e5m2";
  }
  return "?";
}

nb::object view(const Tensor& t) {
  if (!t.defined()) return nb::none();
  const size_t shape[1] = {static_cast<size_t>(t.numel())};
  const Device d = t.device();
  const int device_type = d.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  nb::ndarray<nb::array_api> a(t.data(), 1, shape, nb::handle(), nullptr, dlpack_dtype(t.dtype()), device_type,
                               d.is_cuda() ? d.index : 0);
  return nb::cast(a, nb::rv_policy::reference);
}

}  // namespace mp::python
