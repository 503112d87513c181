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

// `e` as a new E with `context` appended, its flags kept.
template <class E>
[[noreturn]] void rethrow_as(const E& e, const std::string& context, bool stream_task) {
  E out(e.file(), e.line(), e.message() + context);
  if (e.agreed()) out.set_agreed();
  if (stream_task || e.from_stream_task()) out.set_from_stream_task();
  throw out;
}

}  // namespace

void rethrow_with_context(std::exception_ptr error, const std::string& context, bool stream_task) {
  try {
    std::rethrow_exception(error);
  } catch (const ConfigError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const IoError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const CommError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const CudaError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const OutOfMemoryError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const NumericError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const ModelError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const EnforceError& e) {
    rethrow_as(e, context, stream_task);
  } catch (const Error& e) {
    rethrow_as(EnforceError(e.file(), e.line(), e.message()), context, stream_task);
  } catch (const std::bad_alloc& e) {
    rethrow_as(OutOfMemoryError(__FILE__, __LINE__, e.what()), context, stream_task);
  } catch (const std::exception& e) {
    rethrow_as(EnforceError(__FILE__, __LINE__, std::string("unexpected exception: ") + e.what()), context,
               stream_task);
  } catch (...) {
    rethrow_as(EnforceError(__FILE__, __LINE__, "unexpected exception of unknown type"), context, stream_task);
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
