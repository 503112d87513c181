// CommConfig -> CommOptions: defaults, and errors that name the field.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/comm_config.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace mp {
namespace {

// The ConfigError message of c's conversion; "(no error)" when it converts.
std::string options_error(const proto::CommConfig& c) {
  return testing::error_of<ConfigError>([&] { comm_options_from_config(c); });
}

TEST(CommConfig, EmptyConfigGivesDefaults) {
  const CommOptions o = comm_options_from_config(proto::CommConfig());
  EXPECT_EQ(o.timeout, std::chrono::seconds(300));
  EXPECT_EQ(o.diagnose_timeout, std::chrono::seconds(2));
  EXPECT_EQ(o.accumulate_chunk_bytes, size_t{4} << 20);
  EXPECT_FALSE(o.check_fingerprints);
  EXPECT_EQ(comm_hook_name(proto::CommConfig()), "fp32");
}

TEST(CommConfig, ValuesAreTakenAndBadOnesNamed) {
  proto::CommConfig c;
  c.set_timeout_s(12.5);
  c.set_check_fingerprints(true);
  c.set_accumulate_chunk_bytes(65536);
  c.set_comm_hook("bf16_compress");
  const CommOptions o = comm_options_from_config(c);
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(12500));
  EXPECT_TRUE(o.check_fingerprints);
  EXPECT_EQ(o.accumulate_chunk_bytes, 65536u);
  EXPECT_EQ(comm_hook_name(c), "bf16_compress");

  c.set_timeout_s(-1);
  EXPECT_EQ(options_error(c), "comm.timeout_s = -1: must be between 0.001 and 2592000 seconds");
  c.set_timeout_s(std::nan(""));
  EXPECT_NE(options_error(c).find("comm.timeout_s = nan"), std::string::npos);
  c.set_timeout_s(10);
  c.set_accumulate_chunk_bytes(100);
  EXPECT_EQ(options_error(c), "comm.accumulate_chunk_bytes = 100: must be between 1024 and 2^34");
}

}  // namespace
}  // namespace mp
