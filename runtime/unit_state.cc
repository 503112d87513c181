#include "runtime/unit_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/ops.h"
#include "kernels/remainder_math.h"
#include "runtime/host_staging.h"
#include "runtime/shard_sizes.h"

namespace mp {
namespace {

using SC = proto::ShardingConfig;

// Stochastic rounding's global element index: unit in the high bits, the
// element's place in the unit below, so it does not depend on the sharding.
uint64_t global_index(int unit, int64_t offset) {
  return (static_cast<uint64_t>(unit) << 40) + static_cast<uint64_t>(offset);
}

}  // namespace

UnitState::UnitState(int index, const UnitLayout& ul, int shard_rank, const EngineOptions& o, const Optimizer& opt,
                     Allocator& alloc, Stream& stream)
    : index_(index), master_mode_(o.precision.master) {
  const Precision& p = o.precision;
  auto tensor = [&](DType t, int64_t count, MemCategory c) { return Tensor::zeros(alloc, t, {count}, c); };
  n_ = ul.shard_numel;
  full_ = ul.padded_numel;
  offset_ = shard_rank * n_;
  if (p.master == MasterMode::kFp32) master_ = tensor(DType::kF32, n_, MemCategory::kMaster);
  if (p.master == MasterMode::kBf16Remainder) remainder_ = alloc.allocate(static_cast<size_t>(n_) * 2, MemCategory::kMaster);
  if (o.persistent_param_shard()) param_shard_ = tensor(p.param_dtype, n_, MemCategory::kParamShards);
  if (o.state_count >= 1) state0_ = tensor(p.state_dtype, n_, MemCategory::kOptimizerState);
  const std::vector<ShardParam> params = shard_params(ul, offset_, n_, opt.muon() != nullptr);
  ranges_ = params.empty() ? std::vector<UpdateRange>{UpdateRange{0, n_, 1.0f, 0.0f}} : opt.ranges_for(params, n_);
  state1_numel_ = compact_state1(ranges_, n_);
  if (o.state_count >= 2) state1_ = tensor(p.state_dtype, state1_numel_, MemCategory::kOptimizerState);
  if (o.deterministic) {
    acc64_ = alloc.allocate(static_cast<size_t>(n_) * 8, MemCategory::kGradient);
    grad_shard_ = tensor(DType::kF32, n_, MemCategory::kGradient);
  } else {
    if (o.full_grad_accumulators()) acc_full_ = tensor(p.grad_accum_dtype, full_, MemCategory::kGradient);
    grad_shard_ = o.strategy == SC::NO_SHARD ? acc_full_ : tensor(o.grad_shard_dtype(), n_, MemCategory::kGradient);
  }
  if (o.keeps_full_params()) full_params_ = tensor(p.param_dtype, full_, MemCategory::kGatheredParams);
  const int64_t bytes = static_cast<int64_t>(ranges_.size() * sizeof(UpdateRange));
  ranges_device_ = alloc.allocate(static_cast<size_t>(bytes), MemCategory::kOther);
  // Through pinned memory, as every host write to the device (Note [Host staging]).
  stage_from_host(ranges_device_.data(), alloc.device(), ranges_.data(), bytes, stream);
}

void UnitState::set_weights(const std::vector<float>& values, Stream& s) {
  MP_ENFORCE_EQ(static_cast<int64_t>(values.size()), n_);
  const Tensor v = Tensor::wrap(const_cast<float*>(values.data()), Device::cpu(), DType::kF32, {n_});
  if (master_mode_ == MasterMode::kFp32) stage_from_host(master_, values.data(), s);
  if (master_mode_ == MasterMode::kBf16Remainder) {
    std::vector<uint16_t> h(static_cast<size_t>(n_));
    std::vector<int16_t> r(static_cast<size_t>(n_));
    for (size_t i = 0; i < h.size(); ++i) {
      const math::Bf16Remainder split = math::split_bf16_remainder(values[i]);
      h[i] = split.h;
      r[i] = split.r;
    }
    stage_from_host(param_shard_, h.data(), s);
    stage_from_host(remainder_.data(), param_shard_.device(), r.data(), n_ * 2, s);
  } else if (param_shard_.defined()) {
    std::vector<char> cast(param_shard_.size_bytes());
    convert(v, Tensor::wrap(cast.data(), Device::cpu(), param_shard_.dtype(), {n_}));
    stage_from_host(param_shard_, cast.data(), s);
  }
}

std::vector<float> UnitState::weights(Stream& s) const {
  std::vector<float> out(static_cast<size_t>(n_));
  switch (master_mode_) {
    case MasterMode::kFp32:
      stage_to_host(out.data(), master_, s);
      break;
    case MasterMode::kBf16Remainder: {
      std::vector<uint16_t> h(static_cast<size_t>(n_));
      std::vector<int16_t> r(static_cast<size_t>(n_));
      stage_to_host(h.data(), param_shard_, s);
      stage_to_host(r.data(), remainder_.data(), param_shard_.device(), n_ * 2, s);
      for (size_t i = 0; i < out.size(); ++i) out[i] = math::merge_bf16_remainder(h[i], r[i]);
      break;
    }
    case MasterMode::kNone: {
      std::vector<char> p(param_shard_.size_bytes());
      stage_to_host(p.data(), param_shard_, s);
      convert(Tensor::wrap(p.data(), Device::cpu(), param_shard_.dtype(), {n_}),
              Tensor::wrap(out.data(), Device::cpu(), DType::kF32, {n_}));
      break;
    }
  }
  return out;
}

UpdateArgs UnitState::update_args(const EngineOptions& o) const {
  const Precision& p = o.precision;
  UpdateArgs a;
  a.n = n_;
  a.master_mode = p.master;
  a.master = master_.defined() ? master_.data_as<float>() : nullptr;
  a.master_remainder = static_cast<int16_t*>(remainder_.data());
  a.state0 = state0_.defined() ? state0_.data() : nullptr;
  a.state1 = state1_.defined() ? state1_.data() : nullptr;
  a.state1_numel = state1_numel_;
  a.state_dtype = p.state_dtype;
  a.grad = grad_shard_.data();
  a.grad_dtype = grad_shard_.dtype();
  a.param_out = param_shard_.defined() ? param_shard_.data() : nullptr;
  a.param_dtype = param_shard_.defined() ? p.param_dtype : DType::kBF16;
  a.rounding = p.rounding;
  a.seed = o.seed;
  a.index_offset = global_index(index_, offset_);
  a.ranges = static_cast<const UpdateRange*>(ranges_device_.data());
  a.num_ranges = static_cast<int64_t>(ranges_.size());
  return a;
}

std::vector<ShardField> UnitState::fields() const {
  std::vector<ShardField> f;
  auto add = [&](const char* name, const Tensor& t) {
    if (!t.defined()) return;
    f.push_back(ShardField{name, std::string(dtype_name(t.dtype())), static_cast<int64_t>(dtype_size(t.dtype())),
                           static_cast<char*>(t.data())});
  };
  add("master", master_);
  add("param", param_shard_);
  if (remainder_.data() != nullptr) f.push_back(ShardField{"remainder", "int16", 2, static_cast<char*>(remainder_.data())});
  add("state0", state0_);
  add("state1", state1_);
  return f;
}

std::vector<ShardFieldPiece> UnitState::field_pieces(int field, int64_t begin, int64_t count) const {
  const std::vector<ShardField> f = fields();
  MP_ENFORCE(field >= 0 && field < static_cast<int>(f.size()), "unit ", index_, " has no field ", field);
  MP_ENFORCE(begin >= 0 && count >= 0 && begin + count <= n_, "elements [", begin, ", ", begin + count,
             ") of a shard of ", n_);
  const ShardField& sf = f[static_cast<size_t>(field)];
  if (sf.name != "state1" || state1_numel_ == n_) {
    return {ShardFieldPiece{begin, count, sf.device_data + begin * sf.element_bytes}};
  }
  std::vector<ShardFieldPiece> out;
  for (const UpdateRange& r : ranges_) {
    const int64_t b = std::max(begin, r.begin), e = std::min(begin + count, r.end);
    if (b >= e) continue;
    char* data = r.skip != 0 ? nullptr : sf.device_data + (b - r.state1_shift) * sf.element_bytes;
    ShardFieldPiece* last = out.empty() ? nullptr : &out.back();
    const bool joins = last != nullptr &&
                       (data == nullptr ? last->data == nullptr
                                        : last->data != nullptr && last->data + last->count * sf.element_bytes == data);
    if (joins) {
      last->count += e - b;
    } else {
      out.push_back(ShardFieldPiece{b, e - b, data});
    }
  }
  return out;
}

}  // namespace mp
