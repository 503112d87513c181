#include "core/tensor.h"

#include <cstring>
#include <limits>

#include "core/cuda_device.h"
#include "core/pinned.h"
#include "mp/config.h"
#if MP_WITH_CUDA
#include "core/cuda_stream.h"
#endif

namespace mp {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) MP_THROW(ConfigError, "shape ", shape_string(shape), ": dimension ", i, " is negative");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      MP_THROW(ConfigError, "shape ", shape_string(shape), ": element count overflows int64");
    }
    n *= d;
  }
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::empty(Allocator& allocator, DType dtype, Shape shape, MemCategory category) {
  const int64_t numel = shape_numel(shape);
  if (static_cast<uint64_t>(numel) > std::numeric_limits<size_t>::max() / dtype_size(dtype)) {
    MP_THROW(ConfigError, "tensor ", dtype_name(dtype), shape_string(shape), " is too large");
  }
  auto storage = std::make_shared<Buffer>(allocator.allocate(static_cast<size_t>(numel) * dtype_size(dtype), category));
  Tensor t = wrap(storage->data(), allocator.device(), dtype, std::move(shape));
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::zeros(Allocator& allocator, DType dtype, Shape shape, MemCategory category) {
  Tensor t = empty(allocator, dtype, std::move(shape), category);
  if (t.device_.is_cpu()) {
    if (t.size_bytes() && !t.storage_->zero_filled()) std::memset(t.data_, 0, t.size_bytes());
  } else {
#if MP_WITH_CUDA
    detail::cuda_memset_zero(t.data_, t.size_bytes(), nullptr);
#endif
  }
  return t;
}

Tensor Tensor::wrap(void* data, Device device, DType dtype, Shape shape) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  MP_ENFORCE(data != nullptr || t.numel_ == 0, "wrap of null memory as ", dtype_name(dtype),
             shape_string(shape));
  t.data_ = data;
  t.device_ = device;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.defined_ = true;
  return t;
}

MemCategory Tensor::category() const { return storage_ ? storage_->category() : MemCategory::kOther; }

Tensor Tensor::flat(int64_t offset, int64_t count) const {
  MP_ENFORCE(defined_, "flat() of an undefined tensor");
  MP_ENFORCE(offset >= 0 && count >= 0 && offset <= numel_ - count, "flat(", offset, ", ", count,
             ") out of range for ", describe());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_ = {count};
  t.numel_ = count;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  MP_ENFORCE(defined_, "reshape() of an undefined tensor");
  const int64_t n = shape_numel(shape);
  MP_ENFORCE_EQ(n, numel_, "reshape of ", describe(), " to ", shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

std::string Tensor::describe() const {
  if (!defined_) return "undefined tensor";
  return detail::str(dtype_name(dtype_), shape_string(shape_), " on ", to_string(device_));
}

void copy_tensor(const Tensor& dst, const Tensor& src, Stream* stream) {
  MP_ENFORCE(dst.defined() && src.defined(), "copy_tensor with an undefined tensor");
  MP_ENFORCE(dst.dtype() == src.dtype() && dst.numel() == src.numel(), "copy_tensor from ",
             src.describe(), " to ", dst.describe(), ": dtype and element count must match");
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (src.size_bytes()) std::memmove(dst.data(), src.data(), src.size_bytes());
    return;
  }
#if MP_WITH_CUDA
  if (stream != nullptr) {
    // core/pinned.h: a pageable host side would block inside the copy, unbounded.
    const Tensor& host = dst.device().is_cpu() ? dst : src;
    const Device device = dst.device().is_cpu() ? src.device() : dst.device();
    MP_ENFORCE(src.size_bytes() == 0 || !host.device().is_cpu() || is_pinned_for(host.data(), device),
               "copy_tensor from ", src.describe(), " to ", dst.describe(), " on stream '", stream->name(),
               "': the host side is pageable; stream-ordered copies need pinned host memory (core/pinned.h "
               "PinnedBuffer)");
  }
  detail::cuda_memcpy(dst.data(), src.data(), src.size_bytes(),
                      stream ? static_cast<void*>(cuda_handle(stream)) : nullptr);
#else
  (void)stream;
  MP_THROW(ConfigError, "copy_tensor to ", dst.describe(), ": mp was built without CUDA");
#endif
}

}  // namespace mp
