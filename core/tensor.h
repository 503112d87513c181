// core/tensor.h: a typed, shaped view of memory on one device.
//
// A Tensor either shares ownership of a Buffer from an Allocator (empty,
// zeros, and the views taken from them) or borrows memory the caller owns
// (wrap); the caller keeps borrowed memory alive. Copies of a Tensor are
// shallow: they alias the same elements. Sizes are element counts; byte
// sizes end in _bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace mp {

class Stream;

using Shape = std::vector<int64_t>;

// Product of the dimensions; throws ConfigError on a negative dimension or overflow.
int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[4, 8]"

class Tensor {
 public:
  Tensor() = default;  // undefined: no dtype, no memory

  static Tensor empty(Allocator& allocator, DType dtype, Shape shape, MemCategory category);
  static Tensor zeros(Allocator& allocator, DType dtype, Shape shape, MemCategory category);
  static Tensor wrap(void* data, Device device, DType dtype, Shape shape);

  bool defined() const { return defined_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t size_bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  bool owns_memory() const { return storage_ != nullptr; }  // false for wrap()
  MemCategory category() const;  // kOther for borrowed memory

  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    MP_ENFORCE(dtype_ == dtype_of_v<T>, "tensor ", describe(), " accessed as ",
               dtype_name(dtype_of_v<T>));
    return static_cast<T*>(data_);
  }

  // A 1-D view of elements [offset, offset + count) of the flattened tensor.
  Tensor flat(int64_t offset, int64_t count) const;
  // The same elements under a new shape with the same element count.
  Tensor reshape(Shape shape) const;

  std::string describe() const;  // "bf16[4, 8] on cpu"

 private:
  std::shared_ptr<Buffer> storage_;
  void* data_ = nullptr;
  Device device_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  bool defined_ = false;
};

// Copies src's elements into dst (same dtype and element count; any devices).
// With a CUDA tensor involved and a CUDA `stream`, the copy is asynchronous on
// it, and a host side must be pinned (EnforceError otherwise: core/pinned.h);
// with no stream it is synchronous (cudaMemcpy, on the legacy default stream,
// which the library's non-blocking streams do not wait for, so it waits only
// for itself). CPU-to-CPU copies run on the caller.
void copy_tensor(const Tensor& dst, const Tensor& src, Stream* stream = nullptr);

}  // namespace mp
