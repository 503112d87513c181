#include "models/input_ring.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace mp {

InputRing::InputRing(Device device, size_t slot_bytes) : device_(device), slot_bytes_(slot_bytes) {}

void* InputRing::next() {
  MP_ENFORCE(current_ < 0, "InputRing::next twice without send");
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].copied.query()) {
      current_ = static_cast<int>(i);
      return slots_[i].host.data();
    }
  }
  slots_.push_back(Slot{PinnedBuffer(device_, slot_bytes_),
                        Event()});
  current_ = static_cast<int>(slots_.size()) - 1;
  return slots_.back().host.data();
}

void InputRing::send(void* dst, Stream& s) {
  MP_ENFORCE(current_ >= 0, "InputRing::send without next");
  Slot& slot = slots_[static_cast<size_t>(current_)];
  current_ = -1;
  ops::copy_bytes(dst, device_, slot.host.data(), Device::cpu(), static_cast<int64_t>(slot_bytes_), s);
  slot.copied = s.record();
}

}  // namespace mp
