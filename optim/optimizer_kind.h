// optim/optimizer_kind.h: optimizer kinds as data, one entry per
// OptimizerConfig.Kind (the table: optim/optimizer_kind.cc), and a
// config's kind resolved from its entry.
//
// Note [Optimizer kinds]
// An entry is all mp knows of a kind; the engine, the memory plan and
// checkpoints (runtime/), the fused update's kernels and the bindings read
// it (through the Optimizer, or configure_kind), and none switches on the
// kind. It states how the kind is configured (defaults, the top-level
// fields it reads: any other that is set is refused, naming the kinds that
// read it); its element rule (kernels/optim_math.h) and so its state, the
// rule's arrays per element, state0 and state1 in checkpoints; whether it
// updates the matrices the model marks whole (Muon: set up from
// OptimizerConfig.muon, which also holds the rule's hyperparameters for the
// other parameters; the fused update skips the matrices and the engine runs
// the kind's exchange, runtime/matrix_step.h; their elements keep state0
// only, and state1 reads as zeros there); and its name, which checkpoints
// record. A new element-wise kind: its Kind value (proto/mp.proto), its
// rule, its entry, and its float64 reference in tests/test_update.cc.
#pragma once

#include <optional>
#include <string>

#include "kernels/optim_math.h"
#include "optim/muon.h"
#include "proto/mp.pb.h"

namespace mp {

// The top-level OptimizerConfig fields a kind may read besides lr and
// weight_decay: beta1 and beta2; eps; momentum, dampening and nesterov.
enum OptimizerFields : unsigned { kBetas = 1, kEps = 2, kMomentum = 4 };

struct OptimizerKind {
  proto::OptimizerConfig::Kind kind;
  const char* label;                       // in messages: "AdamW"
  double lr, beta1, beta2, weight_decay;  // the defaults
  unsigned reads;                         // OptimizerFields
  const char* hint;                       // appended to a refused field's message
  UpdateRule rule;
  UpdateRule rule_without_momentum;  // at momentum 0 (SGD's keeps no buffer)
  // Whole matrices: their settings and the rule's hyperparameters from
  // OptimizerConfig.muon (and the matrices' weight decay); null for none.
  MuonSettings (*matrices)(const proto::MuonConfig& c, double weight_decay);

  std::string name() const { return proto::OptimizerConfig::Kind_Name(kind); }  // "ADAMW"
};

// The kind's part of an OptimizerConfig, defaults filled in and every
// value checked (ConfigError naming the field: "optimizer.beta2 = 1.5:
// must be in [0, 1)"; an unknown kind).
struct KindConfig {
  const OptimizerKind* kind = nullptr;
  double lr = 0;
  OptimizerHyper hyper;              // the fused update's (the rule's)
  std::optional<MuonSettings> muon;  // a kind with whole matrices
};
KindConfig configure_kind(const proto::OptimizerConfig& c);

}  // namespace mp
