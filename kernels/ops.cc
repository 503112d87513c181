// The engine's element ops (kernels/ops.h): argument checks, then the CPU
// body submitted to a CpuStream or the CUDA body launched on a CUDA stream.
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/accumulate_math.h"
#include "kernels/convert_math.h"
#include "kernels/cpu/accumulate.h"
#include "kernels/cpu/grad_stats.h"
#include "kernels/cpu/newton_schulz.h"
#include "kernels/cpu/update.h"
#include "kernels/dispatch.h"
#include "kernels/remainder_math.h"
#include "mp/config.h"

#if MP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_stream.h"
#include "core/error_cuda.h"
#include "core/pinned.h"
#include "kernels/cuda/grad_stats_cuda.h"
#include "kernels/cuda/muon_cuda.h"
#include "kernels/cuda/newton_schulz_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/update_cuda.h"
#endif

namespace mp::ops {
namespace {

// Runs the CPU body on the stream's worker, or the CUDA body on the stream
// (Note [Op dispatch] in kernels/dispatch.h), once the memory's device is
// the stream's.
template <class Cpu, class Cuda>
void dispatch(Device device, Stream& stream, const char* op, Cpu&& cpu, Cuda&& cuda,
              OpFamily family = OpFamily::kElementwise) {
#if !MP_WITH_CUDA
  if (!device.is_cpu()) MP_THROW(ConfigError, op, " on ", to_string(device), ": mp was built without CUDA");
#endif
  MP_ENFORCE(stream.device() == device, op, " of ", to_string(device), " memory on ", to_string(stream.device()),
             " stream '", stream.name(), "'");
  OpContext{stream}.run(op, family, std::forward<Cpu>(cpu), std::forward<Cuda>(cuda));
}

bool accumulable(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

void zero(const Tensor& t, Stream& stream) {
  MP_ENFORCE(t.defined(), "zero of an undefined tensor");
  void* p = t.data();
  const size_t bytes = t.size_bytes();
  dispatch(
      t.device(), stream, "zero",
      [p, bytes] {
        if (bytes > 0) std::memset(p, 0, bytes);  // an empty tensor may have no memory
      },
      MP_CUDA_BODY(MP_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, cuda_stream))));
}

void zero_ranges(const Tensor& t, const std::vector<Range>& ranges, Stream& stream) {
  MP_ENFORCE(t.defined(), "zero_ranges of an undefined tensor");
  for (const Range& r : ranges) {
    MP_ENFORCE(0 <= r.begin && r.begin <= r.end && r.end <= t.numel(), "zero_ranges: [", r.begin, ", ", r.end,
               ") is outside ", t.describe());
  }
  char* p = static_cast<char*>(t.data());
  const size_t elem = dtype_size(t.dtype());
  dispatch(
      t.device(), stream, "zero_ranges",
      [p, elem, ranges] {
        for (const Range& r : ranges) {
          if (r.end > r.begin) std::memset(p + r.begin * elem, 0, static_cast<size_t>(r.end - r.begin) * elem);
        }
      },
      MP_CUDA_BODY(
        for (const Range& r : ranges) {
          if (r.end > r.begin) {
            MP_CHECK_CUDA(
                cudaMemsetAsync(p + r.begin * elem, 0, static_cast<size_t>(r.end - r.begin) * elem, cuda_stream));
          }
        }));
}

void fill_nan(const Tensor& t, int64_t n, Stream& stream) {
  MP_ENFORCE(t.defined() && accumulable(t.dtype()) && 0 <= n && n <= t.numel(), "fill_nan of ", n,
             " elements of ", t.defined() ? t.describe() : std::string("an undefined tensor"));
  void* p = t.data();
  const DType dtype = t.dtype();
  dispatch(
      t.device(), stream, "fill_nan",
      [p, dtype, n] {
        if (dtype == DType::kF32) {
          std::fill_n(static_cast<uint32_t*>(p), n, math::kQuietNanF32Bits);
        } else {
          std::fill_n(static_cast<uint16_t*>(p), n, dtype == DType::kBF16 ? math::kQuietNanBf16Bits : math::kQuietNanF16Bits);
        }
      },
      MP_CUDA_BODY(fill_nan_cuda(p, dtype, n, cuda_stream)));
}

void device_fault(Stream& stream) {
  const Device device = stream.device();
  if (device.is_cpu()) {
    MP_THROW(ConfigError, "MP_FAULT device_fault needs a CUDA engine; this one computes on the CPU");
  }
  dispatch(device, stream, "device_fault", [] {}, MP_CUDA_BODY(device_fault_cuda(cuda_stream)));
}

void accumulate(const Tensor& dst, const Tensor& src, bool overwrite, Stream& stream) {
  MP_ENFORCE(dst.defined() && src.defined() && dst.numel() == src.numel() && dst.device() == src.device() &&
                 accumulable(dst.dtype()) && accumulable(src.dtype()),
             "accumulate of ", src.defined() ? src.describe() : "undefined", " into ",
             dst.defined() ? dst.describe() : "undefined", ": same device and element count, fp32, bf16 or fp16");
  void* d = dst.data();
  const void* s = src.data();
  const DType dt = dst.dtype(), st = src.dtype();
  const int64_t n = dst.numel();
  dispatch(
      dst.device(), stream, "accumulate", [=] { accumulate_cpu(d, dt, s, st, n, overwrite); },
      MP_CUDA_BODY(accumulate_cuda(d, dt, s, st, n, overwrite, cuda_stream)));
}

void accumulate_f64(double* acc, Device device, const Tensor& src, int blocks, int64_t n, bool first,
                    Stream& stream) {
  MP_ENFORCE(src.defined() && src.dtype() == DType::kF32 && src.device() == device && blocks >= 0 && n >= 0 &&
                 static_cast<int64_t>(blocks) * n <= src.numel(),
             "accumulate_f64 of ", blocks, " blocks of ", n, " from ", src.defined() ? src.describe() : "undefined",
             " on ", to_string(device));
  const float* s = src.data_as<float>();
  dispatch(
      device, stream, "accumulate_f64",
      [=] {
        if (first && n > 0) std::memset(acc, 0, static_cast<size_t>(n) * sizeof(double));
        accumulate_f64_cpu(acc, s, blocks, n, n);
      },
      MP_CUDA_BODY(accumulate_f64_cuda(acc, s, blocks, n, first, cuda_stream)));
}

void round_f64(const double* acc, const Tensor& out, int64_t n, Stream& stream) {
  MP_ENFORCE(out.defined() && out.dtype() == DType::kF32 && 0 <= n && n <= out.numel(), "round_f64 of ", n,
             " elements into ", out.defined() ? out.describe() : "undefined");
  float* o = out.data_as<float>();
  dispatch(
      out.device(), stream, "round_f64", [=] { round_f64_cpu(acc, o, n); },
      MP_CUDA_BODY(round_f64_cuda(acc, o, n, cuda_stream)));
}

int64_t grad_stats_workspace_bytes(Device device) {
  if (device.is_cpu()) return 0;
#if MP_WITH_CUDA
  return grad_stats_cuda_workspace_bytes();
#else
  MP_THROW(ConfigError, "grad_stats on ", to_string(device), ": mp was built without CUDA");
#endif
}

void grad_stats(const Tensor& grad, int64_t n, float multiplier, GradStatsSlot* out, void* workspace,
                Stream& stream, std::optional<RoundThrough> round) {
  MP_ENFORCE(grad.defined() && 0 <= n && n <= grad.numel() && out != nullptr, "grad_stats of ", n,
             " elements of ", grad.defined() ? grad.describe() : "undefined");
  MP_ENFORCE(!round || (grad.dtype() == DType::kF32 && accumulable(round->through) &&
                        std::isfinite(round->divisor) && round->divisor > 0),
             "grad_stats rounding ", grad.describe(), " through ", round ? dtype_name(round->through) : "",
             ": an fp32 gradient, an fp32, bf16 or fp16 wire, a positive divisor");
  void* g = grad.data();
  const DType dtype = grad.dtype();
  (void)workspace;  // the CUDA body's
  dispatch(
      grad.device(), stream, "grad_stats",
      [=] {
        const GradStats s = round ? grad_stats_round_cpu(static_cast<float*>(g), n, multiplier, round->through,
                                                         round->divisor)
                                  : grad_stats_cpu(g, dtype, n, multiplier);
        out->sum_sq = s.sum_sq;
        out->non_finite = s.non_finite ? 1 : 0;
      },
      MP_CUDA_BODY(
        static_assert(sizeof(GradStatsSlot) == sizeof(DeviceGradStats));
        if (round) {
          float* f = static_cast<float*>(g);
          round_through_cuda(f, f, round->through, round->divisor, n, cuda_stream);
        }
        grad_stats_cuda(g, dtype, n, multiplier, reinterpret_cast<DeviceGradStats*>(out), workspace, cuda_stream)));
}

void fused_update(const UpdateArgs& args, const StepScalars* scalars, Device device, Stream& stream) {
  MP_ENFORCE(scalars != nullptr, "fused_update without step scalars");
  dispatch(
      device, stream, "fused_update", [args, scalars] { fused_update_cpu(args, *scalars); },
      MP_CUDA_BODY(fused_update_cuda(args, scalars, cuda_stream)));
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes, Stream& stream) {
  MP_ENFORCE(bytes >= 0 && (bytes == 0 || (dst != nullptr && src != nullptr)), "copy_bytes of ", bytes, " bytes");
  const Device d = dst_device.is_cuda() ? dst_device : src_device;
  [[maybe_unused]] const std::string stream_name = stream.name();  // for the CUDA body's message
  dispatch(
      d, stream, "copy_bytes",
      [=] {
        if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));  // null pointers allowed then
      },
      MP_CUDA_BODY(
        // core/pinned.h: a pageable host side would block here, unbounded.
        const void* host = dst_device.is_cpu() ? dst : src_device.is_cpu() ? src : nullptr;
        MP_ENFORCE(bytes == 0 || host == nullptr || is_pinned_for(host, d), "copy_bytes of ", bytes, " bytes between ",
                   d, " and pageable host memory on stream '", stream_name,
                   "': stream-ordered copies need pinned host memory (core/pinned.h PinnedBuffer)");
        MP_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, cuda_stream))));
}

