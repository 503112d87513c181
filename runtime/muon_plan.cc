// runtime/muon_plan.cc: Note [Muon in the engine]'s layout (runtime/muon_plan.h).
#include "runtime/muon_plan.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"

namespace mp {
namespace {

int64_t sum(const std::vector<int64_t>& v, size_t end) {
  int64_t s = 0;
  for (size_t i = 0; i < end; ++i) s += v[i];
  return s;
}

}  // namespace

MuonTables muon_tables(const FlatLayout& layout, const MuonHyper& hyper, int shard_size) {
  MuonTables t;
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

MuonSizes muon_sizes(const MuonTables& t, const MuonHyper& hyper, int rank, Device device) {
  MuonSizes s;
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
  const MuonTables t = muon_tables(layout, hyper, shard_size);
  std::vector<int64_t> out(static_cast<size_t>(shard_size), 0);
  if (t.matrices.empty()) return out;
  for (int r = 0; r < shard_size; ++r) {
    const MuonSizes s = muon_sizes(t, hyper, r, device);
    out[static_cast<size_t>(r)] = (s.send + s.recv + 2 * s.matrix + s.scratch) * 4;
  }
  return out;
}

}  // namespace mp
