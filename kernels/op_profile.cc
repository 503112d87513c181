#include "kernels/op_profile.h"

#include <mutex>

namespace mp {
namespace detail {

std::atomic<bool> g_op_profile_on{false};
std::atomic<int64_t> g_model_ops{0}, g_engine_ops{0};

namespace {
std::mutex g_mu;
OpProfile g_profile;
}  // namespace

void op_profile_add(OpFamily f, double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_profile.seconds[static_cast<size_t>(f)] += seconds;
  ++g_profile.calls[static_cast<size_t>(f)];
}

OpProfileThread& op_profile_thread() {
  thread_local OpProfileThread t;
  return t;
}

}  // namespace detail

std::string_view op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::kGemm: return "gemm";
    case OpFamily::kLayerNorm: return "layernorm";
    case OpFamily::kAttention: return "attention";
    case OpFamily::kGelu: return "gelu";
    case OpFamily::kSoftmaxXent: return "softmax_xent";
    case OpFamily::kEmbedding: return "embedding";
    case OpFamily::kCast: return "cast";
    case OpFamily::kElementwise: return "elementwise";
    case OpFamily::kCount: break;
  }
  return "?";
}

double OpProfile::total_s() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

void op_profile_enable(bool on) { detail::g_op_profile_on.store(on, std::memory_order_relaxed); }
bool op_profile_enabled() { return detail::g_op_profile_on.load(std::memory_order_relaxed); }

OpCount op_count_take() {
  return OpCount{detail::g_model_ops.exchange(0, std::memory_order_relaxed),
                 detail::g_engine_ops.exchange(0, std::memory_order_relaxed)};
}

OpProfile op_profile_take() {
  std::lock_guard<std::mutex> lock(detail::g_mu);
  OpProfile p = detail::g_profile;
  detail::g_profile = OpProfile{};
  return p;
}

}  // namespace mp
