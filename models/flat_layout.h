// models/flat_layout.h: a model as an ordered list of units of named
// parameters, and the flat layout the engine shards.
//
// Note [Flat units]
// Each unit's parameters are concatenated in declaration order into one
// flat buffer. Every parameter starts at a multiple of kParamAlignElements
// (16 bytes of bf16, as FSDP1 aligns each parameter to 16 bytes); the gaps
// are zero. The buffer is then padded to a multiple of the shard group size
// S, and rank r of the group owns the r-th contiguous slice of
// padded_numel / S elements. Parameter offsets do not depend on S: only the
// trailing padding does, so a parameter's global (unit, offset, numel) is
// the same at every world size (checkpoints rely on it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mp {

inline constexpr int64_t kParamAlignElements = 8;

// How a parameter starts. Values are drawn per (seed, parameter, element),
// so every rank computes its slice without communication and the result
// does not depend on the world size.
struct ParamInit {
  enum class Kind : uint8_t { kZeros, kOnes, kNormal, kUniform };
  Kind kind = Kind::kNormal;
  double scale = 0.02;  // std of kNormal; half-width of kUniform
};

struct ParamSpec {
  std::string name;  // unique in the model, e.g. "layer0.weight"
  Shape shape;
  ParamInit init;
  // Optimizer kind MUON updates this parameter with Muon (optim/muon.h),
  // whole on one rank, and not with its AdamW: a 2-D matrix [rows, cols],
  // row-major. (muon_lr_a, muon_lr_b): the shape adjust_lr_fn reads (0, 0:
  // rows, cols). Other optimizers ignore it.
  bool muon = false;
  int64_t muon_lr_a = 0, muon_lr_b = 0;
};

struct UnitSpec {
  std::string name;  // e.g. "layer0"
  std::vector<ParamSpec> params;
  // False when the unit's backward reads none of its parameters (the GPT's
  // embedding: Note [Tied head] in models/gpt.h): the engine then gathers
  // nothing for it and passes an undefined `params` to backward_on.
  bool backward_reads_params = true;
  // The model can run the unit's forward again just before its backward
  // (Note [Activation recomputation] in models/model.h).
  bool recomputable = false;
};

struct ModelSpec {
  std::vector<UnitSpec> units;
  int64_t numel() const;  // parameters, without alignment or padding
};

// The units whose activations are recomputed for a policy of every k-th
// recomputable unit (engine.activation_checkpointing; k = 0: none, 1: all):
// of the recomputable units in order, the 1st, the (1+k)th, ... The engine
// and the models that size their activations by it (GptOptions) both ask
// here. ConfigError when k > 0 and the model can recompute no unit.
std::vector<bool> recomputed_units(const ModelSpec& spec, int every);

// Where a parameter lives: its unit and its element range in the unit's
// flat buffer.
struct ParamPlacement {
  std::string name;
  Shape shape;
  ParamInit init;
  int unit = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  bool muon = false;  // ParamSpec's
  int64_t muon_lr_a = 0, muon_lr_b = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<ParamPlacement> params;
  int64_t numel = 0;         // end of the last parameter (alignment gaps included)
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the group size
  int64_t shard_numel = 0;   // padded_numel / group size
  bool backward_reads_params = true;  // UnitSpec's
  // Far larger than every other unit (FlatLayout::oversized): the engine's
  // full-size buffers (a gathered copy, a backward's gradients) for it are
  // its own, and the shared ones are sized by the other units.
  bool oversized = false;
};

class FlatLayout {
 public:
  // Throws ConfigError naming the unit or parameter: no units, an empty
  // unit, a duplicate name, a negative dimension.
  FlatLayout(const ModelSpec& spec, int group_size);

  int group_size() const { return group_size_; }
  const std::vector<UnitLayout>& units() const { return units_; }
  const UnitLayout& unit(int u) const { return units_.at(static_cast<size_t>(u)); }
  int num_units() const { return static_cast<int>(units_.size()); }
  // Throws ConfigError if no parameter has that name.
  const ParamPlacement& param(const std::string& name) const;
  int64_t max_padded_numel() const;
  // The largest padded unit that is not oversized: what shared full-size
  // buffers hold.
  // Note [Oversized units]: the engine's full-size buffers come in sets
  // shared by the units (at least two: the gradients' double buffer, the
  // gather ring). The m largest units are oversized, with buffers of their
  // own, for the m that minimises their sizes plus two shared buffers of
  // the next largest: a transformer's root unit (embeddings, tied head; 39M
  // of GPT-2 124M's 124M parameters) then costs one buffer of its size, not
  // two or three, and the blocks share buffers of a block's size. A set of
  // two or more shared buffers is never larger than without.
  int64_t shared_padded_numel() const;
  int num_shared_units() const;  // the units that are not oversized
  int64_t max_shard_numel() const;
  int64_t total_numel() const;  // parameters only

 private:
  void mark_oversized();

  int group_size_ = 1;
  std::vector<UnitLayout> units_;
  std::map<std::string, std::pair<int, int>> index_;  // name -> (unit, position)
};

}  // namespace mp
