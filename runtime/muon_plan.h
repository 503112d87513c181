// runtime/muon_plan.h: the layout of optimizer kind MUON's exchange (Note
// [Muon in the engine] in runtime/muon_exchange.h) as a pure function of
// the flat layout, Muon's settings and the shard group's size: the Muon
// matrices and their owners, the piece of each that each shard rank holds
// and where it sits in the exchange's buffers, and those buffers' sizes.
// The exchange and the memory plan both read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "models/flat_layout.h"
#include "optim/muon.h"

namespace mp {

struct MuonMatrixInfo {
  std::string name;
  int unit = 0;
  int64_t offset = 0;          // in the unit's flat buffer
  int64_t rows = 0, cols = 0;
  int64_t lr_a = 0, lr_b = 0;  // adjust_lr_fn's shape
  double flops = 0;            // muon_ns_flops
  int owner = 0;               // in the shard group
};

// The Muon matrices of a layout (ParamSpec::muon) and their owners in a
// shard group of `shard_size`. ConfigError for a marked parameter that is
// not 2-D.
std::vector<MuonMatrixInfo> muon_matrices(const FlatLayout& layout, const MuonHyper& hyper, int shard_size);

// The part of a Muon matrix one shard rank holds: elements [begin, end) of
// its unit's flat buffer, at send_at of that rank's exchange send buffer
// and at recv_at of the owner's receive buffer.
struct MuonPiece {
  int matrix = 0;  // in muon_matrices' order
  int rank = 0;    // the shard rank holding it
  int64_t begin = 0, end = 0;
  int64_t send_at = 0, recv_at = 0;
};

// Which parameters Muon takes (the model's marks: their count, elements and
// the first names) and, one line per rank of the shard group, the matrices
// it owns and its share of the Newton-Schulz flops: the run log and --plan.
std::string describe_muon_owners(const std::vector<MuonMatrixInfo>& matrices, int shard_size);

// The bytes the exchange allocates on each rank of the shard group, all
// MemCategory::kCommScratch, for the memory plan: the send buffer (the
// rank's Muon elements) and the receive buffer (its matrices' elements;
// none in a group of one), its largest owned matrix's U and O, and that
// matrix's Newton-Schulz scratch. [shard rank].
std::vector<int64_t> muon_scratch_bytes(const FlatLayout& layout, const MuonHyper& hyper, int shard_size,
                                        Device device = Device::cpu());

// Every Muon matrix of the model and its pieces: the part of it each shard
// rank holds. Unit by unit, each rank's send buffer holds its pieces for
// owner 0, then owner 1, ...; each owner's receive buffer the pieces from
// rank 0, then rank 1, ... (Note [Muon in the engine]); pieces keep offset
// order within each (rank, owner) pair.
struct MuonTables {
  std::vector<MuonMatrixInfo> matrices;
  std::vector<std::vector<MuonPiece>> pieces;  // per unit
  // [unit][rank][peer]: elements rank sends peer (peer owns them)
  std::vector<std::vector<std::vector<int64_t>>> counts;
  std::vector<int64_t> send_total, recv_total;  // per rank: every unit's
};
MuonTables muon_tables(const FlatLayout& layout, const MuonHyper& hyper, int shard_size);

// What a rank of the shard group allocates for the exchange.
struct MuonSizes {
  int64_t send = 0, recv = 0;  // exchange buffers, fp32 elements (a group of one: no receive buffer)
  int64_t matrix = 0;          // the largest owned matrix
  int64_t scratch = 0;         // the owned matrices' largest NS scratch, in floats
};
MuonSizes muon_sizes(const MuonTables& t, const MuonHyper& hyper, int rank, Device device);

}  // namespace mp
