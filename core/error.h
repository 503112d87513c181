// core/error.h: the two tiers of errors (docs/architecture.md "Error tiers").
//
// 1. Recoverable failures are typed exceptions derived from mp::Error:
//    ConfigError (bad config, flag or input file contents), IoError (file
//    system), CommError (collectives, peers), CudaError (CUDA, cuBLASLt,
//    NCCL), OutOfMemoryError, NumericError, ModelError (an embedding host's
//    model code). Throw them with MP_THROW(Type, parts...).
// 2. Broken invariants use MP_ENFORCE / MP_ENFORCE_EQ / _NE / _LT / _LE / _GT
//    / _GE, which throw EnforceError and print both operands. They never
//    vanish under NDEBUG, unlike assert.
//
// An error every rank throws at the same point, from a decision the ranks
// took together (a collective checkpoint save or load, the non-finite
// policy), is marked agreed (MP_THROW_AGREED, Error::set_agreed). launch/
// ends such a rank normally with the error's exit code, since no rank waits
// on another; any other error ends the whole job with MPI_Abort.
//
// Every message reads "[rank R] file:line: what", where R is the process's
// rank once launch/ has set it (set_error_rank), and file is repo-relative.
// Foreign-library checks live beside their library: comm/mpi/mpi_error.h
// (MP_CHECK_MPI), core/error_cuda.h (MP_CHECK_CUDA, MP_CHECK_CUBLAS) and
// comm/nccl/nccl_error.h (MP_CHECK_NCCL). Library code throws; only launch/
// ends the process.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace mp {

// The rank that error messages name. Set once by launch/ after MPI start-up
// (or by an embedding host); -1 means unknown and the prefix is left out.
void set_error_rank(int rank) noexcept;
int error_rank() noexcept;

// The tiers in one fixed order, for code that maps them to codes of its own
// (the C ABI's statuses, the Python classes). An Error of no other tier
// counts as kEnforce.
enum class ErrorTier { kConfig, kIo, kComm, kCuda, kOutOfMemory, kNumeric, kModel, kEnforce };
inline constexpr int kNumErrorTiers = 8;

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& message);
  const std::string& message() const noexcept { return message_; }  // without prefix
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  int rank() const noexcept { return rank_; }
  virtual ErrorTier tier() const noexcept { return ErrorTier::kEnforce; }
  // Every rank throws this error at the same point (see the top of the file).
  bool agreed() const noexcept { return agreed_; }
  void set_agreed() noexcept { agreed_ = true; }
  // Thrown by a task on a stream (core/stream.h) and carried to the host
  // thread: the message says which op on which stream, and the engine adds
  // where the rank was (its device and step) when it rethrows it.
  bool from_stream_task() const noexcept { return from_stream_task_; }
  void set_from_stream_task() noexcept { from_stream_task_ = true; }

 private:
  std::string message_;
  const char* file_;
  int line_;
  int rank_;
  bool agreed_ = false;
  bool from_stream_task_ = false;
};

#define MP_DEFINE_ERROR(Name, Tier)                                      \
  class Name : public Error {                                            \
   public:                                                               \
    using Error::Error;                                                  \
    ErrorTier tier() const noexcept override { return ErrorTier::Tier; } \
  }
MP_DEFINE_ERROR(ConfigError, kConfig);            // bad configuration, flag or input data: exit code 2
MP_DEFINE_ERROR(IoError, kIo);                    // a file could not be opened, read, written or renamed
MP_DEFINE_ERROR(CommError, kComm);                // a collective failed, timed out or was mismatched
MP_DEFINE_ERROR(CudaError, kCuda);                // CUDA runtime, cuBLASLt or NCCL reported an error
MP_DEFINE_ERROR(OutOfMemoryError, kOutOfMemory);  // an allocation failed
MP_DEFINE_ERROR(NumericError, kNumeric);          // NaN/Inf where the run cannot skip the step
MP_DEFINE_ERROR(ModelError, kModel);  // the model's own code failed (a host's callback raised or returned an error)
MP_DEFINE_ERROR(EnforceError, kEnforce);          // a broken invariant: a bug in mp or in its caller
#undef MP_DEFINE_ERROR

