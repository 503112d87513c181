// tests/quadratic_model.h: a model written only with the engine's
// device-dispatched ops (kernels/ops.h, convert), so one implementation runs
// on the CPU and on a GPU: the engine's GPU tests compare a GPU step with a
// CPU step of exactly this model.
//
// Each unit u holds one parameter vector w_u of n_u elements; the loss is
// 0.5 * sum_u |w_u - t_u|^2 with fixed targets t_u (every micro-batch the
// same), so d loss / d w_u = w_u - t_u. Forward u computes d_u = w_u - t_u in
// fp32 (a cast of the params, then an fp32 add of -t_u) and its sum of
// squares; the last forward copies the sums to the host (a pinned slot:
// core/pinned.h), where loss_on's host task adds them in unit order.
// Backward u writes d_u into the gradient buffer.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/pinned.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/ops.h"
#include "models/model.h"

namespace mp::testing {

class QuadraticModel final : public Model {
 public:
  // Units of the given sizes, on `device`; targets t_u[i] = sin(1 + u + 0.37 i).
  QuadraticModel(const std::vector<int64_t>& sizes, Device device) : alloc_(device) {
    for (size_t u = 0; u < sizes.size(); ++u) {
      ParamSpec p{"unit" + std::to_string(u) + ".w", {sizes[u]}, ParamInit{ParamInit::Kind::kNormal, 0.5}};
      spec_.units.push_back(UnitSpec{"unit" + std::to_string(u), {p}});
    }
    std::unique_ptr<Stream> s = Stream::create(device, "quadratic setup");
    for (size_t u = 0; u < sizes.size(); ++u) {
      const int64_t n = sizes[u];
      PinnedBuffer neg(device, static_cast<size_t>(n) * sizeof(float));  // a stream copy's source: pinned
      for (int64_t i = 0; i < n; ++i) neg.as<float>()[i] = -static_cast<float>(std::sin(1.0 + u + 0.37 * i));
      neg_targets_.push_back(Tensor::empty(alloc_, DType::kF32, {n}, MemCategory::kOther));
      diffs_.push_back(Tensor::zeros(alloc_, DType::kF32, {n}, MemCategory::kActivations));
      ops::copy_bytes(neg_targets_.back().data(), device, neg.data(), Device::cpu(), n * 4, *s);
      s->synchronize();  // before `neg` is freed
    }
    slots_ = alloc_.allocate(sizes.size() * sizeof(ops::GradStatsSlot), MemCategory::kOther);
    workspace_ = alloc_.allocate(sizes.size() * static_cast<size_t>(ops::grad_stats_workspace_bytes(device)),
                                 MemCategory::kOther);
    host_slots_ = PinnedBuffer(device, sizes.size() * sizeof(ops::GradStatsSlot));
  }

  const ModelSpec& spec() const override { return spec_; }
  void begin_micro_batch_on(int64_t, Stream&) override {}
  void forward_on(int u, const Tensor& params, Stream& s) override {
    const Tensor& d = diffs_[static_cast<size_t>(u)];
    convert(params.flat(0, d.numel()), d, {}, &s);
    ops::accumulate(d, neg_targets_[static_cast<size_t>(u)], false, s);
    const size_t ws = static_cast<size_t>(ops::grad_stats_workspace_bytes(alloc_.device()));
    ops::grad_stats(d, d.numel(), 1.0f, static_cast<ops::GradStatsSlot*>(slots_.data()) + u,
                    static_cast<char*>(workspace_.data()) + static_cast<size_t>(u) * ws, s);
    if (u == static_cast<int>(diffs_.size()) - 1) {
      ops::copy_bytes(host_slots_.data(), Device::cpu(), slots_.data(), alloc_.device(),
                      static_cast<int64_t>(host_slots_.size_bytes()), s);
    }
  }
  void loss_on(double* loss, Stream& s) override {
    // In stream order, after the last forward's copy of the sums.
    s.host_task(
        [this, loss] {
          double sum = 0;
          const size_t units = host_slots_.size_bytes() / sizeof(ops::GradStatsSlot);
          for (size_t u = 0; u < units; ++u) sum += host_slots_.as<const ops::GradStatsSlot>()[u].sum_sq;
          *loss = 0.5 * sum;
        },
        TaskName{"quadratic loss"});
  }
  void backward_on(int u, const Tensor&, const Tensor& grads, Stream& s) override {
    const Tensor& d = diffs_[static_cast<size_t>(u)];
    convert(d, grads.flat(0, d.numel()), {}, &s);
  }

 private:
  Allocator alloc_;
  ModelSpec spec_;
  std::vector<Tensor> neg_targets_, diffs_;
  Buffer slots_, workspace_;
  PinnedBuffer host_slots_;  // the last forward's copy of slots_, read by loss_on's host task
};

}  // namespace mp::testing
