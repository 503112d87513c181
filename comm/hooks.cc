#include "comm/hooks.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/cpu/quant.h"

namespace mp {
namespace {

class Fp32Hook final : public CommHook {
 public:
  WorkPtr run(Communicator& comm, const GradBucket& bucket) override {
    check_bucket(bucket);
    // DDP's allreduce_hook: divide first, then sum.
    convert(bucket.grads, bucket.grads, ConvertOptions{.divisor = static_cast<double>(comm.size())},
            &comm.stream());
    return comm.all_reduce(bucket.grads, bucket.grads, {ReduceOp::kSum});
  }

  static void check_bucket(const GradBucket& b) {
    MP_ENFORCE(b.grads.defined() && b.grads.dtype() == DType::kF32, "comm hook bucket ", b.index,
               " must hold fp32 gradients, got ", b.grads.describe());
  }
};

class CompressHook final : public CommHook {
 public:
  CompressHook(DType wire, Allocator& scratch) : wire_(wire), scratch_(scratch) {}

  WorkPtr run(Communicator& comm, const GradBucket& bucket) override {
    Fp32Hook::check_bucket(bucket);
    const int n = comm.size();
    const double pre = wire_ == DType::kF16 ? fp16_predivide_factor(n) : n;
    const double post = n / pre;
    Tensor& wire = buffer_for(bucket);
    convert(bucket.grads, wire, ConvertOptions{.divisor = pre}, &comm.stream());
    comm.all_reduce(wire, wire, {ReduceOp::kSum, post});
    convert(wire, bucket.grads, {}, &comm.stream());
    return comm.fence(std::string(dtype_name(wire_)) + "_compress hook, bucket " +
                      std::to_string(bucket.index));
  }

 private:
  // One wire buffer per bucket index, allocated on first use and reused.
  Tensor& buffer_for(const GradBucket& bucket) {
    Tensor& t = buffers_[bucket.index];
    if (!t.defined() || t.numel() != bucket.grads.numel() || t.device() != bucket.grads.device()) {
      MP_ENFORCE(bucket.grads.device() == scratch_.device(), "hook scratch on ", scratch_.device(),
                 " but bucket ", bucket.index, " on ", bucket.grads.device());
      t = Tensor();
      t = Tensor::empty(scratch_, wire_, {bucket.grads.numel()}, MemCategory::kCommScratch);
    }
    return t;
  }

  DType wire_;
  Allocator scratch_;
  std::map<int, Tensor> buffers_;
};

// Blockwise int8 all-reduce (DeepSpeed ZeRO++'s qgZ: quantized
// reduce-scatter by all-to-all, then a quantized all-gather). See hooks.h.
class Int8Hook final : public CommHook {
 public:
  Int8Hook(bool error_feedback, Allocator& scratch) : ef_(error_feedback), scratch_(scratch) {}

  WorkPtr run(Communicator& comm, const GradBucket& bucket) override {
    Fp32Hook::check_bucket(bucket);
    if (!bucket.grads.device().is_cpu()) {
      MP_THROW(ConfigError, "comm hook int8: bucket ", bucket.index, " is on ", bucket.grads.device(),
               "; the int8 hooks run on CPU buckets only (no device kernel yet)");
    }
    const int n = comm.size(), rank = comm.rank();
    Buffers& b = buffers_for(bucket, n);
    const int64_t m = bucket.grads.numel(), c = b.chunk;
    const size_t span = int8_span_bytes(c);
    auto bytes = [](const Tensor& t, size_t offset) { return static_cast<char*>(t.data()) + offset; };
    const Tensor grads = bucket.grads;
    const Tensor work = b.work, send = b.send, recv = b.recv, acc = b.acc, residual = b.residual;
    const bool ef = ef_;
    Stream& s = comm.stream();
    s.host_task([=] {  // this rank's share of the mean, (plus the carried error), quantized per chunk
      float* w = work.data_as<float>();
      const float* g = grads.data_as<float>();
      const float inv = 1.0f / static_cast<float>(n);
      for (int64_t i = 0; i < m; ++i) w[i] = g[i] * inv;
      if (ef) {
        const float* e = residual.data_as<float>();
        for (int64_t i = 0; i < m; ++i) w[i] += e[i];
      }
      for (int j = 0; j < n; ++j) {
        quantize_int8(w + j * c, c, bytes(send, j * span), ef ? residual.data_as<float>() + j * c : nullptr);
      }
    });
    comm.all_to_all(send, recv);
    s.host_task([=] {  // my chunk: every rank's part decoded and added in rank order, quantized again
      for (int j = 0; j < n; ++j) dequantize_int8(bytes(recv, j * span), c, acc.data_as<float>(), j > 0);
      quantize_int8(acc.data_as<float>(), c, bytes(send, rank * span));
    });
    comm.all_gather(send.flat(static_cast<int64_t>(rank * span), static_cast<int64_t>(span)), send);
    s.host_task([=] {
      float* w = work.data_as<float>();
      for (int j = 0; j < n; ++j) dequantize_int8(bytes(send, j * span), c, w + j * c, false);
      std::memcpy(grads.data(), w, static_cast<size_t>(m) * sizeof(float));
    });
    return comm.fence(std::string(ef_ ? "int8_ef" : "int8") + " hook, bucket " + std::to_string(bucket.index));
  }

