// Dtypes (core/dtype.h): names, sizes and parsing.
#include <gtest/gtest.h>

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace mp {
namespace {

TEST(DType, NamesSizesAndParsing) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  try {
    parse_dtype("float16");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'float16'; valid: fp32, bf16"), std::string::npos);
  }
}

}  // namespace
}  // namespace mp
