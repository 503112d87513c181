// Op dispatch (kernels/dispatch.h): the CPU submission with its error name
// and profile scope, the CUDA launch's checks, timing and MP_CUDA_SYNC.
#include "kernels/dispatch.h"

#include <vector>

#include "core/error.h"
#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#endif

namespace mp {

// ---- OpTimer -----------------------------------------------------------------

#if MP_WITH_CUDA
struct OpTimer::Impl {
  struct Timed {
    OpFamily family;
    cudaEvent_t start, end;
  };
  std::vector<Timed> pending;
  std::vector<cudaEvent_t> free_events, used_events;

  cudaEvent_t take() {
    if (free_events.empty()) {
      cudaEvent_t e = nullptr;
      MP_CHECK_CUDA(cudaEventCreate(&e));  // timed
      free_events.push_back(e);
    }
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    used_events.push_back(e);
    return e;
  }
  ~Impl() {
    for (const auto* events : {&free_events, &used_events}) {
      for (cudaEvent_t e : *events) (void)cudaEventDestroy(e);
    }
  }
};
#else
struct OpTimer::Impl {};
#endif

OpTimer::OpTimer() : impl_(std::make_unique<Impl>()) {}
OpTimer::~OpTimer() = default;

void OpTimer::flush() {
#if MP_WITH_CUDA
  for (const Impl::Timed& t : impl_->pending) {
    // Bounded (Note [Bounded host waits] in core/host_wait.h); after a run
    // the ops have long finished.
    synchronize_event(t.end, kDefaultWaitTimeout, "the end event of a profiled op");
    float ms = 0;
    MP_CHECK_CUDA(cudaEventElapsedTime(&ms, t.start, t.end));
    detail::op_profile_add(t.family, ms / 1e3);
  }
  impl_->pending.clear();
  impl_->free_events.insert(impl_->free_events.end(), impl_->used_events.begin(), impl_->used_events.end());
  impl_->used_events.clear();
#endif
}

// ---- CpuOpBatch -------------------------------------------------------------

void CpuOpBatch::add(TaskName name, OpFamily family, bool profiled, std::function<void()> body) {
  ops_.push_back(Op{name, family, profiled, std::move(body)});
}

void CpuOpBatch::submit(Stream& stream) {
  if (ops_.empty()) return;
  auto* cpu = dynamic_cast<CpuStream*>(&stream);
  MP_ENFORCE(cpu != nullptr, "a batch of CPU ops on stream '", stream.name(), "' of another kind");
  cpu->submit(
      [ops = std::move(ops_), name = stream.name()] {
        for (const Op& op : ops) {
          try {
            if (op.profiled) {
              ModelCallScope call;  // Note [Op profile]: a model's compute
              ScopedOp timed(op.family);
              op.body();
            } else {
              op.body();
            }
          } catch (...) {
            std::rethrow_exception(task_error(std::current_exception(), op.name, name));
          }
        }
      },
      TaskName{"batch of model ops"});
  ops_.clear();
}

namespace detail {

// ---- CPU ---------------------------------------------------------------------

void submit_cpu_op(const OpContext& cx, const char* name, OpFamily family, std::function<void()> body) {
  auto* cpu = dynamic_cast<CpuStream*>(&cx.stream);
  MP_ENFORCE(cpu != nullptr, "op ", name, " on CPU stream '", cx.stream.name(), "' of another kind");
  if (cx.batch != nullptr) {
    cx.batch->add(TaskName{name, cx.unit}, family, cx.profiled, std::move(body));
    return;
  }
  CpuOpBatch one;  // a task of its own
  one.add(TaskName{name, cx.unit}, family, cx.profiled, std::move(body));
  one.submit(*cpu);
}

[[noreturn]] void op_without_cuda(const OpContext& cx, const char* name) {
  MP_THROW(ConfigError, "op ", name, " on ", cx.device(), ": mp was built without CUDA");
}

// ---- CUDA --------------------------------------------------------------------

#if MP_WITH_CUDA

namespace {
bool timing(const OpContext& cx) { return cx.profiled && cx.timer != nullptr && op_profile_enabled(); }
}  // namespace

CudaOpMark begin_cuda_op(const OpContext& cx) {
  CudaOpMark mark{cuda_handle(&cx.stream), nullptr};
  if (timing(cx)) {
    cudaEvent_t start = cx.timer->impl()->take();
    MP_CHECK_CUDA(cudaEventRecord(start, mark.stream));
    mark.start = start;
  }
  return mark;
}

void end_cuda_op(const OpContext& cx, const char* name, OpFamily family, const CudaOpMark& mark) {
  if (mark.start != nullptr) {
    cudaEvent_t end = cx.timer->impl()->take();
    MP_CHECK_CUDA(cudaEventRecord(end, mark.stream));
    cx.timer->impl()->pending.push_back(OpTimer::Impl::Timed{family, static_cast<cudaEvent_t>(mark.start), end});
  }
  if (!cuda_sync_each_op()) return;
  // Bounded by the stream's wait timeout (Note [Bounded host waits] in core/host_wait.h).
  const auto* cuda = dynamic_cast<const CudaStream*>(&cx.stream);
  const std::chrono::milliseconds timeout = cuda != nullptr ? cuda->wait_timeout() : kDefaultWaitTimeout;
  const cudaError_t err = query_stream_until(mark.stream, timeout);
  if (err == cudaErrorNotReady) {
    abandon_cpu_streams();
    MP_THROW(CudaError, "op ", name, cx.unit != nullptr ? " of unit " : "", cx.unit != nullptr ? cx.unit : "", " on ",
             cx.device(), " did not finish within ", seconds_text(timeout), " s (MP_CUDA_SYNC waits after every op)");
  }
  if (err != cudaSuccess) {
    MP_THROW(CudaError, "op ", name, cx.unit != nullptr ? " of unit " : "", cx.unit != nullptr ? cx.unit : "", " on ",
             cx.device(), " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
}

#else

CudaOpMark begin_cuda_op(const OpContext& cx) { op_without_cuda(cx, "a CUDA op"); }
void end_cuda_op(const OpContext& cx, const char* name, OpFamily, const CudaOpMark&) { op_without_cuda(cx, name); }

#endif

}  // namespace detail
}  // namespace mp
