// kernels/op_profile.h: where a model's compute time goes, by op family:
// the profile `mp_bench gpt` and MP_OP_PROFILE=1 print (Note [Op profile]).
//
// Note [Op profile]
// Off unless op_profile_enable(true). When on, on the CPU a ScopedOp
// around every model op (kernels/dispatch.h opens one, in its family, on
// the stream's worker, inside a ModelCallScope; HostModel opens a
// ModelCallScope around each host body, where gemm_cpu's and the loops'
// own ScopedOps count) adds its wall time to its family, but only on a
// thread inside a model call and only for the outermost scope, so that a
// GEMM inside another timed op is not counted twice and casts on the
// communication thread do not count as compute. On a GPU the model's ops
// are timed between CUDA events (OpTimer in kernels/dispatch.h) and added
// by op_profile_add when the model flushes them. op_profile_take() returns
// the totals since the last take and resets them. Off, a scope costs one
// relaxed atomic load.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace mp {

enum class OpFamily : uint8_t {
  kGemm = 0,      // gemm_cpu: every matmul, the lm head included
  kLayerNorm,
  kAttention,     // scores, softmax and the weighted sum (not the projections)
  kGelu,
  kSoftmaxXent,   // the loss and d logits
  kEmbedding,
  kCast,          // fp32 <-> bf16 roundings for the GEMMs
  kElementwise,   // residual adds, bias gradients, copies and fills
  kCount
};
inline constexpr int kNumOpFamilies = static_cast<int>(OpFamily::kCount);

std::string_view op_family_name(OpFamily f);  // "gemm", "layernorm", ...

struct OpProfile {
  std::array<double, kNumOpFamilies> seconds{};
  std::array<int64_t, kNumOpFamilies> calls{};
  double total_s() const;
};

void op_profile_enable(bool on);
bool op_profile_enabled();

// Note [Op count]
// Every op enqueued on a stream counts one, profile on or off (a relaxed
// atomic add): a model's ops (kernels/nn/, OpContext::profiled) and the
// engine's (kernels/ops.h, convert onto a stream). On a GPU each is one
// kernel launch, library call (a cuBLASLt matmul, a cuDNN graph) or copy,
// but for the fallbacks that say they launch more (a GEMM form with
// kernels after the product, attention on fp32 copies). The count of one
// training step is what the run log and mp_bench report as ops per step.
struct OpCount {
  int64_t model = 0, engine = 0;
  int64_t total() const { return model + engine; }
};
// The counts since the last take (every thread), then zero.
OpCount op_count_take();
// The totals since the last take (every thread), then zero.
OpProfile op_profile_take();

namespace detail {
extern std::atomic<bool> g_op_profile_on;
extern std::atomic<int64_t> g_model_ops, g_engine_ops;
inline void count_op(bool model) { (model ? g_model_ops : g_engine_ops).fetch_add(1, std::memory_order_relaxed); }
void op_profile_add(OpFamily f, double seconds);
struct OpProfileThread {
  int model_calls = 0;  // ModelCallScope depth
  int ops = 0;          // ScopedOp depth
};
OpProfileThread& op_profile_thread();
}  // namespace detail

// Marks the calling thread as computing a model call for its lifetime.
class ModelCallScope {
 public:
  ModelCallScope() {
    if (detail::g_op_profile_on.load(std::memory_order_relaxed)) {
      t_ = &detail::op_profile_thread();
      ++t_->model_calls;
    }
  }
  ~ModelCallScope() {
    if (t_ != nullptr) --t_->model_calls;
  }
  ModelCallScope(const ModelCallScope&) = delete;
  ModelCallScope& operator=(const ModelCallScope&) = delete;

 private:
  detail::OpProfileThread* t_ = nullptr;
};

// Times the enclosing op as family `f` (Note [Op profile]).
class ScopedOp {
 public:
  explicit ScopedOp(OpFamily f) {
    if (!detail::g_op_profile_on.load(std::memory_order_relaxed)) return;
    detail::OpProfileThread& t = detail::op_profile_thread();
    if (t.model_calls == 0 || t.ops++ > 0) {
      if (t.model_calls > 0) t_ = &t;  // nested: only keeps the depth
      return;
    }
    t_ = &t;
    family_ = f;
    timing_ = true;
    start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOp() {
    if (t_ == nullptr) return;
    --t_->ops;
    if (timing_) {
      detail::op_profile_add(family_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }
  ScopedOp(const ScopedOp&) = delete;
  ScopedOp& operator=(const ScopedOp&) = delete;

 private:
  detail::OpProfileThread* t_ = nullptr;
  OpFamily family_ = OpFamily::kGemm;
  bool timing_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mp
