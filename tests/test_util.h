// tests/test_util.h: helpers every kind of test shares (unit, multi-rank):
// the message of an expected error, a temporary directory that removes
// itself, whole files as bytes, bitwise comparison of float vectors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace mp::testing {

// The message (without the "[rank R] file:line: " prefix) of the E that f()
// throws, or "(no error)" when f returns. Any other exception propagates
// and fails the test: an error of the wrong type cannot pass for the right
// one by its text.
template <class E = Error, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  }
  return "(no error)";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// v in scientific notation, for RecordProperty.
inline std::string sci(double v) {
  std::ostringstream os;
  os << std::scientific << v;
  return os.str();
}

// n values drawn from N(0, scale^2), the same for the same seed.
// v widened, for float64 references.
inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The whole file; empty when it cannot be read.
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Replaces the file's contents with `bytes`.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Same length and the same bits (NaN payloads and signed zeros included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The first index where a and b differ in bits; the shorter length when one
// is a prefix of the other.
inline size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  }
  return std::min(a.size(), b.size());
}

// Unit buffers (weights, shards, gradients), one vector per unit.
using UnitVectors = std::vector<std::vector<float>>;

// As many units, each the same bits; a failure names the first unit that
// differs and its first differing element.
inline ::testing::AssertionResult same_bits(const UnitVectors& a, const UnitVectors& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " units vs " << b.size();
  for (size_t u = 0; u < a.size(); ++u) {
    if (!same_bits(a[u], b[u])) {
      return ::testing::AssertionFailure() << "unit " << u << " differs first at element "
                                           << first_difference(a[u], b[u]) << " (sizes " << a[u].size() << ", "
                                           << b[u].size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// A fresh directory $TMPDIR/mp_<prefix>_XXXXXX (mkdtemp), removed with all
// it holds when the object is destroyed.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "test") {
    std::string pattern = (std::filesystem::temp_directory_path() / ("mp_" + prefix + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // `name` inside the directory.
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The fixture of tests that write files: dir_ is a fresh directory named
// after the test suite, removed after each test; path(name) is inside it.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    temp_ = std::make_unique<TempDir>(::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name());
    dir_ = temp_->path();
  }
  void TearDown() override { temp_.reset(); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;

 private:
  std::unique_ptr<TempDir> temp_;
};

}  // namespace mp::testing