// Throws the error class of `tier` (EnforceError for kEnforce) from
// file:line with `message`, marked agreed and from_stream_task as asked.
[[noreturn]] void throw_error(ErrorTier tier, const char* file, int line, const std::string& message,
                              bool agreed = false, bool stream_task = false);

// Rethrows `error` with `context` appended to its message: an mp::Error as
// the error class of its tier (file, line and flags kept), std::bad_alloc as
// OutOfMemoryError, any other exception as EnforceError naming what it
// said. With `stream_task`, the result is marked from_stream_task().
[[noreturn]] void rethrow_with_context(std::exception_ptr error, const std::string& context,
                                       bool stream_task = false);
// The same, as an exception_ptr.
std::exception_ptr with_context(std::exception_ptr error, const std::string& context, bool stream_task = false);

namespace detail {

template <class... Parts>
std::string str(const Parts&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    return std::string();
  } else {
    std::ostringstream os;
    (os << ... << parts);
    return os.str();
  }
}

// Formats an operand for MP_ENFORCE_* messages; chars print as numbers.
template <class T>
std::string operand(const T& v) {
  if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> ||
                std::is_same_v<T, unsigned char>) {
    return std::to_string(static_cast<int>(v));
  } else {
    return str(v);
  }
}

template <class E>
E agreed(E e) {
  e.set_agreed();
  return e;
}

[[noreturn]] void throw_enforce(const char* file, int line, const std::string& what,
                                const std::string& extra);

template <class A, class B, class Cmp>
void enforce_cmp(const A& a, const B& b, Cmp cmp, const char* file, int line,
                 const char* expr, const std::string& extra) {
  if (!cmp(a, b)) {
    throw_enforce(file, line,
                  str("Expected ", expr, ", got ", operand(a), " vs ", operand(b)), extra);
  }
}

}  // namespace detail
}  // namespace mp

#define MP_THROW(ErrorType, ...) \
  throw ErrorType(__FILE__, __LINE__, ::mp::detail::str(__VA_ARGS__))

// MP_THROW for an error every rank throws at the same point (see above).
#define MP_THROW_AGREED(ErrorType, ...) \
  throw ::mp::detail::agreed(ErrorType(__FILE__, __LINE__, ::mp::detail::str(__VA_ARGS__)))

#define MP_ENFORCE(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      ::mp::detail::throw_enforce(__FILE__, __LINE__, "Enforce failed: " #cond, \
                                  ::mp::detail::str(__VA_ARGS__));                 \
    }                                                                            \
  } while (0)

#define MP_ENFORCE_CMP_(a, b, op, ...)                                                  \
  ::mp::detail::enforce_cmp(                                                            \
      (a), (b), [](const auto& x, const auto& y) { return static_cast<bool>(x op y); }, \
      __FILE__, __LINE__, #a " " #op " " #b,                                            \
      ::mp::detail::str(__VA_ARGS__))

#define MP_ENFORCE_EQ(a, b, ...) MP_ENFORCE_CMP_(a, b, ==, __VA_ARGS__)
#define MP_ENFORCE_NE(a, b, ...) MP_ENFORCE_CMP_(a, b, !=, __VA_ARGS__)
#define MP_ENFORCE_LT(a, b, ...) MP_ENFORCE_CMP_(a, b, <, __VA_ARGS__)
#define MP_ENFORCE_LE(a, b, ...) MP_ENFORCE_CMP_(a, b, <=, __VA_ARGS__)
#define MP_ENFORCE_GT(a, b, ...) MP_ENFORCE_CMP_(a, b, >, __VA_ARGS__)
#define MP_ENFORCE_GE(a, b, ...) MP_ENFORCE_CMP_(a, b, >=, __VA_ARGS__)
