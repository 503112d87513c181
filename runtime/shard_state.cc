#include "runtime/shard_state.h"

#include "runtime/engine_impl.h"

namespace mp {

Communicator& ShardStateView::world() const { return impl_->world(); }
const EngineOptions& ShardStateView::options() const { return impl_->options(); }
const FlatLayout& ShardStateView::layout() const { return impl_->layout(); }
Optimizer& ShardStateView::optimizer() const { return impl_->optimizer(); }
int ShardStateView::replicate_rank() const { return impl_->mesh().replicate->rank(); }
int ShardStateView::replicate_size() const { return impl_->mesh().replicate->size(); }

int64_t ShardStateView::shard_begin(int unit) const { return impl_->unit(unit).offset(); }
int64_t ShardStateView::shard_numel(int unit) const { return impl_->unit(unit).n(); }
std::vector<ShardField> ShardStateView::fields(int unit) const { return impl_->unit(unit).fields(); }

int64_t ShardStateView::steps_run() const { return impl_->steps_run(); }
void ShardStateView::set_steps_run(int64_t steps) { impl_->set_steps_run(steps); }
void ShardStateView::replaced() { impl_->state_replaced(); }

ShardStateView Engine::shard_state() { return ShardStateView(*impl_); }

}  // namespace mp
