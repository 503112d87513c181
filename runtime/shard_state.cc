#include "runtime/shard_state.h"

#include "runtime/engine_impl.h"

namespace mp {
namespace {

std::string dtype_label(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    default: return std::string(dtype_name(t));
  }
}

}  // namespace

Communicator& ShardStateView::world() const { return impl_->world; }
const EngineOptions& ShardStateView::options() const { return impl_->o; }
const FlatLayout& ShardStateView::layout() const { return impl_->layout; }
Optimizer& ShardStateView::optimizer() const { return *impl_->opt; }
int ShardStateView::replicate_rank() const { return impl_->mesh.replicate->rank(); }
int ShardStateView::replicate_size() const { return impl_->mesh.replicate->size(); }

int64_t ShardStateView::shard_begin(int unit) const { return impl_->units.at(static_cast<size_t>(unit)).offset; }
int64_t ShardStateView::shard_numel(int unit) const { return impl_->units.at(static_cast<size_t>(unit)).n; }

std::vector<ShardField> ShardStateView::fields(int unit) const {
  const EngineUnit& eu = impl_->units.at(static_cast<size_t>(unit));
  std::vector<ShardField> f;
  auto add = [&](const char* name, const Tensor& t) {
    if (!t.defined()) return;
    f.push_back(ShardField{name, dtype_label(t.dtype()), static_cast<int64_t>(dtype_size(t.dtype())),
                           static_cast<char*>(t.data())});
  };
  add("master", eu.master);
  add("param", eu.param_shard);
  if (eu.remainder.data() != nullptr) f.push_back(ShardField{"remainder", "int16", 2, static_cast<char*>(eu.remainder.data())});
  add("state0", eu.state0);
  add("state1", eu.state1);
  return f;
}

int64_t ShardStateView::steps_run() const { return impl_->steps_run; }
void ShardStateView::set_steps_run(int64_t steps) { impl_->steps_run = steps; }
void ShardStateView::replaced() { impl_->state_replaced(); }

ShardStateView Engine::shard_state() { return ShardStateView(*impl_); }

}  // namespace mp
