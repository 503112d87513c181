// optim/muon.h: Muon (torch.optim.Muon, PyTorch 2.15) on one whole matrix,
// and which of the GPT's parameters it takes. The schedule, clipping and
// loss scaling stay the Optimizer's (optim/optimizer.h): the step takes the
// lr and the gradient multiplier of the StepPlan.
//
// Note [Muon step]
// torch/optim/_muon.py, _single_tensor_muon, for a param P [A, B], its
// gradient G and momentum buffer M (zeros before the first step), every
// array fp32:
//   M = M.lerp(G, 1 - momentum)
//   U = nesterov ? G.lerp(M, momentum) : M
//   O = NS(U)                  (kernels/cpu/newton_schulz.h)
//   P = P * (1 - lr weight_decay)
//   P = P - adjusted_lr O,     adjusted_lr = lr x adjust_lr_fn(A, B)
// with torch's CPU arithmetic, element by element, so that the same inputs
// give torch's bits wherever NS does:
// - lerp(s, e, w) is ATen's vectorized one: |w| < 0.5 ? fma(w, e - s, s)
//   : fma(w - 1, e - s, e), the weight rounded to fp32 (1 - momentum is
//   computed in double first, as Python does);
// - the decay is one fp32 multiply by (float)(1 - lr weight_decay), the
//   update fma(O, (float)(-adjusted_lr), P) (add_ with alpha is an fma);
// - adjusted_lr is computed in double from (A, B): torch's param.shape[:2].
// A step whose gradients are not finite is the caller's to skip
// (StepPlan::skip); NaN or Inf in G makes the whole update NaN.
// Two additions, both no-ops at their defaults: the gradient is first
// multiplied by grad_multiplier (the StepPlan's loss-scale and clipping
// factor; 1 leaves it as it is), and (A, B) may be given apart from the
// stored shape (MuonMatrix::lr_a, lr_b; Note [Muon and the GPT]).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/muon_math.h"
#include "kernels/newton_schulz.h"
#include "kernels/optim_math.h"

