// kernels/muon_math.h: Muon's element math (Note [Muon step] in
// optim/muon.h), written once for the CPU loops and the CUDA kernels: the
// momentum and U (step 1 of the split step) and the decay and update (step
// 3). torch's CPU arithmetic: ATen's vectorized lerp, each branch one fma,
// and the update one fma after a plain multiply. Files that compile these
// for CUDA do so with --fmad=false, so the multiply is not contracted and
// the bits are the CPU's.
#pragma once

#include <cmath>

#include "kernels/hd.h"

namespace mp {

// Step 1's constants: the momentum lerp's weight 1 - momentum and Nesterov's
// weight momentum, each rounded to fp32 once.
struct MuonMomentum {
  float w_buf = 0.05f, w_nesterov = 0.95f;
  bool nesterov = true;
};

// ATen's lerp on the CPU (aten/src/ATen/native/Lerp.h, lerp_vec): start + w
// (end - start) for |w| < 0.5, else end - (1 - w)(end - start), each as one
// fma.
MP_HD float muon_torch_lerp(float start, float end, float w) {
  const float diff = end - start;
  return fabsf(w) < 0.5f ? fmaf(w, diff, start) : fmaf(w - 1.0f, diff, end);
}

// The momentum buffer, torch's lerp with weight 1 - momentum, in place;
// returns U: Nesterov's lerp(g, buf, momentum), or buf. g is the reduced
// gradient times its multiplier (the true one).
MP_HD float muon_momentum_element(float& buf, float g, const MuonMomentum& c) {
  buf = muon_torch_lerp(buf, g, c.w_buf);
  return c.nesterov ? muon_torch_lerp(g, buf, c.w_nesterov) : buf;
}

// Step 3's constants: P = fma(O, alpha, P x decay), with alpha =
// -adjusted_lr and decay = 1 - lr weight_decay, each rounded once.
struct MuonApply {
  float alpha = 0.0f;
  float decay = 1.0f;
};

MP_HD float muon_apply_element(float param, float update, const MuonApply& c) {
  return fmaf(update, c.alpha, param * c.decay);
}

}  // namespace mp
