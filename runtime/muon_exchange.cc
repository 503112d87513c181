#include "runtime/muon_exchange.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"

namespace mp {

MuonExchange::MuonExchange(const FlatLayout& layout, const EngineOptions& o, const MuonSettings& settings,
                           Communicator& shard, CommWatch& comm, Allocator& alloc)
    : o_(o),
      settings_(settings),
      shard_(shard),
      comm_(comm),
      device_(alloc.device()),
      rank_(shard.rank()),
      size_(shard.size()) {
  MuonTables t = muon_tables(layout, settings.hyper, size_);
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
    send_base += std::accumulate(unit.send_counts.begin(), unit.send_counts.end(), int64_t{0});
    recv_base += std::accumulate(unit.recv_counts.begin(), unit.recv_counts.end(), int64_t{0});
  }
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (matrices_[i].owner == rank_) owned_.push_back(static_cast<int>(i));
  }
  if (matrices_.empty()) return;
  const MuonSizes s = muon_sizes(t, settings.hyper, rank_, alloc.device());
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

std::unique_ptr<MatrixStep> make_matrix_step(const FlatLayout& layout, const EngineOptions& o, const Optimizer& opt,
                                             Communicator& shard, CommWatch& comm, Allocator& alloc) {
  if (opt.muon() == nullptr) return nullptr;
  return std::make_unique<MuonExchange>(layout, o, *opt.muon(), shard, comm, alloc);
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
  if (!o_.optimizer_in_backward || !has(u)) return;  // Note [Muon overlapped]: steps 2 and 3 now
  const Event ready = stream.record();
  const WorkPtr w = exchange(u, false, ready);  // on the communication stream, which never waits for ns_
  ns_->wait(w ? w->event() : ready);
  orthogonalize(u, *ns_);
}

// Unit u's pieces to their owners (back: from them), after `ready`; null
// for a group of one (which reads its own pieces).
WorkPtr MuonExchange::exchange(int u, bool back, const Event& ready) {
  if (size_ == 1) return nullptr;
  const Unit& t = units_[static_cast<size_t>(u)];
  auto view = [&](const Tensor& buffer, int64_t base, const std::vector<int64_t>& counts) {
    const int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t{0});  // none: the buffer may not exist
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
// stream; each owner then runs all its matrices in a row. With
// optimizer_in_backward (Note [Muon overlapped]) that was done in begin().
void MuonExchange::finish(const std::vector<UnitState>& units, double lr, Stream& compute) {
  if (matrices_.empty()) return;
  if (o_.optimizer_in_backward) {
    const Event done = ns_->record();
    compute.wait(done);  // the iterations' own time: not communication
    receive_and_apply(units, lr, compute, done);
    return;
  }
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

}  // namespace mp
