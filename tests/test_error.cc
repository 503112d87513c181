// Errors (core/error.h): the message names file, line and rank; the agreed
// mark survives a rethrow; MP_ENFORCE prints both operands, evaluated once.
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <regex>
#include <string>

#include "core/error.h"

namespace mp {
namespace {

TEST(Error, MessageNamesFileLineAndRank) {
  set_error_rank(3);
  try {
    MP_THROW(IoError, "cannot open ", "x.bin", ": ", 2);
    FAIL() << "no throw";
  } catch (const IoError& e) {
    EXPECT_TRUE(std::regex_match(e.what(), std::regex(R"(\[rank 3\] tests/test_error\.cc:\d+: cannot open x\.bin: 2)")))
        << e.what();
    EXPECT_EQ(e.message(), "cannot open x.bin: 2");
    EXPECT_EQ(e.rank(), 3);
  }
  set_error_rank(-1);
  try {
    MP_THROW(ConfigError, "bad");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tests/test_error.cc:", 0), 0u) << "no rank prefix when unknown: " << e.what();
  }
}

// launch/rank_main ends a rank normally on an agreed error and aborts the
// job on any other; the mark must survive a catch and rethrow and keep the
// error's type and message.
TEST(Error, AgreedMarkKeepsTypeAndMessageAndSurvivesRethrow) {
  try {
    MP_THROW(IoError, "local");
  } catch (const Error& e) {
    EXPECT_FALSE(e.agreed());
  }
  try {
    MP_THROW_AGREED(NumericError, "step ", 4, ": stop");
    FAIL() << "no throw";
  } catch (const NumericError& e) {
    EXPECT_TRUE(e.agreed());
    EXPECT_EQ(e.message(), "step 4: stop");
    EXPECT_NE(std::string(e.what()).find("tests/test_error.cc:"), std::string::npos) << e.what();
  }
  std::exception_ptr p;
  try {
    MP_THROW(ConfigError, "bad shard");
  } catch (...) {
    p = std::current_exception();
  }
  try {
    try {
      std::rethrow_exception(p);
    } catch (Error& e) {
      e.set_agreed();
      throw;
    }
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.agreed());
    EXPECT_EQ(e.message(), "bad shard");
  }
}

TEST(Error, EnforcePrintsBothOperandsAndEvaluatesOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  try {
    MP_ENFORCE_EQ(next(), 5, "while checking ", "counts");
    FAIL() << "no throw";
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("Expected next() == 5, got 1 vs 5. while checking counts"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(calls, 1);
  EXPECT_NO_THROW(MP_ENFORCE_LT(1, 2));
  EXPECT_THROW(MP_ENFORCE_GE(1, 2), EnforceError);
  EXPECT_THROW(MP_ENFORCE(false), EnforceError);
  const uint8_t a = 7;
  try {
    MP_ENFORCE_NE(a, 7);
  } catch (const EnforceError& e) {
    EXPECT_NE(std::string(e.what()).find("got 7 vs 7"), std::string::npos) << "chars print as numbers: " << e.what();
  }
}

}  // namespace
}  // namespace mp
