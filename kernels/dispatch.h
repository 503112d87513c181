// kernels/dispatch.h: one op on a stream, with its CPU body and its CUDA
// body side by side. The engine's ops (kernels/ops.h) and the models' layer
// ops (kernels/nn/) are written this way, so a model or the engine is one
// body of logic for both devices and only the bodies differ:
//
//   cx.run("layernorm forward", OpFamily::kLayerNorm,
//          [=] { gpt_layernorm_forward(x, w, b, rows, c, y, mean, rstd, cx.threads); },
//          MP_CUDA_BODY(gpt_layernorm_forward_cuda(x, w, b, rows, c, y, mean, rstd, cuda_stream)));
//
// Note [Op dispatch]
// - On a CPU stream the CPU body is submitted to the stream's worker
//   (CpuStream::submit; a model gathers each call's ops in a CpuOpBatch,
//   one task per call) and runs there later, in order: the host thread
//   that enqueued it has moved on (Note [Host runs ahead] in
//   models/model.h), so a body captures what it reads by value when it is
//   enqueued. On a CUDA stream the CUDA body launches its kernels on the
//   stream at once, from the host thread; MP_CUDA_BODY(code) is a lambda of
//   `cuda_stream` (the cudaStream_t) in CUDA builds and nullptr otherwise,
//   where an op on a CUDA stream is a ConfigError.
// - Failure: a CPU body that throws fails its stream with its error, named
//   "op 'NAME' of unit 'UNIT' on stream 'S'" (Note [Stream and event
//   semantics] in core/stream.h); the engine rethrows it at its next call.
//   A CUDA body's launch errors throw at once; with MP_CUDA_SYNC=1
//   (core/device.h) the host synchronises after every op, so a device fault
//   throws CudaError naming the op and unit instead of surfacing later.
// - Op profile (kernels/op_profile.h): a model's op (OpContext::profiled)
//   counts its time in its family: on the CPU the body's wall time on the
//   worker; on a GPU the time between CUDA events recorded around it by the
//   context's OpTimer, added at OpTimer::flush().
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/stream.h"
#include "kernels/op_profile.h"
#include "mp/config.h"

struct CUstream_st;

namespace mp {

using CudaStreamHandle = CUstream_st*;  // cudaStream_t, without the CUDA headers

// CUDA event pairs around a model's ops while the op profile is on (Note
// [Op dispatch]). One per model; not thread-safe. Without CUDA, or with the
// profile off, it records nothing.
class OpTimer {
 public:
  OpTimer();
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  // Waits for the recorded ops and adds their times to the op profile.
  void flush();

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// A model call's CPU ops, submitted to the stream as one task that runs
// them in order: the stream's worker wakes once per call rather than once
// per op (small models' ops take microseconds). Each op keeps its own name
// in errors and its family in the profile; the first that throws ends the
// task and fails the stream (Note [Op dispatch]).
class CpuOpBatch {
 public:
  CpuOpBatch() = default;
  CpuOpBatch(const CpuOpBatch&) = delete;
  CpuOpBatch& operator=(const CpuOpBatch&) = delete;
  void add(TaskName name, OpFamily family, bool profiled, std::function<void()> body);
  // Submits the ops added so far to `stream` (a CpuStream) as one task, in
  // order, and empties the batch; nothing when it is empty.
  void submit(Stream& stream);

 private:
  struct Op {
    TaskName name;
    OpFamily family;
    bool profiled;
    std::function<void()> body;
  };
  std::vector<Op> ops_;
};

// Where and how ops run: the stream, the CPU bodies' threads, and for a
// model's ops the unit they compute and whether they count in the profile.
struct OpContext {
  Stream& stream;
  int threads = 0;             // CPU bodies' threads; 0: default_cpu_threads()
  const char* unit = nullptr;  // the model unit, named in errors; must outlive the ops
  bool profiled = false;       // a model's op: counts in the op profile
  OpTimer* timer = nullptr;    // device op times while profiling (may be null)
  CpuOpBatch* batch = nullptr; // CPU: collect the ops into this batch (its owner submits it)

  Device device() const { return stream.device(); }
  bool on_cpu() const { return stream.device().is_cpu(); }

  // Enqueues op `name` of `family` (Note [Op dispatch]).
  template <class Cpu, class Cuda>
  void run(const char* name, OpFamily family, Cpu&& cpu, Cuda&& cuda) const;
};

namespace detail {
void submit_cpu_op(const OpContext& cx, const char* name, OpFamily family, std::function<void()> body);
// A CUDA op under way: its stream and, while profiling, its start event.
struct CudaOpMark {
  CudaStreamHandle stream = nullptr;
  void* start = nullptr;  // cudaEvent_t
};
CudaOpMark begin_cuda_op(const OpContext& cx);
void end_cuda_op(const OpContext& cx, const char* name, OpFamily family, const CudaOpMark& mark);
[[noreturn]] void op_without_cuda(const OpContext& cx, const char* name);
}  // namespace detail

template <class Cpu, class Cuda>
void OpContext::run(const char* name, OpFamily family, Cpu&& cpu, Cuda&& cuda) const {
  detail::count_op(profiled);  // Note [Op count] in kernels/op_profile.h
  if (on_cpu()) {
    detail::submit_cpu_op(*this, name, family, std::forward<Cpu>(cpu));
    return;
  }
  if constexpr (std::is_null_pointer_v<std::decay_t<Cuda>>) {
    detail::op_without_cuda(*this, name);
  } else {
    const detail::CudaOpMark mark = detail::begin_cuda_op(*this);
    cuda(mark.stream);
    detail::end_cuda_op(*this, name, family, mark);
  }
}

}  // namespace mp

#if MP_WITH_CUDA
#define MP_CUDA_BODY(...) [=](::mp::CudaStreamHandle cuda_stream) { __VA_ARGS__; }
#else
#define MP_CUDA_BODY(...) nullptr
#endif
