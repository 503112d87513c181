#include "comm/hooks.h"

#include "kernels/convert.h"
#include "core/error.h"

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

}  // namespace

int fp16_predivide_factor(int n) {
  int p = 1;
  while (n % p == 0 && n / p > p) p *= 2;
  return p;
}

CommHookRegistry::CommHookRegistry() {
  factories_["fp32"] = [](Allocator&) { return std::make_unique<Fp32Hook>(); };
  factories_["bf16_compress"] = [](Allocator& a) { return std::make_unique<CompressHook>(DType::kBF16, a); };
  factories_["fp16_compress"] = [](Allocator& a) { return std::make_unique<CompressHook>(DType::kF16, a); };
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
