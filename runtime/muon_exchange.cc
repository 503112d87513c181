#include "runtime/muon_exchange.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/remainder_math.h"

namespace mp {
namespace {

// Every Muon matrix of the model, and its pieces: the part of it each shard
// rank holds, each at a slot of the one block that rank sends the matrix's
// owner (the pieces of all units, in unit and offset order).
struct Tables {
  std::vector<MuonMatrixInfo> matrices;
  std::vector<std::vector<int>> unit_matrices;  // per unit: its matrices, by offset
  int64_t block = 0;                            // elements per all-to-all block: the largest
};

// Calls piece(matrix, rank, begin, end, slot) for every piece, unit by unit.
template <class F>
int64_t walk_pieces(const FlatLayout& layout, const Tables& t, int shard_size, F&& piece) {
  std::map<std::pair<int, int>, int64_t> used;  // (rank, owner): elements so far
  int64_t block = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).shard_numel;
    for (const int i : t.unit_matrices[static_cast<size_t>(u)]) {
      const MuonMatrixInfo& m = t.matrices[static_cast<size_t>(i)];
      const int64_t b0 = m.offset, e0 = m.offset + m.rows * m.cols;
      for (int r = static_cast<int>(b0 / n); r < shard_size && r * n < e0; ++r) {
        const int64_t b = std::max(b0, r * n), e = std::min(e0, (r + 1) * n);
        if (b >= e) continue;
        int64_t& at = used[{r, m.owner}];
        piece(i, r, b, e, at);
        at += e - b;
        block = std::max(block, at);
      }
    }
  }
  return block;
}

Tables make_tables(const FlatLayout& layout, const MuonHyper& hyper, int shard_size) {
  Tables t;
  t.matrices = muon_matrices(layout, hyper, shard_size);
  t.unit_matrices.resize(static_cast<size_t>(layout.num_units()));
  for (size_t i = 0; i < t.matrices.size(); ++i) {
    t.unit_matrices[static_cast<size_t>(t.matrices[i].unit)].push_back(static_cast<int>(i));
  }
  t.block = walk_pieces(layout, t, shard_size, [](int, int, int64_t, int64_t, int64_t) {});
  return t;
}

struct Sizes {
  int64_t exchange = 0;  // elements of send and of recv
  int64_t matrix = 0;    // the largest owned matrix
  int64_t scratch = 0;   // the largest owned matrix's NS scratch
};

Sizes sizes(const Tables& t, const MuonHyper& hyper, int shard_size, int rank) {
  Sizes s;
  s.exchange = t.block * shard_size;
  for (const MuonMatrixInfo& m : t.matrices) {
    if (m.owner != rank) continue;
    s.matrix = std::max(s.matrix, m.rows * m.cols);
    s.scratch = std::max(s.scratch, muon_owner_scratch_elements(m.rows, m.cols, hyper));
  }
  return s;
}

}  // namespace

std::vector<MuonMatrixInfo> muon_matrices(const FlatLayout& layout, const MuonHyper& hyper, int shard_size) {
  std::vector<MuonMatrixInfo> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const ParamPlacement& p : layout.unit(u).params) {
      if (!p.muon) continue;
      if (p.shape.size() != 2) {
        MP_THROW(ConfigError, "parameter '", p.name, "' of shape ", shape_string(p.shape),
                 " is marked for Muon (ParamSpec::muon), which takes 2-D matrices only");
      }
      MuonMatrixInfo m;
      m.name = p.name;
      m.unit = u;
      m.offset = p.offset;
      m.rows = p.shape[0];
      m.cols = p.shape[1];
      m.lr_a = p.muon_lr_a > 0 ? p.muon_lr_a : m.rows;
      m.lr_b = p.muon_lr_b > 0 ? p.muon_lr_b : m.cols;
      m.flops = muon_ns_flops(m.rows, m.cols, hyper.ns_steps);
      out.push_back(std::move(m));
    }
  }
  std::vector<double> flops;
  for (const MuonMatrixInfo& m : out) flops.push_back(m.flops);
  const std::vector<int> owners = assign_muon_owners(flops, shard_size);
  for (size_t i = 0; i < out.size(); ++i) out[i].owner = owners[i];
  return out;
}

