// comm/hooks.h: data-parallel gradient all-reduce hooks (NO_SHARD and the
// replicate dimension of HYBRID_SHARD), after PyTorch DDP's comm hooks.
//
// A hook receives a flat fp32 bucket of gradients and returns a Work. When
// that Work completes, the bucket holds the average over ranks. Hooks issue
// their casts and collectives on the communicator's stream, so the caller's
// thread (or compute stream) goes on computing meanwhile.
//
// Built-in hooks:
// - "fp32": divide by N, all-reduce in fp32 (DDP's allreduce_hook).
// - "bf16_compress": bucket / N rounded to bf16, all-reduce in bf16, cast
//   back into the fp32 bucket. Half the bytes on the wire. Each element gets
//   one bf16 rounding of its input and one per reduction step.
// - "fp16_compress": as bf16 but in fp16, with FSDP's split division. The
//   bucket is divided by p before the cast (p: double while N % p == 0 and
//   N / p > p; about sqrt N, a power of two) and by N / p after the sum, so
//   neither the inputs nor the partial sums overflow or underflow needlessly.
// Users add their own with CommHookRegistry::add.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"

namespace mp {

struct GradBucket {
  int index = 0;  // buckets are numbered in the order they are reduced
  Tensor grads;   // flat fp32 gradients; reduced in place
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual WorkPtr run(Communicator& comm, const GradBucket& bucket) = 0;
};

// FSDP's fp16 pre-divide factor for world size n (see above).
int fp16_predivide_factor(int n);

// Named hook factories. The three built-ins are present from construction.
class CommHookRegistry {
 public:
  // Makes a hook; `scratch` provides its reusable low-precision buffers
  // (category comm_scratch).
  using Factory = std::function<std::unique_ptr<CommHook>(Allocator& scratch)>;

  CommHookRegistry();
  // Throws ConfigError if the name is taken.
  void add(const std::string& name, Factory factory);
  // Throws ConfigError naming the registered hooks if `name` is unknown.
  std::unique_ptr<CommHook> make(const std::string& name, Allocator& scratch) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Factory> factories_;
};

}  // namespace mp
