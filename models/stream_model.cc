#include "models/stream_model.h"

#include "core/error.h"

namespace mp {

Stream& StreamModel::direct_stream() const {
  MP_ENFORCE(device().is_cpu(), name_, "'s direct calls run on the CPU; this one computes on ", device());
  if (!direct_) {
    direct_ = std::make_unique<CpuStream>(std::string(name_) + " direct");
    direct_loss_ = PinnedBuffer(Device::cpu(), sizeof(double));
  }
  return *direct_;
}

void StreamModel::begin_micro_batch(int64_t global_index) {
  Stream& s = direct_stream();
  begin_micro_batch_on(global_index, s);
  s.synchronize();
}

void StreamModel::forward(int unit, const Tensor& params) {
  Stream& s = direct_stream();
  forward_on(unit, params, s);
  s.synchronize();
}

double StreamModel::loss() const {
  Stream& s = direct_stream();
  enqueue_loss(direct_loss_.as<double>(), s);
  s.synchronize();
  return *direct_loss_.as<double>();
}

void StreamModel::recompute(int unit, const Tensor& params) {
  Stream& s = direct_stream();
  recompute_on(unit, params, s);
  s.synchronize();
}

void StreamModel::backward(int unit, const Tensor& params, const Tensor& grads) {
  Stream& s = direct_stream();
  backward_on(unit, params, grads, s);
  s.synchronize();
}

}  // namespace mp
