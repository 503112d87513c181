#include "runtime/gather_ring.h"

#include <algorithm>

#include "core/error.h"

namespace mp {

GatherRing::GatherRing(const FlatLayout& layout, int slots, int prefetch_depth, DType dtype, Allocator& alloc,
                       CommWatch& comm, Stream& comm_stream, Issue issue)
    : layout_(layout), prefetch_depth_(prefetch_depth), comm_(comm), comm_stream_(comm_stream), issue_(std::move(issue)) {
  slots_.resize(static_cast<size_t>(slots));
  for (Slot& s : slots_) {
    s.buffer = Tensor::zeros(alloc, dtype, {layout_.max_padded_numel()}, MemCategory::kGatheredParams);
  }
}

void GatherRing::issue(int u, Slot& slot) {
  comm_stream_.wait(slot.released);  // the compute that read the old contents
  slot.released = Event();
  slot.unit = u;
  slot.last_use = ++tick_;
  slot.work = issue_(u, slot.buffer.flat(0, layout_.unit(u).padded_numel));
}

GatherRing::Slot* GatherRing::find(int u) {
  for (Slot& s : slots_) {
    if (s.unit == u) return &s;
  }
  return nullptr;
}

GatherRing::Slot& GatherRing::free_slot(const std::vector<int>& wanted) {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (std::find(wanted.begin(), wanted.end(), s.unit) != wanted.end()) continue;
    if (!best || s.last_use < best->last_use) best = &s;
  }
  MP_ENFORCE(best != nullptr, "no free gather slot among ", slots_.size());
  return *best;
}

Tensor GatherRing::acquire(int u, int direction, Stream& compute) {
  const int num_units = layout_.num_units();
  std::vector<int> wanted{u};
  for (int v = u + direction; v >= 0 && v < num_units && static_cast<int>(wanted.size()) <= prefetch_depth_;
       v += direction) {
    if (direction < 0 && !layout_.unit(v).backward_reads_params) continue;  // never acquired in the backward
    wanted.push_back(v);
  }
  for (int v : wanted) {  // u first, then the prefetches in order of use
    if (!find(v)) issue(v, free_slot(wanted));
  }
  Slot* slot = find(u);
  slot->last_use = ++tick_;
  comm_.wait_on(compute, slot->work);
  slot->work.reset();
  return slot->buffer.flat(0, layout_.unit(u).padded_numel);
}

void GatherRing::release(int u, Event readers_done) {
  if (Slot* slot = find(u)) slot->released = std::move(readers_done);
}

void GatherRing::drop() {
  for (Slot& s : slots_) {
    s.work.reset();  // a stale gather still runs before any later one into the slot
    s.unit = -1;
  }
}

void GatherRing::prefetch_into(int u) {
  MP_ENFORCE(u >= 0 && u < size(), "prefetch_into slot ", u, " of ", size());
  issue(u, slots_[static_cast<size_t>(u)]);
}

}  // namespace mp
