#include "runtime/muon_exchange.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"

namespace mp {
namespace {

// Every Muon matrix of the model and its pieces: the part of it each shard
// rank holds. Unit by unit, each rank's send buffer holds its pieces for
// owner 0, then owner 1, ...; each owner's receive buffer the pieces from
// rank 0, then rank 1, ... (Note [Muon in the engine]); pieces keep offset
// order within each (rank, owner) pair.
struct Tables {
  std::vector<MuonMatrixInfo> matrices;
  std::vector<std::vector<MuonPiece>> pieces;  // per unit
  // [unit][rank][peer]: elements rank sends peer (peer owns them)
  std::vector<std::vector<std::vector<int64_t>>> counts;
  std::vector<int64_t> send_total, recv_total;  // per rank: every unit's
};

int64_t sum(const std::vector<int64_t>& v, size_t end) {
  int64_t s = 0;
  for (size_t i = 0; i < end; ++i) s += v[i];
  return s;
}

Tables make_tables(const FlatLayout& layout, const MuonHyper& hyper, int shard_size) {
  Tables t;
  t.matrices = muon_matrices(layout, hyper, shard_size);
  const size_t units = static_cast<size_t>(layout.num_units()), ranks = static_cast<size_t>(shard_size);
  t.pieces.resize(units);
  t.counts.assign(units, std::vector<std::vector<int64_t>>(ranks, std::vector<int64_t>(ranks, 0)));
  t.send_total.assign(ranks, 0);
  t.recv_total.assign(ranks, 0);
  for (size_t i = 0; i < t.matrices.size(); ++i) {  // in unit and offset order
    const MuonMatrixInfo& m = t.matrices[i];
    const int64_t n = layout.unit(m.unit).shard_numel;
    const int64_t b0 = m.offset, e0 = m.offset + m.rows * m.cols;
    for (int r = static_cast<int>(b0 / n); r < shard_size && r * n < e0; ++r) {
      const int64_t b = std::max(b0, r * n), e = std::min(e0, (r + 1) * n);
      if (b < e) t.pieces[static_cast<size_t>(m.unit)].push_back(MuonPiece{static_cast<int>(i), r, b, e, 0, 0});
    }
  }
  // Where each piece sits: its pair's place within the unit, then its own.
  for (size_t u = 0; u < units; ++u) {
    std::vector<std::vector<int64_t>>& c = t.counts[u];
    std::vector<std::vector<int64_t>> used(ranks, std::vector<int64_t>(ranks, 0));
    for (MuonPiece& p : t.pieces[u]) {
      const size_t r = static_cast<size_t>(p.rank), o = static_cast<size_t>(t.matrices[static_cast<size_t>(p.matrix)].owner);
      p.send_at = used[r][o];  // within the pair, for now
      p.recv_at = used[r][o];
      used[r][o] += p.end - p.begin;
    }
    c = used;
    for (MuonPiece& p : t.pieces[u]) {
      const size_t r = static_cast<size_t>(p.rank), o = static_cast<size_t>(t.matrices[static_cast<size_t>(p.matrix)].owner);
      std::vector<int64_t> to_owner(ranks);
      for (size_t k = 0; k < ranks; ++k) to_owner[k] = c[k][o];
      p.send_at += t.send_total[r] + sum(c[r], o);
      p.recv_at += t.recv_total[o] + sum(to_owner, r);
    }
    for (size_t r = 0; r < ranks; ++r) {
      for (size_t o = 0; o < ranks; ++o) {
        t.send_total[r] += c[r][o];
        t.recv_total[o] += c[r][o];
      }
    }
  }
  return t;
}

struct Sizes {
  int64_t send = 0, recv = 0;  // exchange buffers, fp32 elements (a group of one: no receive buffer)
  int64_t matrix = 0;          // the largest owned matrix
  int64_t scratch = 0;         // the owned matrices' largest NS scratch, in floats
};

Sizes sizes(const Tables& t, const MuonHyper& hyper, int rank, Device device) {
  Sizes s;
  s.send = t.send_total[static_cast<size_t>(rank)];
  s.recv = t.send_total.size() > 1 ? t.recv_total[static_cast<size_t>(rank)] : 0;
  for (const MuonMatrixInfo& m : t.matrices) {
    if (m.owner != rank) continue;
    s.matrix = std::max(s.matrix, m.rows * m.cols);
    const int64_t bytes = ops::newton_schulz_scratch_bytes(m.rows, m.cols, muon_ns_options(hyper), device);
    s.scratch = std::max(s.scratch, (bytes + 3) / 4);
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

std::vector<int64_t> muon_scratch_bytes(const FlatLayout& layout, const MuonHyper& hyper, int shard_size,
                                        Device device) {
  const Tables t = make_tables(layout, hyper, shard_size);
  std::vector<int64_t> out(static_cast<size_t>(shard_size), 0);
  if (t.matrices.empty()) return out;
  for (int r = 0; r < shard_size; ++r) {
    const Sizes s = sizes(t, hyper, r, device);
    out[static_cast<size_t>(r)] = (s.send + s.recv + 2 * s.matrix + s.scratch) * 4;
  }
  return out;
}

MuonExchange::MuonExchange(const FlatLayout& layout, const EngineOptions& o, const MuonSettings& settings,
                           Communicator& shard, CommWatch& comm, Allocator& alloc)
    : o_(o),
      settings_(settings),
      shard_(shard),
      comm_(comm),
      device_(alloc.device()),
      rank_(shard.rank()),
      size_(shard.size()) {
  Tables t = make_tables(layout, settings.hyper, size_);
  matrices_ = t.matrices;
  units_.resize(static_cast<size_t>(layout.num_units()));
  const size_t me = static_cast<size_t>(rank_);
  int64_t send_base = 0, recv_base = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    unit.pieces = std::move(t.pieces[u]);
    for (int r = 0; r < size_; ++r) {
      unit.send_counts.push_back(t.counts[u][me][static_cast<size_t>(r)]);
      unit.recv_counts.push_back(t.counts[u][static_cast<size_t>(r)][me]);
    }
    unit.send_base = send_base;
    unit.recv_base = recv_base;
    send_base += sum(unit.send_counts, unit.send_counts.size());
    recv_base += sum(unit.recv_counts, unit.recv_counts.size());
  }
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (matrices_[i].owner == rank_) owned_.push_back(static_cast<int>(i));
  }
  if (matrices_.empty()) return;
  const Sizes s = sizes(t, settings.hyper, rank_, alloc.device());
  auto buffer = [&](int64_t count) {
    return count > 0 ? Tensor::zeros(alloc, DType::kF32, {count}, MemCategory::kCommScratch) : Tensor();
  };
  send_ = buffer(s.send);
  recv_ = size_ > 1 ? buffer(s.recv) : send_;  // a group of one reads its own pieces
  u_ = buffer(s.matrix);
  o_mat_ = buffer(s.matrix);
  scratch_ = buffer(s.scratch);
  if (o.optimizer_in_backward) {
    ns_ = Stream::create(alloc.device(), "muon",
                         StreamOptions{.lags_under_torture = true, .wait_timeout = shard.options().timeout});
  }
}

void MuonExchange::begin(int u, const UnitState& unit, float grad_multiplier, Stream& stream) {
  const Unit& table = units_[static_cast<size_t>(u)];
  const UpdateArgs args = unit.update_args(o_);
  const MuonMomentum mc = muon_momentum_constants(settings_.hyper);
  for (const MuonPiece& p : table.pieces) {
    if (p.rank != rank_) continue;
    const int64_t at = p.begin - unit.offset();
    const char* g = static_cast<const char*>(args.grad) + at * static_cast<int64_t>(dtype_size(args.grad_dtype));
    ops::muon_momentum(g, args.grad_dtype, static_cast<float*>(args.state0) + at, send_.data_as<float>() + p.send_at,
                       p.end - p.begin, grad_multiplier, mc, device_, stream);
  }
}

// Unit u's pieces to their owners (back: from them), after `ready`; null
// for a group of one (which reads its own pieces).
WorkPtr MuonExchange::exchange(int u, bool back, const Event& ready) {
  if (size_ == 1) return nullptr;
  const Unit& t = units_[static_cast<size_t>(u)];
  auto view = [&](const Tensor& buffer, int64_t base, const std::vector<int64_t>& counts) {
    const int64_t n = sum(counts, counts.size());  // none: the buffer may not exist
    return n > 0 ? buffer.flat(base, n) : Tensor::wrap(nullptr, shard_.device(), DType::kF32, {0});
  };
  const Tensor mine = view(send_, t.send_base, t.send_counts);
  const Tensor owned = view(recv_, t.recv_base, t.recv_counts);
  shard_.stream().wait(ready);
  WorkPtr w = back ? shard_.all_to_all_v(owned, t.recv_counts, mine, t.send_counts)
                   : shard_.all_to_all_v(mine, t.send_counts, owned, t.recv_counts);
  comm_.track(w);
  return w;
}

// Step 3 for the matrices of unit u this rank owns: U whole, O = NS(U),
// O's slices back where U's were in the receive buffer.
void MuonExchange::orthogonalize(int u, Stream& stream) {
  const Unit& table = units_[static_cast<size_t>(u)];
  float* pieces = recv_.data_as<float>();
  float* whole = u_.data_as<float>();
  float* o = o_mat_.data_as<float>();
  const NewtonSchulzOptions options = muon_ns_options(settings_.hyper);
  auto copy = [&](float* dst, const float* src, int64_t n) {
    ops::copy_bytes(dst, device_, src, device_, n * static_cast<int64_t>(sizeof(float)), stream);
  };
  for (const int i : owned_) {
    const MuonMatrixInfo& m = matrices_[static_cast<size_t>(i)];
    if (m.unit != u) continue;
    for (const MuonPiece& p : table.pieces) {
      if (p.matrix == i) copy(whole + (p.begin - m.offset), pieces + p.recv_at, p.end - p.begin);
    }
    ops::newton_schulz(whole, o, m.rows, m.cols, options, scratch_.data(), static_cast<int64_t>(scratch_.size_bytes()), device_,
                       stream);
    for (const MuonPiece& p : table.pieces) {
      if (p.matrix == i) copy(pieces + p.recv_at, o + (p.begin - m.offset), p.end - p.begin);
    }
  }
}

// Step 5 for unit u: the element part on this rank's master slices, and
// the parameter copies.
void MuonExchange::apply(int u, const UnitState& unit, double lr, Stream& stream) {
  const Unit& table = units_[static_cast<size_t>(u)];
  const UpdateArgs args = unit.update_args(o_);
  const bool fp32 = args.master_mode == MasterMode::kFp32;  // else bf16 + remainder (kNone is refused)
  for (const MuonPiece& p : table.pieces) {
    if (p.rank != rank_) continue;
    const MuonMatrixInfo& m = matrices_[static_cast<size_t>(p.matrix)];
    const MuonApply c = muon_apply_constants(settings_.hyper, lr, settings_.weight_decay, m.lr_a, m.lr_b);
    const int64_t at = p.begin - unit.offset();
    char* out = args.param_out == nullptr
                    ? nullptr
                    : static_cast<char*>(args.param_out) + at * static_cast<int64_t>(dtype_size(args.param_dtype));
    ops::muon_apply(fp32 ? args.master + at : nullptr, fp32 ? nullptr : args.master_remainder + at, out,
                    args.param_dtype, send_.data_as<float>() + p.send_at, p.end - p.begin, c, device_, stream);
  }
}

// The exchanges go out unit by unit, back to back on the communication
// stream; each owner then runs all its matrices in a row.
void MuonExchange::finish(const std::vector<UnitState>& units, double lr, Stream& compute) {
  if (matrices_.empty()) return;
  const Event ready = compute.record();
  for (size_t u = 0; u < units_.size(); ++u) {  // 2. U to the owners
    if (has(static_cast<int>(u))) comm_.wait_on(compute, exchange(static_cast<int>(u), false, ready));
  }
  for (size_t u = 0; u < units_.size(); ++u) {  // 3.
    if (has(static_cast<int>(u))) orthogonalize(static_cast<int>(u), compute);
  }
  receive_and_apply(units, lr, compute, compute.record());
}

// 4. O back, each unit's after `ready`; 5.
void MuonExchange::receive_and_apply(const std::vector<UnitState>& units, double lr, Stream& compute,
                                     const Event& ready) {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (has(static_cast<int>(u))) comm_.wait_on(compute, exchange(static_cast<int>(u), true, ready));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (has(static_cast<int>(u))) apply(static_cast<int>(u), units[u], lr, compute);
  }
}

void MuonExchange::begin_in_backward(int u, const UnitState& unit, float grad_multiplier, Stream& reduced) {
  if (!has(u)) return;
  MP_ENFORCE(ns_ != nullptr, "the Muon stream exists with optimizer_in_backward only");
  begin(u, unit, grad_multiplier, reduced);
  const Event ready = reduced.record();
  const WorkPtr w = exchange(u, false, ready);  // on the communication stream, which never waits for ns_
  ns_->wait(w ? w->event() : ready);
  orthogonalize(u, *ns_);
}

void MuonExchange::finish_in_backward(const std::vector<UnitState>& units, double lr, Stream& compute) {
  if (matrices_.empty()) return;
  const Event done = ns_->record();
  compute.wait(done);  // the iterations' own time: not communication
  receive_and_apply(units, lr, compute, done);
}

}  // namespace mp
