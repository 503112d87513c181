// models/input_ring.h: how a micro-batch's data (a GPT's tokens, an MLP's
// samples) reaches the model's device: the host writes it into a slot of
// host memory (pinned for a GPU: core/pinned.h), and a copy on the compute
// stream takes it to the device, in stream order. The same on the CPU,
// where the copy is a task of the stream's worker.
//
// The host never waits here: a slot is reused only once the copy that read
// it has run (its event has completed); while every slot is still in use
// (the host has run far ahead of the stream: Note [Host runs ahead] in
// models/model.h) the ring grows by one. So it grows to the micro-batches
// the host enqueues between two of the engine's waits (a step's), and no
// further.
#pragma once

#include <cstddef>
#include <vector>

#include "core/pinned.h"
#include "core/stream.h"

namespace mp {

class InputRing {
 public:
  InputRing() = default;
  InputRing(Device device, size_t slot_bytes);

  // A slot for the host to fill: slot_bytes of host memory that no queued
  // copy still reads.
  void* next();
  // Enqueues on `s` the copy of the slot next() returned into `dst` (device
  // memory of slot_bytes), and notes when it has run.
  void send(void* dst, Stream& s);
  int slots() const { return static_cast<int>(slots_.size()); }

 private:
  struct Slot {
    PinnedBuffer host;
    Event copied;  // default: complete
  };
  Device device_;
  size_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  int current_ = -1;  // next()'s slot
};

}  // namespace mp
