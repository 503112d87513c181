// models/input_ring.h: a slot is reused only once the copy that read it has
// run; while all are in flight the ring grows instead of waiting; the copy
// lands in stream order.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "core/stream.h"
#include "models/input_ring.h"

namespace mp {
namespace {

TEST(InputRing, GrowsWhileCopiesAreQueuedAndReusesTheirSlotsAfter) {
  CpuStream s("ring test");
  InputRing ring(Device::cpu(), sizeof(int));
  std::atomic<bool> go{false};
  s.submit([&] {
    while (!go.load()) std::this_thread::yield();  // the stream lags behind the host
  });
  int dst[3] = {0, 0, 0};
  void* first = ring.next();
  *static_cast<int*>(first) = 11;
  ring.send(&dst[0], s);
  void* second = ring.next();  // the first copy has not run: a new slot, no wait
  EXPECT_NE(second, first);
  *static_cast<int*>(second) = 22;
  ring.send(&dst[1], s);
  EXPECT_EQ(ring.slots(), 2);
  EXPECT_EQ(dst[0], 0);  // nothing has run yet
  go = true;
  s.synchronize();
  EXPECT_EQ(dst[0], 11);
  EXPECT_EQ(dst[1], 22);
  void* third = ring.next();  // both copies ran: a slot is reused
  EXPECT_TRUE(third == first || third == second);
  *static_cast<int*>(third) = 33;
  ring.send(&dst[2], s);
  s.synchronize();
  EXPECT_EQ(dst[2], 33);
  EXPECT_EQ(ring.slots(), 2);
}

}  // namespace
}  // namespace mp