std::string describe_muon_owners(const std::vector<MuonMatrixInfo>& matrices, int shard_size) {
  double total = 0;
  for (const MuonMatrixInfo& m : matrices) total += m.flops;
  std::string s;
  char line[160];
  int64_t elements = 0;
  std::string names;
  for (size_t i = 0; i < matrices.size(); ++i) {
    elements += matrices[i].rows * matrices[i].cols;
    if (i < 4) names += (i ? ", " : "") + matrices[i].name;
  }
  if (matrices.size() > 4) names += ", ...";
  std::snprintf(line, sizeof(line), "muon: %zu matrices of %lld elements (", matrices.size(),
                static_cast<long long>(elements));
  s += line + names + "), AdamW on the other parameters\n";
  std::snprintf(line, sizeof(line), "muon: %.4g Newton-Schulz flops a step, over %d owner rank(s)\n", total,
                shard_size);
  s += line;
  for (int r = 0; r < shard_size; ++r) {
    int count = 0;
    double f = 0;
    for (const MuonMatrixInfo& m : matrices) {
      if (m.owner != r) continue;
      ++count;
      f += m.flops;
    }
    std::snprintf(line, sizeof(line), "muon: shard rank %d owns %d matrices, %.1f%% of the flops\n", r, count,
                  total > 0 ? 100.0 * f / total : 0.0);
    s += line;
  }
  return s;
}

std::vector<int64_t> muon_scratch_bytes(const FlatLayout& layout, const MuonHyper& hyper, int shard_size) {
  const Tables t = make_tables(layout, hyper, shard_size);
  std::vector<int64_t> out(static_cast<size_t>(shard_size), 0);
  if (t.matrices.empty()) return out;
  for (int r = 0; r < shard_size; ++r) {
    const Sizes s = sizes(t, hyper, shard_size, r);
    out[static_cast<size_t>(r)] = (2 * s.exchange + 2 * s.matrix + s.scratch) * 4;
  }
  return out;
}

MuonExchange::MuonExchange(const FlatLayout& layout, const EngineOptions& o, const MuonSettings& settings,
                           Communicator& shard, CommWatch& comm, Allocator& alloc)
    : o_(o), settings_(settings), shard_(shard), comm_(comm), rank_(shard.rank()), size_(shard.size()) {
  const Tables t = make_tables(layout, settings.hyper, size_);
  matrices_ = t.matrices;
  units_.resize(static_cast<size_t>(layout.num_units()));
  block_ = walk_pieces(layout, t, size_, [&](int i, int r, int64_t b, int64_t e, int64_t slot) {
    units_[static_cast<size_t>(matrices_[static_cast<size_t>(i)].unit)].pieces.push_back(Piece{i, r, b, e, slot});
  });
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (matrices_[i].owner == rank_) owned_.push_back(static_cast<int>(i));
  }
  if (matrices_.empty()) return;
  const Sizes s = sizes(t, settings.hyper, size_, rank_);
  auto buffer = [&](int64_t count) {
    return count > 0 ? Tensor::zeros(alloc, DType::kF32, {count}, MemCategory::kCommScratch) : Tensor();
  };
  send_ = buffer(s.exchange);
  recv_ = buffer(s.exchange);
  u_ = buffer(s.matrix);
  o_mat_ = buffer(s.matrix);
  scratch_ = buffer(s.scratch);
}

void MuonExchange::begin(int u, const UnitState& unit, float grad_multiplier, Stream& compute) {
  const Unit& table = units_[static_cast<size_t>(u)];
  if (table.pieces.empty()) return;
  const UpdateArgs args = unit.update_args(o_);
  const int64_t offset = unit.offset(), B = block_;
  float* send = send_.data_as<float>();
  compute.host_task([this, &table, args, send, B, offset, grad_multiplier] {
    const MuonMomentum mc = muon_momentum_constants(settings_.hyper);
    for (const Piece& p : table.pieces) {
      if (p.rank != rank_) continue;
      const int64_t at = p.begin - offset, len = p.end - p.begin;
      const char* g = static_cast<const char*>(args.grad) + at * static_cast<int64_t>(dtype_size(args.grad_dtype));
      float* dst = send + matrices_[static_cast<size_t>(p.matrix)].owner * B + p.slot;
      convert(Tensor::wrap(const_cast<char*>(g), Device::cpu(), args.grad_dtype, {len}),
              Tensor::wrap(dst, Device::cpu(), DType::kF32, {len}));
      float* buf = static_cast<float*>(args.state0) + at;
      for (int64_t k = 0; k < len; ++k) {
        dst[k] = muon_momentum_element(buf[k], grad_multiplier == 1.0f ? dst[k] : dst[k] * grad_multiplier, mc);
      }
    }
  });
}

