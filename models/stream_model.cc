#include "models/stream_model.h"

#include "core/error.h"

namespace mp {

void StreamModel::check_stream(const Stream& s) const {
  if (s.device() != device()) {
    MP_THROW(ConfigError, noun_, " computes on ", device(), " (its allocator's device), but stream '", s.name(),
             "' runs on ", s.device(), ": give the model the engine's allocator");
  }
}

void StreamModel::unit_ops(Stream& s, const UnitLayout& unit, int threads, OpTimer* timer,
                           const std::function<void(const OpContext&)>& body) const {
  check_stream(s);
  CpuOpBatch batch;  // the call's CPU ops, one task
  body(OpContext{s, threads, unit.name.c_str(), /*profiled=*/true, timer, &batch});
  batch.submit(s);
}

void StreamModel::check_params(const Tensor& params, const UnitLayout& unit) const {
  MP_ENFORCE(params.defined() && params.device() == device() && params.shape().size() == 1 &&
                 params.numel() >= unit.numel,
             "parameters of unit ", unit.name, " (", unit.numel, " elements on ", device(), "): got ",
             params.defined() ? params.describe() : std::string("none"));
  const DType dtype = params.dtype();
  MP_ENFORCE(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, "parameters of unit ", unit.name,
             " in ", dtype_name(dtype), ": need fp32, bf16 or fp16");
}

void StreamModel::check_grads(const Tensor& grads, const UnitLayout& unit) const {
  MP_ENFORCE(grads.defined() && grads.device() == device() && grads.dtype() == DType::kF32 &&
                 grads.shape().size() == 1 && grads.numel() >= unit.numel,
             "gradients of unit ", unit.name, " (fp32, ", unit.numel, " elements on ", device(), "): got ",
             grads.defined() ? grads.describe() : std::string("none"));
}

void StreamModel::direct(const std::function<void(Stream&)>& call) const {
  MP_ENFORCE(device().is_cpu(), name_, "'s direct calls run on the CPU; this one computes on ", device());
  if (!direct_) {
    direct_ = std::make_unique<CpuStream>(std::string(name_) + " direct");
    direct_loss_ = PinnedBuffer(Device::cpu(), sizeof(double));
  }
  call(*direct_);
  direct_->synchronize();
}

void StreamModel::begin_micro_batch(int64_t global_index) {
  direct([&](Stream& s) { begin_micro_batch_on(global_index, s); });
}

void StreamModel::forward(int unit, const Tensor& params) {
  direct([&](Stream& s) { forward_on(unit, params, s); });
}

double StreamModel::loss() const {
  direct([&](Stream& s) { enqueue_loss(direct_loss_.as<double>(), s); });
  return *direct_loss_.as<double>();
}

void StreamModel::recompute(int unit, const Tensor& params) {
  direct([&](Stream& s) { recompute_on(unit, params, s); });
}

void StreamModel::backward(int unit, const Tensor& params, const Tensor& grads) {
  direct([&](Stream& s) { backward_on(unit, params, grads, s); });
}

}  // namespace mp
