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
// - "int8": blockwise int8 (Note [Int8 blocks] in kernels/quant_math.h:
//   blocks of 256 values, one fp32 scale each), as DeepSpeed ZeRO++'s qgZ
//   reduces gradients. The bucket / N is split into N chunks (padded to
//   whole blocks) and quantized; an all-to-all sends chunk j to rank j,
//   which decodes the N parts, adds them in rank order in fp32, quantizes
//   the sum and all-gathers it. About 1.02 bytes per element each way,
//   against 2 for bf16 and 4 for fp32; each element is off by at most
//   max|x| / 254 of its block per quantization (two). CPU buckets only.
// - "int8_ef": "int8" with error feedback (as EF-SGD): what quantizing this
//   rank's share lost is added to its next call's share of the same bucket,
//   so the error does not accumulate over steps.
// Users add their own with CommHookRegistry::add.
#pragma once

#include <cstddef>
#include <cstdint>
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

// The int8 hooks' elements per rank for a bucket of `numel` on `world`
// ranks: numel / world rounded up to whole blocks.
int64_t int8_hook_chunk(int64_t numel, int world);

// Bytes of comm_scratch a built-in hook allocates (once, then reuses) for a
// bucket of `numel` fp32 elements on `world` ranks; 0 for unknown names.
size_t comm_hook_scratch_bytes(const std::string& name, int64_t numel, int world);

// Named hook factories. The five built-ins are present from construction.
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