// ---- Muon (Note [Muon in the engine] in runtime/muon_exchange.h) -----------

void muon_momentum(const void* grad, DType grad_dtype, float* momentum, float* u, int64_t n, float multiplier,
                   const MuonMomentum& c, Device device, Stream& stream) {
  MP_ENFORCE(accumulable(grad_dtype), "muon_momentum of a ", dtype_name(grad_dtype), " gradient");
  MP_ENFORCE(n >= 0 && (n == 0 || (grad != nullptr && momentum != nullptr && u != nullptr)), "muon_momentum of ", n,
             " elements");
  dispatch(
      device, stream, "muon_momentum",
      [=] {
        dispatch_dtype(grad_dtype, [&](auto tag) {
          using G = decltype(tag);
          const G* g = static_cast<const G*>(grad);
          for (int64_t i = 0; i < n; ++i) {
            const float x = math::to_f32(g[i]);
            u[i] = muon_momentum_element(momentum[i], multiplier == 1.0f ? x : x * multiplier, c);
          }
        });
      },
      MP_CUDA_BODY(muon_momentum_cuda(grad, grad_dtype, momentum, u, n, multiplier, c, cuda_stream)));
}

void muon_apply(float* master, int16_t* remainder, void* param_out, DType param_dtype, const float* o, int64_t n,
                const MuonApply& c, Device device, Stream& stream) {
  MP_ENFORCE(n >= 0 && (n == 0 || o != nullptr), "muon_apply of ", n, " elements");
  MP_ENFORCE(master != nullptr ? accumulable(param_dtype)
                               : remainder != nullptr && param_out != nullptr && param_dtype == DType::kBF16,
             "muon_apply: an fp32 master, or bf16 params with their remainders");
  dispatch(
      device, stream, "muon_apply",
      [=] {
        if (master == nullptr) {
          uint16_t* h = static_cast<uint16_t*>(param_out);
          for (int64_t i = 0; i < n; ++i) {
            const math::Bf16Remainder split =
                math::split_bf16_remainder(muon_apply_element(math::merge_bf16_remainder(h[i], remainder[i]), o[i], c));
            h[i] = split.h;
            remainder[i] = split.r;
          }
          return;
        }
        for (int64_t i = 0; i < n; ++i) master[i] = muon_apply_element(master[i], o[i], c);
        if (param_out == nullptr) return;
        dispatch_dtype(param_dtype, [&](auto tag) {
          using P = decltype(tag);
          if constexpr (std::is_same_v<P, float> || std::is_same_v<P, bf16> || std::is_same_v<P, fp16>) {
            P* out = static_cast<P*>(param_out);
            for (int64_t i = 0; i < n; ++i) out[i] = math::from_f32<P>(master[i]);
          }
        });
      },
      MP_CUDA_BODY(muon_apply_cuda(master, remainder, param_out, param_dtype, o, n, c, cuda_stream)));
}

