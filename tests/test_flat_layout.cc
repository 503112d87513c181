// The flat layout (models/flat_layout.h): parameters aligned in unit
// buffers padded to the group size, and bad model specs named.
#include <gtest/gtest.h>

#include <string>

#include "models/flat_layout.h"
#include "tests/test_util.h"

namespace mp {
namespace {

using testing::contains;
using testing::error_of;

ModelSpec two_units() {
  ModelSpec m;
  m.units.push_back(UnitSpec{"a", {ParamSpec{"a.w", {3, 5}, {}}, ParamSpec{"a.b", {3}, {}}}});
  m.units.push_back(UnitSpec{"b", {ParamSpec{"b.w", {7}, {}}}});
  return m;
}

TEST(FlatLayout, AlignsParamsAndPadsToTheGroupSize) {
  const FlatLayout l(two_units(), 3);
  const UnitLayout& a = l.unit(0);
  EXPECT_EQ(a.params[0].offset, 0);
  EXPECT_EQ(a.params[1].offset, 16);  // 15 rounded up to a multiple of 8
  EXPECT_EQ(a.numel, 19);
  EXPECT_EQ(a.padded_numel, 21);
  EXPECT_EQ(a.shard_numel, 7);
  EXPECT_EQ(l.unit(1).padded_numel, 9);
  EXPECT_EQ(l.total_numel(), 25);
  EXPECT_EQ(l.max_padded_numel(), 21);
  EXPECT_EQ(l.param("b.w").unit, 1);
  // Offsets do not depend on the group size; only the padding does.
  const FlatLayout l4(two_units(), 4);
  EXPECT_EQ(l4.unit(0).params[1].offset, 16);
  EXPECT_EQ(l4.unit(0).padded_numel, 20);
}

TEST(FlatLayout, BadModelsAreNamed) {
  ModelSpec dup = two_units();
  dup.units[1].params[0].name = "a.w";
  EXPECT_EQ(error_of([&] { FlatLayout(dup, 1); }), "parameter name 'a.w' appears twice");
  ModelSpec empty_unit = two_units();
  empty_unit.units[1].params.clear();
  EXPECT_EQ(error_of([&] { FlatLayout(empty_unit, 1); }), "unit 'b' has no parameters");
  ModelSpec negative = two_units();
  negative.units[0].params[0].shape = {3, -5};
  EXPECT_TRUE(contains(error_of([&] { FlatLayout(negative, 1); }), "parameter 'a.w' shape [3, -5]"));
  EXPECT_EQ(error_of([&] { FlatLayout(ModelSpec{}, 1); }), "model has no units");
  EXPECT_EQ(error_of([&] { FlatLayout(two_units(), 2).param("c"); }), "no parameter named 'c'");
}

}  // namespace
}  // namespace mp
