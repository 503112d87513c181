#include "runtime/shard_state.h"

#include <cstring>

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

ShardStateView::Located ShardStateView::locate(int unit, int field, int64_t begin, int64_t count) const {
  Located l;
  l.pieces = impl_->unit(unit).field_pieces(field, begin, count);  // checks the field and the range
  l.element_bytes = fields(unit)[static_cast<size_t>(field)].element_bytes;
  if (l.pieces.size() == 1) l.whole = l.pieces[0].data;
  return l;
}

const char* ShardStateView::read(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) const {
  const Located l = locate(unit, field, begin, count);
  const int64_t eb = l.element_bytes;
  if (l.whole != nullptr) {
    return static_cast<const char*>(host_view(l.whole, device(), count * eb, impl_->compute(), staging));
  }
  staging.assign(static_cast<size_t>(count * eb), 0);  // what the field does not keep reads as zeros
  for (const ShardFieldPiece& p : l.pieces) {
    if (p.data != nullptr) {
      stage_to_host(staging.data() + (p.begin - begin) * eb, p.data, device(), p.count * eb, impl_->compute());
    }
  }
  return staging.data();
}

void ShardStateView::read_into(int unit, int field, int64_t begin, int64_t count, const PinnedBuffer& snapshot,
                               int64_t offset) const {
  const Located l = locate(unit, field, begin, count);
  const int64_t eb = l.element_bytes;
  MP_ENFORCE(snapshot.device() == device(), "a snapshot pinned for ", to_string(snapshot.device()),
             " cannot take copies from ", to_string(device()));
  MP_ENFORCE(offset >= 0 && offset + count * eb <= static_cast<int64_t>(snapshot.size_bytes()), "bytes [", offset, ", ",
             offset + count * eb, ") of a snapshot of ", snapshot.size_bytes());
  Stream& s = impl_->compute();
  char* out = static_cast<char*>(snapshot.data()) + offset;
  for (const ShardFieldPiece& p : l.pieces) {
    char* to = out + (p.begin - begin) * eb;
    if (p.data == nullptr) {
      std::memset(to, 0, static_cast<size_t>(p.count * eb));  // host memory no copy on `s` touches
    } else {
      ops::copy_bytes(to, Device::cpu(), p.data, device(), p.count * eb, s);
    }
  }
  s.synchronize();
}

char* ShardStateView::write_target(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) {
  const Located l = locate(unit, field, begin, count);
  const int64_t eb = l.element_bytes;
  impl_->synchronize();  // nothing still reads or writes the state (gathers on the communication streams too)
  if (l.whole != nullptr) {
    return static_cast<char*>(host_target(l.whole, device(), count * eb, impl_->compute(), staging));
  }
  staging.assign(static_cast<size_t>(count * eb), 0);
  return staging.data();
}

void ShardStateView::commit_write(int unit, int field, int64_t begin, int64_t count, std::vector<char>& staging) {
  const Located l = locate(unit, field, begin, count);
  const int64_t eb = l.element_bytes;
  if (l.whole != nullptr) {
    commit_host_write(l.whole, device(), staging, impl_->compute());
    return;
  }
  // What the field does not keep is dropped (zeros, as it was saved).
  for (const ShardFieldPiece& p : l.pieces) {
    if (p.data != nullptr) {
      stage_from_host(p.data, device(), staging.data() + (p.begin - begin) * eb, p.count * eb, impl_->compute());
    }
  }
}

int64_t ShardStateView::steps_run() const { return impl_->steps_run(); }
void ShardStateView::set_steps_run(int64_t steps) { impl_->set_steps_run(steps); }
void ShardStateView::replaced() { impl_->state_replaced(); }

ShardStateView Engine::shard_state() { return ShardStateView(*impl_); }

}  // namespace mp