// send -> recv over the shard group, ordered on `compute`.
void MuonExchange::exchange(Stream& compute) {
  if (size_ == 1) return;  // a group of one reads its own blocks
  const int64_t count = block_ * size_;
  shard_.stream().wait(compute.record());
  WorkPtr w = shard_.all_to_all(send_.flat(0, count), recv_.flat(0, count));
  comm_.track(w);
  comm_.wait_on(compute, w);
}

void MuonExchange::finish(const std::vector<UnitState>& units, double lr, Stream& compute) {
  if (matrices_.empty()) return;
  const int64_t B = block_;
  float* send = send_.data_as<float>();
  const float* in = size_ > 1 ? recv_.data_as<float>() : send;
  exchange(compute);  // 2. U to the owners

  // 3. Each matrix this rank owns: U whole, O = NS(U), O's slices back into
  // the blocks to each rank, at the same slots.
  compute.host_task([this, in, send, B] {
    float* whole = u_.data_as<float>();
    float* o = o_mat_.data_as<float>();
    for (const int i : owned_) {
      const MuonMatrixInfo& m = matrices_[static_cast<size_t>(i)];
      const std::vector<Piece>& pieces = units_[static_cast<size_t>(m.unit)].pieces;
      for (const Piece& p : pieces) {
        if (p.matrix == i) std::copy_n(in + p.rank * B + p.slot, p.end - p.begin, whole + (p.begin - m.offset));
      }
      muon_orthogonalize_cpu(settings_.hyper, whole, m.rows, m.cols, o, 0, scratch_.data_as<float>(),
                             scratch_.numel());
      for (const Piece& p : pieces) {
        if (p.matrix == i) std::copy_n(o + (p.begin - m.offset), p.end - p.begin, send + p.rank * B + p.slot);
      }
    }
  });
  exchange(compute);  // 4. O back

  // 5. The element part on this rank's master slices, and the copy.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].pieces.empty()) continue;
    const UpdateArgs args = units[u].update_args(o_);
    compute.host_task([this, &table = units_[u], in, args, B, offset = units[u].offset(), lr] {
      for (const Piece& p : table.pieces) {
        if (p.rank != rank_) continue;
        const MuonMatrixInfo& m = matrices_[static_cast<size_t>(p.matrix)];
        const MuonApply c = muon_apply_constants(settings_.hyper, lr, settings_.weight_decay, m.lr_a, m.lr_b);
        const float* o = in + m.owner * B + p.slot;
        const int64_t at = p.begin - offset, len = p.end - p.begin;
        if (args.master_mode == MasterMode::kFp32) {
          float* w = args.master + at;
          for (int64_t k = 0; k < len; ++k) w[k] = muon_apply_element(w[k], o[k], c);
          if (args.param_out != nullptr) {
            char* out = static_cast<char*>(args.param_out) + at * static_cast<int64_t>(dtype_size(args.param_dtype));
            convert(Tensor::wrap(w, Device::cpu(), DType::kF32, {len}),
                    Tensor::wrap(out, Device::cpu(), args.param_dtype, {len}));
          }
        } else {  // kBf16Remainder (the engine refuses kNone with MUON)
          uint16_t* h = static_cast<uint16_t*>(args.param_out) + at;
          int16_t* r = args.master_remainder + at;
          for (int64_t k = 0; k < len; ++k) {
            const float w = muon_apply_element(math::merge_bf16_remainder(h[k], r[k]), o[k], c);
            const math::Bf16Remainder split = math::split_bf16_remainder(w);
            h[k] = split.h;
            r[k] = split.r;
          }
        }
      }
    });
  }
}

}  // namespace mp
