// Tensors (core/tensor.h): owning tensors, views that keep their buffer
// alive, wrapped memory, copies and bad shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace mp {
namespace {

TEST(Tensor, OwningViewsAndWrappedMemory) {
  Allocator alloc;
  Tensor t = Tensor::zeros(alloc, DType::kF32, {4, 8}, MemCategory::kMaster);
  EXPECT_EQ(t.numel(), 32);
  EXPECT_EQ(t.size_bytes(), 128u);
  EXPECT_TRUE(t.owns_memory());
  EXPECT_EQ(t.category(), MemCategory::kMaster);
  EXPECT_EQ(t.describe(), "fp32[4, 8] on cpu");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0f);
  Tensor row = t.flat(8, 8);
  row.data_as<float>()[0] = 5;
  EXPECT_EQ(t.data_as<float>()[8], 5) << "views alias";
  EXPECT_THROW(t.flat(30, 3), EnforceError);
  EXPECT_THROW(t.data_as<bf16>(), EnforceError);
  EXPECT_THROW(t.reshape({5, 7}), EnforceError);
  EXPECT_EQ(t.reshape({32}).shape(), Shape{32});
  {
    Tensor keep = t.flat(0, 4);
    t = Tensor();
    row = Tensor();
    EXPECT_EQ(alloc.stats().current(MemCategory::kMaster), 128u) << "a view keeps its buffer alive";
  }
  EXPECT_EQ(alloc.stats().current(MemCategory::kMaster), 0u);

  std::vector<bf16> host(6);
  Tensor w = Tensor::wrap(host.data(), Device::cpu(), DType::kBF16, {2, 3});
  EXPECT_FALSE(w.owns_memory());
  Tensor copy = Tensor::empty(alloc, DType::kBF16, {6}, MemCategory::kOther);
  host[5].bits = 0x3f80;
  copy_tensor(copy, w.reshape({6}));
  EXPECT_EQ(copy.data_as<bf16>()[5].bits, 0x3f80);
  EXPECT_THROW(Tensor::empty(alloc, DType::kF32, {-1, 2}, MemCategory::kOther), ConfigError);
  EXPECT_THROW(Tensor::empty(alloc, DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, MemCategory::kOther),
               ConfigError);
  Tensor zero = Tensor::empty(alloc, DType::kF16, {0, 5}, MemCategory::kOther);
  EXPECT_EQ(zero.numel(), 0);
}

}  // namespace
}  // namespace mp
