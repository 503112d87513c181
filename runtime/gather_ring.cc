#include "runtime/gather_ring.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace mp {

GatherRing::GatherRing(const FlatLayout& layout, int slots, int prefetch_depth, DType dtype, Allocator& alloc,
                       CommWatch& comm, Stream& comm_stream, Issue issue)
    : layout_(layout), prefetch_depth_(prefetch_depth), comm_(comm), comm_stream_(comm_stream), issue_(std::move(issue)) {
  slots_.resize(static_cast<size_t>(slots));
  for (Slot& s : slots_) {
    s.buffer = Tensor::zeros(alloc, dtype, {layout_.shared_padded_numel()}, MemCategory::kGatheredParams);
  }
  for (int u = 0; u < layout_.num_units() && slots > 0; ++u) {  // no ring, no slots of their own
    if (!layout_.unit(u).oversized) continue;
    Slot own;
    own.buffer = Tensor::zeros(alloc, dtype, {layout_.unit(u).padded_numel}, MemCategory::kGatheredParams);
    own.owner = u;
    slots_.push_back(std::move(own));
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

GatherRing::Slot* GatherRing::free_slot(int u, const std::vector<int>& wanted) {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (s.owner == u) return &s;  // only u is ever in it, and u is not (else find(u) had it)
    if (s.owner >= 0 || s.held || std::find(wanted.begin(), wanted.end(), s.unit) != wanted.end()) continue;
    if (!best || s.last_use < best->last_use) best = &s;
  }
  return best;
}

// u and its next k units in `direction`, in order of use (in the backward,
// units whose backward reads no parameters are skipped).
std::vector<int> GatherRing::window(int u, int direction) const {
  const int num_units = layout_.num_units();
  std::vector<int> wanted{u};
  for (int v = u + direction; v >= 0 && v < num_units && static_cast<int>(wanted.size()) <= prefetch_depth_;
       v += direction) {
    if (direction < 0 && !layout_.unit(v).backward_reads_params) continue;  // never acquired in the backward
    wanted.push_back(v);
  }
  return wanted;
}

bool GatherRing::issue_missing(const std::vector<int>& wanted) {
  for (int v : wanted) {  // u first, then the prefetches in order of use
    if (find(v)) continue;
    Slot* slot = free_slot(v, wanted);
    if (!slot) return v != wanted.front();  // the rest of the prefetches wait for their acquire
    issue(v, *slot);
  }
  return true;
}

Tensor GatherRing::acquire(int u, int direction, Stream& compute) {
  if (!issue_missing(window(u, direction))) {
    std::string held;
    for (const Slot& s : slots_) held += (held.empty() ? "'" : ", '") + layout_.unit(s.unit).name + "'";
    MP_THROW(ConfigError, "unit '", layout_.unit(u).name, "': every one of the ", slots_.size(),
             " gather buffers holds a unit that is unsharded (", held,
             "): reshard one first, or raise sharding.held_units (buffers = prefetch_depth + 1 + held_units)");
  }
  Slot* slot = find(u);
  slot->last_use = ++tick_;
  slot->held = true;
  comm_.wait_on(compute, slot->work);
  slot->work.reset();
  return slot->buffer.flat(0, layout_.unit(u).padded_numel);
}

void GatherRing::prefetch(int u, int direction) { issue_missing(window(u, direction)); }

void GatherRing::release(int u, Event readers_done) {
  if (Slot* slot = find(u)) {
    slot->released = std::move(readers_done);
    slot->held = false;
  }
}

void GatherRing::drop() {
  for (Slot& s : slots_) {
    s.work.reset();  // a stale gather still runs before any later one into the slot
    s.unit = -1;
    s.held = false;
  }
}

void GatherRing::prefetch_into(int u) {
  MP_ENFORCE(u >= 0 && u < size(), "prefetch_into slot ", u, " of ", size());
  (void)issue_missing({u});  // after drop() every slot is free; past the shared ones it waits for its acquire
}

}  // namespace mp
