// kernels/ops.h: the engine's element ops, one function per op, each with a
// CPU body and a CUDA body picked by the device of its memory (Note [Op
// dispatch] in kernels/dispatch.h; the models' ops are kernels/nn/, casts
// are convert, kernels/convert.h). The engine calls only these and
// convert, so it has no device branches.
//
// Every op is asynchronous on `stream`, in order with the stream's other
// work: for CPU memory `stream` is a CpuStream and the body is submitted to
// its worker; for CUDA memory it is a CUDA stream on that device and the body
// is a kernel (or cudaMemsetAsync/cudaMemcpyAsync) launched on it. Arguments
// are checked at the call (EnforceError); a CPU body's failure fails its
// stream, named by the op (Note [Stream and event semantics] in
// core/stream.h), a CUDA body's surfaces from later CUDA calls (at once,
// naming the op, with MP_CUDA_SYNC=1). Pointers and tensors must stay
// valid until the op has run (record an event after it and wait for that).
// CPU and CUDA bodies share their element math (*_math.h), so they give the
// same bits.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/muon_math.h"
#include "kernels/newton_schulz.h"
#include "kernels/update_math.h"

namespace mp {

struct UpdateArgs;

namespace ops {

// Every byte of `t` set to 0.
void zero(const Tensor& t, Stream& stream);

// Elements [begin, end) of `t`, for each range, set to 0 (the alignment gaps
// and padding of a gradient buffer). Ranges within t, in any order.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};
void zero_ranges(const Tensor& t, const std::vector<Range>& ranges, Stream& stream);

// The first `n` elements of `t` (fp32, bf16 or fp16) set to a quiet NaN:
// MP_FAULT's nan fault (runtime/fault.h).
void fill_nan(const Tensor& t, int64_t n, Stream& stream);

// MP_FAULT's device_fault (runtime/fault.h): a kernel on `stream` that
// writes outside any allocation, so the device reports an illegal memory
// access (asynchronously; at once with MP_CUDA_SYNC=1, naming this op, as
// for every op here). ConfigError on a CPU stream: the fault is a device's.
void device_fault(Stream& stream);

// dst[i] = round(dst[i] + src[i]), or round(src[i]) with overwrite: the sum
// in fp32, rounded to nearest-even into dst's dtype (fp32, bf16, fp16; src
// the same or fp32). Same element count and device. accumulate_cpu's math.
void accumulate(const Tensor& dst, const Tensor& src, bool overwrite, Stream& stream);

// Deterministic fp64 accumulation: acc[i] (+)= src[k * n + i] for
// k = 0 .. blocks-1 in that order, each addition exact in fp64; with
// `first` acc starts from 0. acc: n doubles in `device` memory; src: fp32,
// at least blocks * n elements, on the same device.
void accumulate_f64(double* acc, Device device, const Tensor& src, int blocks, int64_t n, bool first,
                    Stream& stream);
// out[i] = (float)acc[i], rounded to nearest-even; out fp32 [n] on acc's device.
void round_f64(const double* acc, const Tensor& out, int64_t n, Stream& stream);

// The statistics of one gradient shard (kernels/cpu/grad_stats.h): the
// fp64 sum of squares of grad x multiplier and whether any element is NaN
// or Inf, written to *out in grad's device memory (no host sync).
struct GradStatsSlot {
  double sum_sq = 0.0;
  int32_t non_finite = 0;  // 0 or 1
  int32_t pad_ = 0;
};
// Scratch bytes grad_stats needs on `device` (0 on the CPU): allocate once,
// pass to every call on one stream.
int64_t grad_stats_workspace_bytes(Device device);
// With `round`, grad (fp32) is first rounded in place, in the same pass:
// grad[i] = (float) round(grad[i] / divisor) into `through` (fp32, bf16 or
// fp16, nearest-even; convert()'s element math), widened back exactly. That
// is what a reduction over one rank in the `through` wire dtype with fp32
// accumulation leaves: the engine's local path and its statistics in one
// read (Note [Gradient reduction] in runtime/grad_reducer.h).
struct RoundThrough {
  DType through = DType::kF32;
  double divisor = 1.0;
};
void grad_stats(const Tensor& grad, int64_t n, float multiplier, GradStatsSlot* out, void* workspace,
                Stream& stream, std::optional<RoundThrough> round = std::nullopt);

// The fused optimizer step (kernels/cpu/update.h, kernels/cuda/update_cuda.h)
// on `device`: every pointer in args, the range table included, and
// `scalars` are that device's memory; the body reads *scalars when it runs,
// so they may be written on the stream before it (found_inf: no-op).
void fused_update(const UpdateArgs& args, const StepScalars* scalars, Device device, Stream& stream);

// Copies `bytes` bytes between any two devices' memory in stream order
// (host memory given as Device::cpu()). CPU to CPU: on the CpuStream; any
// CUDA side: cudaMemcpyAsync on the CUDA stream; host memory must then be
// pinned (EnforceError otherwise: core/pinned.h).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes, Stream& stream);

// Muon's parts on `device` (Note [Muon in the engine] in
// runtime/muon_exchange.h), every pointer that device's memory:
// u[i] = muon_momentum_element(momentum[i], grad[i] widened, times
// multiplier unless 1) for an fp32, bf16 or fp16 gradient;
void muon_momentum(const void* grad, DType grad_dtype, float* momentum, float* u, int64_t n, float multiplier,
                   const MuonMomentum& c, Device device, Stream& stream);
// the master's elements p = muon_apply_element(p, o[i]): the fp32 `master`,
// with param_out (null: none) then written in param_dtype, rounded to
// nearest; or, master null, the bf16 params in param_out with `remainder`;
void muon_apply(float* master, int16_t* remainder, void* param_out, DType param_dtype, const float* o, int64_t n,
                const MuonApply& c, Device device, Stream& stream);
// out = NS(g), [rows, cols] fp32 (may alias) (kernels/cpu/newton_schulz.h,
// kernels/cuda/newton_schulz_cuda.h), with scratch of
// newton_schulz_scratch_bytes for the device.
int64_t newton_schulz_scratch_bytes(int64_t rows, int64_t cols, const NewtonSchulzOptions& options, Device device);
void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                   void* scratch, int64_t scratch_bytes, Device device, Stream& stream);

}  // namespace ops
}  // namespace mp