 private:
  struct Buffers {
    int64_t numel = -1;
    int64_t chunk = 0;            // elements per rank, a multiple of the block
    Tensor work, send, recv, acc;  // fp32 [n * chunk], bytes x2 [n * span], fp32 [chunk]
    Tensor residual;               // fp32 [n * chunk], error feedback only, kept across steps
  };

  Buffers& buffers_for(const GradBucket& bucket, int n) {
    Buffers& b = buffers_[bucket.index];
    if (b.numel == bucket.grads.numel()) return b;
    b = Buffers{};
    b.numel = bucket.grads.numel();
    b.chunk = int8_hook_chunk(b.numel, n);
    const int64_t span = static_cast<int64_t>(int8_span_bytes(b.chunk));
    auto make = [&](DType t, int64_t count) { return Tensor::zeros(scratch_, t, {count}, MemCategory::kCommScratch); };
    b.work = make(DType::kF32, n * b.chunk);
    b.send = make(kByteCarrier, n * span);
    b.recv = make(kByteCarrier, n * span);
    b.acc = make(DType::kF32, b.chunk);
    if (ef_) b.residual = make(DType::kF32, n * b.chunk);
    return b;
  }

  // Raw bytes travel as a 1-byte dtype; nothing reduces them.
  static constexpr DType kByteCarrier = DType::kF8E4M3;
  bool ef_;
  Allocator scratch_;
  std::map<int, Buffers> buffers_;
};

}  // namespace

int64_t int8_hook_chunk(int64_t numel, int world) {
  const int64_t per_rank = (numel + world - 1) / std::max(world, 1);
  return (per_rank + math::kQuantBlock - 1) / math::kQuantBlock * math::kQuantBlock;
}

size_t comm_hook_scratch_bytes(const std::string& name, int64_t numel, int world) {
  if (name == "bf16_compress" || name == "fp16_compress") return static_cast<size_t>(numel) * 2;
  if (name == "int8" || name == "int8_ef") {
    const int64_t c = int8_hook_chunk(numel, world);
    const size_t padded = static_cast<size_t>(world) * static_cast<size_t>(c);
    const size_t fp32 = (padded + static_cast<size_t>(c) + (name == "int8_ef" ? padded : 0)) * sizeof(float);
    return fp32 + 2 * static_cast<size_t>(world) * int8_span_bytes(c);
  }
  return 0;
}

int fp16_predivide_factor(int n) {
  int p = 1;
  while (n % p == 0 && n / p > p) p *= 2;
  return p;
}

CommHookRegistry::CommHookRegistry() {
  factories_["fp32"] = [](Allocator&) { return std::make_unique<Fp32Hook>(); };
  factories_["bf16_compress"] = [](Allocator& a) { return std::make_unique<CompressHook>(DType::kBF16, a); };
  factories_["fp16_compress"] = [](Allocator& a) { return std::make_unique<CompressHook>(DType::kF16, a); };
  factories_["int8"] = [](Allocator& a) { return std::make_unique<Int8Hook>(false, a); };
  factories_["int8_ef"] = [](Allocator& a) { return std::make_unique<Int8Hook>(true, a); };
}

void CommHookRegistry::add(const std::string& name, Factory factory) {
  MP_ENFORCE(factory != nullptr, "comm hook '", name, "' has no factory");
  if (!factories_.emplace(name, std::move(factory)).second) {
    MP_THROW(ConfigError, "a comm hook named '", name, "' is already registered");
  }
}

std::unique_ptr<CommHook> CommHookRegistry::make(const std::string& name, Allocator& scratch) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    MP_THROW(ConfigError, "unknown comm hook '", name, "'; registered: ", known);
  }
  return it->second(scratch);
}

std::vector<std::string> CommHookRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : factories_) out.push_back(n);
  return out;
}

}  // namespace mp
