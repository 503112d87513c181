#include "core/error.h"

#include <atomic>
#include <new>

namespace mp {
namespace {

// Process identity, written once at start-up; not configuration state.
std::atomic<int> g_error_rank{-1};

std::string format(const char* file, int line, int rank, const std::string& message) {
  std::string out;
  if (rank >= 0) out += "[rank " + std::to_string(rank) + "] ";
  out += file;
  out += ':';
  out += std::to_string(line);
  out += ": ";
  out += message;
  return out;
}

}  // namespace

void set_error_rank(int rank) noexcept { g_error_rank.store(rank, std::memory_order_relaxed); }
int error_rank() noexcept { return g_error_rank.load(std::memory_order_relaxed); }

Error::Error(const char* file, int line, const std::string& message)
    : std::runtime_error(format(file, line, error_rank(), message)),
      message_(message),
      file_(file),
      line_(line),
      rank_(error_rank()) {}

namespace {

template <class E>
[[noreturn]] void throw_flagged(const char* file, int line, const std::string& message, bool agreed,
                                bool stream_task) {
  E e(file, line, message);
  if (agreed) e.set_agreed();
  if (stream_task) e.set_from_stream_task();
  throw e;
}

}  // namespace

void throw_error(ErrorTier tier, const char* file, int line, const std::string& message, bool agreed,
                 bool stream_task) {
  switch (tier) {
    case ErrorTier::kConfig: throw_flagged<ConfigError>(file, line, message, agreed, stream_task);
    case ErrorTier::kIo: throw_flagged<IoError>(file, line, message, agreed, stream_task);
    case ErrorTier::kComm: throw_flagged<CommError>(file, line, message, agreed, stream_task);
    case ErrorTier::kCuda: throw_flagged<CudaError>(file, line, message, agreed, stream_task);
    case ErrorTier::kOutOfMemory: throw_flagged<OutOfMemoryError>(file, line, message, agreed, stream_task);
    case ErrorTier::kNumeric: throw_flagged<NumericError>(file, line, message, agreed, stream_task);
    case ErrorTier::kModel: throw_flagged<ModelError>(file, line, message, agreed, stream_task);
    case ErrorTier::kEnforce: break;
  }
  throw_flagged<EnforceError>(file, line, message, agreed, stream_task);
}

void rethrow_with_context(std::exception_ptr error, const std::string& context, bool stream_task) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    throw_error(e.tier(), e.file(), e.line(), e.message() + context, e.agreed(),
                stream_task || e.from_stream_task());
  } catch (const std::bad_alloc& e) {
    throw_error(ErrorTier::kOutOfMemory, __FILE__, __LINE__, e.what() + context, false, stream_task);
  } catch (const std::exception& e) {
    throw_error(ErrorTier::kEnforce, __FILE__, __LINE__, std::string("unexpected exception: ") + e.what() + context,
                false, stream_task);
  } catch (...) {
    throw_error(ErrorTier::kEnforce, __FILE__, __LINE__, "unexpected exception of unknown type" + context, false,
                stream_task);
  }
}

std::exception_ptr with_context(std::exception_ptr error, const std::string& context, bool stream_task) {
  try {
    rethrow_with_context(std::move(error), context, stream_task);
  } catch (...) {
    return std::current_exception();
  }
}

namespace detail {

void throw_enforce(const char* file, int line, const std::string& what, const std::string& extra) {
  throw EnforceError(file, line, extra.empty() ? what : what + ". " + extra);
}

}  // namespace detail
}  // namespace mp
