#include "runtime/shard_state.h"

#include "core/error.h"
#include "runtime/engine_impl.h"
#include "runtime/host_staging.h"

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

char* ShardStateView::field_data(int unit, int field, int64_t begin) const {
  const std::vector<ShardField> f = fields(unit);
  MP_ENFORCE(field >= 0 && field < static_cast<int>(f.size()), "unit ", unit, " has no field ", field);
  MP_ENFORCE(begin >= 0 && begin <= shard_numel(unit), "element ", begin, " of a shard of ", shard_numel(unit));
  return f[static_cast<size_t>(field)].device_data + begin * f[static_cast<size_t>(field)].element_bytes;
}

const char* ShardStateView::read(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) const {
  MP_ENFORCE(count >= 0 && begin + count <= shard_numel(unit), "elements [", begin, ", ", begin + count,
             ") of a shard of ", shard_numel(unit));
  const int64_t bytes = count * fields(unit)[static_cast<size_t>(field)].element_bytes;
  return static_cast<const char*>(
      host_view(field_data(unit, field, begin), impl_->allocator().device(), bytes, impl_->compute(), staging));
}

char* ShardStateView::write_target(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) {
  MP_ENFORCE(count >= 0 && begin + count <= shard_numel(unit), "elements [", begin, ", ", begin + count,
             ") of a shard of ", shard_numel(unit));
  const int64_t bytes = count * fields(unit)[static_cast<size_t>(field)].element_bytes;
  impl_->synchronize();  // nothing still reads or writes the state (gathers on the communication streams too)
  return static_cast<char*>(
      host_target(field_data(unit, field, begin), impl_->allocator().device(), bytes, impl_->compute(), staging));
}

void ShardStateView::commit_write(int unit, int field, int64_t begin, std::vector<char>& staging) {
  commit_host_write(field_data(unit, field, begin), impl_->allocator().device(), staging, impl_->compute());
}

int64_t ShardStateView::steps_run() const { return impl_->steps_run(); }
void ShardStateView::set_steps_run(int64_t steps) { impl_->set_steps_run(steps); }
void ShardStateView::replaced() { impl_->state_replaced(); }

ShardStateView Engine::shard_state() { return ShardStateView(*impl_); }

}  // namespace mp
