// Errors (core/error.h): the message names file, line and rank; the agreed
// mark survives a rethrow; MP_ENFORCE prints both operands, evaluated once.
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <new>
#include <regex>
#include <stdexcept>
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

// throw_error maps each tier to its class (the C ABI, the Python classes and
// agree()'s remote failures go through the tier); rethrow_with_context keeps
// the class, file, line and flags and appends the context.
TEST(Error, EveryTierThrowsItsClassAndContextKeepsIt) {
  const auto thrown = [](const std::function<void()>& f) -> std::exception_ptr {
    try {
      f();
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  };
  const auto tier_of = [](std::exception_ptr p) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      return e.tier();
    }
  };
  for (int t = 0; t < kNumErrorTiers; ++t) {
    const auto tier = static_cast<ErrorTier>(t);
    const std::exception_ptr p = thrown([&] { throw_error(tier, "a.cc", 7, "what", /*agreed=*/true); });
    EXPECT_EQ(tier_of(p), tier) << t;
    const std::exception_ptr q = thrown([&] { rethrow_with_context(p, " (step 3)", /*stream_task=*/true); });
    EXPECT_EQ(tier_of(q), tier) << t;
    try {
      std::rethrow_exception(q);
    } catch (const Error& e) {
      EXPECT_EQ(e.message(), "what (step 3)");
      EXPECT_EQ(std::string(e.file()) + ":" + std::to_string(e.line()), "a.cc:7");
      EXPECT_TRUE(e.agreed() && e.from_stream_task()) << t;
    }
  }
  EXPECT_THROW(rethrow_with_context(thrown([] { throw std::bad_alloc(); }), ""), OutOfMemoryError);
  EXPECT_THROW(rethrow_with_context(thrown([] { throw std::runtime_error("x"); }), ""), EnforceError);
  EXPECT_THROW(throw_error(ErrorTier::kCuda, "a.cc", 1, "y"), CudaError);
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