int64_t newton_schulz_scratch_bytes(int64_t rows, int64_t cols, const NewtonSchulzOptions& options, Device device) {
#if MP_WITH_CUDA
  if (device.is_cuda()) return newton_schulz_cuda_scratch_bytes(rows, cols, options);
#endif
  (void)device;
  return newton_schulz_scratch_elements(rows, cols, options) * static_cast<int64_t>(sizeof(float));
}

void newton_schulz(const float* g, float* out, int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                   void* scratch, int64_t scratch_bytes, Device device, Stream& stream) {
  MP_ENFORCE(scratch_bytes >= newton_schulz_scratch_bytes(rows, cols, options, device), "newton_schulz: scratch of ",
             scratch_bytes, " bytes for a [", rows, ", ", cols, "] matrix");
  dispatch(
      device, stream, "newton_schulz",
      [=] {
        newton_schulz_cpu(g, out, rows, cols, options, static_cast<float*>(scratch),
                          scratch_bytes / static_cast<int64_t>(sizeof(float)));
      },
      MP_CUDA_BODY(newton_schulz_cuda(g, out, rows, cols, options, scratch, scratch_bytes, cuda_stream)),
      OpFamily::kGemm);  // the op profile counts its products with the GEMMs
}

}  // namespace mp::ops
