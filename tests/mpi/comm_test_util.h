// tests/mpi/comm_test_util.h: data with exactly known answers for collective
// tests, and typed fill/compare helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/gloo/gloo_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/store.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/convert_math.h"
#include "tests/mpi/mpi_test.h"
#include "tests/reference_float.h"

namespace mp::testing {

// A world of Gloo's (comm/gloo/): the ranks meet through a file store in a
// fresh directory that rank 0 makes and tells the others over MPI.
inline std::unique_ptr<Communicator> make_gloo_world(const std::string& name, CommOptions options) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char dir[256] = "/tmp/mp_gloo_test.XXXXXX";
  if (rank == 0 && mkdtemp(dir) == nullptr) std::abort();
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  struct Remove {  // at exit (splits meet in the store too)
    std::vector<std::string> dirs;
    ~Remove() {
      for (const std::string& d : dirs) std::filesystem::remove_all(d);
    }
  };
  static Remove made;
  if (rank == 0) made.dirs.push_back(dir);
  return GlooCommunicator::create_world(make_file_store(dir), rank, size, "127.0.0.1", name, options);
}

// The communicator the comm and engine tests run on: MPI's, or Gloo's with
// MP_TEST_COMM=gloo (the same tests, CTest comm_gloo_np*, engine_gloo_np*).
inline std::unique_ptr<Communicator> make_world(const std::string& name, CommOptions options = {}) {
  const char* which = std::getenv("MP_TEST_COMM");
  if (which != nullptr && std::string(which) == "gloo") return make_gloo_world(name, options);
  return MpiCommunicator::create_world(name, options);
}

// A test with a world communicator of its own (comm_), made in SetUp and
// released before the harness agrees on the verdict.
class CommTest : public MpiTest {
 protected:
  explicit CommTest(std::string name, CommOptions options = {}) : name_(std::move(name)), options_(options) {}
  void SetUp() override {
    MpiTest::SetUp();
    comm_ = make_world(name_, options_);
  }
  void TearDown() override {
    comm_.reset();
    MpiTest::TearDown();
  }

  std::unique_ptr<Communicator> comm_;

 private:
  std::string name_;
  CommOptions options_;
};

// Small integers in [-4, 4]: exact in every dtype, and any sum of up to 16
// of them is exact in bf16, fp16 and fp32 whatever the order.
inline double exact_value(int rank, int64_t i) {
  return static_cast<double>(((i * 7 + rank * 3) % 9 + 9) % 9 - 4);
}

inline RefFormat ref_format(DType t) {
  switch (t) {
    case DType::kBF16: return kRefBF16;
    case DType::kF16: return kRefFP16;
    case DType::kF8E4M3: return kRefE4M3;
    case DType::kF8E5M2: return kRefE5M2;
    case DType::kF32: break;
  }
  return kRefBF16;  // unused for fp32
}

// Bits of `v` rounded once to dtype t (the plain reference). Memoized: test
// data repeats a few values millions of times.
inline uint32_t ref_bits(DType t, double v) {
  if (t == DType::kF32) return math::f32_bits(static_cast<float>(v));
  static thread_local std::vector<std::pair<DType, RefRounder>> rounders;
  static thread_local std::map<std::pair<int, double>, uint32_t> memo;
  const auto key = std::make_pair(static_cast<int>(t), v);
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  const RefRounder* rounder = nullptr;
  for (auto& [d, r] : rounders) {
    if (d == t) rounder = &r;
  }
  if (rounder == nullptr) rounder = &rounders.emplace_back(t, RefRounder(ref_format(t))).second;
  const uint32_t bits = rounder->round(v);
  if (memo.size() < (1u << 16)) memo.emplace(key, bits);
  return bits;
}

// v rounded once to dtype t, as a double.
inline double rounded(DType t, double v) {
  const uint32_t b = ref_bits(t, v);
  return t == DType::kF32 ? static_cast<double>(math::f32_from_bits(b)) : ref_decode(b, ref_format(t));
}

inline uint32_t load_bits(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data()) + i * static_cast<int64_t>(dtype_size(t.dtype()));
  uint32_t bits = 0;
  std::memcpy(&bits, p, dtype_size(t.dtype()));
  return bits;
}

inline void store_bits(const Tensor& t, int64_t i, uint32_t bits) {
  char* p = static_cast<char*>(t.data()) + i * static_cast<int64_t>(dtype_size(t.dtype()));
  std::memcpy(p, &bits, dtype_size(t.dtype()));
}

inline double load_value(const Tensor& t, int64_t i) {
  const uint32_t b = load_bits(t, i);
  if (t.dtype() == DType::kF32) return math::f32_from_bits(b);
  return ref_decode(b, ref_format(t.dtype()));
}

// Fills t[i] = f(i) rounded once to t's dtype.
inline void fill(const Tensor& t, const std::function<double(int64_t)>& f) {
  for (int64_t i = 0; i < t.numel(); ++i) store_bits(t, i, ref_bits(t.dtype(), f(i)));
}

// Expects t[i] == round(f(i)) bit for bit; reports the first mismatches.
inline ::testing::AssertionResult equals_rounded(const Tensor& t, const std::function<double(int64_t)>& f,
                                                 const std::string& what) {
  int bad = 0;
  std::string first;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint32_t want = ref_bits(t.dtype(), f(i));
    const uint32_t got = load_bits(t, i);
    if (want != got) {
      if (bad++ < 3) {
        first += " [" + std::to_string(i) + "] got " + std::to_string(load_value(t, i)) + " want " +
                 std::to_string(f(i)) + ";";
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << t.numel()
                                       << " elements differ:" << first;
}

}  // namespace mp::testing