namespace mp {

// torch's adjust_lr_fn: None and "original", "match_rms_adamw",
// "spectral_unclamped".
enum class MuonAdjustLr : uint8_t { kOriginal = 0, kMatchRmsAdamW = 1, kSpectralUnclamped = 2 };

// Fixed for a run; torch.optim.Muon's defaults.
struct MuonHyper {
  double momentum = 0.95;
  bool nesterov = true;
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  int ns_steps = 5;
  double eps = 1e-7;
  MuonAdjustLr adjust_lr = MuonAdjustLr::kOriginal;
  DType iteration_dtype = DType::kBF16;  // of Newton-Schulz: kBF16 (torch's) or kF32
};

// An OptimizerConfig of kind MUON, resolved (Optimizer::muon()).
struct MuonSettings {
  MuonHyper hyper;
  double weight_decay = 0.1;  // the matrices' (OptimizerConfig.weight_decay)
  // The other parameters' AdamW (torch.optim.AdamW's defaults for unset
  // fields) and its peak lr, scaled by the schedule as lr is
  // (Optimizer::element_lr).
  OptimizerHyper adamw;
  double adamw_lr = 1e-3;
};

// lr x torch's adjusted ratio for a param of shape [a, b]: original
// sqrt(max(1, a / b)), match_rms_adamw 0.2 sqrt(max(a, b)), spectral_unclamped
// sqrt(a / b); in double, as torch's _adjust_lr.
double muon_adjusted_lr(double lr, MuonAdjustLr fn, int64_t a, int64_t b);

// One matrix on its owner: row-major [rows, cols] fp32 arrays, contiguous.
struct MuonMatrix {
  float* param = nullptr;        // the fp32 master, updated in place
  float* momentum = nullptr;     // the momentum buffer: zeros before the first step
  const float* grad = nullptr;   // the reduced gradient (times grad_multiplier: the true one)
  int64_t rows = 0, cols = 0;
  // The (A, B) adjust_lr_fn reads (torch's param.shape[:2]); 0: (rows, cols).
  int64_t lr_a = 0, lr_b = 0;
};

// What changes per step (and per parameter group).
struct MuonStep {
  double lr = 0.0;            // the scheduled lr (StepPlan::lr) times any group scale
  double weight_decay = 0.0;  // decoupled: P *= 1 - lr weight_decay
  float grad_multiplier = 1.0f;
  int threads = 0;            // 0: default_cpu_threads()
  // At least muon_scratch_elements floats, or null for a buffer of the
  // calling thread, grown as needed and kept.
  float* scratch = nullptr;
  int64_t scratch_elements = 0;
};

// The fp32 scratch muon_step_cpu needs for a [rows, cols] matrix: the
// update (rows x cols) and newton_schulz_scratch_elements.
int64_t muon_scratch_elements(int64_t rows, int64_t cols, const MuonHyper& hyper);

// Note [Muon step] on one matrix: updates param and momentum in place.
// Deterministic for any thread count. Throws EnforceError for a bad shape,
// pointer or scratch.
void muon_step_cpu(const MuonHyper& hyper, const MuonMatrix& matrix, const MuonStep& step);

// The step in three parts, so that everything but Newton-Schulz stays
// sharded element by element (Note [Muon in the engine] in
// runtime/muon_exchange.h); muon_step_cpu is exactly their composition.
//   1. whoever holds elements of the gradient updates the momentum there
//      and forms U (muon_momentum_element: the momentum is element-wise);
//   2. the owner of the whole matrix computes O = NS(U)
//      (muon_orthogonalize_cpu);
//   3. whoever holds elements of the master applies O to them
//      (muon_apply_element).
//
// The element math of 1 and 3 is kernels/muon_math.h's (the CPU's and the
// CUDA kernels'). 1: its constants;
MuonMomentum muon_momentum_constants(const MuonHyper& hyper);
// 2: O = NS(U), both rows x cols fp32 (may alias). scratch:
// muon_owner_scratch_elements floats, or null for a buffer of the calling
// thread.
int64_t muon_owner_scratch_elements(int64_t rows, int64_t cols, const MuonHyper& hyper);
// The Newton-Schulz options of `hyper` (threads: the CPU's, 0 for
// default_cpu_threads()).
NewtonSchulzOptions muon_ns_options(const MuonHyper& hyper, int threads = 0);
void muon_orthogonalize_cpu(const MuonHyper& hyper, const float* u, int64_t rows, int64_t cols, float* o,
                            int threads = 0, float* scratch = nullptr, int64_t scratch_elements = 0);

// 3: its constants; (lr_a, lr_b): the shape adjust_lr_fn reads
// (MuonMatrix::lr_a, lr_b, or the stored shape).
MuonApply muon_apply_constants(const MuonHyper& hyper, double lr, double weight_decay, int64_t lr_a, int64_t lr_b);
void muon_apply_cpu(float* param, const float* update, int64_t n, const MuonApply& c, int threads = 0);

// Note [Muon owners]
// The sharded engine brings each Muon matrix's U whole to one rank of the
// shard group, its owner, which runs Newton-Schulz. The
// cost of a [rows, cols] matrix, with m = min(rows, cols), n = max:
//   flops = ns_steps x (4 m^2 n + 2 m^3)
// (per iteration X X^T and B X are 2 m^2 n each, A A is 2 m^3; the
// element passes are left out). Owners are assigned greedily, largest cost
// first (ties: the lower index), each to the rank with the least cost so
// far (ties: the lower rank): deterministic, a pure function of the costs
// and the rank count, so every rank computes the same assignment. Ranks
// may own nothing.
double muon_ns_flops(int64_t rows, int64_t cols, int ns_steps);
// owners[i] in [0, ranks) for matrix i of cost flops[i].
std::vector<int> assign_muon_owners(const std::vector<double>& flops, int ranks);

// Note [Muon and the GPT]
// Muon takes the 2-D matrices inside the transformer blocks (h<l>.attn.
// c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj weights: models/gpt_config.cc);
// AdamW takes the embeddings wte and wpe (the head is tied to wte), and
// every 1-D parameter (biases, LayerNorm weights, ln_f), as Keller Jordan's
// Muon, modded-nanogpt and nanochat do. The GPT stores its weights [in, out]
// (y = x W, Hugging Face's Conv1D), the transpose of the nn.Linear weight
// [out, in] that torch.optim.Muon's adjust_lr_fn reads as (A, B) = (fan-out,
// fan-in); so a GPT matrix's lr shape is (A, B) = (out, in) = (shape[1],
// shape[0]): the adjusted lr of the same matrix in nanoGPT's nn.Linear
// under torch.optim.Muon (c_fc: sqrt(4) with ORIGINAL, mlp.c_proj: 1). The
// GPT's model spec marks them (ParamSpec::muon, muon_lr_a, muon_lr_b).

}  // namespace mp
