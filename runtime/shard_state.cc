#include "runtime/shard_state.h"

#include "core/error.h"
#include "kernels/ops.h"
#include "runtime/engine_impl.h"
#include "runtime/host_staging.h"

namespace mp {

Communicator& ShardStateView::world() const { return impl_->world(); }
const EngineOptions& ShardStateView::options() const { return impl_->options(); }
const FlatLayout& ShardStateView::layout() const { return impl_->layout(); }
Optimizer& ShardStateView::optimizer() const { return impl_->optimizer(); }
Device ShardStateView::device() const { return impl_->allocator().device(); }
int ShardStateView::replicate_rank() const { return impl_->mesh().replicate->rank(); }
int ShardStateView::replicate_size() const { return impl_->mesh().replicate->size(); }

int64_t ShardStateView::shard_begin(int unit) const { return impl_->unit(unit).offset(); }
int64_t ShardStateView::shard_numel(int unit) const { return impl_->unit(unit).n(); }
std::vector<ShardField> ShardStateView::fields(int unit) const { return impl_->unit(unit).fields(); }

// Field `field` of unit u's shard from element `begin` on: where it is and
// how many bytes `count` elements take.
ShardStateView::FieldRange ShardStateView::field_range(int unit, int field, int64_t begin, int64_t count) const {
  const std::vector<ShardField> f = fields(unit);
  MP_ENFORCE(field >= 0 && field < static_cast<int>(f.size()), "unit ", unit, " has no field ", field);
  MP_ENFORCE(begin >= 0 && count >= 0 && begin + count <= shard_numel(unit), "elements [", begin, ", ",
             begin + count, ") of a shard of ", shard_numel(unit));
  const ShardField& sf = f[static_cast<size_t>(field)];
  return FieldRange{sf.device_data + begin * sf.element_bytes, count * sf.element_bytes};
}

const char* ShardStateView::read(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) const {
  const FieldRange r = field_range(unit, field, begin, count);
  return static_cast<const char*>(host_view(r.data, impl_->allocator().device(), r.bytes, impl_->compute(), staging));
}

void ShardStateView::read_into(int unit, int field, int64_t begin, int64_t count, const PinnedBuffer& snapshot,
                               int64_t offset) const {
  const FieldRange r = field_range(unit, field, begin, count);
  const Device device = impl_->allocator().device();
  MP_ENFORCE(snapshot.device() == device, "a snapshot pinned for ", to_string(snapshot.device()),
             " cannot take copies from ", to_string(device));
  MP_ENFORCE(offset >= 0 && offset + r.bytes <= static_cast<int64_t>(snapshot.size_bytes()), "bytes [", offset, ", ",
             offset + r.bytes, ") of a snapshot of ", snapshot.size_bytes());
  Stream& s = impl_->compute();
  ops::copy_bytes(static_cast<char*>(snapshot.data()) + offset, Device::cpu(), r.data, device, r.bytes, s);
  s.synchronize();
}

char* ShardStateView::write_target(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) {
  const FieldRange r = field_range(unit, field, begin, count);
  impl_->synchronize();  // nothing still reads or writes the state (gathers on the communication streams too)
  return static_cast<char*>(host_target(r.data, impl_->allocator().device(), r.bytes, impl_->compute(), staging));
}

void ShardStateView::commit_write(int unit, int field, int64_t begin, std::vector<char>& staging) {
  const FieldRange r = field_range(unit, field, begin, 0);
  commit_host_write(r.data, impl_->allocator().device(), staging, impl_->compute());
}

int64_t ShardStateView::steps_run() const { return impl_->steps_run(); }
void ShardStateView::set_steps_run(int64_t steps) { impl_->set_steps_run(steps); }
void ShardStateView::replaced() { impl_->state_replaced(); }

ShardStateView Engine::shard_state() { return ShardStateView(*impl_); }

}  // namespace mp
